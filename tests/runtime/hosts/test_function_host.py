"""runtime/hosts/function_host.py in process: `FunctionHost` imports the node's function, fills
in `out_key` from the node's single declared write when the function takes one, and `run`
calls `fn(batch, **args)`; `accepts` decides what "takes one" means.

The controller tests use the host through the in-process executor; here it is constructed and
called directly, with the shipped shaping and filter functions and with local stand-ins."""

from __future__ import annotations

import sys
import types

import pytest
import torch

from areal_graph.api.imports import ImportPathError
from areal_graph.data.packed import PackedBatch
from areal_graph.runtime.hosts.function_host import FunctionHost, accepts


def _batch() -> PackedBatch:
    return PackedBatch.from_sequences(
        {"input_ids": [[1, 2], [3, 4, 5], [6]], "loss_mask": [[0, 1], [0, 1, 1], [0]]},
        seqs={"group_id": [0, 0, 1], "sample_id": [0, 1, 2], "a": [1.0, 2.0, 3.0], "b": [0.5, 0.0, -1.0]},
    )


def test_the_single_declared_write_becomes_out_key():
    host = FunctionHost(
        "areal_graph.nodes.shaping:weighted_sum", {"weights": {"a": 1.0, "b": 2.0}}, node="mix", writes=("total",)
    )
    assert host.args == {"weights": {"a": 1.0, "b": 2.0}, "out_key": "total"}
    assert host.node == "mix" and host.path == "areal_graph.nodes.shaping:weighted_sum"
    out = host.run(_batch())
    assert out.keys() == {"total"} and out["total"].tolist() == pytest.approx([2.0, 2.0, 1.0])


def test_an_out_key_set_in_args_wins_and_several_writes_set_none():
    explicit = FunctionHost(
        "areal_graph.nodes.shaping:weighted_sum", {"weights": {"a": 1}, "out_key": "mine"}, writes=["total"]
    )
    assert explicit.args["out_key"] == "mine" and explicit.run(_batch()).keys() == {"mine"}
    several = FunctionHost("areal_graph.nodes.shaping:weighted_sum", {"weights": {"a": 1}}, writes=("x", "y"))
    assert "out_key" not in several.args
    with pytest.raises(TypeError, match="out_key"):
        several.run(_batch())


def test_a_function_without_an_out_key_parameter_is_not_given_one():
    host = FunctionHost("areal_graph.nodes.filters:drop_uniform_groups", {"key": "a"}, node="dapo", writes=("kept",))
    assert host.args == {"key": "a"}
    out = host.run(_batch())
    assert out["sample_id"].tolist() == [0, 1]  # group 0 mixes a=1,2; group 1 has one answer


def test_args_are_copied_not_shared():
    args = {"weights": {"a": 1.0}}
    host = FunctionHost("areal_graph.nodes.shaping:weighted_sum", args, writes=("t",))
    assert "out_key" not in args and host.args is not args


def test_run_returns_whatever_the_function_returns(monkeypatch):
    mod = types.ModuleType("fh_test_functions")

    def with_stats(batch, out_key, scale=1.0):
        return PackedBatch(batch.cu_seqlens.clone(), seqs={out_key: torch.full((batch.num_seqs,), scale)}), {"n": 3.0}

    mod.with_stats = with_stats
    mod.not_callable = 42
    monkeypatch.setitem(sys.modules, "fh_test_functions", mod)
    out, stats = FunctionHost("fh_test_functions:with_stats", {"scale": 2.5}, writes=("w",)).run(_batch())
    assert out["w"].tolist() == [2.5, 2.5, 2.5] and stats == {"n": 3.0}
    with pytest.raises(TypeError, match="function node 'bad': fh_test_functions:not_callable is not callable"):
        FunctionHost("fh_test_functions:not_callable", node="bad")


def test_a_missing_function_is_an_import_error_naming_the_node():
    with pytest.raises(ImportPathError, match="function node 'shape' fn 'areal_graph.nodes.shaping:nope'"):
        FunctionHost("areal_graph.nodes.shaping:nope", node="shape")


def test_accepts_counts_named_parameters_only():
    def named(batch, out_key):
        pass

    def keyword_only(batch, *, out_key="x"):
        pass

    def catch_all(batch, **kwargs):
        pass

    assert accepts(named, "out_key") and accepts(keyword_only, "out_key")
    assert not accepts(catch_all, "out_key") and not accepts(named, "other")
    assert not accepts(dict, "out_key")  # no signature to read: not assumed
