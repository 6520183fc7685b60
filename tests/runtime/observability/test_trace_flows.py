"""Flow arrows in the trace: each prompt group's rollout span -> the train span of the step that trained it.

Fast tests run the real controller in one process (tests/support/fake_kinds.py, as test_controller.py
does) with a real Tracer; the slow one runs `areal-graph run` on the e2e kit and checks the
same on a real trace, plus the engine's request spans and the `runtime.trace` switch.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pytest

from areal_graph.graph.loader import load_workflow_text
from areal_graph.graph.plan import build_plan
from areal_graph.runtime.observability.flows import FLOW_CAT, GroupFlows, flow_events
from areal_graph.runtime.observability.run_dir import RunDir
from areal_graph.runtime.observability.tracing import Tracer, load_trace
from areal_graph.runtime.orchestration.controller import Controller
from areal_graph.runtime.orchestration.executor import InProcessExecutor
from support import fake_kinds
from support.e2e import SMALL, run_cli, write_workflow

WORKFLOW = """
name: flows
models:
  actor: {path: unused, train: {lr: 1.0e-5}}
data: {train: unused}
nodes:
  rollout: {kind: "support.fake_kinds:ROLLOUT", group_size: 4, delay_s: 0.01, fail: FAIL}
  reward: {kind: function, fn: "support.fake_kinds:parity_reward", reads: [loss_mask], writes: [rewards]}
  advantage: {kind: advantage, estimator: grpo, reads: [rewards, loss_mask], writes: [advantages]}
  train: {kind: "support.fake_kinds:TRAIN", model: actor, loss: ppo,
          reads: [input_ids, loss_mask, behav_logprobs, advantages, versions]}
runtime: {batch_size: 8, max_staleness: ETA, steps: 6, max_concurrent_rollouts: 16, eval_every: 0}
"""


@dataclass
class _Prompt:
    id: str
    input_ids: list[int]
    answer: str


def run_in_process(tmp_path: Path, eta: int, fail: str = "{}") -> tuple[list[dict], list[dict]]:
    """Run the workflow with a real Tracer; return (trace events, the fake trainer's batches)."""
    plan = build_plan(load_workflow_text(WORKFLOW.replace("ETA", str(eta)).replace("FAIL", fail)))
    executor = InProcessExecutor(plan)
    prompts = [_Prompt(f"p{i}", [1, 2, 3 + i % 5], str(i)) for i in range(50)]
    tracer = Tracer(tmp_path / "trace.json")
    controller = Controller(plan, executor, prompts, [], RunDir(tmp_path / "run", tensorboard=False), tracer)
    fake_kinds.HOSTS.clear()
    executor.start(controller.on_failure)
    try:
        controller.run()
    finally:
        executor.shutdown()
        tracer.close()
    return load_trace(tmp_path / "trace.json"), fake_kinds.HOSTS["train"].batches


def flow_pairs(events: list[dict]) -> dict[str, tuple[dict, dict]]:
    """id -> (its "s" event, its "f" event); asserts every "f" has exactly one "s" and vice versa where trained."""
    starts = [e for e in events if e.get("ph") == "s"]
    ends = [e for e in events if e.get("ph") == "f"]
    assert len({e["id"] for e in starts}) == len(starts), "a flow id starts twice"
    assert len({e["id"] for e in ends}) == len(ends), "a flow id ends twice"
    by_id = {e["id"]: e for e in starts}
    for f in ends:
        assert f["id"] in by_id, f"flow {f['id']} ends but never starts"
        s = by_id[f["id"]]
        assert (s["cat"], s["name"]) == (f["cat"], f["name"]) and f["cat"] == FLOW_CAT and f["bp"] == "e"
    return {f["id"]: (by_id[f["id"]], f) for f in ends}


def enclosing(events: list[dict], flow: dict) -> dict:
    """The complete span a flow event binds to: same pid and tid, ts inside it (innermost)."""
    inside = [
        e
        for e in events
        if e.get("ph") == "X"
        and e["pid"] == flow["pid"]
        and e["tid"] == flow["tid"]
        and e["ts"] <= flow["ts"] <= e["ts"] + e["dur"]
    ]
    assert inside, f"flow event {flow} is not inside any span of its thread"
    return min(inside, key=lambda e: e["dur"])


def group_of(flow_id: str) -> int:
    return int(flow_id.split(".g")[1].split(".")[0])


@pytest.mark.parametrize("eta", [0, 2])
def test_every_trained_group_has_an_arrow_from_its_rollout_to_its_train_step(tmp_path, eta):
    events, batches = run_in_process(tmp_path, eta)
    pairs = flow_pairs(events)
    assert len(pairs) == 6 * 2  # 6 steps x 2 groups of 4
    trained_in: dict[int, set[int]] = {}
    staleness = []
    for fid, (s, f) in pairs.items():
        rollout, train = enclosing(events, s), enclosing(events, f)
        assert rollout["name"] == "rollout" and rollout["cat"] == "node" and train["name"] == "train"
        assert s["ts"] < f["ts"]  # generated before it was trained
        # staleness is the arrow: the policy version at generation vs the step that trained it
        staleness.append(train["args"]["step"] - rollout["args"]["version"])
        trained_in.setdefault(train["args"]["step"], set()).add(group_of(fid))
    assert min(staleness) >= 0 and max(staleness) == eta  # async runs do use their staleness budget
    # the arrows end exactly at the step whose batch held those groups
    assert trained_in == {step: set(b["group_ids"]) for step, b in enumerate(batches)}
    # order: steps consume groups in submission order, so arrow ends follow group ids
    assert [group_of(fid) for fid, _ in sorted(pairs.items(), key=lambda kv: kv[1][1]["ts"])] == sorted(
        group_of(fid) for fid in pairs
    )


def test_a_retried_group_draws_one_arrow_from_the_attempt_that_succeeded(tmp_path):
    events, batches = run_in_process(tmp_path, 0, fail="{1: 2}")  # group 1 fails twice, then succeeds
    pairs = flow_pairs(events)
    ids = [fid for fid in pairs if group_of(fid) == 1]
    assert len(ids) == 1 and ids[0].endswith(".g1.a2")
    failed = [e for e in events if e.get("ph") == "X" and e["name"] == "rollout" and "error" in e["args"]]
    assert len(failed) == 2  # the failed attempts are in the trace, without arrows
    assert not [e for e in events if e.get("ph") == "s" and group_of(e["id"]) == 1 and e["id"] != ids[0]]
    assert 1 in {g for b in batches for g in b["group_ids"]}


def test_flow_events_sit_inside_their_spans_and_a_failed_span_starts_none():
    span = {
        "name": "rollout",
        "ph": "X",
        "ts": 1000,
        "dur": 50,
        "pid": 3,
        "tid": 4,
        "args": {"flow_out": ["r.g7"], "flow_in": ["r.g1", "r.g2"]},
    }
    evs = flow_events(span)
    assert [(e["ph"], e["id"], e["ts"]) for e in evs] == [("s", "r.g7", 1049), ("f", "r.g1", 1001), ("f", "r.g2", 1001)]
    assert all(e["pid"] == 3 and e["tid"] == 4 and e["cat"] == FLOW_CAT for e in evs)
    assert all(e["bp"] == "e" for e in evs if e["ph"] == "f")
    assert flow_events(dict(span, args={"flow_out": ["x"], "error": "RuntimeError"})) == []
    assert flow_events(dict(span, args={})) == []


def test_group_flows_forget_groups_dropped_before_training():
    import torch

    class Batch(dict):
        pass

    flows = GroupFlows("rollout", {"train"}, run_tag="t")
    for g in range(4):
        flows.attempt(g, 0)
        flows.accepted(g)
    step = Batch(group_id=torch.tensor([0, 0, 2, 2]))  # group 1 was dropped on the training side
    assert flows.span_args("train", step) == {"flow_in": ["t.g0", "t.g2"]}
    assert flows.span_args("train", Batch(group_id=torch.tensor([3]))) == {"flow_in": ["t.g3"]}
    assert flows._ready == {}
    assert flows.span_args("rollout", Batch(group_id=torch.tensor([-1, -2]))) == {}  # eval groups
    assert GroupFlows("rollout", {"train"}, enabled=False).span_args("rollout", Batch(group_id=torch.tensor([5]))) == {}


# ---------------------------------------------------------------------------- a real run (slow)
@pytest.mark.slow
def test_a_real_run_traces_requests_flows_and_obeys_the_switch(kit, tmp_path):
    wf = write_workflow(kit, tmp_path)
    small = [o for o in SMALL if not o.startswith(("runtime.save_every", "runtime.eval_every"))]
    proc = run_cli(wf, tmp_path / "on", *small, "runtime.max_staleness=1", "runtime.steps=4")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    events = json.loads((tmp_path / "on" / "trace.json").read_text())
    pairs = flow_pairs(events)
    assert len(pairs) == 4 * 2  # steps x (batch 8 / group 4)
    for s, f in pairs.values():
        assert enclosing(events, s)["name"] == "rollout" and enclosing(events, f)["name"] == "train"
        assert s["ts"] < f["ts"]
    spans = [e for e in events if e.get("ph") == "X"]
    requests = [e for e in spans if e["name"] == "request" and e["cat"] == "request"]
    assert len(requests) >= 4 * 8  # every trajectory's request, from the inference server
    assert all(r["args"]["prompt_tokens"] > 0 and r["args"]["output_tokens"] > 0 for r in requests)
    names = {e["name"] for e in spans}
    assert {"queued", "prefill", "decode", "finished", "weight_swap", "update_weights"} <= names
    # the server's spans line up with the controller's: every request lies inside the run
    lo, hi = min(e["ts"] for e in spans), max(e["ts"] + e["dur"] for e in spans)
    assert all(lo <= r["ts"] and r["ts"] + r["dur"] <= hi for r in requests)
    proc = run_cli(wf, tmp_path / "off", *small, "runtime.steps=2", "runtime.trace=false")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert not (tmp_path / "off" / "trace.json").exists()
