"""Reading damaged traces and the summary math of `areal-graph trace` (busy share, critical path,
staleness, packing), asserted on values, on traces written by the real Tracer or by hand in the
standard Chrome format."""

from __future__ import annotations

import argparse
import json
import random
import time
from pathlib import Path

import pytest

from areal_graph.cli import cmd_trace
from areal_graph.runtime.observability.tracing import Tracer
from areal_graph.trace_analysis.trace_metrics import packing_efficiency, staleness_histogram
from areal_graph.trace_analysis.trace_model import build_timeline, load_timeline
from areal_graph.trace_analysis.trace_read import read_trace_file, trace_files
from areal_graph.trace_analysis.trace_run import load_run
from areal_graph.trace_analysis.trace_stats import (
    WAIT_GENERATION,
    WEIGHT_SYNC,
    node_totals,
    process_shares,
    step_bounds,
    utilisation,
)
from areal_graph.trace_analysis.trace_summary import summarize_run
from support.paths import FIXTURES

FIXTURES = FIXTURES / "trace_runs"
S = 1_000_000  # microseconds per second


def _x(name, ts_s, dur_s, pid, tid, cat="", **args):
    return {"name": name, "cat": cat, "ph": "X", "ts": ts_s * S, "dur": dur_s * S, "pid": pid, "tid": tid, "args": args}


def _meta(pid, pname, threads):
    out = [{"name": "process_name", "ph": "M", "pid": pid, "tid": 0, "args": {"name": pname}}]
    out += [
        {"name": "thread_name", "ph": "M", "pid": pid, "tid": tid, "args": {"name": t}} for tid, t in threads.items()
    ]
    return out


def _write(path: Path, events) -> Path:
    path.write_text("[\n" + ",\n".join(json.dumps(e) for e in events) + "\n]\n")
    return path


def _one_step_events():
    """A step 0..3.3 s: wait for the batch 0..1 (a rollout call ends at 0.9 inside it), advantage
    1.0..1.2 on the controller, train 1.2..3.0 on model-actor, weight sync 3.0..3.2."""
    return [
        _x("step", 0, 3.3, 1, 1, "step", step=0, process="controller"),
        _x("wait_batch", 0, 1.0, 1, 2, "controller", step=0, process="controller"),
        _x("rollout", -0.5, 1.4, 2, 3, "node", node="rollout", worker="rollout", process="controller", version=0),
        _x("advantage", 1.0, 0.2, 1, 4, "node", node="advantage", worker="controller", process="controller"),
        _x("train", 1.2, 1.8, 3, 5, "node", node="train", worker="model-actor", process="controller", version=0),
        _x("actor.train", 1.25, 1.7, 3, 6, "compute", worker="model-actor"),
        _x("weight_sync", 3.0, 0.2, 1, 7, "weights", process="controller", version=1),
        *_meta(1, "controller", {1: "step", 2: "controller", 4: "advantage", 7: "weights"}),
        *_meta(2, "rollout", {3: "rollout"}),
        *_meta(3, "model-actor", {5: "train", 6: "compute"}),
    ]


# ---------------------------------------------------------------------- reading damaged files
def _real_trace(path: Path) -> Path:
    tr = Tracer(path)
    t = time.perf_counter()
    for k in range(40):
        tr.record(
            f"span-{k}", t + k * 0.01, t + k * 0.01 + 0.005, cat="compute", worker=f"w{k % 3}", node="n", note="grüße ✓"
        )
    tr.flush()
    return path


def test_a_file_cut_at_any_byte_keeps_exactly_its_complete_events(tmp_path):
    src = _real_trace(tmp_path / "trace.json").read_bytes()
    ends, offset = [], 0  # byte offset where each event's JSON object ends
    for line in src.split(b"\n"):
        body = line.rstrip(b",")
        if body.startswith(b"{"):
            ends.append(offset + len(body))
        offset += len(line) + 1
    cut_path = tmp_path / "cut.json"
    random.seed(7)
    for cut in sorted(random.sample(range(2, len(src) - 3), 120)) + [len(src) - 2]:
        cut_path.write_bytes(src[:cut])
        tf = read_trace_file(cut_path)
        assert len(tf.events) == sum(1 for e in ends if e <= cut), cut
        assert not tf.closed and "cut off mid-write" in tf.notes[0]
        kept = sum(len(json.dumps(e, separators=(",", ":")).encode()) for e in tf.events)
        assert kept <= cut


def test_a_cut_inside_a_utf8_character_is_counted_as_skipped_bytes(tmp_path):
    # areal-graph writes ASCII (JSON escapes); other writers put UTF-8 in names and args
    events = [_x(f"grüße-{k}", k, 0.5, 1, 1, note="✓") for k in range(5)]
    src = ("[\n" + ",\n".join(json.dumps(e, ensure_ascii=False) for e in events) + "\n]\n").encode()
    last = src.rindex("✓".encode())  # the 3-byte check mark of the last event
    (tmp_path / "cut.json").write_bytes(src[: last + 1])
    tf = read_trace_file(tmp_path / "cut.json")
    line_start = src.rindex(b"\n", 0, last) + 1
    assert [e["name"] for e in tf.events] == [f"grüße-{k}" for k in range(4)]
    assert tf.bytes_skipped == last + 1 - line_start  # the partial last line, in raw bytes
    assert tf.regions_skipped == 1 and any("unparsable bytes skipped at its end" in n for n in tf.notes)


def test_garbage_in_the_middle_is_skipped_and_the_rest_read(tmp_path):
    events = [_x(f"s{k}", k, 0.5, 1, 1) for k in range(6)] + _meta(1, "p", {1: "t"})
    text = _write(tmp_path / "t.json", events).read_text().splitlines()
    text.insert(3, '{"name": "broken", "ph": "X", "ts": 12,, garbage')
    (tmp_path / "bad.json").write_text("\n".join(text) + "\n")
    tf = read_trace_file(tmp_path / "bad.json")
    assert [e["name"] for e in tf.events if e["ph"] == "X"] == [f"s{k}" for k in range(6)]
    assert tf.closed and tf.regions_skipped == 1
    assert tf.bytes_skipped == len(text[3]) + 1


def test_object_format_whole_and_cut(tmp_path):
    events = [_x(f"s{k}", k, 0.5, 1, 1) for k in range(3)]
    whole = json.dumps({"traceEvents": events, "displayTimeUnit": "ms"}, indent=1)
    (tmp_path / "o.json").write_text(whole)
    assert len(read_trace_file(tmp_path / "o.json").events) == 3
    (tmp_path / "cut.json").write_text(whole[: whole.index('"s2"')])
    tf = read_trace_file(tmp_path / "cut.json")
    assert [e["name"] for e in tf.events] == ["s0", "s1"] and not tf.closed


def test_not_a_trace_is_a_clear_error(tmp_path):
    (tmp_path / "x.json").write_text("hello")
    with pytest.raises(ValueError, match="not a Chrome trace"):
        read_trace_file(tmp_path / "x.json")
    (tmp_path / "e.json").write_text("")
    with pytest.raises(ValueError, match="empty"):
        read_trace_file(tmp_path / "e.json")
    with pytest.raises(FileNotFoundError, match="no trace.json"):
        trace_files(tmp_path)


def test_names_come_back_from_span_args_when_the_metadata_tail_is_lost(tmp_path):
    tr = Tracer(tmp_path / "trace.json")
    t = time.perf_counter()
    tr.record("gen", t, t + 1, cat="node", worker="rollout", node="rollout", flow_out=["g1"])
    tr.record("gen", t + 0.5, t + 1.5, cat="node", worker="rollout", node="rollout")  # overlaps: lane 2
    tr.record("fwd", t, t + 2, cat="compute", worker="model-actor", flow_in=["g1"])  # flow events name nothing
    tr.flush()
    text = tr.path.read_text()
    (tmp_path / "cut.json").write_text(text[: text.index('{"name":"process_name"')])
    full, cut = load_timeline(tr.path), load_timeline(tmp_path / "cut.json")
    assert cut.processes == full.processes == ["model-actor", "rollout"]  # pids in order of first span
    assert [(s["process"], s["thread"]) for s in cut.spans] == [(s["process"], s["thread"]) for s in full.spans]
    assert cut.counts["recovered_process_names"] == 2 and cut.counts["recovered_thread_names"] == 3
    assert [[p.span for p in f.points] for f in cut.flows] == [[p.span for p in f.points] for f in full.flows]
    assert len(cut.flows) == 1 and None not in [p.span for p in cut.flows[0].points]
    assert any("recovered from the span args" in n for n in cut.notes)


# ---------------------------------------------------------------------- killed workers, parts
def test_a_killed_worker_leaves_an_open_span_drawn_to_the_end_and_counted(tmp_path):
    events = [
        _x("step", 0, 10, 1, 1, "step", step=0, process="controller"),
        {"name": "actor.train", "cat": "compute", "ph": "B", "ts": 2 * S, "pid": 2, "tid": 2, "args": {"k": 1}},
        {"name": "lost", "ph": "E", "ts": 3 * S, "pid": 3, "tid": 3},
        _x("train", 1, 9, 2, 3, "node", node="train", worker="model-actor", process="controller", error="WorkerDied"),
        *_meta(1, "controller", {1: "step"}),
        *_meta(2, "model-actor", {2: "compute", 3: "train"}),
    ]
    tl = load_timeline(_write(tmp_path / "trace.json", events))
    open_spans = [s for s in tl.spans if s["open"]]
    assert len(open_spans) == 1 and open_spans[0]["dur"] == 8 * S and open_spans[0]["args"]["unterminated"]
    assert tl.counts["unterminated"] == 1 and tl.counts["unmatched_end"] == 1
    text = " | ".join(tl.notes)
    assert "1 spans were begun and never ended" in text and "1 end events without a matching begin" in text
    assert "1 spans ended in an error: WorkerDied x1 (first: train on model-actor at 1.00 s)" in text
    shares = {r["process"]: r for r in process_shares(tl)}
    assert shares["model-actor"]["busy_s"] == pytest.approx(8.0)  # the open compute span counts to the end
    assert shares["model-actor"]["busy_share"] == pytest.approx(0.8)


def test_parts_of_a_resumed_run_are_read_in_order_and_merged_by_name(tmp_path):
    part1 = [
        _x("a", 0, 2, 1, 1, "compute"),
        _x("b", 0, 1, 2, 2, "compute"),
        *_meta(1, "model-actor", {1: "compute"}),
        *_meta(2, "reward", {2: "compute"}),
    ]
    part2 = [
        _x("c", 10, 2, 1, 1, "compute"),
        _x("d", 11, 1, 2, 2, "compute"),  # pids swapped in the new file
        *_meta(1, "reward", {1: "compute"}),
        *_meta(2, "model-actor", {2: "compute"}),
    ]
    _write(tmp_path / "trace.part1.json", part1)
    _write(tmp_path / "trace.json", part2)
    assert [p.name for p in trace_files(tmp_path)] == ["trace.part1.json", "trace.json"]
    tl = load_timeline(tmp_path)
    assert tl.processes == ["model-actor", "reward"]
    assert {s["name"]: s["process"] for s in tl.spans} == {
        "a": "model-actor",
        "b": "reward",
        "c": "reward",
        "d": "model-actor",
    }
    assert tl.wall_s == pytest.approx(4.0)  # 0..2 and 10..12: the gap between parts is not the run's time
    busy = {r["process"]: r["busy_s"] for r in process_shares(tl)}
    assert busy == {"model-actor": pytest.approx(3.0), "reward": pytest.approx(3.0)}
    assert any("2 trace parts read in order" in n for n in tl.notes)


def test_profile_records_are_kept_apart_from_the_spans_every_view_draws(tmp_path):
    """The engine's step log and CPU samples (category "profile") are data for the cost model:
    they stay out of the span tables, busy shares and pages, and come back in `profiles`."""
    events = [
        _x("engine", 0, 2, 1, 1, "compute"),
        _x("engine_steps", 0, 2, 1, 2, "profile"),
        *_meta(1, "inference-0", {1: "engine", 2: "engine"}),
    ]
    _write(tmp_path / "trace.json", events)
    tl = load_timeline(tmp_path)
    assert [s["name"] for s in tl.spans] == ["engine"] and [s["name"] for s in tl.profiles] == ["engine_steps"]
    assert [r["key"] for r in cmd_trace.summarize(tl.spans, "name", tl.wall_s)] == ["engine"]


# ---------------------------------------------------------------------- summary math
def test_busy_idle_shares_and_utilisation_are_exact(tmp_path):
    tl = load_timeline(_write(tmp_path / "trace.json", _one_step_events()))
    assert tl.wall_s == pytest.approx(3.8)  # -0.5 .. 3.3
    rows = {r["process"]: r for r in process_shares(tl)}
    actor = rows["model-actor"]
    assert actor["busy_s"] == pytest.approx(1.7)  # actor.train only; the train call is a call in flight
    assert actor["busy_share"] == pytest.approx(1.7 / 3.8)
    assert actor["busy_share_steps"] == pytest.approx(1.7 / 3.3)
    assert actor["idle_share_steps"] == pytest.approx(1 - 1.7 / 3.3)
    assert actor["in_span_share"] == pytest.approx(1.8 / 3.8)
    assert rows["controller"]["busy_s"] == pytest.approx(0.2)  # advantage, computed on the controller
    assert rows["rollout"]["busy_s"] == 0.0 and rows["rollout"]["in_span_share"] == pytest.approx(1.4 / 3.8)
    u = utilisation(tl, bins=38)  # 0.1 s slices from -0.5 s
    assert u["bin_s"] == pytest.approx(0.1)
    series = u["by_process"]["model-actor"]
    assert series[17] == pytest.approx(0.5) and series[18] == pytest.approx(1.0) and series[35] == 0.0
    assert sum(series) * 0.1 == pytest.approx(1.7)


def test_the_critical_path_names_what_bounded_the_step(tmp_path):
    tl = load_timeline(_write(tmp_path / "trace.json", _one_step_events()))
    [row] = step_bounds(tl, generation=["rollout"], training=["advantage", "train"])
    assert row["seconds"] == pytest.approx(
        {
            WAIT_GENERATION: 1.0,
            "advantage on controller": 0.2,
            "train on model-actor": 1.8,
            WEIGHT_SYNC: 0.2,
            "controller overhead": 0.1,
        }
    )
    assert row["bound_by"] == "train on model-actor" and row["bound_share"] == pytest.approx(1.8 / 3.3)
    totals = node_totals(tl, ["rollout", "train", "prox_logp"])
    assert totals["train"] == {"calls": 1, "total_s": pytest.approx(1.8), "busy_share": pytest.approx(1.8 / 3.8)}
    assert totals["prox_logp"]["calls"] == 0


def test_a_generation_bound_step(tmp_path):
    events = [
        _x("step", 0, 2, 1, 1, "step", step=3, process="controller"),
        _x("wait_batch", 0, 1.6, 1, 2, "controller", process="controller"),
        _x("rollout", 0.1, 1.5, 2, 3, "node", node="rollout", worker="rollout", process="controller"),
        _x("train", 1.6, 0.3, 3, 4, "node", node="train", worker="model-actor", process="controller"),
        *_meta(1, "controller", {1: "step", 2: "controller"}),
        *_meta(2, "rollout", {3: "rollout"}),
        *_meta(3, "model-actor", {4: "train"}),
    ]
    tl = load_timeline(_write(tmp_path / "trace.json", events))
    [row] = step_bounds(tl, ["rollout"], ["train"])
    assert row["step"] == 3 and row["bound_by"] == WAIT_GENERATION and row["bound_share"] == pytest.approx(0.8)


def test_flows_bind_to_their_spans_and_give_per_group_staleness(tmp_path):
    events = _one_step_events() + [
        {"ph": "s", "id": "g1", "cat": "flow", "name": "group", "ts": 0.8 * S, "pid": 2, "tid": 3},
        {"ph": "f", "bp": "e", "id": "g1", "cat": "flow", "name": "group", "ts": 1.3 * S, "pid": 3, "tid": 5},
        {"ph": "s", "id": "g2", "cat": "flow", "name": "group", "ts": 0.85 * S, "pid": 2, "tid": 3},
        {"ph": "f", "id": "g2", "cat": "flow", "name": "group", "ts": 1.1 * S, "pid": 3, "tid": 5},  # next slice
    ]
    events[2]["args"]["version"] = 0
    events[4]["args"]["version"] = 3
    tl = load_timeline(_write(tmp_path / "trace.json", events))
    by_name = {s["name"]: s["index"] for s in tl.spans}
    assert [(f.id, [p.span for p in f.points]) for f in tl.flows] == [
        ("g1", [by_name["rollout"], by_name["train"]]),
        ("g2", [by_name["rollout"], by_name["train"]]),
    ]
    st = staleness_histogram(tl, metrics=[{"step": 1, "staleness/mean": 9.0}])  # flows win over metrics
    assert st["counts"] == {3.0: 2} and st["unit"] == "prompt groups" and st["mean"] == 3.0


def test_staleness_from_metrics_and_when_nothing_records_it():
    metrics = [
        {"step": k, "staleness/mean": v, "staleness/max": m}
        for k, (v, m) in enumerate([(0.0, 0), (1.2, 2), (1.4, 3), (2.75, 4)])
    ]
    st = staleness_histogram(build_timeline([]), metrics)
    assert st["unit"] == "steps" and st["counts"] == {0.0: 1, 1.0: 2, 2.5: 1}
    assert st["mean"] == pytest.approx((0 + 1.2 + 1.4 + 2.75) / 4) and st["max"] == 4
    none = staleness_histogram(build_timeline([]), [{"step": 1}])
    assert none["counts"] == {} and "no staleness recorded" in none["note"]


def test_packing_efficiency_and_what_is_missing():
    metrics = [
        {"step": 1, "train/tokens": 3000.0, "train/n_microbatches": 1.0},
        {"step": 2, "train/tokens": 5000.0, "train/n_microbatches": 3.0},  # lower bound 2: one extra
        {"step": 3, "train/tokens": 4096.0, "train/n_microbatches": 1.0},
    ]
    pk = packing_efficiency(metrics, budget=4096)
    assert pk["fill_median"] == pytest.approx(3000 / 4096) and pk["fill_min"] == pytest.approx(5000 / (3 * 4096))
    assert pk["at_lower_bound"] == 2 and pk["extra_microbatches"] == 1
    two_ranks = packing_efficiency([{"step": 1, "train/tokens": 9000.0, "train/n_microbatches": 4.0}], 4096, ranks=2)
    assert two_ranks["at_lower_bound"] == 1 and two_ranks["extra_microbatches"] == 0  # 2 ranks x ceil(4500/4096)
    gone = packing_efficiency([{"step": 1}], budget=None)
    assert not gone["available"] and "train/n_microbatches" in gone["missing"] and "budget" in gone["missing"]


# ---------------------------------------------------------------------- real runs (fixtures) and the CLI
def test_fixture_runs_summarise_with_flows_staleness_and_the_plan():
    for name, eta in (("sync", 0), ("async", 4)):
        run = load_run(FIXTURES / name)
        s = summarize_run(run)
        assert run.spec is not None and run.sides_from == "plan" and s["flows"] > 0
        assert s["critical_path"]["steps"] == 4 and s["staleness"]["unit"] == "prompt groups"
        assert max(s["staleness"]["counts"]) <= eta and (eta == 0) == (max(s["staleness"]["counts"]) == 0)
        assert s["packing"]["available"] and 0 < s["packing"]["fill_median"] <= 1
        assert {r["process"] for r in s["processes"]} >= {"controller", "rollout", "model-actor", "inference-0"}
        assert s["nodes"]["train"]["calls"] == 4 and s["fused"] == {"prox_logp": "train"}


def _cli(*argv: str) -> int:
    parser = argparse.ArgumentParser()
    cmd_trace.register(parser.add_subparsers())
    args = parser.parse_args(["trace", *argv])
    return args.func(args)


def test_cli_json_text_and_errors(tmp_path, capsys):
    assert _cli(str(FIXTURES / "async"), "--json") == 0
    out = json.loads(capsys.readouterr().out)
    assert out["label"] == "async" and out["spans"] > 0 and out["critical_path"]["steps"] == 4
    assert {"processes", "staleness", "packing", "nodes", "notes", "by", "per_step"} <= set(out)
    assert _cli(str(FIXTURES / "sync"), str(FIXTURES / "async"), "--json") == 0
    assert [r["label"] for r in json.loads(capsys.readouterr().out)["runs"]] == ["sync", "async"]
    assert _cli(str(FIXTURES / "async")) == 0
    text = capsys.readouterr().out
    assert "busy and idle per process" in text and "what bounded each step" in text and "staleness" in text
    assert _cli(str(FIXTURES / "async"), "--label", "a", "--label", "b") == 2
    assert "one per RUN" in capsys.readouterr().err
    assert _cli(str(tmp_path)) == 1
    assert "no trace.json" in capsys.readouterr().err
    # a bad page option is said before any table, and nothing is written
    assert _cli(str(FIXTURES / "async"), "--html", str(tmp_path / "x.html"), "--span-budget", "0") == 2
    said = capsys.readouterr()
    assert said.out == "" and "--span-budget must be an integer >= 100 (spans drawn on the page), got 0" in said.err
    assert not (tmp_path / "x.html").exists()


def test_cli_png_writes_both_pictures(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    assert _cli(str(FIXTURES / "sync"), str(FIXTURES / "async"), "--png", str(tmp_path / "png")) == 0
    for name in ("utilisation.png", "learning_curve.png"):
        data = (tmp_path / "png" / name).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000


def test_a_config_from_an_older_schema_still_gives_the_graph(tmp_path):
    import shutil

    run = tmp_path / "old"
    shutil.copytree(FIXTURES / "async", run)
    cfg = (run / "config.yaml").read_text()
    (run / "config.yaml").write_text(cfg.replace("runtime:\n", "runtime:\n  a_field_from_another_age: 3\n", 1))
    loaded = load_run(run)
    assert loaded.spec is not None and loaded.plan is not None
    assert any("does not load with today's schema" in n and "a_field_from_another_age" in n for n in loaded.notes)


def test_damaged_metrics_lines_are_skipped_counted_and_noted(tmp_path):
    """A run killed mid-write: its metrics.jsonl read by the recorder's one reader, and the note says how many
    lines were lost; no metrics.jsonl is a note too."""
    import shutil

    run = tmp_path / "killed"
    shutil.copytree(FIXTURES / "async", run)
    whole = load_run(run)
    assert whole.metrics and not any("damaged" in n for n in whole.notes)
    with open(run / "metrics.jsonl", "a") as f:
        f.write('\n"not a step"\n{"step": 99, "loss')
    damaged = load_run(run)
    assert damaged.metrics == whole.metrics
    assert "metrics.jsonl: 2 damaged line(s) skipped" in damaged.notes
    (run / "metrics.jsonl").unlink()
    gone = load_run(run)
    assert gone.metrics == [] and any(n.startswith("no metrics.jsonl") for n in gone.notes)
