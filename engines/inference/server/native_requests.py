"""SGLang-native request bodies (`/generate`, the weight, pause and abort endpoints) checked
into what the engine takes, and its finish reasons into SGLang's JSON.

Pure: no aiohttp, no engine. A bad field is a `BadRequest` naming it, which the server turns
into a 400 in SGLang's error shape (http_server.py); the OpenAI routes reuse `BadRequest`.
"""

from __future__ import annotations

import uuid
from typing import Any, TypeGuard

# SGLang sampling_params fields we honour; any other field is rejected (silently ignoring a
# sampling knob would give the user a different distribution than the one they asked for).
SAMPLING_FIELDS = {
    "max_new_tokens",
    "temperature",
    "top_p",
    "top_k",
    "stop",
    "stop_token_ids",
    "ignore_eos",
    "sampling_seed",
    "seed",
    "greedy",
    "skip_special_tokens",
    "no_stop_trim",
    "json_schema",
    "grammar",  # constrained decoding: SGLang's JSON Schema string; our Lark grammar
    "frequency_penalty",
    "presence_penalty",
    "repetition_penalty",  # engines/inference/penalties.py
}
# `trace` (ours): the request's group, episode and turn for its trace spans (request_tags.py)
GENERATE_FIELDS = {"input_ids", "sampling_params", "return_logprob", "rid", "stream", "logprob_start_len", "trace"}
ABORT_FIELDS = {"rid", "abort_all"}
UPDATE_FIELDS = {"model_path", "load_format", "weight_version", "abort_all_requests", "flush_cache"}
PAUSE_FIELDS = {"mode"}
PAUSE_MODES = ("abort", "retract", "in_place")
CONTINUE_FIELDS = {"torch_empty_cache"}


class BadRequest(ValueError):
    """A request the server refuses with 400, naming what was wrong."""


def is_int(x: Any) -> TypeGuard[int]:
    return isinstance(x, int) and not isinstance(x, bool)


def is_number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def parse_sampling_params(raw: Any, prompt_len: int, max_context: int | None):
    """Turn SGLang `sampling_params` JSON into the engine's SamplingParams, or raise BadRequest.

    SGLang means greedy by `temperature == 0`; we map that to `greedy=True`.
    """
    from areal_graph.engines.inference.sampling import SamplingParams

    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise BadRequest(f"sampling_params must be an object, got {type(raw).__name__}")
    unknown = sorted(set(raw) - SAMPLING_FIELDS)
    if unknown:
        raise BadRequest(f"sampling_params has unknown field(s) {unknown}; supported: {sorted(SAMPLING_FIELDS)}")
    kw: dict[str, Any] = {}
    if "max_new_tokens" in raw:
        v = raw["max_new_tokens"]
        if not is_int(v) or v < 0:
            raise BadRequest(f"sampling_params.max_new_tokens must be an integer >= 0, got {v!r}")
        kw["max_new_tokens"] = v
    if "temperature" in raw:
        v = raw["temperature"]
        if not is_number(v) or v < 0:
            raise BadRequest(f"sampling_params.temperature must be a number >= 0, got {v!r}")
        if v == 0:
            kw["greedy"] = True
        else:
            kw["temperature"] = float(v)
    if "top_p" in raw:
        v = raw["top_p"]
        if not is_number(v) or not 0 < v <= 1:
            raise BadRequest(f"sampling_params.top_p must be a number in (0, 1], got {v!r}")
        kw["top_p"] = float(v)
    if "top_k" in raw:
        v = raw["top_k"]
        if not is_int(v) or (v < 1 and v != -1):
            raise BadRequest(f"sampling_params.top_k must be -1 (off) or an integer >= 1, got {v!r}")
        kw["top_k"] = v
    if "stop_token_ids" in raw and raw["stop_token_ids"] is not None:
        v = raw["stop_token_ids"]
        if not isinstance(v, list) or not all(is_int(t) for t in v):
            raise BadRequest(f"sampling_params.stop_token_ids must be a list of integers, got {v!r}")
        kw["stop_token_ids"] = list(v)
    if "stop" in raw and raw["stop"] is not None:
        v = raw["stop"]
        if isinstance(v, str):
            v = [v]
        if not isinstance(v, list) or not all(isinstance(s, str) for s in v):
            raise BadRequest(f"sampling_params.stop must be a string or a list of strings, got {v!r}")
        kw["stop"] = list(v)
    if "ignore_eos" in raw:
        if not isinstance(raw["ignore_eos"], bool):
            raise BadRequest(f"sampling_params.ignore_eos must be a boolean, got {raw['ignore_eos']!r}")
        kw["ignore_eos"] = raw["ignore_eos"]
    if "greedy" in raw:
        if not isinstance(raw["greedy"], bool):
            raise BadRequest(f"sampling_params.greedy must be a boolean, got {raw['greedy']!r}")
        kw["greedy"] = raw["greedy"] or kw.get("greedy", False)
    for key in ("sampling_seed", "seed"):
        if key in raw and raw[key] is not None:
            if not is_int(raw[key]):
                raise BadRequest(f"sampling_params.{key} must be an integer, got {raw[key]!r}")
            kw["seed"] = raw[key]
    for key in ("frequency_penalty", "presence_penalty", "repetition_penalty"):
        if raw.get(key) is not None:
            if not is_number(raw[key]):
                raise BadRequest(f"sampling_params.{key} must be a number, got {raw[key]!r}")
            kw[key] = float(raw[key])
    for key in ("json_schema", "grammar"):
        if raw.get(key) is not None:
            if not isinstance(raw[key], str):
                raise BadRequest(f"sampling_params.{key} must be a string, got {type(raw[key]).__name__}")
            kw[key] = raw[key]
    params = SamplingParams(**kw)
    problems = params.problems() if hasattr(params, "problems") else []
    if problems:
        raise BadRequest("sampling_params: " + "; ".join(problems))
    if max_context is not None and prompt_len + params.max_new_tokens > max_context:
        raise BadRequest(
            f"prompt ({prompt_len} tokens) + sampling_params.max_new_tokens ({params.max_new_tokens}) "
            f"exceeds the model context of {max_context} tokens"
        )
    return params


def parse_generate_request(body: Any, max_context: int | None) -> tuple[list[int], Any, bool, str]:
    """Validate a /generate body; return (input_ids, SamplingParams, return_logprob, rid)."""
    if not isinstance(body, dict):
        raise BadRequest("the request body must be a JSON object")
    if "text" in body:
        raise BadRequest("this server takes token ids: send 'input_ids' instead of 'text'")
    unknown = sorted(set(body) - GENERATE_FIELDS)
    if unknown:
        raise BadRequest(f"unknown field(s) {unknown}; supported: {sorted(GENERATE_FIELDS)}")
    ids = body.get("input_ids")
    if ids is None:
        raise BadRequest("missing 'input_ids' (a non-empty list of token ids)")
    if not isinstance(ids, list) or not all(is_int(t) for t in ids):
        raise BadRequest("'input_ids' must be a flat list of integers (batched requests are not supported)")
    if not ids:
        raise BadRequest("'input_ids' is empty: a prompt needs at least one token")
    if not isinstance(body.get("stream", False), bool):
        raise BadRequest(f"'stream' must be a boolean, got {body.get('stream')!r}")
    ret_lp = body.get("return_logprob", False)
    if not isinstance(ret_lp, bool):
        raise BadRequest(f"'return_logprob' must be a boolean, got {ret_lp!r}")
    rid = body.get("rid")
    if rid is None:
        rid = uuid.uuid4().hex
    elif not isinstance(rid, str) or not rid:
        raise BadRequest(f"'rid' must be a non-empty string, got {rid!r}")
    params = parse_sampling_params(body.get("sampling_params"), len(ids), max_context)
    return ids, params, ret_lp, rid


def parse_logprob_start_len(body: dict, prompt_len: int) -> int | None:
    """SGLang's `logprob_start_len`: with `return_logprob`, the prompt position from which
    `input_token_logprobs` are returned (-1, the default: none). SGLang refuses a start at or
    past the prompt's end, and so do we, naming the field."""
    start = body.get("logprob_start_len", -1)
    if not is_int(start) or start < -1:
        raise BadRequest(f"'logprob_start_len' must be an integer >= -1, got {start!r}")
    if start >= prompt_len:
        raise BadRequest(f"'logprob_start_len' ({start}) must be less than the prompt's {prompt_len} tokens")
    return start if start >= 0 and body.get("return_logprob") is True else None


def finish_reason_json(reason: str, num_output: int, last_token: int | None) -> dict[str, Any]:
    """SGLang's finish_reason objects: {"type": "stop"|"length"|"abort", ...}."""
    if reason == "stop":
        return {"type": "stop", "matched": last_token}
    if reason == "length":
        return {"type": "length", "length": num_output}
    return {"type": "abort", "message": "request aborted"}
