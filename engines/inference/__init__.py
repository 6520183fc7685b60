"""Inference: the embedded engine core (continuous batching, KV cache, the lean forward,
sampling, constrained decoding), the one client that drives every backend's servers,
interruptible generation, and `backends/` (embedded, SGLang, vLLM). The embedded engine's HTTP
server is `server/`; the OpenAI wire format it shares with the recording client is
`engines/openai/`.
"""
