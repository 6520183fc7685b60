"""The OpenAI wire format, free of torch: request parsing and validation (chat, completions,
Responses), the conversions between messages and token ids, structured output, and the
Responses store.

Why a package of its own: two audiences read it, the embedded server's `/v1` routes
(`engines/inference/server/`) and the recording client that trains an agent written for the
`openai` package (`workflows/rollout/openai_agent.py`). Both must accept and refuse the same
requests and render the same messages; neither needs the engine, the server or torch.
"""
