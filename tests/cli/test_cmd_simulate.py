"""`areal-graph costs`, `areal-graph simulate` and `trace --json`'s steps window (cli/cmd_costs.py,
cli/cmd_simulate.py) on the recorded calibration run: the tables and the JSON carry what the
issue promises (steps_window_s, step_s_median, staleness_mean, busy), the prediction and the
measurement are comparable, and bad input is a message, not a traceback."""

from __future__ import annotations

import json

import pytest

from areal_graph.cli import cmd_costs, cmd_simulate
from areal_graph.cli.main import main
from support.calibration import unpack_calibration_run
from support.cli import parser_of
from support.paths import WORKFLOWS


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    return unpack_calibration_run(tmp_path_factory.mktemp("calibration_run"))


@pytest.fixture(autouse=True)
def _wide(monkeypatch):
    monkeypatch.setenv("COLUMNS", "240")


def test_costs_prints_each_fit_with_its_error_and_saves_the_model(run_dir, tmp_path, capsys):
    saved = tmp_path / "costs.json"
    assert cmd_costs.run(parser_of(cmd_costs, "costs")(str(run_dir), "--save", str(saved))) == 0
    out = capsys.readouterr().out
    assert "decode step" in out and "per item" in out and "output length, versions 0-5" in out
    assert json.loads(saved.read_text())["lengths"]["max_new_tokens"] == 64


def test_simulate_json_has_the_promised_keys_and_compares_with_trace_json(run_dir, capsys):
    args = parser_of(cmd_simulate, "simulate")(
        str(run_dir / "config.yaml"), "--calibrate", str(run_dir), "--json", "--seeds", "2"
    )
    assert cmd_simulate.run(args) == 0
    predicted = json.loads(capsys.readouterr().out)
    assert {"steps_window_s", "step_s_median", "staleness_mean", "busy"} <= set(predicted)
    assert set(predicted["busy"]) == {"inference-0", "trainer", "reward"}
    assert main(["trace", str(run_dir), "--json"]) == 0
    measured = json.loads(capsys.readouterr().out)["steps_window_s"]
    assert predicted["steps_window_s"] == pytest.approx(measured, rel=0.3)


def test_simulate_says_where_it_extrapolates_and_what_changes(run_dir, capsys):
    args = parser_of(cmd_simulate, "simulate")(
        str(WORKFLOWS / "ppo_async.yaml"), "runtime.steps=200", "runtime.max_staleness=0", "--calibrate", str(run_dir)
    )
    assert cmd_simulate.run(args) == 0
    out = capsys.readouterr().out
    assert "steps window" in out and "extrapolates:" in out and "policy versions 0-" in out


def test_a_calibration_slowed_from_outside_is_named_by_costs_and_simulate(run_dir, tmp_path, capsys):
    """A calibration whose decode steps ran 1.6x the engine probed alone (a busy loop beside it)
    makes every prediction about that much slow: costs and simulate say so, in
    their tables and their JSON, and a quiet one says nothing."""
    from areal_graph.perfmodel.calibration import load_costs

    model = load_costs(run_dir)
    for scale, warned in ((1.6, True), (1.05, False)):
        model.probe_scale = scale
        saved = tmp_path / f"costs-{scale}.json"
        model.save(saved)
        assert cmd_costs.run(parser_of(cmd_costs, "costs")(str(saved))) == 0
        assert ("warning:" in capsys.readouterr().out) is warned
        args = parser_of(cmd_simulate, "simulate")(
            str(run_dir / "config.yaml"), "--calibrate", str(saved), "--seeds", "1"
        )
        assert cmd_simulate.run(args) == 0
        printed = capsys.readouterr().out
        assert ("calibration:" in printed and "x1.60" in printed) is warned
        args = parser_of(cmd_simulate, "simulate")(
            str(run_dir / "config.yaml"), "--calibrate", str(saved), "--seeds", "1", "--json"
        )
        assert cmd_simulate.run(args) == 0
        assert (json.loads(capsys.readouterr().out)["calibration_warning"] is not None) is warned


def test_bad_input_is_a_message(run_dir, tmp_path, capsys):
    parse = parser_of(cmd_simulate, "simulate")
    assert cmd_simulate.run(parse(str(WORKFLOWS / "ppo_async.yaml"), "--calibrate", str(tmp_path))) == 1
    assert "not a run directory with a trace.json" in capsys.readouterr().err
    assert (
        cmd_simulate.run(parse(str(WORKFLOWS / "ppo_async.yaml"), "runtime.stepz=3", "--calibrate", str(run_dir))) == 1
    )
    assert "stepz" in capsys.readouterr().err
    spec_on = parse(
        str(WORKFLOWS / "ppo_async.yaml"), "inference.speculative.enabled=true", "--calibrate", str(run_dir)
    )
    assert cmd_simulate.run(spec_on) == 1
    assert "no shadow acceptance" in capsys.readouterr().err
    assert cmd_costs.run(parser_of(cmd_costs, "costs")(str(tmp_path / "none"))) == 1
    assert "no such run directory" in capsys.readouterr().err
