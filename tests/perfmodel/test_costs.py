"""perfmodel/costs.py on a real run's trace (tests/fixtures/calibration_run: 12 steps of
ppo_async.yaml recorded on a 2-core machine): every cost is fitted, the fits report their error,
the model round-trips through JSON, and the simulator driven by it predicts the run it came
from. Bad calibration input is an error that says what is wrong."""

from __future__ import annotations

import json
import shutil

import pytest

from areal_graph.graph.loader import load_workflow_text
from areal_graph.perfmodel.calibration import load_costs
from areal_graph.perfmodel.cost_model import (
    QUIET_OUTSIDE_CORES,
    QUIET_PROBE_SCALE,
    CostModel,
    calibration_warning,
    costs_summary,
    describe_costs,
)
from areal_graph.perfmodel.costs import CalibrationError
from areal_graph.perfmodel.simulator import simulate
from areal_graph.perfmodel.workflow_config import config_from_spec
from support.calibration import unpack_calibration_run


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    return unpack_calibration_run(tmp_path_factory.mktemp("calibration_run"))


@pytest.fixture(scope="module")
def costs(run_dir):
    return load_costs(run_dir)


def test_a_trace_without_the_admitted_column_says_what_it_cannot_price(costs):
    """The fixture predates the step log's admitted-requests column: the admission after a finish
    is priced at 0, and `costs` says so instead of leaving it silent."""
    assert costs.engine_admit_after_finish_ms == 0.0
    assert any("no admitted-requests column" in n for n in costs.notes)
    assert costs.outside_cores is None and any("does not measure the CPU other processes" in n for n in costs.notes)


def test_every_cost_is_fitted_with_its_error(costs):
    assert costs.decode_ms.n > 100 and costs.prefill_ms.n > 5
    assert abs(costs.decode_ms.total_rel_err) < 0.05 and costs.decode_ms.median_rel_err < 0.6
    assert 0 < costs.decode_ms.predict(rows=1, rows_x_width_k=0.05) < costs.decode_ms.predict(rows=64, rows_x_width_k=5)
    assert set(costs.model_calls) == {"train"} and costs.model_calls["train"].predict(tokens_k=2, seqs=32) > 0
    assert set(costs.generation_nodes_s) == {"reward"} and set(costs.controller_nodes_s) == {"advantage"}
    assert costs.sync_s >= 0 and costs.swap_s > 0 and 0 < costs.reprefill_keep <= 1
    assert costs.background_cpu and all(v["cpu_s_per_request"] >= 0 for v in costs.background_cpu.values())
    assert len(costs.lengths.groups) >= 40 and costs.lengths.max_new_tokens == 64
    assert costs.measured["steps"] == 12 and costs.calibrated["max_staleness"] == 4
    rows = describe_costs(costs)
    assert rows[0][0] == "decode step" and "per item" in rows[0][2]
    assert json.dumps(costs_summary(costs))


def test_the_model_round_trips_through_json(costs, tmp_path):
    path = tmp_path / "costs.json"
    costs.save(path)
    again = load_costs(path)
    assert again == CostModel.from_json(costs.to_json()) and again.decode_ms == costs.decode_ms
    assert again.lengths.groups == costs.lengths.groups


def test_the_simulation_predicts_the_run_it_was_fitted_on(costs, run_dir):
    spec = load_workflow_text((run_dir / "config.yaml").read_text())
    predicted = simulate(config_from_spec(spec, costs, machine_cores=costs.machine_cores), costs)
    measured = costs.measured["steps_window_s"]
    assert predicted.steps_window_s == pytest.approx(measured, rel=0.25)
    assert predicted.staleness_max <= 4


def test_bad_calibration_input_says_what_is_wrong(run_dir, tmp_path):
    with pytest.raises(FileNotFoundError, match="no such run directory"):
        load_costs(tmp_path / "nope")
    with pytest.raises(CalibrationError, match="not a run directory with a trace.json"):
        load_costs(tmp_path)
    short = tmp_path / "short"
    short.mkdir()
    shutil.copy(run_dir / "config.yaml", short / "config.yaml")
    events = json.loads((run_dir / "trace.json").read_text())
    events = events["traceEvents"] if isinstance(events, dict) else events
    steps = [e for e in events if e.get("cat") == "step"]
    cut = sorted(steps, key=lambda e: e["ts"])[3]["ts"]
    (short / "trace.json").write_text(json.dumps([e for e in events if e.get("ts", 0) < cut]))
    with pytest.raises(CalibrationError, match="3 training step"):
        load_costs(short)
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    with pytest.raises(CalibrationError, match="not a cost model"):
        load_costs(bad)


def test_a_trace_with_the_out_column_and_verifying_steps_fits_the_same(costs, run_dir, tmp_path):
    """Engines since speculative decoding log an eighth column (`out`) and verifying steps (kind 2,
    engine_spans.STEP_VERIFY): the decode and prefill fits read the old columns alone and leave
    the verifying steps out, so the same run fits the same; the verifying steps are fitted on
    their own (their time beyond their rows' plain step) and the prefill-based price is checked
    against them. A trace without shadow counts prices no speculation, and says so."""
    from areal_graph.engines.inference.engine_spans import STEP_VERIFY

    shutil.copytree(run_dir, tmp_path / "run")
    trace_path = tmp_path / "run" / "trace.json"
    trace = json.loads(trace_path.read_text())
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    changed = 0
    for e in events:
        if e.get("name") == "engine_steps":
            steps = e["args"]["steps"]
            # every row fed 3 tokens (2 proposed), the step 1.5x the plain one
            e["args"]["steps"] = [[*s, s[3]] for s in steps] + [
                [s[0], int(s[1] * 1.5), STEP_VERIFY, s[3], 3 * s[3], *s[5:], 2 * s[3]] for s in steps[::4] if s[2] == 1
            ]
            changed += sum(1 for s in steps[::4] if s[2] == 1)
    assert changed
    trace_path.write_text(json.dumps(trace))
    again = load_costs(tmp_path / "run")
    assert again.decode_ms == costs.decode_ms and again.prefill_ms == costs.prefill_ms
    assert any(f"{changed} verifying steps (speculative decoding) fitted directly" in n for n in again.notes)
    assert "probe_total_rel_err" not in again.verify_check  # recorded elsewhere: its forwards cannot be probed here
    assert again.verify_ms is not None and again.verify_check["steps"] == changed
    assert changed >= 20 and again.verify_ms.terms == ["1", "rows", "extra_k", "extra_x_width_m"]
    check = again.verify_check
    assert abs(check["fit_total_rel_err"]) < 0.02 and abs(check["fit_total_rel_err"]) <= abs(
        check["formula_total_rel_err"]
    )
    assert costs.verify_ms is None and not costs.verify_check
    assert costs.speculation is None and any("no shadow acceptance" in n for n in costs.notes)


def test_the_engine_work_outside_forwards_is_split_per_step_row_prefill_and_request(costs, run_dir):
    """The engine's busy time outside its forwards: per decode step and row (the gap between two
    decode steps of the same rows), per prefill forward (the gap after it, less the rows of the
    decode that follows), the rest per request served; the parts add up to what the trace holds,
    all divided by the calibration's preemption as the forwards are. Charged per decode step, a
    run with few rows per step was priced too slow; with nothing per prefill, a run admitting
    requests one at a time (a prefill each) too fast."""
    from statistics import median

    from areal_graph.engines.inference.engine_spans import STEP_DECODE, STEP_PREFILL
    from areal_graph.perfmodel.costs import _material, _requests_between
    from areal_graph.trace_analysis.trace_model import merge_intervals
    from areal_graph.trace_analysis.trace_run import load_run

    run = load_run(run_dir)
    m = _material(run.timeline)
    spans = [s for s in run.timeline.spans if s["name"] == "engine" and s["cat"] == "compute"]
    outside = sum(s["dur"] for s in spans) / 1e3 - sum(b - a for a, b in merge_intervals(m.busy["inference-0"])) * 1e3
    steps = m.steps["inference-0"]
    decodes = [r for r in steps if int(r[2]) == STEP_DECODE]
    prefills = sum(1 for r in steps if int(r[2]) == STEP_PREFILL)
    lo, hi = min(s["ts"] for s in spans) / 1e6, max(s["ts"] + s["dur"] for s in spans) / 1e6
    served = _requests_between(run.timeline, lo, hi + 1.0)
    p = costs.engine_preemption
    assert 0 <= costs.engine_step_overhead_ms < 0.5 and 0 <= costs.engine_row_overhead_ms < 0.05
    assert costs.engine_prefill_overhead_ms > 0.1 and costs.engine_request_overhead_ms > 0.1
    split = p * (
        costs.engine_step_overhead_ms * len(decodes)
        + costs.engine_row_overhead_ms * sum(r[3] for r in decodes)
        + costs.engine_prefill_overhead_ms * prefills
        + costs.engine_request_overhead_ms * served
    )
    assert split == pytest.approx(outside, rel=1e-6)
    after_prefill = [
        (b[0] - (a[0] + a[1])) * 1e3 - p * costs.engine_row_overhead_ms * b[3]
        for a, b in zip(steps[:-1], steps[1:])
        if int(a[2]) == STEP_PREFILL and int(b[2]) == STEP_DECODE and 0 <= b[0] - (a[0] + a[1]) < 0.002
    ]
    assert len(after_prefill) > 20
    assert costs.engine_prefill_overhead_ms * p == pytest.approx(median(after_prefill), rel=1e-6)


def test_a_probed_decode_shape_is_scaled_to_the_runs_own_steps(run_dir, tiny_model_dir):
    """Where the run's model is here, the decode fit's shape comes from the step probed alone at
    every batch size (1 row included, which the run itself barely decoded), scaled by one factor
    so that the run's own decode steps add up to what they took."""
    from areal_graph.perfmodel.costs import _fit_engine, _material, _probe_decode_shape, fit_costs
    from areal_graph.trace_analysis.trace_run import load_run

    run = load_run(run_dir)
    model = fit_costs(run, probe=False)
    m = _material(run.timeline)
    _fit_engine(run, m, model)
    before = model.decode_ms
    _probe_decode_shape(str(tiny_model_dir), m, model)
    after = model.decode_ms
    assert after is not before and after.lo[after.terms.index("rows")] == 1.0  # probed down to one row
    assert abs(after.total_rel_err) < 1e-9  # scaled to the run's total
    assert after.n == before.n and any("probed alone" in n for n in model.notes)
    assert model.engine_preemption >= 1.0  # the light load's share of the engine's cores, divided out first
    # the factor is kept (calibration_warning reads it), and it is the one the note reports
    (note,) = [n for n in model.notes if "probed alone" in n]
    assert model.probe_scale is not None and f"x{model.probe_scale:.2f} to the run's own decode steps" in note


@pytest.mark.parametrize(
    ("outside", "scale", "says"),
    [
        (None, None, None),  # neither measured (another machine, an old trace): nothing to go on
        (0.0, 1.07, None),  # a fresh calibration on a quiet machine (2026-11-30)
        (0.0, 1.6, None),  # measured quiet: the slow steps are the run's own (not outside it)
        (0.0, 0.5, "busier now"),  # measured quiet during the run, but the probe ran on a busy machine
        (0.59, 1.49, "0.59 cores"),  # a busy loop on one core beside the calibration (2026-11-30)
        (0.59, None, "0.59 cores"),  # ... where the probe could not run: no ratio quoted
        (None, 1.39, None),  # an old trace at 8 running, nothing else on the machine: not named
        (None, 1.63, "outside the run"),  # an old trace beside a busy loop (the long-tailed kit)
        (None, 0.5, "busier now"),  # the probe itself slowed
    ],
)
def test_a_calibration_slowed_from_outside_the_run_is_named(outside, scale, says):
    """The cost model cannot tell a machine slowed by something outside the run from slow work (a
    calibration beside a type check came out 1.4x slow, and so did every prediction from it). A
    trace since 2026-11-30 measures the others' CPU on the run's cores; an older one has only the
    engine probed alone, whose ratio to the run's steps is named only where it is clear."""
    model = CostModel(probe_scale=scale, outside_cores=outside)
    got = calibration_warning(model)
    if says is None:
        assert got is None
    else:
        assert says in got and (f"x{scale:.2f}" in got if scale is not None else " x" not in got)
    assert 1.39 < QUIET_PROBE_SCALE[1] < 1.63 and 0.0 < QUIET_OUTSIDE_CORES < 0.59
    assert costs_summary(model)["calibration_warning"] == got
    again = CostModel.from_json(model.to_json())
    assert (again.probe_scale, again.outside_cores) == (scale, outside)


def test_the_cpu_outside_the_run_is_the_cores_busy_time_less_the_runs():
    """_outside_load: over the cpu_time samples that bracket the training window, the busy time
    of the run's cores less what its processes used, per second; a trace without the machine's
    CPU (before 2026-11-30) gives None."""
    import numpy as np

    from areal_graph.perfmodel.costs import _Material, _outside_load

    cpu = [(9.0, {"a": 1.0, "b": 2.0}), (15.0, {"a": 4.0, "b": 3.0}), (21.0, {"a": 7.0, "b": 4.0})]
    m = _Material((10.0, 20.0), {"inference-0": np.zeros((0, 8))}, {}, {}, cpu)
    assert _outside_load(m) is None
    m.machine_cpu = {9.0: 100.0, 15.0: 106.0, 21.0: 113.0}  # 13 s busy over 12 s, the run used 8
    assert _outside_load(m) == pytest.approx(5.0 / 12.0)
    m.machine_cpu = {9.0: 100.0, 21.0: 107.9}  # coarser ticks than the processes': never below 0
    assert _outside_load(m) == 0.0
    m.machine_cpu = {9.0: 100.0, 21.0: 113.0}
    m.cpu = [(9.0, {"a": 1.0, "b": 2.0}), (21.0, {"a": 0.5, "b": 4.0})]  # `a` restarted: its CPU counts again from 0
    assert _outside_load(m) is None
    m.cpu = [(9.0, {"a": 1.0, "b": 2.0}), (21.0, {"b": 4.0})]  # `a` gone at the second sample
    assert _outside_load(m) is None


def test_a_model_saved_before_preemption_is_loaded_with_the_calibrations_bursts_divided_out():
    """benchmarks/reference/*.json were fitted with the background's bursts inside the forwards'
    costs; the simulator now applies them at the simulated run's load, so loading divides the
    calibration's out (1 / (1 - light load per core)), and a model saved since loads unchanged."""
    from pathlib import Path

    text = (Path(__file__).resolve().parents[2] / "benchmarks" / "reference" / "costs-longtail-2core.json").read_text()
    raw = json.loads(text)
    old = CostModel.from_json(text)
    light = sum(
        v["rate_cores"]
        for p, v in raw["background_cpu"].items()
        if v.get("rate_cores", 0) > 0 and not p.startswith("model-")
    )  # a model worker's is dropped (see below)
    assert old.engine_preemption == pytest.approx(1 / (1 - light / len(raw["machine_cores"])))  # unpinned
    assert old.decode_ms.coef == pytest.approx([c / old.engine_preemption for c in raw["decode_ms"]["coef"]])
    assert old.prefill_ms.coef == pytest.approx([c / old.engine_preemption for c in raw["prefill_ms"]["coef"]])
    again = CostModel.from_json(old.to_json())
    assert (
        again.decode_ms.coef == pytest.approx(old.decode_ms.coef) and again.engine_preemption == old.engine_preemption
    )


def test_a_model_worker_whose_calls_hop_threads_shows_no_training_as_background(costs, run_dir, tmp_path):
    """A model worker runs each call on whichever gRPC thread took it, so its compute spreads over
    threads; its background is what it used beyond its compute spans, however the threads split
    it (read as "beyond the busiest thread", half the training counted as background and slowed
    every simulated forward at the request rate). An inference server keeps the busiest-thread
    rule: its engine has a thread of its own, and what runs beside it is the server's overhead."""
    shutil.copytree(run_dir, tmp_path / "run")
    trace_path = tmp_path / "run" / "trace.json"
    trace = json.loads(trace_path.read_text())
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    first = min(e["ts"] for e in events if e.get("name") == "cpu_time")
    for e in events:
        if e.get("name") == "cpu_time":
            procs = e["args"]["processes"]
            model, server = procs["model-actor"], procs["inference-0"]
            model["threads_s"] = {"11": model["cpu_s"] / 2, "12": model["cpu_s"] / 2}  # the calls alternate
            beside = 0.25 * (e["ts"] - first) / 1e6  # 0.25 cores of gRPC handling beside the engine's thread
            server["threads_s"] = {"1": server["cpu_s"] - beside, "2": beside}
    trace_path.write_text(json.dumps(trace))
    split = load_costs(tmp_path / "run")
    assert split.background_cpu["model-actor"]["rate_cores"] == pytest.approx(
        costs.background_cpu["model-actor"]["rate_cores"], abs=1e-9
    )
    assert split.background_cpu["model-actor"]["rate_cores"] < 0.05
    assert split.background_cpu["inference-0"]["rate_cores"] == pytest.approx(0.25, rel=1e-6)


def test_a_model_saved_before_the_fix_loads_without_training_counted_as_background():
    from pathlib import Path

    text = (Path(__file__).resolve().parents[2] / "benchmarks" / "reference" / "costs-shipped-2core.json").read_text()
    raw = json.loads(text)
    assert raw["background_cpu"]["model-actor"]["rate_cores"] > 0.02
    old = CostModel.from_json(text)
    assert old.background_cpu["model-actor"]["rate_cores"] == 0.0
    assert old.background_cpu["reward"] == raw["background_cpu"]["reward"]


def test_a_prefill_right_after_a_finish_is_priced_by_its_own_gap():
    """The gap before a prefill forward is longer when the decode step before it finished a request
    (the one admitted replaces it: at few running, nearly every prefill): the fit takes the
    difference of the two medians, read off the rows (the next decode's rows are this one's, less
    those finished, plus those the prefill admitted); a step log without the admitted column (older
    traces) prices it at 0."""
    import numpy as np

    from areal_graph.engines.inference.engine_spans import STEP_DECODE, STEP_PREFILL
    from areal_graph.perfmodel.costs import _admission_after_finish, _Material

    rows, t = [], 0.0

    def step(kind: int, n: int, admitted: int, gap: float) -> None:
        nonlocal t
        rows.append([t, 0.001, kind, n, n, 10 * n, 10, admitted])
        t += 0.001 + gap

    for _ in range(6):  # a request finishes at the end of the first decode; its successor is admitted
        step(STEP_DECODE, 8, 8, 0.0006)
        step(STEP_PREFILL, 1, 1, 0.0001)
    for _ in range(7):  # a fresh group joins 8 running: nobody finished
        step(STEP_DECODE, 8, 8, 0.00015)
        step(STEP_PREFILL, 1, 8, 0.0001)
        step(STEP_DECODE, 16, 16, 0.00015)
        step(STEP_DECODE, 16, 16, 0.00015)  # 8 finish here, with no prefill after: not counted
    step(STEP_DECODE, 8, 8, 0.0)

    def material(steps: np.ndarray) -> _Material:
        return _Material((0.0, t), {"inference-0": steps}, {}, {}, [])

    seconds, how_often = _admission_after_finish(material(np.array(rows)))
    assert seconds == pytest.approx(0.0006 - 0.00015, rel=1e-6) and how_often == 6
    assert _admission_after_finish(material(np.array(rows)[:, :7])) == (0.0, 0)
