"""The field checks chat and the Responses API share (engines/openai/fields.py): one rule, the
field named as the caller spelled it (chat's nested tools and response_format, Responses' flat ones)."""

from __future__ import annotations

import pytest

from areal_graph.engines.openai.fields import (
    OpenAIRequestError,
    as_object,
    function_tools,
    optional_int,
    parts_text,
    response_format,
)


@pytest.mark.parametrize(
    "tools, flat, param",
    [
        ([{"type": "web_search"}], False, "tools[0]"),
        ([{"type": "web_search"}], True, "tools[0]"),
        ([{"type": "function", "function": {}}], False, "tools[0].function"),
        ([{"type": "function"}], True, "tools[0].name"),
        ([{"type": "function", "function": {"name": "f", "parameters": []}}], False, "tools[0].function.parameters"),
        ([{"type": "function", "name": "f", "strict": "yes"}], True, "tools[0].strict"),
        ([{"type": "function", "name": "f"}, {"type": "function", "name": "f"}], True, "tools"),
        ("f", True, "tools"),
    ],
)
def test_function_tools_name_the_field_as_spelled(tools, flat, param):
    with pytest.raises(OpenAIRequestError) as err:
        function_tools(tools, flat=flat)
    assert err.value.param == param, err.value.message


def test_the_two_spellings_of_a_json_schema_format_become_one():
    schema = {"type": "object"}
    chat = response_format({"type": "json_schema", "json_schema": {"name": "a", "schema": schema, "strict": True}})
    flat = response_format({"type": "json_schema", "name": "a", "schema": schema, "strict": True}, "text.format", True)
    assert chat == flat == {"type": "json_schema", "json_schema": {"name": "a", "schema": schema, "strict": True}}
    assert response_format({"type": "text"}, "text.format", True) is None
    with pytest.raises(OpenAIRequestError) as err:
        response_format({"type": "json_schema", "name": "x"}, "text.format", True)
    assert err.value.param == "text.format.schema"


def test_integers_are_not_booleans_and_content_is_text_only():
    assert optional_int({"n": 3}, "n", 1, 16) == 3 and optional_int({}, "n", 1, 16) is None
    with pytest.raises(OpenAIRequestError, match="'n' must be an integer"):
        optional_int({"n": True}, "n", 1, 16)
    assert parts_text([{"type": "text", "text": "a"}, {"type": "text", "text": "b"}], "c", ("text",), (), "") == "ab"
    with pytest.raises(OpenAIRequestError, match="text-only") as err:
        parts_text([{"type": "input_image"}], "input[0].content", ("input_text",), ("input_image",), "")
    assert err.value.param == "input[0].content[0]"
    with pytest.raises(OpenAIRequestError) as err:
        as_object("hi", "messages[2]")
    assert err.value.param == "messages[2]"
