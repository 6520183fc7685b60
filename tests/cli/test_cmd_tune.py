"""`areal-graph tune` (cli/cmd_tune.py) on the recorded calibration run: it ranks configurations,
each a list of overrides the workflow accepts, says what to run, and refuses bad options."""

from __future__ import annotations

import json

import pytest

from areal_graph.cli import cmd_tune
from areal_graph.graph.loader import load_workflow
from support.calibration import unpack_calibration_run
from support.cli import parser_of
from support.paths import WORKFLOWS

parse = parser_of(cmd_tune, "tune")


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    return unpack_calibration_run(tmp_path_factory.mktemp("calibration_run"))


def test_tune_ranks_configurations_the_workflow_accepts(run_dir, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "240")
    args = parse(
        str(WORKFLOWS / "ppo_async.yaml"),
        "runtime.steps=40",
        "inference.kv_on_update=recompute",  # keeping the cache is then priced beside the search
        "--calibrate",
        str(run_dir),
        "--top",
        "3",
        "--seeds",
        "1",
        "--search-speculative",
        "--json",
    )
    assert cmd_tune.run(args) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["max_staleness_searched"] == 4 and len(out["best"]) == 3 and out["simulations"] > 50
    # the recorded run predates shadow counting: speculation is not searched, and the output says why
    assert not out["speculation_searched"] and "no shadow acceptance" in out["speculation_note"]
    assert not any(c["speculative"] for c in [out["given"], *out["best"]])
    assert out["kv_keep"]["overrides"][0] == "inference.kv_on_update=keep" and out["kv_keep"]["steps_window_s"] > 0
    windows = [c["steps_window_s"] for c in out["best"]]
    assert windows == sorted(windows) and windows[0] <= out["given"]["steps_window_s"] * 1.02
    for cand in out["best"]:
        spec = load_workflow(WORKFLOWS / "ppo_async.yaml", ["runtime.steps=40", *cand["overrides"]])
        assert spec.runtime.max_staleness <= 4
    args = parse(
        str(WORKFLOWS / "ppo_async.yaml"), "runtime.steps=40", "--calibrate", str(run_dir), "--top", "2", "--seeds", "1"
    )
    assert cmd_tune.run(args) == 0
    printed = capsys.readouterr().out
    assert "the best configurations, predicted" in printed and "use: areal-graph run" in printed
    assert "calibration:" not in printed and out["calibration_warning"] is None  # recorded elsewhere: not probed
    assert "speculative decoding not searched (ask with --search-speculative" in printed
    # a workflow that speculates cannot be priced on this calibration: a message, not a guess
    args = parse(
        str(WORKFLOWS / "ppo_async.yaml"),
        "inference.speculative.enabled=true",
        "--calibrate",
        str(run_dir),
        "--top",
        "1",
    )
    assert cmd_tune.run(args) == 1
    assert "cannot price speculative decoding" in capsys.readouterr().err


def test_tune_names_a_calibration_slowed_from_outside_the_run(run_dir, tmp_path, capsys, monkeypatch):
    """The engine's share of every prediction is slowed alike, which shifts the ranking between
    engine- and trainer-bound configurations: tune says so above what to run."""
    from areal_graph.perfmodel.calibration import load_costs

    monkeypatch.setenv("COLUMNS", "240")
    model = load_costs(run_dir)
    model.probe_scale = 1.6
    model.save(tmp_path / "costs.json")
    args = parse(
        str(WORKFLOWS / "ppo_async.yaml"), "runtime.steps=20", "--calibrate", str(tmp_path / "costs.json"), "--top", "1"
    )
    assert cmd_tune.run(args) == 0
    printed = capsys.readouterr().out
    assert "calibration:" in printed and "x1.60" in printed and "use: areal-graph run" in printed


def test_bad_options_are_refused(run_dir, capsys):
    assert cmd_tune.run(parse(str(WORKFLOWS / "ppo_async.yaml"), "--calibrate", str(run_dir), "--top", "0")) == 2
    assert "--top" in capsys.readouterr().err


def test_verify_interleaves_its_rounds_and_reports_the_median_of_each_rounds_speedup(run_dir, tmp_path, monkeypatch):
    """--verify --verify-rounds 3: the best and the workflow as given run three times each, the order
    alternating by round (best first, then as given first, ...), and the speed-up is the median of
    the ratios within each round, never a ratio across rounds."""
    from areal_graph.cli.measured_run import MeasuredRun

    windows = iter([10.0, 13.0, 15.0, 12.0, 10.0, 11.0])  # round 1: best, given; round 2: given, best; ...
    ran: list[str] = []

    def fake_run(workflow, overrides, run_dir_, log, **_):
        ran.append(run_dir_.name)
        return MeasuredRun(run_dir_, exit_code=0, window_s=next(windows))

    monkeypatch.setattr(cmd_tune, "measured_run", fake_run)
    args = parse(
        str(WORKFLOWS / "ppo_async.yaml"),
        "runtime.steps=10",
        "--calibrate",
        str(run_dir),
        "--top",
        "1",
        "--seeds",
        "1",
        "--verify",
        "--verify-rounds",
        "3",
        "--work-dir",
        str(tmp_path),
    )
    out = {}
    monkeypatch.setattr(cmd_tune, "_print", lambda console, a, o: out.update(o))
    assert cmd_tune.run(args) == 0
    assert ran == [
        "verify-best-1",
        "verify-as-given-1",
        "verify-as-given-2",
        "verify-best-2",
        "verify-best-3",
        "verify-as-given-3",
    ]
    rows = {r["label"]: r for r in out["verify"]}
    assert rows["best"]["measured_rounds"] == [10.0, 12.0, 10.0] and rows["best"]["measured_s"] == 10.0
    assert rows["as given"]["measured_rounds"] == [13.0, 15.0, 11.0] and rows["as given"]["measured_s"] == 13.0
    speedup = out["verified_speedup"]
    assert speedup["rounds"] == pytest.approx([1.3, 1.25, 1.1]) and speedup["median"] == pytest.approx(1.25)
    assert speedup["predicted"] == pytest.approx(rows["as given"]["predicted_s"] / rows["best"]["predicted_s"])
    assert (
        cmd_tune.run(parse(str(WORKFLOWS / "ppo_async.yaml"), "--calibrate", str(run_dir), "--verify-rounds", "0")) == 2
    )
