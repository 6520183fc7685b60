"""The embedded engine's HTTP server: SGLang-compatible native routes (`/generate`, weight
updates, pause and resume), the OpenAI `/v1` routes (chat, completions, Responses) over the
wire format in `engines/openai/`, its command line and the contract its launcher waits on.

Why a package of its own: the engine core (`engines/inference/`) is what a rollout drives and
what the simulator replays; the server is what a process serves. A reader of one never needs
the other's files.
"""
