"""The checks of single request fields that the chat and Responses parsers share.

Why a module of its own: `/v1/responses` (`responses_requests.py`) takes the same sampling
numbers, function tools and output formats as `/v1/chat/completions` (`chat_requests.py`), only
spelled differently in places (flat tools, `text.format`). One check per field keeps the two
refusing for the same reasons with the same words; each error names the field as the caller
spelled it. Pure: no aiohttp, no torch, no `openai`.
"""

from __future__ import annotations

import json
from typing import Any

__all__ = [
    "OpenAIRequestError",
    "is_int",
    "is_number",
    "int_field",
    "optional_int",
    "bool_field",
    "refuse_unknown",
    "function_tools",
    "response_format",
    "as_object",
    "parts_text",
]


class OpenAIRequestError(ValueError):
    """A request refused with an OpenAI-shaped error: {"error": {message, type, param, code}}."""

    def __init__(
        self,
        message: str,
        param: str | None = None,
        status: int = 400,
        kind: str = "invalid_request_error",
        code: str | None = None,
    ) -> None:
        super().__init__(message)
        self.message, self.param, self.status, self.kind, self.code = message, param, status, kind, code

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}}


# --------------------------------------------------------------------------- scalars
def is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def is_number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def int_field(body: dict, key: str, lo: int, hi: int | None, default: int) -> int:
    value = optional_int(body, key, lo, hi)
    return default if value is None else value


def optional_int(body: dict, key: str, lo: int, hi: int | None) -> int | None:
    value = body.get(key)
    if value is None:
        return None
    if not is_int(value) or value < lo or (hi is not None and value > hi):
        bound = f"[{lo}, {hi}]" if hi is not None else f">= {lo}"
        raise OpenAIRequestError(f"'{key}' must be an integer {bound}, got {value!r}", key)
    return value


def bool_field(body: dict, key: str, default: bool = False) -> bool:
    value = body.get(key)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise OpenAIRequestError(f"'{key}' must be a boolean, got {value!r}", key)
    return value


def refuse_unknown(body: dict, allowed: set[str], endpoint: str, note: str = "") -> None:
    """A 400 naming the first field `endpoint` does not take (`note`: what the list leaves unsaid)."""
    unknown = sorted(set(body) - allowed)
    if unknown:
        raise OpenAIRequestError(
            f"unsupported parameter(s) {unknown} for {endpoint}; this server takes {sorted(allowed)}{note}",
            unknown[0],
        )


# --------------------------------------------------------------------------- tools and formats
def function_tools(tools: Any, flat: bool = False) -> list[dict[str, Any]]:
    """`tools`, each a function tool: chat's {"type": "function", "function": {"name", "parameters"?,
    "strict"?}}, or (`flat`) the Responses API's {"type": "function", "name", "parameters"?, "strict"?}.
    Returned as given; the names must be unique."""
    if tools is None:
        return []
    if not isinstance(tools, list):
        raise OpenAIRequestError("'tools' must be a list", "tools")
    for k, tool in enumerate(tools):
        kind = tool.get("type") if isinstance(tool, dict) else type(tool).__name__
        if not isinstance(tool, dict) or kind != "function":
            hosted = " (this server runs no hosted tools)" if flat else ""
            raise OpenAIRequestError(
                f"tools[{k}]: only tools of type 'function' are supported{hosted}, got {kind!r}", f"tools[{k}]"
            )
        fn, where = (tool, f"tools[{k}]") if flat else (tool.get("function"), f"tools[{k}].function")
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not fn["name"]:
            raise OpenAIRequestError(f"{where} needs a 'name'", f"{where}.name" if flat else where)
        if fn.get("parameters") is not None and not isinstance(fn["parameters"], dict):
            raise OpenAIRequestError(f"{where}.parameters must be a JSON Schema object", f"{where}.parameters")
        if not isinstance(fn.get("strict", False), (bool, type(None))):
            raise OpenAIRequestError(f"{where}.strict must be a boolean", f"{where}.strict")
    names = [t["name"] if flat else t["function"]["name"] for t in tools]
    if len(set(names)) != len(names):
        raise OpenAIRequestError(f"tools: function names must be unique, got {names}", "tools")
    return tools


def response_format(value: Any, where: str = "response_format", flat: bool = False) -> dict[str, Any] | None:
    """None (text), {"type": "json_object"} or {"type": "json_schema", "json_schema": {...}}, from
    chat's `response_format` or (`flat`, where="text.format") the Responses API's `text.format`,
    whose json_schema fields (name, schema, strict) stand beside its type."""
    if value is None:
        return None
    kind = value.get("type") if isinstance(value, dict) else None
    if kind == "text":
        return None
    if kind == "json_object":
        return {"type": "json_object"}
    if kind == "json_schema" and flat:
        schema = value.get("schema")
        if not isinstance(schema, dict):
            raise OpenAIRequestError(f"{where}.schema must be a JSON Schema object", f"{where}.schema")
        spec = {"name": value.get("name") or "response", "schema": schema, "strict": bool(value.get("strict"))}
        return {"type": "json_schema", "json_schema": spec}
    if kind == "json_schema":
        spec = value.get("json_schema")
        if not isinstance(spec, dict):
            raise OpenAIRequestError(f"{where}.json_schema must be an object with a 'schema'", f"{where}.json_schema")
        schema = spec.get("schema", {})
        if not isinstance(schema, (dict, bool)):
            raise OpenAIRequestError(
                f"{where}.json_schema.schema must be a JSON Schema object", f"{where}.json_schema.schema"
            )
        return {"type": "json_schema", "json_schema": {**spec, "schema": schema}}
    raise OpenAIRequestError(f"{where} type must be 'text', 'json_object' or 'json_schema', got {kind!r}", where)


# --------------------------------------------------------------------------- messages and their content
def as_object(value: Any, where: str) -> dict[str, Any]:
    """A message or input item as a dict: pydantic models (what an agent passes back) dumped."""
    if hasattr(value, "model_dump"):
        value = value.model_dump(exclude_none=True)
    if not isinstance(value, dict):
        raise OpenAIRequestError(f"{where} must be an object, got {type(value).__name__}", where)
    return value


def parts_text(content: Any, where: str, text_kinds: tuple[str, ...], media_kinds: tuple[str, ...], shape: str) -> str:
    """A list of content parts as its text: parts of `text_kinds` (a refusal part: its refusal)
    joined; `media_kinds` refused (the served models read text only); anything else refused,
    naming the `shape` a text part has."""
    if not isinstance(content, list):
        raise OpenAIRequestError(f"{where} must be a string or a list of content parts", where)
    texts = []
    for k, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        text = part.get("refusal" if kind == "refusal" else "text") if kind in text_kinds else None
        if isinstance(text, str):
            texts.append(text)
        elif kind in media_kinds:
            raise OpenAIRequestError(
                f"{where}[{k}]: content of type {kind!r} is not supported: this server serves a text-only model",
                f"{where}[{k}]",
            )
        else:
            raise OpenAIRequestError(
                f"{where}[{k}] must be {shape}, got {json.dumps(part, default=str)[:80]}", f"{where}[{k}]"
            )
    return "".join(texts)
