"""trace_analysis/trace_view/payload.py: a run's timeline as the page's compact columnar
JSON. Times are milliseconds from the run's start, rows follow the tracks' order, names, args
and colours are interned, one "step bounded by" span per step, node spans carry their node's
kind colour, instants and counters get rows, and flow arrows past the budget are thinned evenly.

tests/trace_analysis/test_trace_html.py checks the page it ends up in (and the span
budget's merging); these call `run_payload` and its helpers directly on the run fixtures and
on small traces written here."""

from __future__ import annotations

import json
import random

import pytest

from areal_graph.trace_analysis.trace_run import load_run
from areal_graph.trace_analysis.trace_summary import summarize_run
from areal_graph.trace_analysis.trace_view import payload as P
from areal_graph.trace_analysis.trace_view.payload import PageOptions, run_payload
from support.paths import FIXTURES


@pytest.fixture(scope="module")
def sync_run():
    run = load_run(FIXTURES / "trace_runs" / "sync", "sync")
    summary = summarize_run(run)
    return run, summary, run_payload(run, summary, PageOptions())


def _write(tmp_path, events):
    (tmp_path / "trace.json").write_text(json.dumps(events))
    return load_run(tmp_path / "trace.json")


def _payload(run, **options):
    return run_payload(run, summarize_run(run), PageOptions(**options))


# ---------------------------------------------------------------------- options
def test_page_options_take_integers_of_at_least_100():
    assert PageOptions() == PageOptions(span_budget=50_000, flow_budget=20_000)
    assert PageOptions(span_budget=100, flow_budget=100).flow_budget == 100
    for bad in (
        {"span_budget": 100.0},
        {"span_budget": "500"},
        {"flow_budget": None},
        {"flow_budget": 99},
        {"flow_budget": True},
    ):
        with pytest.raises(ValueError, match=f"PageOptions.{next(iter(bad))} must be an integer >= 100"):
            PageOptions(**bad)


# ---------------------------------------------------------------------- a real run
def test_every_span_is_a_column_entry_in_milliseconds_from_the_start(sync_run):
    run, summary, p = sync_run
    tl = run.timeline
    cols = p["spans"]
    steps = len(summary["critical_path"]["per_step"])
    assert steps == 4 and p["spans_total"] == len(tl.spans) + steps
    assert all(len(v) == p["spans_total"] for v in cols.values()) and not p["aggregation"]["applied"]
    assert p["label"] == "sync" and p["duration_ms"] == round((tl.end_us - tl.start_us) / 1e3, 3)
    first_step = next(s for s in tl.spans if s["cat"] == "step")
    assert p["first_step_ms"] == round((first_step["ts"] - tl.start_us) / 1e3, 3)
    drawn = {(p["names"][n], t, d) for n, t, d in zip(cols["n"], cols["t"], cols["d"])}
    for s in tl.spans:
        assert (s["name"], round((s["ts"] - tl.start_us) / 1e3, 3), round(s["dur"] / 1e3, 3)) in drawn
    assert min(cols["t"]) >= 0 and all(f == 0 for f in cols["f"])  # nothing open or merged in a clean run
    assert len(set(p["names"])) == len(p["names"])  # interned: each name once
    assert len({json.dumps(a, sort_keys=True) for a in p["args"]}) == len(p["args"])


def test_tracks_are_ordered_by_process_then_step_tracks_first_and_rows_are_numbered_in_turn(sync_run):
    run, _, p = sync_run
    tracks = p["tracks"]
    assert [t["process"] for t in tracks] == sorted((t["process"] for t in tracks), key=run.timeline.processes.index)
    assert [t["name"] for t in tracks[:2]] == ["step", "step bounded by"] and tracks[0]["process"] == "controller"
    row = 0
    for t in tracks:
        assert t["row0"] == row and t["rows"] >= 1
        row += t["rows"]
    assert all(0 <= r < row for r in p["spans"]["r"])


def test_one_bound_span_per_step_named_by_what_bounded_it(sync_run):
    _, summary, p = sync_run
    cols = p["spans"]
    bound_row = next(t["row0"] for t in p["tracks"] if t["name"] == "step bounded by")
    bound = [i for i, r in enumerate(cols["r"]) if r == bound_row]
    per_step = summary["critical_path"]["per_step"]
    assert [p["names"][cols["n"][i]] for i in bound] == [r["bound_by"] for r in per_step]
    assert [p["args"][cols["a"][i]]["step"] for i in bound] == [r["step"] for r in per_step]
    assert [cols["d"][i] for i in bound] == pytest.approx([r["wall_s"] * 1e3 for r in per_step], abs=1e-3)
    keys = {p["colours"][cols["c"][i]]["key"] for i in bound}
    assert keys == {f"bound:{r['bound_by']}" for r in per_step}


def test_node_spans_name_their_node_and_take_their_kinds_colour(sync_run):
    run, _, p = sync_run
    cols = p["spans"]
    kinds = {n.name: n.kind for n in run.spec.nodes.values()}
    seen = set()
    for k, c, a in zip(cols["k"], cols["c"], cols["a"]):
        node = p["args"][a].get("node")
        if node in kinds:
            assert p["names"][k] == node
            assert p["colours"][c] == {"key": f"kind:{kinds[node]}", "colour": P.KIND_COLOURS[kinds[node]]}
            seen.add(kinds[node])
        else:
            assert k == -1
    assert {"rollout", "reward", "advantage", "train"} <= seen


def test_flows_join_rows_forward_in_time(sync_run):
    _, _, p = sync_run
    rows = sum(t["rows"] for t in p["tracks"])
    assert p["flows_total"] == len(p["flows"]) > 0
    for t0, r0, t1, r1, s0, s1 in p["flows"]:
        assert t1 >= t0 and 0 <= r0 < rows and 0 <= r1 < rows
        assert -1 <= s0 < p["spans_total"] and -1 <= s1 < p["spans_total"]


# ---------------------------------------------------------------------- small traces
def test_flows_past_the_budget_are_thinned_evenly(tmp_path):
    events = [
        {"name": "w", "cat": "compute", "ph": "X", "ts": k * 100.0, "dur": 50.0, "pid": 1, "tid": 1} for k in range(150)
    ]
    events += [
        {"name": "r", "cat": "compute", "ph": "X", "ts": k * 100.0 + 60, "dur": 30.0, "pid": 1, "tid": 2}
        for k in range(150)
    ]
    for k in range(150):
        events += [
            {"ph": "s", "id": k, "name": "f", "cat": "flow", "ts": k * 100.0 + 10, "pid": 1, "tid": 1},
            {"ph": "f", "bp": "e", "id": k, "name": "f", "cat": "flow", "ts": k * 100.0 + 70, "pid": 1, "tid": 2},
        ]
    run = _write(tmp_path, events)
    full = _payload(run, flow_budget=1000)
    thin = _payload(run, flow_budget=100)
    assert full["flows_total"] == thin["flows_total"] == len(full["flows"]) == 150
    assert len(thin["flows"]) == 100
    assert thin["flows"] == [full["flows"][int(k * 1.5)] for k in range(100)]
    names = full["names"]
    assert {(names[full["spans"]["n"][f[4]]], names[full["spans"]["n"][f[5]]]) for f in full["flows"]} == {("w", "r")}


def test_instants_and_counters_get_rows_and_lose_what_json_cannot_carry(tmp_path):
    run = _write(
        tmp_path,
        [
            {"name": "process_name", "ph": "M", "pid": 1, "tid": 0, "args": {"name": "controller"}},
            {"name": "thread_name", "ph": "M", "pid": 1, "tid": 1, "args": {"name": "work #2"}},
            {"name": "thread_name", "ph": "M", "pid": 1, "tid": 3, "args": {"name": "quiet"}},
            {
                "name": "a",
                "cat": "compute",
                "ph": "X",
                "ts": 1000.0,
                "dur": 500.0,
                "pid": 1,
                "tid": 1,
                "args": {"x": 1},
            },
            {
                "name": "b",
                "cat": "compute",
                "ph": "X",
                "ts": 2000.0,
                "dur": 500.0,
                "pid": 1,
                "tid": 1,
                "args": {"x": 1},
            },
            {"name": "mark", "ph": "i", "s": "g", "ts": 1200.0, "pid": 1, "tid": 1, "args": {}},
            {"name": "tick", "ph": "i", "s": "t", "ts": 1300.0, "pid": 1, "tid": 3, "args": {"v": float("nan")}},
            {"name": "mem", "ph": "C", "ts": 1100.0, "pid": 1, "tid": 1, "args": {"rss": 5, "bad": float("inf")}},
            {"name": "mem", "ph": "C", "ts": 1400.0, "pid": 1, "tid": 1, "args": {"rss": 7}},
        ],
    )
    p = _payload(run)
    # "work #2" is lane 1 of the track "work"; the counter and the span-less thread get tracks of their own
    assert p["tracks"] == [
        {"process": "controller", "name": "work", "row0": 0, "rows": 1},
        {"process": "controller", "name": "mem (counter)", "row0": 1, "rows": 1},
        {"process": "controller", "name": "quiet", "row0": 2, "rows": 1},
    ]
    assert p["spans"]["t"] == [0.0, 1.0] and p["spans"]["d"] == [0.5, 0.5] and p["spans"]["a"] == [0, 0]
    assert p["first_step_ms"] == 0.0 and p["duration_ms"] == 1.5
    # [t_ms, row (-1: global), name, args]
    assert [[t, r, p["names"][n], p["args"][a]] for t, r, n, a in p["instants"]] == [
        [0.2, -1, "mark", {}],
        [0.3, 2, "tick", {"v": "nan"}],
    ]
    assert p["counters"] == [{"row": 1, "name": "mem", "series": {"rss": [[0.1, 5.0], [0.4, 7.0]]}}]  # inf dropped
    assert p["colours"] == [{"key": "cat:compute", "colour": P.CATEGORY_COLOURS["compute"]}]


# ---------------------------------------------------------------------- helpers
@pytest.mark.parametrize(
    "key,colour",
    [
        ("kind:train", "#dc2626"),
        ("kind:function", "#0d9488"),
        ("cat:weights", "#a855f7"),
        ("cat:step", "#9ca3af"),
        ("bound:waiting for generation", P.KIND_COLOURS["rollout"]),
        ("bound:waiting for the trainer", "#cbd5e1"),
        ("bound:weight sync", P.CATEGORY_COLOURS["weights"]),
        ("bound:controller overhead", "#475569"),
    ],
)
def test_colours_of_kinds_categories_and_bounds(key, colour):
    assert P._colour(key) == colour


def test_other_colour_keys_get_a_stable_extra_colour():
    for key in ("kind:my_kind", "cat:-", "bound:train on model-actor", "cat:custom"):
        assert P._colour(key) in P.EXTRA_COLOURS and P._colour(key) == P._colour(key)
    assert P._colour("cat:custom") == P.EXTRA_COLOURS[sum(map(ord, "cat:custom")) % len(P.EXTRA_COLOURS)]


def test_colour_keys_of_spans():
    kinds = {"train": "train"}
    assert P._colour_key({"cat": "bound", "name": "weight sync", "args": {}}, kinds) == "bound:weight sync"
    assert P._colour_key({"cat": "node", "name": "x", "args": {"node": "train"}}, kinds) == "kind:train"
    assert P._colour_key({"cat": "node", "name": "x", "args": {"node": "other"}}, kinds) == "cat:node"
    assert P._colour_key({"cat": "", "name": "x", "args": {}}, kinds) == "cat:-"


@pytest.mark.parametrize(
    "thread,place",
    [
        ("train #3", ("p", "train", 2)),
        ("train", ("p", "train", 0)),
        ("a #b", ("p", "a #b", 0)),
        ("x #1", ("p", "x", 0)),
    ],
)
def test_a_threads_lane_comes_from_its_name(thread, place):
    assert P._place("p", thread) == place


def test_interner_and_finite():
    i = P._Interner()
    assert [i.add("a"), i.add({"x": 1, "y": 2}), i.add("a"), i.add({"y": 2, "x": 1}), i.add([1])] == [0, 1, 0, 1, 2]
    assert i.items == ["a", {"x": 1, "y": 2}, [1]]
    assert P._finite({"a": [1.0, float("-inf"), {"b": float("nan")}], "c": "s"}) == {
        "a": [1.0, "-inf", {"b": "nan"}],
        "c": "s",
    }


def test_the_merge_count_agrees_with_the_merge_for_any_quantum():
    """`_aggregate` sizes the quantum with the numpy count, then merges: on a row of spans that
    follow one another (as the spans of one lane and depth do) the two agree exactly."""
    import numpy as np

    rng = random.Random(3)
    spans, end = [], 0.0
    for _ in range(400):
        ts = end + rng.choice([0.0, 0.5, 2.0, 30.0, 300.0])
        dur = rng.choice([0.5, 3.0, 20.0, 500.0])
        end = ts + dur
        spans.append(
            {
                "name": "s",
                "cat": "c",
                "ts": ts,
                "dur": dur,
                "process": "p",
                "track": "t",
                "lane": 0,
                "depth": 0,
                "args": {},
                "open": False,
            }
        )
    idxs = list(range(len(spans)))
    ts = np.array([s["ts"] for s in spans])
    dur = np.array([s["dur"] for s in spans])
    arrays = [(ts, dur, np.maximum.accumulate(ts + dur))]
    counts = []
    for quantum in (0.1, 1.0, 4.0, 25.0, 100.0, 1e3, 1e5):
        kept, into = P._merge_short(spans, {0: idxs}, quantum, [])
        counts.append(len(kept))
        assert P._count_after_merging(arrays, quantum) == len(kept), quantum
        assert sorted(into) == idxs and all(0 <= k < len(kept) for k in into.values())
        assert sum(s.get("aggregated", 1) for s in kept) == len(spans)  # every span drawn once, alone or in a block
        assert [s["ts"] for s in kept] == sorted(s["ts"] for s in kept)
    assert counts == sorted(counts, reverse=True) and counts[0] == 400 and counts[-1] == 1
