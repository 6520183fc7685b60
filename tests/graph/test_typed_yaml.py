"""graph/typed_yaml.py on its own: `Validator` turns plain YAML values into any dataclass and
reports every value that does not fit, naming file, line, node and field (and the override
that set it); `type_name` and `described` phrase what was expected and what was given.

The loader tests run it on workflow files; these use small dataclasses made for the purpose,
so each conversion rule (int vs bool, float from '2e-5', Literal, fixed tuples, nested
dataclasses, checks, moved fields) is checked in isolation, with its exact message."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, Optional

import pytest

from areal_graph.api.fields import cfg, positive
from areal_graph.graph.typed_yaml import BadValue, Validator, described, type_name


@dataclass(frozen=True)
class Inner:
    rate: float = cfg(0.5, positive)
    mode: Literal["a", "b"] = cfg("a")


@dataclass(frozen=True)
class Outer:
    name: str
    count: int = cfg(1, positive)
    flag: bool = cfg(False)
    pair: tuple[int, int] = cfg((0, 0))
    items: list[str] = cfg([])
    opts: dict = cfg({})
    inner: Inner = field(default_factory=Inner, metadata={"check": None})
    maybe: int | None = cfg(None)
    either: int | str = cfg(0)
    anything: Any = cfg(None)


def _v(lines=None, origins=None, moved=None) -> Validator:
    return Validator("wf.yaml", lines or {}, origins or {}, moved)


def test_good_values_build_the_dataclass_with_defaults_for_the_rest():
    v = _v()
    got = v.build(
        Outer,
        {
            "name": "x",
            "count": 3,
            "pair": [1, 2],
            "items": ["p", "q"],
            "inner": {"rate": "2e-5"},
            "maybe": None,
            "either": "text",
            "anything": {"k": [1]},
            "opts": {"z": 1},
        },
        ("top",),
    )
    assert v.problems == []
    assert got == Outer(
        name="x",
        count=3,
        pair=(1, 2),
        items=["p", "q"],
        inner=Inner(rate=2e-5),
        maybe=None,
        either="text",
        anything={"k": [1]},
        opts={"z": 1},
    )
    assert isinstance(got.pair, tuple) and isinstance(got.inner.rate, float)


def test_inject_supplies_fields_the_mapping_may_not_set_and_also_allowed_keys_pass():
    v = _v()
    got = v.build(Outer, {"count": 2, "kind": "ignored"}, ("nodes", "n"), inject={"name": "n"}, also_allowed=("kind",))
    assert v.problems == [] and got.name == "n" and got.count == 2
    # an injected field is not settable from the mapping: it is unknown there
    assert _v().build(Outer, {"name": "y"}, ("nodes", "n"), inject={"name": "n"}) is None


@pytest.mark.parametrize(
    "key,value,message",
    [
        ("count", True, "expected an integer, got a boolean True"),
        ("count", 2.0, "expected an integer, got a number 2.0"),
        ("count", "3", "expected an integer, got a string '3'"),
        ("count", 0, "must be > 0, got 0"),
        ("flag", "yes", "expected true/false, got a string 'yes'"),
        ("name", 42, "expected a string, got an integer 42"),
        ("pair", [1, 2, 3], "expected a list of 2 items, got 3"),
        ("pair", [1, "x"], "item 1: expected an integer, got a string 'x'"),
        ("pair", 5, "expected a list, got an integer 5"),
        ("items", "p", "expected a list, got a string 'p'"),
        ("opts", [1], "expected a mapping, got a list [1]"),
        ("inner", 3, "expected a mapping of Inner fields, got an integer 3"),
        ("maybe", "none", "expected an integer, got a string 'none'"),
    ],
)
def test_each_bad_value_is_one_problem_naming_its_field(key, value, message):
    v = _v()
    assert v.build(Outer, {"name": "x", key: value}, ("top",)) is None
    [p] = v.problems
    assert (p.file, p.node, p.field, p.message) == ("wf.yaml", None, f"top.{key}", message)


def test_a_literal_mismatch_lists_the_choices_and_suggests_one():
    v = _v()
    v.build(Outer, {"name": "x", "inner": {"mode": "bb"}}, ("nodes", "n"))
    [p] = v.problems
    assert (p.node, p.field) == ("n", "inner.mode")
    assert p.message == "must be one of 'a', 'b', got a string 'bb' (did you mean 'b'?)"


def test_every_problem_is_reported_not_only_the_first():
    v = _v()
    assert v.build(Outer, {"count": -1, "flag": 1, "colour": "red", "inner": {"rate": 0, "rat": 1}}, ()) is None
    got = sorted((p.field, p.message.split(";")[0]) for p in v.problems)
    assert got == [
        ("colour", "unknown field 'colour'"),
        ("count", "must be > 0, got -1"),
        ("flag", "expected true/false, got an integer 1"),
        ("inner.rat", "unknown field 'rat' (did you mean 'rate'?)"),
        ("inner.rate", "must be > 0, got 0.0"),
        ("name", "missing required field 'name'"),
    ]
    unknown = next(p for p in v.problems if p.field == "colour").message
    assert unknown.endswith("allowed: name, count, flag, pair, items, opts, inner, maybe, either, anything")


def test_lines_come_from_the_nearest_recorded_path_and_overrides_are_named():
    lines = {("nodes",): 3, ("nodes", "n"): 4, ("nodes", "n", "inner"): 9}
    origins = {("nodes", "n", "inner"): "nodes.n.inner.rate=-1"}
    v = _v(lines, origins)
    v.build(Outer, {"name": "x", "count": 0, "inner": {"rate": -1.0}}, ("nodes", "n"))
    by_field = {p.field: p for p in v.problems}
    assert by_field["count"].line == 4  # no line of its own: its node's
    assert by_field["inner.rate"].line == 9
    assert by_field["inner.rate"].message == "must be > 0, got -1.0 (set by override 'nodes.n.inner.rate=-1')"
    assert "override" not in by_field["count"].message
    assert v.line(("elsewhere", "x")) is None
    assert _v({(): 1}).line(("a", "b")) == 1  # the empty path is the document itself


def test_a_moved_field_says_where_it_went_instead_of_unknown():
    v = _v(moved={("top", "count_old"): "now `count` (write count: N)"})
    assert v.build(Outer, {"name": "x", "count_old": 3}, ("top",)) is None
    [p] = v.problems
    assert p.field == "top.count_old"
    assert p.message == "moved: now `count` (write count: N)"


def test_convert_on_its_own():
    v = _v()
    assert v.convert(float, 3, ()) == 3.0 and isinstance(v.convert(float, 3, ()), float)
    assert v.convert(float, "1e3", ()) == 1000.0
    assert v.convert(tuple[int, ...], [1, 2, 3], ()) == (1, 2, 3)
    assert v.convert(list, [1, "a"], ()) == [1, "a"]
    assert v.convert(Optional[str], None, ()) is None  # noqa: UP045 - the older spelling is read too
    assert v.convert(int | str, 2.5, ()) == 2.5  # a union of several types is passed through unchecked
    with pytest.raises(BadValue, match="expected a number, got a string 'fast'"):
        v.convert(float, "fast", ())
    with pytest.raises(BadValue, match="expected a number, got a boolean False"):
        v.convert(float, False, ())
    with pytest.raises(BadValue, match="item 0: item 1: expected an integer"):
        v.convert(list[list[int]], [[1, None]], ())


@pytest.mark.parametrize(
    "tp,name",
    [
        (int, "an integer"),
        (float, "a number"),
        (str, "a string"),
        (bool, "true/false"),
        (list[int], "a list"),
        (tuple[float, float], "a list"),
        (dict, "a mapping"),
        (dict[str, int], "a mapping"),
        (Inner, "a mapping"),
        (Literal["x", 1], "one of 'x', 1"),
        (Optional[int], "an integer or null"),  # noqa: UP045 - the older spelling is read too
        (int | str, "an integer or a string"),
        (Optional[Literal["a"]], "one of 'a' or null"),  # noqa: UP045
    ],
)
def test_type_name_phrases_what_is_expected(tp, name):
    assert type_name(tp) == name


@pytest.mark.parametrize(
    "value,text",
    [
        (True, "a boolean True"),
        (3, "an integer 3"),
        (2.5, "a number 2.5"),
        ("s", "a string 's'"),
        ([1, 2], "a list [1, 2]"),
        ({"a": 1}, "a mapping {'a': 1}"),
        (list(range(30)), "a list"),  # long containers are not printed
        ("x" * 60, "a string '" + "x" * 60 + "'"),  # strings always are
        (object, "type <class 'object'>"),
    ],
)
def test_described_phrases_what_was_given(value, text):
    assert described(value) == text


def test_null_is_described_as_null():
    assert described(None) == "null"
