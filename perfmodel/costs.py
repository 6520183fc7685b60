"""What each part of a run costs, read off the run's own trace and metrics.

`fit_costs(run)` turns one finished run (trace_analysis/trace_run.py `RunMaterial`)
into a `CostModel`: every engine forward (prefill chunks and decode steps, against batch and
context), each training-side call (train, log-prob passes, against tokens), the weight sync,
the generation-side nodes (reward), the rollout's own overhead, the controller's per-step
overhead, the background CPU of the processes that show no compute spans (controller,
rollout and reward workers, the servers' HTTP handling), and the output-length
distribution by policy version (`LengthModel`: it drifts as the policy learns).

Each measured time is divided by the CPU slowdown it ran under (perfmodel/cpu.py: who else
was computing on its cores at that moment), so the fitted costs are what the work takes alone
on its placement; the simulator multiplies them back for the placement and moment it
simulates. Every fit keeps its error on the run it came from, and `describe_costs` prints them.

What the trace must hold (recorded since placement and the engine's step log existed): the
`engine_steps` spans of the inference servers, and ideally `cpu_time` and `placement`. A run
without engine steps (older, or vLLM/SGLang servers, which record no steps) is an error that
says so.
"""

from __future__ import annotations

import bisect
import math
import platform
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from areal_graph.engines.inference.engine_spans import STEP_DECODE, STEP_PREFILL, STEP_VERIFY
from areal_graph.graph.kinds.common import actor_model
from areal_graph.modelkit.builtin import resolve_model_path
from areal_graph.perfmodel.cost_model import LENGTH_WINDOW, CostModel, LengthModel, SidePlacement
from areal_graph.perfmodel.cpu import preemption, slowdown
from areal_graph.perfmodel.engine_probe import probe_decode, probe_verify
from areal_graph.perfmodel.fits import LinearFit, fit_linear, median
from areal_graph.perfmodel.speculation import Acceptance, fed_token_ms, verify_fixed_ms, verify_token_ms
from areal_graph.runtime.orchestration.placement import thread_split, usable_cores
from areal_graph.trace_analysis.speculation_summary import add_positions
from areal_graph.trace_analysis.trace_model import merge_intervals
from areal_graph.trace_analysis.trace_stats import training_window

MIN_STEPS = 10  # a calibration run needs at least this many training steps
DECODE_TERMS = ["1", "rows", "rows_x_width_k"]
PREFILL_TERMS = ["1", "padded_k", "padded_x_width_m"]  # padded positions; attention over the window
CALL_TERMS = ["1", "tokens_k", "seqs", "microbatches"]
# a verifying step beyond its rows' plain decode step: fixed, per row, per extra fed token, per extra token x window
VERIFY_TERMS = ["1", "rows", "extra_k", "extra_x_width_m"]
MIN_VERIFY_STEPS = 20  # verifying steps a run's own fit needs (fewer: the probe's, or the prefill-based price)


class CalibrationError(ValueError):
    """The run cannot calibrate the model (no trace, too few steps, no engine step log)."""


# ============================================================================ reading the run
@dataclass
class _Material:
    """What the fit reads off a timeline, in seconds."""

    window: tuple[float, float]
    steps: dict[str, np.ndarray]  # server -> rows [t, dur, kind, rows, tokens, ctx, width(, out)]
    busy: dict[str, list[tuple[float, float]]]  # process -> compute intervals
    placement: dict[str, dict[str, Any]]
    cpu: list[tuple[float, dict[str, float]]]
    cpu_threads: dict[float, dict[str, dict[str, float]]] = field(
        default_factory=dict
    )  # time -> process -> thread -> s
    # the decode fit's samples (x, ms alone on the placement, slowdown), kept for the probe's rescaling
    decode_samples: tuple[list, list, list] = ([], [], [])
    # verifying steps (speculation): (rows, extra fed tokens, width, ms alone on the placement, slowdown)
    verify_samples: list[tuple[float, float, float, float, float]] = field(default_factory=list)
    # time -> busy CPU seconds of the cores the run could use, whoever used them (traces since 2026-11-30)
    machine_cpu: dict[float, float] = field(default_factory=dict)


def _material(tl: Any) -> _Material:
    window = training_window(tl)
    if window is None:
        raise CalibrationError("the run has no training steps in its trace: it cannot calibrate the model")
    steps: dict[str, list[list[float]]] = defaultdict(list)
    busy: dict[str, list[tuple[float, float]]] = defaultdict(list)
    placement: dict[str, dict[str, Any]] = {}
    cpu: list[tuple[float, dict[str, float]]] = []
    threads: dict[float, dict[str, dict[str, float]]] = {}
    machine: dict[float, float] = {}
    for s in [*tl.spans, *tl.profiles]:
        name, proc = s["name"], s["process"]
        if name == "engine_steps":
            t0 = s["ts"] / 1e6
            steps[proc].extend([t0 + r[0] / 1e6, r[1] / 1e6, *r[2:]] for r in s["args"].get("steps", []))
        elif name == "placement" and isinstance(s["args"].get("processes"), dict):
            placement = s["args"]["processes"]
        elif name == "cpu_time" and isinstance(s["args"].get("processes"), dict):
            procs = s["args"]["processes"]
            cpu.append((s["ts"] / 1e6, {p: float(v.get("cpu_s", 0.0)) for p, v in procs.items()}))
            threads[s["ts"] / 1e6] = {
                p: v["threads_s"] for p, v in procs.items() if isinstance(v.get("threads_s"), dict)
            }
            if isinstance(s["args"].get("machine"), dict):
                machine[s["ts"] / 1e6] = float(s["args"]["machine"].get("cpu_s", 0.0))
        elif s["cat"] == "compute" and s["dur"] > 0 and proc.startswith("model-"):
            busy[proc].append((s["ts"] / 1e6, (s["ts"] + s["dur"]) / 1e6))
    if not steps:
        raise CalibrationError(
            "the trace has no engine step log (engine_steps spans): it comes from a run older "
            "than the cost model, or from vLLM/SGLang servers, which record none; run the "
            "workflow again with the embedded engine"
        )
    arrays = {p: np.array(sorted(rows), dtype=float) for p, rows in steps.items()}
    for p, a in arrays.items():
        busy[p] = [(float(t), float(t + d)) for t, d in a[:, :2]]
    busy_sorted = {p: sorted(v) for p, v in busy.items()}
    return _Material(window, arrays, busy_sorted, placement, sorted(cpu), threads, machine_cpu=machine)


def _overlap(intervals: list[tuple[float, float]], a: float, b: float) -> float:
    """Seconds of [a, b] covered by sorted, non-overlapping-or-not `intervals`."""
    if b <= a or not intervals:
        return 0.0
    i = max(bisect.bisect_left(intervals, (a,)) - 1, 0)
    total = 0.0
    for x, y in intervals[i:]:
        if x >= b:
            break
        total += max(0.0, min(b, y) - max(a, x))
    return min(total, b - a)


def _side(placement: dict[str, dict[str, Any]], process: str, threads: int) -> SidePlacement:
    p = placement.get(process) or {}
    return SidePlacement(list(p["cores"]) if p.get("cores") else None, int(p.get("threads") or threads))


# ============================================================================ the fit
def fit_costs(run: Any, probe: bool = True) -> CostModel:
    """The cost model of one run (`RunMaterial`); raises CalibrationError when it cannot.

    probe: measure the engine's decode (and verifying) step alone on the run's model
    (perfmodel/engine_probe.py, a few seconds), when the run was recorded on this machine and its model
    is here."""
    spec = run.spec
    if spec is None:
        raise CalibrationError(
            f"{run.path}: no readable config.yaml beside the trace: the cost model needs the workflow that ran"
        )
    m = _material(run.timeline)
    steps = [s for s in run.timeline.spans if s["cat"] == "step"]
    if len(steps) < MIN_STEPS:
        raise CalibrationError(
            f"{run.path}: {len(steps)} training step(s) in the trace; calibrating needs at "
            f"least {MIN_STEPS} (30 give fits within a few percent)"
        )

    gen_t, train_t = thread_split(spec.runtime.max_staleness)
    model = CostModel(source=str(run.path))
    cores = sorted({c for p in m.placement.values() for c in (p.get("affinity") or p.get("cores") or ())})
    model.machine_cores = cores or list(usable_cores())
    model.inference = _side(m.placement, "inference-0", 1)
    model.training = _side(m.placement, f"model-{run.plan.actor}", train_t)
    model.other = _side(m.placement, "controller", 1)
    model.calibrated = calibration_settings(spec)
    bg = _background(run, m, model)
    model.background_cpu = bg
    model.outside_cores = _outside_load(m)
    if model.outside_cores is None:
        model.notes.append(
            "the trace does not measure the CPU other processes took during the run (traces before 2026-11-30, "
            "runs not on the local launcher, or a process restarted in the window): a calibration slowed by other "
            "work is caught only when its steps ran over 1.5x the engine's step timed on its own"
        )
    model.speculation = shadow_acceptance(run.timeline)
    _fit_engine(run, m, model)
    if probe:
        _probe_engine(run, m, model)
    _fit_verify(m, model)
    if model.speculation is None:
        model.notes.append(
            "no shadow acceptance in the trace (speculation_shadow records): speculative decoding cannot be "
            "priced from this calibration"
        )
    _fit_model_calls(run, m, model)
    _fit_controller(run, m, model)
    model.lengths = _lengths(run, spec)
    model.measured = _measured(run, m)
    return model


def calibration_settings(spec: Any) -> dict[str, Any]:
    """The settings of a workflow the simulator varies (and the cost model was fitted under)."""
    src = next(n for n in spec.nodes.values() if n.kind == "rollout")
    rt = spec.runtime
    return {
        "batch_size": rt.batch_size,
        "max_staleness": rt.max_staleness,
        "group_size": src.params.group_size,
        "max_concurrent_rollouts": rt.max_concurrent_rollouts,
        "max_running_requests": spec.inference.max_running_requests,
        "servers": spec.inference.servers,
        "max_new_tokens": src.params.sampling.max_new_tokens,
        "max_tokens_per_microbatch": rt.max_tokens_per_microbatch,
        "steps": rt.steps,
        "actor": actor_model(spec),
        "model_path": spec.models[actor_model(spec) or ""].path,
        "backend": spec.inference.backend,
    }


def _background(run: Any, m: _Material, model: CostModel) -> dict[str, dict[str, Any]]:
    """CPU each process used beyond its compute spans, per request finished, from the cpu_time
    samples that bracket the training window."""
    inside = _window_samples(m)
    if len(inside) < 2:
        model.notes.append(
            "fewer than two CPU samples in the training window: background CPU (controller, "
            "rollout, reward) is not modelled; a run of at least ~10 s of steps records them"
        )
        return {}
    (ta, ca), (tb, cb) = inside[0], inside[-1]
    finished = max(_requests_between(run.timeline, ta, tb), 1)
    out: dict[str, dict[str, Any]] = {}
    threads_a, threads_b = dict(m.cpu_threads.get(ta, {})), dict(m.cpu_threads.get(tb, {}))
    for proc in sorted(set(ca) & set(cb)):
        used = cb[proc] - ca[proc]
        threads = (m.placement.get(proc) or {}).get("threads") or 1
        if proc in threads_a and proc in threads_b and proc.startswith("inference-"):
            # what the server used beyond its busiest thread over the window (the engine's): HTTP and gRPC
            # handling, (de)serialisation; it competes with the compute when both share one core. Not so for a
            # model worker: its calls run on whichever gRPC thread took them, so its compute spreads over
            # threads (two threads of ~1.8 s each in one 60-step run), and "beyond the busiest thread" would
            # count the training itself again, at the request rate (0.15-0.3 cores in most calibrations)
            a, b = threads_a[proc], threads_b[proc]
            busiest = max((b[t] - a.get(t, 0.0) for t in b), default=0.0)
            extra = max(used - busiest, 0.0)
        else:
            computed = _overlap(m.busy.get(proc, []), ta, tb) * threads
            extra = max(used - computed, 0.0)
        side = (m.placement.get(proc) or {}).get("side") or (
            "inference" if proc.startswith("inference-") else "training" if proc.startswith("model-") else "other"
        )
        out[proc] = {"cpu_s_per_request": extra / finished, "side": side, "rate_cores": extra / (tb - ta)}
    return out


def _window_samples(m: _Material) -> list[tuple[float, dict[str, float]]]:
    """The cpu_time samples that bracket the training window (they come every few seconds: one
    just before its start and one just after its end count)."""
    lo, hi = m.window
    return [(t, c) for t, c in m.cpu if lo - 1.0 <= t <= hi + 3.0]


def _outside_load(m: _Material) -> float | None:
    """Cores that processes outside the run kept busy, on the cores the run could use, over the
    training window: the cores' busy time less the run's processes' CPU (the cpu_time samples that
    bracket the window, as `_background` reads them). None for a trace that did not record the
    machine's CPU (before 2026-11-30).

    Why: the cost model cannot tell a machine slowed by something else (a build, a type check,
    another job) from slow work, and every prediction from such a calibration inherits it (one
    taken beside a type check came out 1.4x slow). This measures that something directly. A
    process that restarted inside the window gives None (its counter started again); CPU of a
    process's children that exited before a sample reads as outside load."""
    inside = [(t, c) for t, c in _window_samples(m) if t in m.machine_cpu]
    if len(inside) < 2:
        return None
    (ta, ca), (tb, cb) = inside[0], inside[-1]
    if tb <= ta:
        return None
    used = {p: cb[p] - ca[p] for p in set(ca) & set(cb)}
    if set(ca) != set(cb) or any(u < 0 for u in used.values()):
        return None  # a process restarted inside the window: its lost CPU would read as someone else's
    return max(m.machine_cpu[tb] - m.machine_cpu[ta] - sum(used.values()), 0.0) / (tb - ta)


def _requests_between(tl: Any, a: float, b: float) -> int:
    return sum(1 for s in tl.spans if s["name"] == "finished" and a * 1e6 <= s["ts"] < b * 1e6)


def _fit_engine(run: Any, m: _Material, model: CostModel) -> None:
    """Decode and prefill costs alone, the interference of a computing trainer, and the engine's
    own scheduling between forwards.

    Interference: two torch workloads on different cores still slow each other (shared caches
    and memory bandwidth: a matmul loop on the other core made a decode step ~40% slower on
    this project's 2-core machines), which the CPU model (cores asked for vs cores there) does
    not see. Its size is read off the run: steps decoded while the trainer computed against
    steps decoded while it did not, at the same batch and context."""
    bg = model.background_demands()
    cores = model.machine_cores
    trainer = sorted(iv for p, v in m.busy.items() if p.startswith("model-") for iv in v)
    engine = model.inference.demand()
    preempted = preemption(engine, bg, cores)  # the light load's bursts on the engine's cores (cpu.py)
    model.engine_preemption = preempted
    slow_with = slowdown(engine, [model.training.demand(), *bg], cores) * preempted
    slow_alone = slowdown(engine, bg, cores) * preempted
    steps = [
        (kind, n, tokens, ctx, width, dur, _overlap(trainer, t, t + dur) / dur if dur > 0 else 0.0)
        for rows in m.steps.values()
        for t, dur, kind, n, tokens, ctx, width, *_ in rows  # traces since speculation add `out`
        if kind in (STEP_PREFILL, STEP_DECODE)  # verifying steps (speculation): _fit_verify
    ]

    def x_of(kind: int, n: float, tokens: float, ctx: float, width: float) -> dict[str, float]:
        if kind == 1:
            return {"rows": n, "rows_x_width_k": n * width / 1e3}
        return {"tokens_k": tokens / 1e3, "padded_k": ctx / 1e3, "padded_x_width_m": ctx * width / 1e6}

    def fit(kind: int, interference: float, only_alone: bool = False) -> tuple[LinearFit, list, list, list]:
        xs, ys, ss = [], [], []
        for k, n, tokens, ctx, width, dur, share in steps:
            if k != kind or (only_alone and share > 0.1):
                continue
            sl = (slow_alone + share * (slow_with - slow_alone)) * (1.0 + interference * share)
            xs.append(x_of(k, n, tokens, ctx, width))
            ys.append(dur * 1e3 / sl)
            ss.append(sl)
        terms = DECODE_TERMS if kind == 1 else PREFILL_TERMS
        return fit_linear(xs, ys, terms), xs, ys, ss

    alone, *_ = fit(1, 0.0, only_alone=True)
    together = [
        (dur * 1e3, alone.predict(**x_of(k, n, tokens, ctx, width)) * (slow_with if share > 0.9 else 1.0))
        for k, n, tokens, ctx, width, dur, share in steps
        if k == 1 and share > 0.9
    ]
    if alone.n >= 30 and len(together) >= 30:
        model.interference = float(min(max(sum(a for a, _ in together) / sum(b for _, b in together) - 1.0, 0.0), 1.0))
    else:
        model.notes.append(
            "too few decode steps with and without the trainer computing to measure how much they "
            "slow each other: taken as none"
        )
    for rows in m.steps.values():
        for t, dur, kind, n, tokens, _ctx, width, *_ in rows:
            if int(kind) == STEP_VERIFY and dur > 0:
                share = _overlap(trainer, t, t + dur) / dur
                sl = (slow_alone + share * (slow_with - slow_alone)) * (1.0 + model.interference * share)
                m.verify_samples.append((float(n), float(tokens - n), float(width), dur * 1e3 / sl, sl))
    decode, dx, dy, ds = fit(1, model.interference)
    m.decode_samples = (dx, dy, ds)
    prefill, px, py, ps = fit(0, model.interference)
    model.decode_ms = _with_measured_error(decode, dx, dy, ds)
    model.prefill_ms = _with_measured_error(prefill, px, py, ps)
    _engine_overheads(run, m, model)
    swaps = [s for s in run.timeline.spans if s["name"] == "weight_swap"]
    model.swap_s = median([s["dur"] / 1e6 for s in swaps])
    resumed = sum(int(s["args"].get("prefill_tokens") or 0) for s in run.timeline.spans if s["name"] == "resumed")
    if resumed:
        real = sum(float(r[4]) for rows in m.steps.values() for r in rows if r[2] == 0)
        fresh = sum(
            int(s["args"].get("prompt_tokens") or 0)
            for s in run.timeline.spans
            if s["name"] == "request" and str(s["args"].get("rid", "")).endswith("-0")
        )
        model.reprefill_keep = float(min(max((real - fresh) / resumed, 0.05), 1.0))


def _engine_overheads(run: Any, m: _Material, model: CostModel) -> None:
    """The engine's time outside its forwards: per decode step and row, per prefill forward, per
    request served.

    Why split so: the engine's busy spans (`engine` compute spans: its steps, back-to-back ones
    merged) hold more than its forwards: the loop between two steps, each row's bookkeeping after
    sampling, each prefill's sampling of first tokens and joining of the batched KV cache, and per
    request leaving the cache and resolving it. Charged all per decode step, a run with few rows
    per step (many more steps for the same requests) was priced up to twice too slow; charged per
    decode step and per request only, a run that admits requests one at a time (8 running, a
    queue: a prefill per request where the calibration had one per group) was priced too fast
    (across 23 runs of both kits, the time outside forwards was ~0.7-1.2 ms per prefill and ~0
    per decode step beyond its rows). Read off the run's own gaps between forwards while the
    engine runs without pause (under the 2 ms at which its busy spans merge): a decode step
    followed by one of the same rows (nobody left or joined) gives the per-step and per-row
    cost; the gap after a prefill, less the rows of the decode that follows, the per-prefill
    cost; the rest of the busy time outside forwards is per request served. All are divided by
    the calibration's preemption, as the forwards' fits are: the simulator applies its own."""
    spans = [s for s in run.timeline.spans if s["name"] == "engine" and s["cat"] == "compute"]
    engine_spans = sum(s["dur"] / 1e6 for s in spans)
    if not engine_spans:
        return
    busy = sum(b - a for p, v in m.busy.items() if p.startswith("inference-") for a, b in merge_intervals(v))
    steady: list[tuple[float, float]] = []  # (rows, gap) of decode steps followed by one of the same rows
    after_prefill: list[tuple[float, float]] = []  # (rows of the next decode, gap) of prefill forwards
    decodes = decoded_rows = prefills = 0
    for rows in m.steps.values():
        for here, after in zip(rows, [*rows[1:], None]):
            kind = int(here[2])
            decodes += kind == STEP_DECODE
            decoded_rows += int(here[3]) if kind == STEP_DECODE else 0
            prefills += kind == STEP_PREFILL
            if after is None:
                continue
            gap = after[0] - (here[0] + here[1])
            if not 0.0 <= gap < 0.002:
                continue
            if kind == STEP_DECODE and int(after[2]) == STEP_DECODE and after[3] == here[3]:
                steady.append((float(here[3]), gap))
            elif kind == STEP_PREFILL and int(after[2]) == STEP_DECODE:
                after_prefill.append((float(after[3]), gap))
    per_step, per_row = 0.0, 0.0
    if len(steady) >= 10:
        x = np.array([r for r, _ in steady])
        y = np.array([g for _, g in steady])
        if np.ptp(x) > 0:  # the slope by least squares; the intercept by the median, robust to stray gaps
            per_row = max(float(np.polyfit(x, y, 1)[0]), 0.0)
        per_step = max(float(np.median(y - per_row * x)), 0.0)
    per_prefill = max(median([g - per_row * r for r, g in after_prefill]), 0.0) if after_prefill else 0.0
    admit_after_finish, finish_admits = _admission_after_finish(m)
    if any(rows.shape[1] < 8 for rows in m.steps.values()):
        model.notes.append(
            "the engine's step log has no admitted-requests column (a trace from before speculative decoding): "
            "a prefill admitted right after a request finished is priced like any other (runs at 8-16 running "
            "come out ~2-4% fast); record the calibration again to price it"
        )
    lo = min(s["ts"] for s in spans) / 1e6
    hi = max(s["ts"] + s["dur"] for s in spans) / 1e6
    served = _requests_between(run.timeline, lo, hi + 1.0)
    rest = engine_spans - busy - per_step * decodes - per_row * decoded_rows - per_prefill * prefills
    rest -= admit_after_finish * finish_admits
    p = model.engine_preemption
    model.engine_step_overhead_ms = per_step * 1e3 / p
    model.engine_row_overhead_ms = per_row * 1e3 / p
    model.engine_prefill_overhead_ms = per_prefill * 1e3 / p
    model.engine_admit_after_finish_ms = admit_after_finish * 1e3 / p
    model.engine_request_overhead_ms = max(rest, 0.0) / served * 1e3 / p if served else 0.0


def _admission_after_finish(m: _Material) -> tuple[float, int]:
    """(seconds, how often): what a prefill waits beyond the loop when the decode step before it
    finished a request, and how often that happened in the run.

    Why: the gap between a decode step and a prefill forward was ~0.15 ms when nobody had finished
    and 0.5-0.7 ms when a request had (the calibration runs of both kits; the same in runs at 8 or
    16 running, where nearly every prefill admits the request that replaces one just finished, so
    there it is a tenth of the engine's time). Whether a request finished is read off the rows:
    the next decode step's rows are this one's, less those that finished, plus those the
    prefills between admitted (a step log's eighth column: traces from before speculative
    decoding have none, and price it at 0)."""
    after: list[float] = []
    none: list[float] = []
    for rows in m.steps.values():
        if rows.shape[1] < 8:
            return 0.0, 0
        decode_at = [i for i in range(len(rows)) if int(rows[i][2]) == STEP_DECODE]
        for here, nxt in zip(decode_at, decode_at[1:]):
            if nxt == here + 1 or any(int(rows[k][2]) != STEP_PREFILL for k in range(here + 1, nxt)):
                continue
            gap = rows[here + 1][0] - (rows[here][0] + rows[here][1])
            if not 0.0 <= gap < 0.002:
                continue
            joined = sum(int(rows[k][7]) for k in range(here + 1, nxt))
            finished = rows[here][3] + joined - rows[nxt][3]
            (after if finished > 0 else none).append(gap)
    if len(after) < 5 or len(none) < 5:
        return 0.0, len(after)
    return max(median(after) - median(none), 0.0), len(after)


def _fit_verify(m: _Material, model: CostModel) -> None:
    """A run that speculated: its verifying steps priced directly, and the prices a calibration
    without speculation has to go on checked against them: the prefill-based one
    (perfmodel/speculation.py `fed_token_ms`) and the probe's (`_probe_verify`, when it ran).

    What a verifying step took beyond the plain decode step of its rows (the decode fit at its
    rows and window) is fitted on VERIFY_TERMS: a fixed cost and one per row (the proposal
    lookup, the index tensors and the per-position sampling a verifying step does whatever it is
    fed), and one per extra fed token and per extra token x window (the forward's compute).
    `verify_check` keeps how far each price is from the measured steps."""
    samples = m.verify_samples
    if not samples:
        return
    dec = model.decode_ms

    def plain(rows: float, width: float) -> float:
        return dec.predict(rows=rows, rows_x_width_k=rows * width / 1e3)

    xs = [{"rows": n, "extra_k": e / 1e3, "extra_x_width_m": e * w / 1e6} for n, e, w, _, _ in samples]
    ys = [y - plain(n, w) for n, _, w, y, _ in samples]
    measured = np.array([y * sl for *_, y, sl in samples])

    def total_and_median(extra: list[float]) -> tuple[float, float]:
        got = np.array([(plain(n, w) + x) * sl for (n, _, w, _, sl), x in zip(samples, extra)])
        return float((got.sum() - measured.sum()) / measured.sum()), float(np.median(np.abs(got - measured) / measured))

    check: dict[str, float] = {"steps": float(len(samples)), "measured_ms": float(measured.sum())}
    check["formula_total_rel_err"], check["formula_median_rel_err"] = total_and_median(
        [e * fed_token_ms(model.prefill_ms, w) for _, e, w, _, _ in samples]
    )
    probe = model.verify_ms
    if probe is not None:
        check["probe_total_rel_err"], check["probe_median_rel_err"] = total_and_median(
            [verify_fixed_ms(probe, n) + e * verify_token_ms(probe, w) for n, e, w, _, _ in samples]
        )
    if len(samples) >= MIN_VERIFY_STEPS:
        fit = fit_linear(xs, ys, VERIFY_TERMS)
        model.verify_ms = fit
        check["fit_total_rel_err"], check["fit_median_rel_err"] = total_and_median([fit.predict(**x) for x in xs])
    model.verify_check = check
    model.notes.append(
        f"{len(samples)} verifying steps (speculative decoding)"
        + (" fitted directly" if len(samples) >= MIN_VERIFY_STEPS else "")
        + f"; priced from the prefill fit alone they come out {check['formula_total_rel_err']:+.1%} in total"
        + (f", from the probe {check['probe_total_rel_err']:+.1%}" if probe is not None else "")
    )


def shadow_acceptance(tl: Any) -> Acceptance | None:
    """What speculation would have accepted, by batch-size bucket, from the trace's
    `speculation_shadow` records (engines/inference/speculation/shadow.py): each server's latest
    running counts, added up (trace_analysis/speculation_summary.py `shadow_summary` reads the
    same). None when the run recorded none, or none that proposed anything."""
    latest: dict[str, tuple[float, dict[str, Any]]] = {}
    for s in tl.profiles:
        if s["name"] == "speculation_shadow" and isinstance(s["args"].get("by_rows"), dict):
            if s["process"] not in latest or s["ts"] >= latest[s["process"]][0]:
                latest[s["process"]] = (s["ts"], s["args"])
    buckets: dict[str, dict[str, Any]] = {}
    max_draft, every = 0, 0
    for _, args in latest.values():
        every = max(every, int(args.get("every") or 0))
        for key, t in args["by_rows"].items():
            b = buckets.setdefault(str(int(key)), {"tries": 0, "proposals": 0, "reached": [], "accepted_at": []})
            b["tries"] += int(t.get("tries", 0))
            b["proposals"] += int(t.get("proposals", 0))
            for name in ("reached", "accepted_at"):
                max_draft = max(max_draft, add_positions(b[name], t.get(name, [])))
    if not any(b["proposals"] for b in buckets.values()):
        return None
    for b in buckets.values():
        for name in ("reached", "accepted_at"):
            b[name].extend([0] * (max_draft - len(b[name])))
    return Acceptance(max_draft, every, dict(sorted(buckets.items(), key=lambda kv: int(kv[0]))))


def _probe_engine(run: Any, m: _Material, model: CostModel) -> None:
    """The engine's steps measured alone on the run's model (perfmodel/engine_probe.py), where that
    means something: the run was recorded on this machine, on its CPU, and its model is here."""
    host = next((s["args"].get("host") for s in run.timeline.spans if s["name"] == "placement"), None)
    if host != platform.node():
        model.notes.append(
            "recorded on another machine (or before runs named theirs): the engine's steps were not "
            "probed alone here, so the decode cost's shape is the fit of the run's own steps"
        )
        return
    if str(run.spec.inference.args.get("device", "cpu")).startswith("cuda") or run.spec.inference.backend != "embedded":
        model.notes.append(
            "the engine ran on a GPU (or is not the embedded one): its steps were not probed "
            "(the probe runs the embedded engine's forward on this CPU)"
        )
        return
    try:
        model_dir = str(resolve_model_path(model.calibrated["model_path"]))
    except Exception as exc:  # noqa: BLE001 - no model here: the probe is an extra, not a requirement
        model.notes.append(f"the run's model is not available here ({exc}): the engine's steps were not probed")
        return
    _probe_decode_shape(model_dir, m, model)


def _probe_decode_shape(model_dir: str, m: _Material, model: CostModel) -> None:
    """The decode cost's shape from the engine's step measured alone over a grid of batch sizes
    (perfmodel/engine_probe.py `probe_decode`), scaled by one factor to the run's own decode steps.

    Why: a run decodes most steps near its own concurrency (a calibration at 64 running, 30-64
    rows), and a fit of those alone extrapolates badly below it: its fixed cost absorbed what is
    per row, and a step of a few rows came out two to three times too slow, so runs with fewer
    requests in flight were predicted up to twice too slow. Alone, every batch size is measured (at
    the run's widths and twice its widest). The run's own steps then give how its environment
    changed them: a factor on the compute (a trainer beside the engine, the other processes on the
    cores) and a stall per step that does not scale with it (the server's other threads holding
    the interpreter, locks), which a synchronous run keeps when its forwards are priced alone."""
    dx, dy, ds = m.decode_samples
    if len(dy) < 20:
        return
    rows_seen = max(int(x["rows"]) for x in dx)
    widths = sorted(x["rows_x_width_k"] * 1e3 / x["rows"] for x in dx if x["rows"] > 0)
    # the run's own widths, and twice its widest (answers grow as the policy learns)
    pick = [widths[int(q * (len(widths) - 1))] for q in (0.1, 0.5, 0.9)] + [2 * widths[-1]]
    got = probe_decode(model_dir, rows_seen, [int(w) for w in pick], threads=model.inference.threads)
    if not got:
        return
    px = [{"rows": float(r), "rows_x_width_k": r * w / 1e3} for r, w, _ in got]
    shape = fit_linear(px, [t * 1e3 for _, _, t in got], DECODE_TERMS, robust=False)
    # the run's decode time as it was measured (each step's normalised time times its slowdown)
    predicted = sum(shape.predict(**x) * sl for x, sl in zip(dx, ds))
    if predicted <= 0:
        return
    scale = sum(y * sl for y, sl in zip(dy, ds)) / predicted
    scaled = LinearFit(shape.terms, [float(c * scale) for c in shape.coef], len(dy), lo=shape.lo, hi=shape.hi)
    model.decode_ms = _with_measured_error(scaled, dx, dy, ds)
    model.probe_scale = float(scale)
    if model.speculation is not None or m.verify_samples:
        _probe_verify(model_dir, rows_seen, [int(w) for w in pick[1:3]], model, scale)
    model.notes.append(
        f"decode cost shape probed alone at {len(got)} batch sizes and widths (1..{rows_seen} rows), "
        f"x{scale:.2f} to the run's own decode steps (beyond the light load's preemption, x{model.engine_preemption:.2f})"
    )


def _probe_verify(model_dir: str, rows_seen: int, widths: list[int], model: CostModel, scale: float) -> None:
    """A verifying step's cost beyond the plain step of its rows, from the engine's steps probed
    alone (perfmodel/engine_probe.py `probe_verify`: 1..`rows_seen` rows, the run's median and 90th
    percentile widths, proposals of 1, 2 and 4 tokens a row), fitted on VERIFY_TERMS and scaled
    by the factor the run's own decode steps gave the decode probe (`scale`: what the run's
    environment does to the engine's compute).

    Why: the prefill fit prices a fed token's compute well (on the tiny kits within ~20% of the
    probe) but knows nothing of what a verifying step does whatever it is fed (building the
    packed layout and its masks, sampling every fed position, advancing ragged rows: 0.3 ms and
    more a step alone), which at a few rows is as much as the tokens; priced without it, the
    simulator had the policy verify at batch sizes where the engine measured it slower."""
    got = probe_verify(model_dir, rows_seen, widths, threads=model.inference.threads)
    if not got:
        model.notes.append(
            "the verifying step could not be probed (no lean forward): it is priced from the prefill fit"
        )
        return
    xs = [{"rows": float(r), "extra_k": e / 1e3, "extra_x_width_m": e * w / 1e6} for r, w, e, _, _ in got]
    ys = [(v - p) * 1e3 for *_, v, p in got]
    fit = fit_linear(xs, ys, VERIFY_TERMS, robust=False)
    model.verify_ms = LinearFit(
        fit.terms, [c * scale for c in fit.coef], fit.n, fit.median_rel_err, fit.total_rel_err, fit.lo, fit.hi
    )
    model.notes.append(
        f"verifying step probed alone at {len(got)} shapes: {verify_fixed_ms(model.verify_ms, 1):.2f} ms at one row "
        f"beyond the plain step, {verify_token_ms(model.verify_ms, widths[0]) * 1e3:.0f} us a fed token (the prefill "
        f"fit says {fed_token_ms(model.prefill_ms, widths[0]) * 1e3:.0f} us), x{scale:.2f} as the decode probe"
    )


def _with_measured_error(fit: LinearFit, xs: list[dict[str, float]], ys: list[float], slows: list[float]) -> LinearFit:
    """The fit's errors against what was measured (its normalised prediction times the slowdown)."""
    if not ys:
        return fit
    pred = np.array([fit.predict(**x) for x in xs]) * np.array(slows)
    meas = np.array(ys) * np.array(slows)
    fit.median_rel_err = float(np.median(np.abs(pred - meas) / meas))
    fit.total_rel_err = float((pred.sum() - meas.sum()) / meas.sum())
    return fit


def _fit_model_calls(run: Any, m: _Material, model: CostModel) -> None:
    """Training-side calls on model workers: compute time against tokens and sequences."""
    spans = run.timeline.spans
    nodes = [s for s in spans if s["cat"] == "node" and s["process"].startswith("model-")]
    computes = [s for s in spans if s["cat"] == "compute" and s["process"].startswith("model-") and s["dur"] > 0]
    by_proc: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for c in computes:
        by_proc[c["process"]].append(c)
    engines = sorted(iv for p, v in m.busy.items() if p.startswith("inference-") for iv in v)
    budget = run.spec.runtime.max_tokens_per_microbatch
    bg = model.background_demands()
    cores = model.machine_cores
    samples: dict[str, tuple[list[dict[str, float]], list[float], list[float]]] = defaultdict(lambda: ([], [], []))
    overheads: dict[str, list[float]] = defaultdict(list)
    for node in nodes:
        a, b = node["ts"], node["ts"] + node["dur"]
        inner = [c for c in by_proc[node["process"]] if c["ts"] >= a and c["ts"] + c["dur"] <= b]
        if not inner:
            continue
        c = max(inner, key=lambda s: s["dur"])
        name = node["args"].get("node") or node["name"]
        ca, cb = c["ts"] / 1e6, (c["ts"] + c["dur"]) / 1e6
        busy = _overlap(engines, ca, cb) / (cb - ca)
        s = slowdown(model.training.demand(), [model.inference.demand(busy * model.inference.threads), *bg], cores)
        s *= 1.0 + model.interference * busy  # the same interference, the other way round
        xs, ys, ss = samples[name]
        tokens = float(c["args"].get("tokens", 0))
        # the planner packs at the lower bound of micro-batches (`areal-graph trace` shows it does)
        xs.append(
            {
                "tokens_k": tokens / 1e3,
                "seqs": float(c["args"].get("seqs", 0)),
                "microbatches": float(math.ceil(tokens / budget)) if tokens else 1.0,
            }
        )
        ys.append((cb - ca) / s)
        ss.append(s)
        overheads[name].append((node["dur"] - c["dur"]) / 1e6)
    for name, (xs, ys, ss) in samples.items():
        model.model_calls[name] = _with_measured_error(fit_linear(xs, ys, CALL_TERMS), xs, ys, ss)
        model.call_overhead_s[name] = median(overheads[name])


def _fit_controller(run: Any, m: _Material, model: CostModel) -> None:
    """Nodes the controller runs, the generation side's nodes, the rollout's own overhead, the
    weight sync and what the controller spends per step around them."""
    spans = run.timeline.spans
    plan = run.plan
    gen_nodes = set(plan.generation)
    per_node: dict[str, list[float]] = defaultdict(list)
    for s in spans:
        if s["cat"] != "node":
            continue
        node = s["args"].get("node") or s["name"]
        if node in gen_nodes or (node in plan.training and s["process"] == "controller"):
            per_node[node].append(s["dur"] / 1e6)
    model.generation_nodes_s = {n: median(v) for n, v in per_node.items() if n in gen_nodes}
    model.controller_nodes_s = {n: median(v) for n, v in per_node.items() if n not in gen_nodes}
    model.dispatch_s, model.collect_s = _rollout_overhead(run)
    swaps = [s for s in spans if s["name"] == "weight_swap"]
    waited = median([float(s["args"].get("waited_s") or 0.0) for s in swaps])
    syncs = [s["dur"] / 1e6 for s in spans if s["name"] == "weight_sync" and s["cat"] == "weights"]
    model.sync_s = max(median(syncs) - model.swap_s - waited, 0.0)
    model.step_overhead_s = _step_overhead(spans)
    steps = sorted((s["ts"], s["ts"] + s["dur"]) for s in spans if s["cat"] == "step")
    evals = merge_intervals([(s["ts"], s["ts"] + s["dur"]) for s in spans if s["name"] == "eval"])
    gaps = [(b[0] - a[1]) / 1e6 for a, b in zip(steps, steps[1:]) if _overlap(evals, a[1], b[0]) == 0]
    model.step_gap_s = max(median(gaps), 0.0)


def _rollout_overhead(run: Any) -> tuple[float, float]:
    """Median time from a rollout call's start to its group's first request, and from the
    group's last answer to the call's end (HTTP, tokenisation, packing)."""
    spans = run.timeline.spans
    calls = sorted(
        (s["ts"], s["ts"] + s["dur"])
        for s in spans
        if s["cat"] == "node" and (s["args"].get("node") or s["name"]) == run.plan.source
    )
    groups: dict[str, list[float]] = {}
    for s in spans:
        if s["name"] == "request" and s["cat"] == "request":
            base = str(s["args"].get("rid", "")).rsplit("-", 1)[0]
            g = groups.setdefault(base, [math.inf, -math.inf])
            g[0], g[1] = min(g[0], s["ts"]), max(g[1], s["ts"] + s["dur"])
    firsts = sorted(groups.values())
    dispatch, collect = [], []
    used = [False] * len(firsts)
    starts = [g[0] for g in firsts]
    for a, b in calls:
        i = bisect.bisect_left(starts, a)
        while i < len(firsts) and (used[i] or firsts[i][1] > b):
            i += 1
        if i < len(firsts) and firsts[i][0] <= b:
            used[i] = True
            dispatch.append((firsts[i][0] - a) / 1e6)
            collect.append((b - firsts[i][1]) / 1e6)
    return max(median(dispatch), 0.0), max(median(collect), 0.0)


def _step_overhead(spans: list[dict[str, Any]]) -> float:
    """Per step: the step's wall time not covered by waiting for the batch, training-side node
    calls or the weight sync (the controller's own bookkeeping: metrics, checks)."""
    steps = sorted((s["ts"], s["ts"] + s["dur"]) for s in spans if s["cat"] == "step")
    chain = sorted(
        (s["ts"], s["ts"] + s["dur"])
        for s in spans
        if s["process"] == "controller"
        and s["cat"] in ("controller", "weights")
        and s["name"] in ("wait_batch", "weight_sync")
        or (s["cat"] == "node" and s["args"].get("worker") is not None and s["name"] != "rollout" and s["dur"] > 0)
    )
    out = []
    for a, b in steps:
        covered = _overlap(merge_intervals([iv for iv in chain if iv[1] > a and iv[0] < b]), a, b)
        out.append(max((b - a) - covered, 0.0) / 1e6)
    return median(out)


def _lengths(run: Any, spec: Any) -> LengthModel:
    """Whole prompt groups: (version, prompt tokens, answer lengths), evaluation requests left out."""
    spans = run.timeline.spans
    evals = merge_intervals([(s["ts"], s["ts"] + s["dur"]) for s in spans if s["name"] == "eval"])
    groups: dict[str, list[Any]] = {}
    for s in spans:
        if s["name"] != "request" or s["cat"] != "request":
            continue
        a = s["args"]
        base = str(a.get("rid", "")).rsplit("-", 1)[0]
        g = groups.setdefault(base, [math.inf, 0, [], s["ts"]])
        v = a.get("version_first")
        g[0] = min(g[0], v if isinstance(v, int) else 0)
        g[1] = int(a.get("prompt_tokens") or 0)
        g[2].append(int(a.get("output_tokens") or 0))
        g[3] = min(g[3], s["ts"])
    src = next(n for n in spec.nodes.values() if n.kind == "rollout")
    G = src.params.group_size
    kept = [
        [int(g[0]) if g[0] != math.inf else 0, g[1], g[2]]
        for g in groups.values()
        if not (len(g[2]) == 1 and G > 1) and not (len(g[2]) == 1 and _overlap(evals, g[3], g[3] + 1) > 0)
    ]
    kept.sort(key=lambda g: g[0])
    return LengthModel(LENGTH_WINDOW, src.params.sampling.max_new_tokens, kept)


def _measured(run: Any, m: _Material) -> dict[str, Any]:
    """The calibration run's own outcome, for the simulator to be checked against."""
    lo, hi = m.window
    steps = sorted(s["dur"] / 1e6 for s in run.timeline.spans if s["cat"] == "step")
    stale = [r["staleness/mean"] for r in run.metrics if "staleness/mean" in r]
    return {
        "steps_window_s": hi - lo,
        "step_s_median": median(steps),
        "steps": len(steps),
        "staleness_mean": float(np.mean(stale)) if stale else None,
        "requests_per_s": _requests_between(run.timeline, lo, hi) / max(hi - lo, 1e-9),
    }
