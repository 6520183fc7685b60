"""graph/kinds/registry.py: a `kind:` resolves to the built-in entry or to a module-level `NodeKind`
named `package.module:NAME`, and anything else is an `UnknownKind` a YAML author can act on.

The loader tests meet the registry only through a misspelt kind in a fixture; here every
branch of `resolve_kind` is called directly (user kinds from tests/support/fake_kinds.py)."""

from __future__ import annotations

import re
from types import SimpleNamespace

import pytest

from areal_graph.graph import kinds
from areal_graph.graph.kind import NodeKind
from areal_graph.graph.kinds.registry import BUILTIN_KINDS, UnknownKind, kind_of, resolve_kind
from support import fake_kinds


@pytest.mark.parametrize("name", sorted(BUILTIN_KINDS))
def test_builtin_names_resolve_to_their_entries(name):
    kind = resolve_kind(name)
    assert kind is BUILTIN_KINDS[name] and kind.name == name


def test_every_family_entry_is_in_the_table_once():
    """graph/kinds/__init__.py fills the table from the family modules; an entry defined in a
    family and missing from it would be a kind no workflow can name."""
    entries = [
        getattr(module, name)
        for module in (kinds.rollout, kinds.rewards, kinds.model, kinds.functions)
        for name in dir(module)
        if isinstance(getattr(module, name), NodeKind)
    ]
    assert sorted(k.name for k in entries) == sorted(BUILTIN_KINDS)
    assert all(BUILTIN_KINDS[k.name] is k for k in entries)


def test_a_user_kind_is_the_module_level_node_kind_its_path_names():
    assert resolve_kind("support.fake_kinds:ROLLOUT") is fake_kinds.ROLLOUT
    assert resolve_kind("support.fake_kinds:TRAIN") is fake_kinds.TRAIN
    assert isinstance(resolve_kind("support.fake_kinds:SLOW"), NodeKind)


def test_kind_of_reads_a_nodes_kind_attribute():
    assert kind_of(SimpleNamespace(kind="advantage")) is BUILTIN_KINDS["advantage"]
    assert kind_of(SimpleNamespace(kind="support.fake_kinds:SLOW")) is fake_kinds.SLOW
    with pytest.raises(AttributeError):
        kind_of(object())


def test_an_unknown_plain_name_lists_the_known_kinds_and_suggests_the_closest():
    with pytest.raises(UnknownKind) as info:
        resolve_kind("rewrad")
    msg = str(info.value)
    assert msg.startswith("unknown node kind 'rewrad' (did you mean 'reward'?); known kinds: ")
    assert ", ".join(BUILTIN_KINDS) in msg and "'package.module:NAME'" in msg
    assert isinstance(info.value, ValueError)  # callers may catch it as a ValueError


@pytest.mark.parametrize("name", [None, 3, ["rollout"], ""])
def test_a_kind_that_is_not_a_string_is_unknown(name):
    with pytest.raises(UnknownKind, match=re.escape(f"unknown node kind {name!r}")):
        resolve_kind(name)


@pytest.mark.parametrize(
    "path,words",
    [
        ("support.no_such_module:KIND", "no module named 'support.no_such_module'"),
        ("support.fake_kinds:NOPE", "'support.fake_kinds' has no attribute 'NOPE'"),
        (":ROLLOUT", "must look like 'package.module:Name'"),
        ("support.fake_kinds:", "must look like 'package.module:Name'"),
    ],
)
def test_an_import_path_that_does_not_import_is_unknown_with_the_reason(path, words):
    with pytest.raises(UnknownKind, match="node kind") as info:
        resolve_kind(path)
    assert words in str(info.value)
    assert info.value.__cause__ is None and info.value.__suppress_context__  # no chained traceback for the user


@pytest.mark.parametrize(
    "path,type_name",
    [
        ("support.fake_kinds:HOSTS", "dict"),
        ("support.fake_kinds:parity_reward", "function"),
        ("support.fake_kinds:FakeTrainHost", "type"),
    ],
)
def test_an_import_path_to_something_else_than_a_node_kind_is_refused(path, type_name):
    with pytest.raises(UnknownKind) as info:
        resolve_kind(path)
    assert str(info.value) == (f"node kind {path!r} is a {type_name}, not an areal_graph.graph.kind.NodeKind")
