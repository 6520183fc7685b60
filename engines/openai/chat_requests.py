"""OpenAI request bodies (`/v1/chat/completions`, `/v1/completions`) checked into plain dataclasses.

Why a module of its own: the HTTP routes (`server/chat_routes.py`) and the recording client for
agents (`workflows/rollout/openai_agent.py`) accept the same parameters with the same rules,
so a request an agent makes through the recording client is refused for exactly the reasons
the server would refuse it. Everything here is pure: no aiohttp, no torch, no `openai`.

What is honoured: `model` (any name: one model is served), `messages` (text content only),
`prompt`, `n`, `temperature`, `top_p`, `max_tokens` / `max_completion_tokens`, `stop`,
`seed`, `logprobs` / `top_logprobs`, `echo` (prompt log-probs), `tools` (functions, `strict`
enforced) with any `tool_choice` ("auto", "none", "required", a named function),
`response_format` (text, json_object, json_schema: by constrained decoding, see
`structured_output.py`), `parallel_tool_calls`, `stream` with `stream_options.include_usage`, `user` and `metadata`
(recorded nowhere, change nothing). Extensions as in SGLang / vLLM: `top_k`, `ignore_eos`,
`return_token_ids` (the prompt's and each choice's token ids, plus our per-token policy
versions). Anything else, and neutral-only knobs set to a non-neutral value (penalties,
`logit_bias`), is a 400 naming the parameter: silently ignoring a knob
would give the caller a different distribution than the one asked for.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from areal_graph.engines.openai.fields import (
    OpenAIRequestError,
    as_object,
    bool_field,
    function_tools,
    int_field,
    is_int,
    is_number,
    optional_int,
    parts_text,
    refuse_unknown,
    response_format,
)

log = logging.getLogger(__name__)

__all__ = [
    "OpenAIRequestError",
    "ChatRequest",
    "CompletionRequest",
    "parse_chat_request",
    "parse_completion_request",
    "normalize_messages",
    "MAX_N",
    "MAX_STOP",
]

MAX_N = 16  # choices per request (and per prompt of a batched /v1/completions)
MAX_STOP = 4  # OpenAI's limit on stop sequences
MAX_TOP_LOGPROBS = 20  # OpenAI's limit for chat; /v1/completions' legacy `logprobs` allows 5, we allow 20
MAX_PROMPTS = 64  # prompts in one batched /v1/completions request
ROLES = ("system", "developer", "user", "assistant", "tool")
_TEXT_KINDS = ("text", "input_text")  # input_text: Responses-API style
_MEDIA_KINDS = ("image_url", "input_image", "input_audio", "file", "audio")

_COMMON = {
    "model",
    "n",
    "temperature",
    "top_p",
    "max_tokens",
    "stop",
    "seed",
    "stream",
    "stream_options",
    "user",
    "metadata",
    "frequency_penalty",
    "presence_penalty",
    "repetition_penalty",
    "logit_bias",
    "top_k",
    "ignore_eos",
    "return_token_ids",
}
CHAT_FIELDS = _COMMON | {
    "messages",
    "max_completion_tokens",
    "logprobs",
    "top_logprobs",
    "tools",
    "tool_choice",
    "parallel_tool_calls",
    "response_format",
}
COMPLETION_FIELDS = _COMMON | {"prompt", "logprobs", "echo", "suffix", "best_of"}

# Fields that cannot change what this server generates: accepted, ignored, noted once in the log.
# (Storage, billing, caching and abuse-tracking hints of OpenAI's service, and `verbosity`, a
# length hint to reasoning models that this server has no way to honour or to break.)
IGNORED_FIELDS = {
    "store": "nothing is stored",
    "service_tier": "one tier",
    "prompt_cache_key": "prefix caching needs no key here",
    "safety_identifier": "no abuse tracking",
    "verbosity": "a hint this server does not take",
    "prediction": "predicted outputs only speed up a server that has them",
    "web_search_options": None,
    "audio": None,
    "modalities": None,
    "reasoning_effort": None,
}
# Fields that would change the output, accepted only at the value that does not.
NEUTRAL_VALUES = {"min_p": (0, 0.0)}
_noted: set[str] = set()


def _ignore_harmless(body: dict) -> None:
    """Drop the fields that cannot change the output (see IGNORED_FIELDS) and neutral values;
    refuse the ones that would (audio output, web search, reasoning effort on a model without it)."""
    for key in [k for k in body if k in IGNORED_FIELDS]:
        value = body[key]
        if key == "modalities":
            if value not in (None, ["text"]):
                raise OpenAIRequestError(f"'modalities' {value!r}: this server outputs text only", key)
        elif key in ("audio", "web_search_options", "reasoning_effort"):
            if value is not None:
                raise OpenAIRequestError(f"'{key}' is not supported by this server (it would change the output)", key)
        elif key not in _noted:
            _noted.add(key)
            log.warning("OpenAI field %r accepted and ignored (noted once): %s", key, IGNORED_FIELDS[key])
        del body[key]
    for key, neutral in NEUTRAL_VALUES.items():
        if key in body:
            if body[key] is not None and body[key] not in neutral:
                raise OpenAIRequestError(f"'{key}' is not supported by this server (only {neutral[-1]})", key)
            del body[key]


@dataclass
class SamplingRequest:
    """The sampling part shared by both endpoints (None: not given, the default applies)."""

    n: int = 1
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    max_tokens: int | None = None
    stop: list[str] = field(default_factory=list)
    seed: int | None = None
    ignore_eos: bool = False
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    repetition_penalty: float = 1.0


@dataclass
class ChatRequest(SamplingRequest):
    model: str = ""
    messages: list[dict[str, Any]] = field(default_factory=list)
    tools: list[dict[str, Any]] = field(default_factory=list)
    tool_choice: str | dict[str, Any] = "auto"  # "auto" | "none" | "required" | {"type": "function", ...}
    parallel_tool_calls: bool = True
    response_format: dict[str, Any] | None = None  # None for text
    logprobs: bool = False
    top_logprobs: int = 0
    stream: bool = False
    include_usage: bool = False
    return_token_ids: bool = False

    @property
    def parse_tools(self) -> bool:
        """Whether generated `<tool_call>` blocks become `tool_calls` (tools given, not disabled)."""
        return bool(self.tools) and self.tool_choice != "none"


@dataclass
class CompletionRequest(SamplingRequest):
    model: str = ""
    prompts: list[str | list[int]] = field(default_factory=list)  # text, or token ids
    logprobs: int | None = None  # the legacy field: None = none, k = the k most likely per token
    echo: bool = False  # the prompt comes back before the completion, with its tokens' log-probs
    stream: bool = False
    include_usage: bool = False
    return_token_ids: bool = False


def _check_fields(body: Any, allowed: set[str], endpoint: str) -> dict:
    if not isinstance(body, dict):
        raise OpenAIRequestError("the request body must be a JSON object")
    body = dict(body)
    _ignore_harmless(body)
    refuse_unknown(body, allowed, endpoint, " (logit_bias empty only)")
    if body.get("logit_bias"):
        raise OpenAIRequestError("'logit_bias' is not supported by this server (only empty)", "logit_bias")
    if body.get("metadata") is not None and not isinstance(body["metadata"], dict):
        raise OpenAIRequestError("'metadata' must be an object", "metadata")
    if body.get("user") is not None and not isinstance(body["user"], str):
        raise OpenAIRequestError("'user' must be a string", "user")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise OpenAIRequestError(
            "'model' is required (a string; this server serves one model and takes any name)", "model"
        )
    return body


def _sampling(body: dict, request: SamplingRequest, max_tokens_key: str | None = None) -> None:
    request.n = int_field(body, "n", 1, MAX_N, 1)
    t = body.get("temperature")
    if t is not None and (not is_number(t) or not 0 <= t <= 2):
        raise OpenAIRequestError(f"'temperature' must be a number in [0, 2], got {t!r}", "temperature")
    request.temperature = None if t is None else float(t)
    p = body.get("top_p")
    if p is not None and (not is_number(p) or not 0 < p <= 1):
        raise OpenAIRequestError(f"'top_p' must be a number in (0, 1], got {p!r}", "top_p")
    request.top_p = None if p is None else float(p)
    k = body.get("top_k")
    if k is not None and (not is_int(k) or (k < 1 and k != -1)):
        raise OpenAIRequestError(f"'top_k' must be -1 (off) or an integer >= 1, got {k!r}", "top_k")
    request.top_k = k
    request.max_tokens = optional_int(body, "max_tokens", 1, None)
    if max_tokens_key is not None and body.get(max_tokens_key) is not None:
        request.max_tokens = optional_int(body, max_tokens_key, 1, None)  # the newer name wins
    stop = body.get("stop")
    if isinstance(stop, str):
        stop = [stop]
    if stop is not None and (not isinstance(stop, list) or not all(isinstance(s, str) and s for s in stop)):
        raise OpenAIRequestError(f"'stop' must be a non-empty string or a list of them, got {stop!r}", "stop")
    if stop is not None and len(stop) > MAX_STOP:
        raise OpenAIRequestError(f"'stop' takes at most {MAX_STOP} sequences, got {len(stop)}", "stop")
    request.stop = list(stop or [])
    request.seed = optional_int(body, "seed", -(2**63), 2**64 - 1)
    request.ignore_eos = bool_field(body, "ignore_eos")
    for key, lo, hi in (("frequency_penalty", -2.0, 2.0), ("presence_penalty", -2.0, 2.0)):
        v = body.get(key)
        if v is not None and (not is_number(v) or not lo <= v <= hi):
            raise OpenAIRequestError(f"'{key}' must be a number in [{lo:g}, {hi:g}], got {v!r}", key)
        if v is not None:
            setattr(request, key, float(v))
    rp = body.get("repetition_penalty")
    if rp is not None and (not is_number(rp) or not 0 < rp < float("inf")):
        raise OpenAIRequestError(
            f"'repetition_penalty' must be a number > 0 (1 is off), got {rp!r}", "repetition_penalty"
        )
    if rp is not None:
        request.repetition_penalty = float(rp)


def _stream(body: dict) -> tuple[bool, bool]:
    stream = bool_field(body, "stream")
    options = body.get("stream_options")
    if options is None:
        return stream, False
    if not stream:
        raise OpenAIRequestError("'stream_options' is only allowed with stream: true", "stream_options")
    if not isinstance(options, dict):
        raise OpenAIRequestError("'stream_options' must be an object", "stream_options")
    # other keys (include_obfuscation, ...) shape the stream's framing, never the text: ignored
    return stream, bool_field(options, "include_usage")


# --------------------------------------------------------------------------- chat
def parse_chat_request(body: Any) -> ChatRequest:
    """Check a /v1/chat/completions body; raise OpenAIRequestError naming what is not supported."""
    body = _check_fields(body, CHAT_FIELDS, "/v1/chat/completions")
    request = ChatRequest(model=body["model"])
    _sampling(body, request, "max_completion_tokens")
    request.messages = normalize_messages(body.get("messages"))
    request.tools = function_tools(body.get("tools"))
    request.tool_choice = _tool_choice(body.get("tool_choice"), request.tools)
    request.parallel_tool_calls = bool_field(body, "parallel_tool_calls", True)
    request.logprobs = bool_field(body, "logprobs")
    request.top_logprobs = int_field(body, "top_logprobs", 0, MAX_TOP_LOGPROBS, 0)
    if request.top_logprobs and not request.logprobs:
        raise OpenAIRequestError("'top_logprobs' needs 'logprobs': true", "top_logprobs")
    request.response_format = response_format(body.get("response_format"))
    request.stream, request.include_usage = _stream(body)
    request.return_token_ids = bool_field(body, "return_token_ids")
    return request


def normalize_messages(messages: Any) -> list[dict[str, Any]]:
    """OpenAI messages -> plain dicts {role, content (str | None), tool_calls?, tool_call_id?, name?}.

    Accepts what clients send: dicts or pydantic models (an agent appends
    `response.choices[0].message` as is), content as a string or a list of text parts.
    `developer` becomes `system` (chat templates know only the older name). Images, audio and
    files are refused: the served models read text only.
    """
    if not isinstance(messages, list) or not messages:
        raise OpenAIRequestError("'messages' must be a non-empty list", "messages")
    out = []
    for i, raw in enumerate(messages):
        raw = as_object(raw, f"messages[{i}]")
        role = raw.get("role")
        if role not in ROLES:
            raise OpenAIRequestError(
                f"messages[{i}].role must be one of {list(ROLES)}, got {role!r}", f"messages[{i}].role"
            )
        msg: dict[str, Any] = {
            "role": "system" if role == "developer" else role,
            "content": _content(raw.get("content"), f"messages[{i}].content"),
        }
        if role == "assistant" and raw.get("tool_calls"):
            msg["tool_calls"] = _message_tool_calls(raw["tool_calls"], f"messages[{i}].tool_calls")
        elif msg["content"] is None and role != "assistant":
            raise OpenAIRequestError(f"messages[{i}] ({role}) needs 'content'", f"messages[{i}].content")
        for key in ("tool_call_id", "name"):
            if isinstance(raw.get(key), str):
                msg[key] = raw[key]
        out.append(msg)
    return out


def _content(content: Any, where: str) -> str | None:
    if content is None or isinstance(content, str):
        return content
    return parts_text(content, where, _TEXT_KINDS, _MEDIA_KINDS, '{"type": "text", "text": ...}')


def _message_tool_calls(calls: Any, where: str) -> list[dict[str, Any]]:
    if not isinstance(calls, list):
        raise OpenAIRequestError(f"{where} must be a list", where)
    out = []
    for k, call in enumerate(calls):
        fn = call.get("function") if isinstance(call, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise OpenAIRequestError(
                f'{where}[{k}] must be {{"type": "function", "function": {{"name": ..., "arguments": ...}}}}',
                f"{where}[{k}]",
            )
        arguments = fn.get("arguments", "{}")
        if not isinstance(arguments, (str, dict)):
            raise OpenAIRequestError(f"{where}[{k}].function.arguments must be a JSON string", f"{where}[{k}]")
        out.append(
            {
                "id": str(call.get("id", "")),
                "type": "function",
                "function": {"name": fn["name"], "arguments": arguments},
            }
        )
    return out


def _tool_choice(choice: Any, tools: list[dict[str, Any]]) -> str | dict[str, Any]:
    """ "auto" | "none" | "required" | {"type": "function", "function": {"name": N}} with N in `tools`."""
    if choice is None:
        return "auto"
    if choice in ("auto", "none"):
        return choice
    names = [t["function"]["name"] for t in tools]
    if choice == "required":
        if not tools:
            raise OpenAIRequestError("'tool_choice' 'required' needs 'tools'", "tool_choice")
        return choice
    if isinstance(choice, dict) and choice.get("type") == "function" and isinstance(choice.get("function"), dict):
        name = choice["function"].get("name")
        if name not in names:
            raise OpenAIRequestError(
                f"'tool_choice' names function {name!r}, which is not in 'tools' {names}", "tool_choice"
            )
        return {"type": "function", "function": {"name": name}}
    raise OpenAIRequestError(
        f"'tool_choice' must be 'auto', 'none', 'required' or "
        f'{{"type": "function", "function": {{"name": ...}}}}, got {choice!r}',
        "tool_choice",
    )


# --------------------------------------------------------------------------- completions
def parse_completion_request(body: Any) -> CompletionRequest:
    """Check a /v1/completions body; raise OpenAIRequestError naming what is not supported."""
    body = _check_fields(body, COMPLETION_FIELDS, "/v1/completions")
    request = CompletionRequest(model=body["model"])
    request.echo = bool_field(body, "echo")
    # echo with max_tokens 0 scores the prompt alone (log-likelihood evaluations)
    score_only = request.echo and body.get("max_tokens") == 0
    _sampling({k: v for k, v in body.items() if k != "max_tokens"} if score_only else body, request)
    if score_only:
        request.max_tokens = 0
    if request.max_tokens is None:
        request.max_tokens = 16  # OpenAI's default for this endpoint
    request.prompts = _prompts(body.get("prompt"))
    if len(request.prompts) * request.n > MAX_PROMPTS:
        raise OpenAIRequestError(
            f"{len(request.prompts)} prompts x n={request.n} choices is more than this "
            f"server takes in one request ({MAX_PROMPTS})",
            "prompt",
        )
    request.logprobs = optional_int(body, "logprobs", 0, MAX_TOP_LOGPROBS)
    if body.get("suffix") is not None:
        raise OpenAIRequestError("'suffix' (insertion) is not supported by this server", "suffix")
    best_of = body.get("best_of")
    if best_of is not None and best_of not in (1, request.n):
        raise OpenAIRequestError("'best_of' other than n is not supported by this server", "best_of")
    request.stream, request.include_usage = _stream(body)
    if request.echo and request.stream:
        raise OpenAIRequestError("'echo' with 'stream' is not built yet: ask without streaming", "echo")
    request.return_token_ids = bool_field(body, "return_token_ids")
    return request


def _prompts(prompt: Any) -> list[str | list[int]]:
    """`prompt` as a list of prompts: text, a list of texts, token ids, or a list of token-id lists."""
    if isinstance(prompt, str):
        prompts: list[Any] = [prompt]
    elif isinstance(prompt, list) and prompt and all(is_int(t) for t in prompt):
        prompts = [list(prompt)]
    elif isinstance(prompt, list) and prompt:
        prompts = list(prompt)
    else:
        raise OpenAIRequestError("'prompt' must be a non-empty string, list of strings, or list of token ids", "prompt")
    for k, p in enumerate(prompts):
        ok = (isinstance(p, str) and p) or (isinstance(p, list) and p and all(is_int(t) and t >= 0 for t in p))
        if not ok:
            raise OpenAIRequestError(
                f"prompt[{k}] must be a non-empty string or a non-empty list of token ids", "prompt"
            )
    return prompts
