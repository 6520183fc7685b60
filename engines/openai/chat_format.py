"""Pure conversions between OpenAI's wire format and token ids: prompts, tool calls, responses.

Shared by the server routes (`server/chat_routes.py`) and the recording client for agents
(`workflows/rollout/openai_agent.py`), so a completion looks the same whichever path made it.
Torch-free and aiohttp-free; the tokenizer is any HF tokenizer.

Prompts. Messages go through the model's chat template (`apply_chat_template`, text, then
`tokenizer(text, add_special_tokens=False)` as the datasets do). Tools follow the Hermes /
Qwen2.5 convention (`api/tool_calls.py`): the assistant writes
`<tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>` blocks and ends its turn; a
result comes back as a `tool` message. A template that knows tools (its source mentions
`tool_calls`, as the tool kit's and Qwen's do) renders them itself, getting `tools=` and
assistant `tool_calls` with their arguments as objects (what HF templates expect). A template
that does not is given plain messages in that convention instead: the assistant's calls are
written into its content as `<tool_call>` blocks, `tool` messages keep their role (ChatML
renders them as a turn of their own, as the tool kit does), and the tool schemas go into the
system message (`tools_system_text`).

Responses. A choice's text is its tokens decoded without special tokens, cut before the stop
string that ended it (OpenAI excludes it). With tools enabled, well-formed `<tool_call>`
blocks become `tool_calls` (finish_reason "tool_calls") and the content is the text before
the first block (None if empty). `logprobs.content` lists every generated token, the
end-of-turn token included, so it lines up one to one with /generate's
`output_token_logprobs` (its sum is the sequence's behaviour log-prob).
"""

from __future__ import annotations

import json
import math
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from areal_graph.api.tool_calls import TOOL_CALL_OPEN, parse_tool_calls, render_tool_call
from areal_graph.engines.openai.chat_requests import OpenAIRequestError

__all__ = [
    "GeneratedChoice",
    "arguments_object",
    "render_chat_prompt",
    "encode_text",
    "template_renders_tool_calls",
    "choice_text",
    "split_tool_calls",
    "chat_choice_json",
    "chat_completion_json",
    "chat_chunks",
    "completion_choice_json",
    "completion_json",
    "completion_chunks",
    "usage_json",
    "usage_chunk",
    "finish_reason",
]


@dataclass
class GeneratedChoice:
    """One generated answer, as the engine or the interruptible loop returns it."""

    index: int
    output_ids: list[int]
    output_logprobs: list[float]
    output_versions: list[int]
    finish_reason: str  # "stop" | "length" | "abort"
    top_logprobs: list[list[tuple[int, float]]] | None = None


# --------------------------------------------------------------------------- prompts
def template_renders_tool_calls(tokenizer: Any) -> bool:
    """Whether the chat template renders assistant `tool_calls` itself (else we write them as text)."""
    template = getattr(tokenizer, "chat_template", None)
    return isinstance(template, str) and "tool_calls" in template


def tools_system_text(tools: Sequence[dict]) -> str:
    """The tool schemas as a system prompt, in the Hermes / Qwen2.5 layout (for templates without tools)."""
    schemas = "\n".join(json.dumps(t, ensure_ascii=False) for t in tools)
    return (
        "# Tools\n\nYou may call one or more functions to help with the user's request. Their signatures "
        f"are inside <tools></tools>:\n<tools>\n{schemas}\n</tools>\n\nTo call a function, write a JSON "
        "object with its name and arguments inside <tool_call></tool_call> tags:\n<tool_call>\n"
        '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>'
    )


def arguments_object(arguments: Any) -> Any:
    """A call's arguments as an object when they are a JSON object string (HF templates `tojson` them)."""
    if isinstance(arguments, str):
        try:
            parsed = json.loads(arguments)
        except ValueError:
            return arguments
        return parsed if isinstance(parsed, dict) else arguments
    return arguments


def _template_message(message: dict, native_tools: bool) -> dict:
    out = {k: v for k, v in message.items() if k != "tool_calls"}
    out["content"] = message.get("content") or ""
    calls = message.get("tool_calls") or []
    if not calls:
        return out
    if native_tools:
        out["tool_calls"] = [
            {
                **c,
                "function": {"name": c["function"]["name"], "arguments": arguments_object(c["function"]["arguments"])},
            }
            for c in calls
        ]
        return out
    blocks = []
    for c in calls:
        args = arguments_object(c["function"]["arguments"])
        blocks.append(render_tool_call(c["function"]["name"], args if isinstance(args, dict) else {}))
    out["content"] = (out["content"] + "\n" if out["content"] else "") + "\n".join(blocks)
    return out


def render_chat_prompt(
    tokenizer: Any, messages: Sequence[dict], tools: Sequence[dict] = (), add_generation_prompt: bool = True
) -> str:
    """The prompt text for normalized `messages` (openai_requests.normalize_messages)."""
    if tokenizer is None:
        raise OpenAIRequestError("this server has no tokenizer: chat needs one (send token ids to /generate)")
    if not getattr(tokenizer, "chat_template", None):
        raise OpenAIRequestError("the model's tokenizer has no chat template: use /v1/completions with a prompt")
    native = template_renders_tool_calls(tokenizer)
    msgs = [_template_message(m, native) for m in messages]
    if tools and not native:
        preamble = tools_system_text(tools)
        if msgs and msgs[0]["role"] == "system":
            msgs[0] = {**msgs[0], "content": msgs[0]["content"] + "\n\n" + preamble}
        else:
            msgs.insert(0, {"role": "system", "content": preamble})
    try:
        return tokenizer.apply_chat_template(
            msgs,
            tools=list(tools) if (tools and native) else None,
            tokenize=False,
            add_generation_prompt=add_generation_prompt,
        )
    except Exception as err:  # a template that raises on these messages (jinja `raise_exception`)
        raise OpenAIRequestError(f"the model's chat template cannot render these messages: {err}", "messages") from None


def encode_text(tokenizer: Any, text: str) -> list[int]:
    """Token ids of prompt text (special tokens written in the text are recognised, none added)."""
    return list(tokenizer(text, add_special_tokens=False).input_ids)


# --------------------------------------------------------------------------- choices
def choice_text(tokenizer: Any, output_ids: Sequence[int], finish: str, stop: Sequence[str] = ()) -> str:
    """The text of a choice: special tokens dropped, cut before the stop string that ended it."""
    text = tokenizer.decode(list(output_ids), skip_special_tokens=True)
    if finish == "stop" and stop:
        cuts = [text.find(s) for s in stop if s in text]
        if cuts:
            text = text[: min(cuts)]
    return text


def split_tool_calls(text: str, parallel: bool = True) -> tuple[str | None, list[dict]]:
    """(content, tool_calls): well-formed `<tool_call>` blocks as OpenAI tool calls.

    Blocks that are not valid JSON with a name stay text (and there are then no calls), as
    vLLM's Hermes parser does: the caller sees what the model wrote."""
    calls = [c for c in parse_tool_calls(text) if c.error is None]
    if not calls:
        return text, []
    if not parallel:
        calls = calls[:1]
    content = text.split(TOOL_CALL_OPEN, 1)[0].strip() or None
    return content, [
        {
            "id": f"call_{uuid.uuid4().hex[:24]}",
            "type": "function",
            "function": {"name": c.name, "arguments": json.dumps(c.arguments)},
        }
        for c in calls
    ]


def finish_reason(engine_reason: str, has_tool_calls: bool) -> str:
    """OpenAI's finish_reason; "abort" (the server aborted the request) has no OpenAI name and stays."""
    if engine_reason == "stop" and has_tool_calls:
        return "tool_calls"
    return engine_reason


def usage_json(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


# --------------------------------------------------------------------------- log-probs
def _byte_decoder() -> dict[str, int]:
    """Byte-level BPE's printable stand-ins for bytes (GPT-2's table), inverted: char -> byte."""
    kept = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), 256))
    table, extra = {b: b for b in kept}, 0
    for b in range(256):
        if b not in table:
            table[b] = 256 + extra
            extra += 1
    return {chr(c): b for b, c in table.items()}


_BYTE_DECODER = _byte_decoder()


def _is_byte_level(tokenizer: Any) -> bool:
    decoder = getattr(getattr(tokenizer, "backend_tokenizer", None), "decoder", None)
    return type(decoder).__name__ == "ByteLevel"


def token_text_and_bytes(tokenizer: Any, token_id: int) -> tuple[str, list[int]]:
    """A token's text (special tokens kept) and its exact bytes (a byte-level BPE token may be half
    a UTF-8 character: its text is then a replacement character, its bytes are still right)."""
    text = tokenizer.decode([int(token_id)], skip_special_tokens=False)
    if _is_byte_level(tokenizer):
        piece = tokenizer.convert_ids_to_tokens(int(token_id))
        if isinstance(piece, str) and piece and all(ch in _BYTE_DECODER for ch in piece):
            return text, [_BYTE_DECODER[ch] for ch in piece]
    return text, list(text.encode("utf-8"))


def _finite(x: float) -> float:
    return x if math.isfinite(x) else -9999.0  # JSON has no -inf; OpenAI reports -9999.0 for impossible tokens


def token_logprobs(tokenizer: Any, choice: GeneratedChoice, start: int, end: int, top_n: int) -> list[dict]:
    """Tokens start..end of a choice as OpenAI log-prob entries {token, logprob, bytes, top_logprobs}
    (chat's `logprobs.content`, and the Responses API's `output_text.logprobs`)."""
    entries = []
    for j in range(start, end):
        text, raw = token_text_and_bytes(tokenizer, choice.output_ids[j])
        entry: dict[str, Any] = {
            "token": text,
            "logprob": _finite(choice.output_logprobs[j]),
            "bytes": raw,
            "top_logprobs": [],
        }
        if top_n and choice.top_logprobs is not None:
            for tid, lp in choice.top_logprobs[j][:top_n]:
                t_text, t_raw = token_text_and_bytes(tokenizer, tid)
                entry["top_logprobs"].append({"token": t_text, "logprob": _finite(lp), "bytes": t_raw})
        entries.append(entry)
    return entries


# --------------------------------------------------------------------------- chat responses
def chat_choice_json(tokenizer: Any, choice: GeneratedChoice, request: Any) -> dict[str, Any]:
    """One choice of a chat.completion (request: openai_requests.ChatRequest)."""
    text = choice_text(tokenizer, choice.output_ids, choice.finish_reason, request.stop)
    content, calls = split_tool_calls(text, request.parallel_tool_calls) if request.parse_tools else (text, [])
    message: dict[str, Any] = {"role": "assistant", "content": content, "refusal": None}
    if calls:
        message["tool_calls"] = calls
    out: dict[str, Any] = {
        "index": choice.index,
        "message": message,
        "logprobs": (
            {
                "content": token_logprobs(tokenizer, choice, 0, len(choice.output_ids), request.top_logprobs),
                "refusal": None,
            }
            if request.logprobs
            else None
        ),
        "finish_reason": finish_reason(choice.finish_reason, bool(calls)),
    }
    if request.return_token_ids:
        out["token_ids"] = list(choice.output_ids)
        out["token_versions"] = list(choice.output_versions)
    return out


def chat_completion_json(
    completion_id: str,
    created: int,
    model: str,
    choices: list[dict],
    prompt_ids: Sequence[int],
    completion_tokens: int,
    return_token_ids: bool,
) -> dict:
    body: dict[str, Any] = {
        "id": completion_id,
        "object": "chat.completion",
        "created": created,
        "model": model,
        "choices": choices,
        "usage": usage_json(len(prompt_ids), completion_tokens),
        "system_fingerprint": None,
        "service_tier": None,
    }
    if return_token_ids:
        body["prompt_token_ids"] = list(prompt_ids)
    return body


def text_deltas(tokenizer: Any, ids: Sequence[int], final_text: str) -> list[tuple[str, int, int]]:
    """(text, first token, end token) pieces whose texts join to exactly `final_text`.

    Cumulative decodes (one per token, or per few tokens for long outputs): a piece ends where
    the decoded prefix is a clean prefix of the final text (no half UTF-8 character)."""
    out: list[tuple[str, int, int]] = []
    emitted, start = "", 0
    step = max(1, math.ceil(len(ids) / 512))
    for end in range(step, len(ids) + 1, step):
        text = tokenizer.decode(list(ids[:end]), skip_special_tokens=True)[: len(final_text)]
        if len(text) > len(emitted) and not text.endswith("\ufffd") and final_text.startswith(text):
            out.append((text[len(emitted) :], start, end))
            emitted, start = text, end
    if len(emitted) < len(final_text) or start < len(ids):
        out.append((final_text[len(emitted) :], start, len(ids)))
    return out


class StreamedText:
    """A choice's text while it is being decoded: deltas that join to `choice_text`'s final text.

    Text that may still change is held back: a half UTF-8 character at the end, and a tail that
    could be the start of a stop string (the answer is cut before a stop string, so its first
    characters must not have been sent)."""

    def __init__(self, tokenizer: Any, stop: Sequence[str]) -> None:
        self.tokenizer, self.stop = tokenizer, list(stop)
        self.emitted, self.tokens = "", 0  # text sent, and the tokens it covers

    def delta(self, ids: Sequence[int]) -> tuple[str, int, int]:
        """(new text, first token, end token) for the tokens so far; "" while nothing is safe."""
        text = self.tokenizer.decode(list(ids), skip_special_tokens=True)
        safe = len(text.rstrip("\ufffd"))
        for s in self.stop:
            found = text.find(s)
            if found >= 0:
                safe = min(safe, found)
            for k in range(min(len(s) - 1, len(text)), 0, -1):
                if text.endswith(s[:k]):
                    safe = min(safe, len(text) - k)
                    break
        if safe <= len(self.emitted) or not text.startswith(self.emitted):
            return "", self.tokens, self.tokens
        out, start = text[len(self.emitted) : safe], self.tokens
        self.emitted, self.tokens = text[:safe], len(ids)
        return out, start, len(ids)

    def final(self, ids: Sequence[int], finish: str) -> tuple[str, int, int]:
        """The rest of the final text (cut before a stop string, as the unstreamed answer is)."""
        text = choice_text(self.tokenizer, ids, finish, self.stop)
        out = text[len(self.emitted) :] if text.startswith(self.emitted) else ""
        start, self.emitted, self.tokens = self.tokens, text, len(ids)
        return out, start, len(ids)


def chat_chunk(
    completion_id: str,
    created: int,
    model: str,
    request: Any,
    index: int,
    delta: dict,
    logprobs: Any = None,
    finish: str | None = None,
) -> dict:
    """One chat.completion.chunk with one choice."""
    body = {
        "id": completion_id,
        "object": "chat.completion.chunk",
        "created": created,
        "model": model,
        "system_fingerprint": None,
        "choices": [{"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish}],
    }
    if request.include_usage:
        body["usage"] = None
    return body


def usage_chunk(
    completion_id: str, kind: str, created: int, model: str, usage: dict[str, int], fingerprint: bool = True
) -> dict:
    """The last streamed object when usage is asked for (`stream_options.include_usage`): no choices."""
    body: dict[str, Any] = {"id": completion_id, "object": kind, "created": created, "model": model}
    if fingerprint:
        body["system_fingerprint"] = None
    return body | {"choices": [], "usage": usage}


def chat_content_logprobs(tokenizer: Any, choice: GeneratedChoice, start: int, end: int, request: Any) -> Any:
    return (
        {"content": token_logprobs(tokenizer, choice, start, end, request.top_logprobs), "refusal": None}
        if request.logprobs
        else None
    )


def completion_chunk(
    completion_id: str, created: int, model: str, index: int, text: str, logprobs: Any = None, finish: str | None = None
) -> dict:
    """One streamed text_completion object with one choice."""
    return {
        "id": completion_id,
        "object": "text_completion",
        "created": created,
        "model": model,
        "system_fingerprint": None,
        "choices": [{"index": index, "text": text, "logprobs": logprobs, "finish_reason": finish}],
    }


def completion_delta_logprobs(
    tokenizer: Any, choice: GeneratedChoice, start: int, end: int, request: Any, offset: int
) -> Any:
    return (
        _legacy_logprobs(tokenizer, choice, start, end, request.logprobs, offset)
        if request.logprobs is not None
        else None
    )


def chat_chunks(
    tokenizer: Any,
    completion_id: str,
    created: int,
    model: str,
    choices: list[GeneratedChoice],
    request: Any,
    prompt_tokens: int,
) -> list[dict]:
    """The chat.completion.chunk objects of a streamed answer (one role chunk, content deltas with
    their tokens' log-probs or one tool_calls delta, one finish chunk per choice; then usage)."""

    def chunk(index: int, delta: dict, logprobs: Any = None, finish: str | None = None) -> dict:
        return chat_chunk(completion_id, created, model, request, index, delta, logprobs, finish)

    out = []
    for c in choices:
        full = chat_choice_json(tokenizer, c, request)
        out.append(chunk(c.index, {"role": "assistant", "content": ""}))
        calls = full["message"].get("tool_calls")
        if calls:
            lp = full["logprobs"]
            out.append(
                chunk(
                    c.index,
                    {
                        "content": full["message"]["content"],
                        "tool_calls": [{"index": k, **call} for k, call in enumerate(calls)],
                    },
                    lp,
                )
            )
        else:
            for text, a, b in text_deltas(tokenizer, c.output_ids, full["message"]["content"] or ""):
                if not text and not request.logprobs:
                    continue  # an end-of-turn token: no text, and no log-prob asked for
                out.append(chunk(c.index, {"content": text}, chat_content_logprobs(tokenizer, c, a, b, request)))
        last = chunk(c.index, {}, None, full["finish_reason"])
        if request.return_token_ids:
            last["choices"][0]["token_ids"] = list(c.output_ids)
            last["choices"][0]["token_versions"] = list(c.output_versions)
        out.append(last)
    if request.include_usage:
        usage = usage_json(prompt_tokens, sum(len(c.output_ids) for c in choices))
        out.append(usage_chunk(completion_id, "chat.completion.chunk", created, model, usage))
    return out


# --------------------------------------------------------------------------- completions responses
def _legacy_logprobs(
    tokenizer: Any, choice: GeneratedChoice, start: int, end: int, top_n: int, offset: int
) -> dict[str, Any]:
    """The /v1/completions log-prob shape: tokens, token_logprobs, top_logprobs, text_offset."""
    entries = token_logprobs(tokenizer, choice, start, end, top_n)
    tokens = [e["token"] for e in entries]
    offsets, pos = [], offset
    for t in tokens:
        offsets.append(pos)
        pos += len(t)
    tops = None
    if choice.top_logprobs is not None:
        tops = []
        for e in entries:
            alts = {a["token"]: a["logprob"] for a in e["top_logprobs"]}
            alts.setdefault(e["token"], e["logprob"])  # the sampled token is always listed (as OpenAI does)
            tops.append(alts)
    return {
        "tokens": tokens,
        "token_logprobs": [e["logprob"] for e in entries],
        "top_logprobs": tops,
        "text_offset": offsets,
    }


@dataclass
class PromptScores:
    """A prompt echoed back (`echo`): its ids, each token's log-prob given those before it
    (None for the first) and, when asked, the most likely ids at each position ([] first)."""

    ids: list[int]
    logprobs: list[float | None] | None = None
    top: list[list[tuple[int, float]]] | None = None


def _echoed_logprobs(tokenizer: Any, prompt: PromptScores, top_n: int) -> dict[str, Any]:
    """The legacy log-prob lists for the prompt's tokens: the first token's entries are null."""
    assert prompt.logprobs is not None  # scored when log-probs were asked for
    tokens: list[str] = []
    offsets: list[int] = []
    tops: list[dict[str, float] | None] = []
    pos = 0
    for j, tid in enumerate(prompt.ids):
        text, _ = token_text_and_bytes(tokenizer, tid)
        tokens.append(text)
        offsets.append(pos)
        pos += len(text)
        if j == 0:
            tops.append(None)
            continue
        alts: dict[str, float] = {}
        for alt, lp in (prompt.top[j] if prompt.top is not None else [])[:top_n]:
            alts.setdefault(token_text_and_bytes(tokenizer, alt)[0], _finite(lp))
        own = prompt.logprobs[j]
        alts.setdefault(text, _finite(own if own is not None else -math.inf))  # the prompt's own token, always listed
        tops.append(alts)
    lps = [None if lp is None else _finite(lp) for lp in prompt.logprobs]
    return {"tokens": tokens, "token_logprobs": lps, "top_logprobs": tops, "text_offset": offsets}


def completion_choice_json(
    tokenizer: Any, choice: GeneratedChoice, request: Any, prompt: PromptScores | None = None
) -> dict[str, Any]:
    """One choice of a text_completion (request: openai_requests.CompletionRequest). With
    `prompt` (echo) the text and the log-prob lists start with the prompt's."""
    text = choice_text(tokenizer, choice.output_ids, choice.finish_reason, request.stop)
    prefix = tokenizer.decode(prompt.ids, skip_special_tokens=False) if prompt is not None else ""
    logprobs = None
    if request.logprobs is not None:
        logprobs = _legacy_logprobs(tokenizer, choice, 0, len(choice.output_ids), request.logprobs, len(prefix))
        if prompt is not None:
            head = _echoed_logprobs(tokenizer, prompt, request.logprobs)
            logprobs = {k: head[k] + (logprobs[k] or [None] * len(choice.output_ids)) for k in head}
    out: dict[str, Any] = {
        "index": choice.index,
        "text": prefix + text,
        "logprobs": logprobs,
        "finish_reason": choice.finish_reason,
    }
    if request.return_token_ids:
        out["token_ids"] = list(choice.output_ids)
        out["token_versions"] = list(choice.output_versions)
    return out


def completion_json(
    completion_id: str, created: int, model: str, choices: list[dict], prompt_tokens: int, completion_tokens: int
) -> dict[str, Any]:
    return {
        "id": completion_id,
        "object": "text_completion",
        "created": created,
        "model": model,
        "choices": choices,
        "usage": usage_json(prompt_tokens, completion_tokens),
        "system_fingerprint": None,
    }


def completion_chunks(
    tokenizer: Any,
    completion_id: str,
    created: int,
    model: str,
    choices: list[GeneratedChoice],
    request: Any,
    prompt_tokens: int,
) -> list[dict]:
    """The streamed text_completion objects: text deltas, then a finish chunk per choice; then usage."""

    def chunk(index: int, text: str, logprobs: Any = None, finish: str | None = None) -> dict:
        return completion_chunk(completion_id, created, model, index, text, logprobs, finish)

    out = []
    for c in choices:
        final = choice_text(tokenizer, c.output_ids, c.finish_reason, request.stop)
        offset = 0
        for text, a, b in text_deltas(tokenizer, c.output_ids, final):
            out.append(chunk(c.index, text, completion_delta_logprobs(tokenizer, c, a, b, request, offset)))
            offset += len(text)
        out.append(chunk(c.index, "", None, c.finish_reason))
    if request.include_usage:
        usage = usage_json(prompt_tokens, sum(len(c.output_ids) for c in choices))
        out.append(usage_chunk(completion_id, "text_completion", created, model, usage, fingerprint=False))
    return out
