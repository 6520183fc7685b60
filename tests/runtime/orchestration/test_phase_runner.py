"""runtime/orchestration/phase_runner.py on its own: `run_phase` runs one phase of a real plan
as a DAG (independent nodes at once, a node after the nodes it reads from), gives each node
exactly its declared reads plus the implicit ids, merges what it returns, counts the prompt
groups a filter drops, cuts a sibling's output down to the sequences left, stops calling
nodes once nothing is left, and cancels the rest when one node fails; `check_output` holds
every node to its declaration.

tests/runtime/orchestration/test_controller.py sees these rules through whole in-process runs;
here the plan comes from a small workflow (fake kinds of tests/support/fake_kinds.py) and the
node calls are local coroutines, or the real `FunctionHost`s of the plan's function nodes."""

from __future__ import annotations

import asyncio

import pytest
import torch

from areal_graph.data.packed import PackedBatch
from areal_graph.graph.kind import RunInfo
from areal_graph.graph.loader import load_workflow_text
from areal_graph.graph.plan import build_plan
from areal_graph.runtime.hosts.function_host import FunctionHost
from areal_graph.runtime.orchestration.phase_runner import (
    NodeContractError,
    NodeResult,
    check_output,
    node_inputs,
    restrict,
    run_phase,
)

HEAD = """
name: phases
models:
  actor: {path: unused, train: {lr: 1.0e-5}}
data: {train: unused}
runtime: {batch_size: 4, max_staleness: 0, steps: 1, eval_every: 0}
nodes:
  rollout: {kind: "support.fake_kinds:ROLLOUT", group_size: 2}
  advantage: {kind: advantage, estimator: grpo, reads: [rewards, loss_mask], writes: [advantages]}
  train: {kind: train, model: actor, loss: ppo, reads: [input_ids, loss_mask, behav_logprobs, advantages]}
"""
# reward and bonus are independent; total needs both; dapo (DAPO's filter) needs total
SHAPING = (
    HEAD
    + """
  reward: {kind: function, fn: "support.fake_kinds:mixed_reward", reads: [loss_mask], writes: [rewards]}
  bonus: {kind: function, fn: "support.fake_kinds:parity_reward", reads: [input_ids], writes: [bonus]}
  total: {kind: function, fn: "areal_graph.nodes.shaping:weighted_sum", args: {weights: {rewards: 1.0, bonus: 0.0}},
          reads: [rewards, bonus], writes: [total]}
  dapo: {kind: function, fn: "areal_graph.nodes.filters:drop_uniform_groups", args: {key: total}, reads: [total]}
"""
)
# gate drops groups and writes `kept`, which `after` reads; side runs beside them from the start
GATED = (
    HEAD
    + """
  reward: {kind: function, fn: "support.fake_kinds:parity_reward", reads: [loss_mask], writes: [rewards]}
  gate: {kind: function, fn: "areal_graph.nodes.filters:drop_uniform_groups", args: {key: rewards},
         reads: [rewards], writes: [kept]}
  after: {kind: function, fn: "support.fake_kinds:parity_reward", reads: [kept], writes: [final]}
  side: {kind: function, fn: "support.fake_kinds:parity_reward", reads: [input_ids], writes: [side]}
"""
)
IDS = {"group_id", "sample_id", "answer"}  # the implicit keys the batch holds (no `info` here)


@pytest.fixture(scope="module")
def shaping():
    return build_plan(load_workflow_text(SHAPING))


@pytest.fixture(scope="module")
def gated():
    return build_plan(load_workflow_text(GATED))


def _batch(groups: int = 3, g: int = 2) -> PackedBatch:
    """What a rollout returns for `groups` prompts of `g` answers (sample id = group * g + j)."""
    seqs = [[1, 2, 3 + k] + [10 + k] * (1 + k % 2) for k in range(groups * g)]
    return PackedBatch.from_sequences(
        {
            "input_ids": seqs,
            "loss_mask": [[0, 0, 0] + [1] * (len(s) - 3) for s in seqs],
            "behav_logprobs": [[0.0] * len(s) for s in seqs],
            "versions": [[-1, -1, -1] + [0] * (len(s) - 3) for s in seqs],
        },
        seqs={"group_id": [k // g for k in range(groups * g)], "sample_id": list(range(groups * g))},
        meta={"answer": [str(k // g) for k in range(groups * g)]},
        dtypes={"input_ids": torch.int64, "loss_mask": torch.int64, "versions": torch.int64},
    )


def _kept(given: PackedBatch, sample_ids: list[int], **writes) -> PackedBatch:
    idx = [i for i, s in enumerate(given["sample_id"].tolist()) if s in sample_ids]
    out = given.select(idx).select_keys(["group_id", "sample_id"])
    for key, fn in writes.items():
        out.seqs[key] = fn(out)
    return out


def _writes(batch: PackedBatch, **values) -> PackedBatch:
    return PackedBatch(
        batch.cu_seqlens.clone(), seqs={k: torch.as_tensor(v, dtype=torch.float32) for k, v in values.items()}
    )


def test_the_plans_phases_are_what_the_tests_expect(shaping, gated):
    assert shaping.generation == ("reward", "bonus", "total", "dapo")
    assert dict(shaping.deps) == {
        "reward": (),
        "bonus": (),
        "total": ("reward", "bonus"),
        "dapo": ("total",),
        "advantage": (),
        "train": ("advantage",),
    }
    assert gated.generation == ("reward", "gate", "after", "side") and gated.deps["after"] == ("gate",)


def test_a_phase_runs_as_a_dag_on_the_plans_function_hosts(shaping):
    hosts = {
        n: FunctionHost(**shaping.kind(n).host_args(shaping.node(n), shaping.spec, RunInfo({})))
        for n in shaping.generation
    }
    events: list[tuple[str, str]] = []
    given: dict[str, set[str]] = {}
    started = {n: asyncio.Event() for n in shaping.generation}

    async def call(name: str, batch: PackedBatch) -> NodeResult:
        events.append(("start", name))
        given[name] = batch.keys()
        started[name].set()
        if name in ("reward", "bonus"):  # each waits until the other has started: they run at the same time
            other = "bonus" if name == "reward" else "reward"
            await asyncio.wait_for(started[other].wait(), timeout=10)
        await asyncio.sleep(0)
        out = hosts[name].run(batch)
        events.append(("end", name))
        return NodeResult(out)

    outcome = asyncio.run(run_phase(shaping, shaping.generation, _batch(), call))
    assert given == {
        "reward": {"loss_mask"} | IDS,
        "bonus": {"input_ids"} | IDS,
        "total": {"rewards", "bonus"} | IDS,
        "dapo": {"total"} | IDS,
    }
    assert events[:2] == [("start", "reward"), ("start", "bonus")]
    assert events.index(("start", "total")) > max(events.index(("end", "reward")), events.index(("end", "bonus")))
    assert events.index(("start", "dapo")) > events.index(("end", "total"))
    # mixed_reward: group 0 all 0 (uniform, dropped by dapo), groups 1 and 2 mix 0 and 1
    batch = outcome.batch
    assert outcome.groups_dropped == {"dapo": 1} and outcome.stats == {}
    assert batch["sample_id"].tolist() == [2, 3, 4, 5] and batch["group_id"].tolist() == [1, 1, 2, 2]
    assert batch["total"].tolist() == [0.0, 1.0, 0.0, 1.0] == batch["rewards"].tolist()
    assert batch["bonus"].tolist() == [0.0, 1.0, 0.0, 1.0]  # parity of the sample id
    assert batch.keys() == {"input_ids", "loss_mask", "behav_logprobs", "versions", "rewards", "bonus", "total"} | IDS
    assert [batch.sequence(i, "input_ids").tolist() for i in range(4)] == [
        _batch().sequence(i, "input_ids").tolist() for i in (2, 3, 4, 5)
    ]


def test_stats_are_named_by_node(gated):
    async def call(name, batch):
        out = {
            "reward": lambda: _writes(batch, rewards=[0, 1] * 3),
            "gate": lambda: _kept(batch, list(range(6)), kept=lambda b: torch.ones(b.num_seqs)),
            "after": lambda: _writes(batch, final=[1] * 6),
            "side": lambda: _writes(batch, side=[2] * 6),
        }[name]()
        return NodeResult(out, {"calls": 1.0, "n": float(batch.num_seqs)})

    outcome = asyncio.run(run_phase(gated, gated.generation, _batch(), call))
    assert outcome.stats == {f"{n}/{k}": v for n in gated.generation for k, v in (("calls", 1.0), ("n", 6.0))}
    assert outcome.groups_dropped == {} and outcome.batch.num_seqs == 6


def _sibling_of_a_filter(side_output):
    """Run GATED where `side` starts on all 6 sequences and returns after `gate` kept groups 0 and 2."""
    gate_done = asyncio.Event()

    async def call(name, batch):
        if name == "reward":
            return NodeResult(_writes(batch, rewards=[0, 1] * 3))
        if name == "gate":  # keeps groups 0 and 2
            await asyncio.sleep(0)  # lets side take its inputs first
            out = _kept(batch, [0, 1, 4, 5], kept=lambda b: b["sample_id"].float())
            gate_done.set()
            return NodeResult(out)
        if name == "after":
            assert batch["sample_id"].tolist() == [0, 1, 4, 5]  # after the filter: only what it kept
            return NodeResult(_writes(batch, final=batch["kept"] + 0.5))
        assert batch.num_seqs == 6  # side started before the filter dropped anything
        await asyncio.wait_for(gate_done.wait(), timeout=10)
        return NodeResult(side_output(batch))

    return call


def test_a_siblings_output_is_cut_to_the_sequences_a_filter_left(gated):
    def with_ids(batch):  # the sibling returns its write with the ids of the sequences it was given
        return _kept(batch, batch["sample_id"].tolist(), side=lambda b: b["sample_id"] * 10.0)

    outcome = asyncio.run(run_phase(gated, gated.generation, _batch(), _sibling_of_a_filter(with_ids)))
    b = outcome.batch
    assert b["sample_id"].tolist() == [0, 1, 4, 5] and outcome.groups_dropped == {"gate": 1}
    assert b["side"].tolist() == [0.0, 10.0, 40.0, 50.0]  # each value stays with its sequence
    assert b["final"].tolist() == [0.5, 1.5, 4.5, 5.5] and b["kept"].tolist() == [0.0, 1.0, 4.0, 5.0]


def test_a_siblings_writes_only_output_is_cut_to_the_sequences_a_filter_left(gated):
    """The usual node output is its writes alone (shaping functions, `PackedBatch(cu, seqs={out_key: ...})`);
    when a filter beside it has dropped groups meanwhile, it is cut down like one with ids (it was a
    KeyError on 'sample_id', and DAPO's dropped groups came back as failed ones)."""
    writes_only = lambda batch: _writes(batch, side=batch["sample_id"] * 10)  # noqa: E731
    outcome = asyncio.run(run_phase(gated, gated.generation, _batch(), _sibling_of_a_filter(writes_only)))
    assert outcome.batch["side"].tolist() == [0.0, 10.0, 40.0, 50.0]


def test_once_everything_is_dropped_no_node_after_it_is_called(gated):
    called = []

    async def call(name, batch):
        called.append(name)
        if name == "reward":
            return NodeResult(_writes(batch, rewards=[1.0] * 6))
        if name == "gate":
            return NodeResult(_kept(batch, [], kept=lambda b: torch.zeros(0)))
        if name == "side":
            return NodeResult(_writes(batch, side=[0.0] * batch.num_seqs))
        raise AssertionError(f"{name} was called on an empty batch")

    outcome = asyncio.run(run_phase(gated, gated.generation, _batch(), call))
    assert outcome.batch is None and outcome.groups_dropped == {"gate": 3}
    assert "after" not in called and {"reward", "gate"} <= set(called)


def test_a_failing_node_cancels_the_others_and_its_error_propagates(gated):
    cancelled = []

    async def call(name, batch):
        if name == "reward":
            await asyncio.sleep(0.01)
            raise RuntimeError("reward worker died")
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            cancelled.append(name)
            raise
        raise AssertionError("not cancelled")

    with pytest.raises(RuntimeError, match="reward worker died"):
        asyncio.run(asyncio.wait_for(run_phase(gated, gated.generation, _batch(), call), timeout=30))
    assert cancelled == ["side"]  # gate and after never started: they wait for reward


# ---------------------------------------------------------------------- the contract
def test_a_read_the_batch_lacks_is_an_error_naming_node_and_key(shaping):
    batch = _batch().select_keys(["input_ids", "group_id", "sample_id"])
    with pytest.raises(
        NodeContractError,
        match=r"node 'reward' reads \['loss_mask'\], which the batch does not hold "
        r"\(it has \['group_id', 'input_ids', 'sample_id'\]\)",
    ):
        node_inputs(shaping, "reward", batch)
    assert node_inputs(shaping, "bonus", batch).keys() == {"input_ids", "group_id", "sample_id"}


def test_a_train_node_is_also_given_versions_when_the_batch_has_them(shaping):
    batch = _batch()
    batch.seqs["advantages"] = torch.zeros(6)
    assert (
        node_inputs(shaping, "train", batch).keys()
        == {"input_ids", "loss_mask", "behav_logprobs", "advantages", "versions"} | IDS
    )


def test_a_node_returns_exactly_its_declared_writes(shaping):
    given = _batch()
    check_output(shaping, "reward", given, _writes(given, rewards=[0] * 6))
    with pytest.raises(
        NodeContractError,
        match=r"node 'reward' must return exactly its declared writes \['rewards'\]; "
        r"it wrote undeclared \['extra'\]$",
    ):
        check_output(shaping, "reward", given, _writes(given, rewards=[0] * 6, extra=[0] * 6))
    with pytest.raises(NodeContractError, match=r"; it did not write \['rewards'\]; it wrote undeclared \['reward'\]"):
        check_output(shaping, "reward", given, _writes(given, reward=[0] * 6))
    check_output(shaping, "dapo", given, _kept(given, list(range(6))))  # a filter writes nothing: ids only


def test_only_kinds_that_may_drop_return_fewer_sequences(shaping):
    given = _batch()
    with pytest.raises(
        NodeContractError,
        match="node 'advantage' returned 4 sequences for the 6 it was given; "
        "a node of kind advantage keeps every sequence",
    ):
        check_output(shaping, "advantage", given, _kept(given, [0, 1, 2, 3], advantages=lambda b: torch.zeros(4)))


@pytest.mark.parametrize(
    "out,words",
    [
        (lambda g: _writes(g.select([0, 1]), rewards=[0, 0]), "dropped sequences but its output has no sample_id"),
        (
            lambda g: _kept(g, [0, 1], rewards=lambda b: torch.zeros(2), sample_id=lambda b: torch.tensor([0, 99])),
            "returned sequences it was not given",
        ),
        (
            lambda g: PackedBatch(
                torch.tensor([0, 5, 10]),
                seqs={"sample_id": torch.tensor([0, 0]), "group_id": torch.tensor([0, 0]), "rewards": torch.zeros(2)},
            ),
            "returned sequences it was not given (or one twice)",
        ),
        (lambda g: _kept(g, [0, 2, 3], rewards=lambda b: torch.zeros(3)), r"dropped part of prompt group(s) [0]"),
    ],
)
def test_a_filter_drops_whole_groups_of_sequences_it_was_given(shaping, out, words):
    given = _batch()
    with pytest.raises(NodeContractError) as info:
        check_output(shaping, "reward", given, out(given))
    assert words in str(info.value) and "node 'reward'" in str(info.value)


def test_restrict_keeps_the_batchs_order_and_returns_it_whole_when_all_are_kept():
    batch = _batch()
    cut = restrict(batch, [5, 0, 3, 42])
    assert cut["sample_id"].tolist() == [0, 3, 5]
    assert cut.sequence(2, "input_ids").tolist() == batch.sequence(5, "input_ids").tolist()
    assert restrict(batch, list(range(6))) is batch
    assert restrict(batch, []).num_seqs == 0
