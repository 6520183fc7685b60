"""What a run costs, as data: the cost model the simulator runs on, and how it prints.

`CostModel` holds every cost `perfmodel/costs.py` fits on a run's trace (or `perfmodel/cluster.py`
derives from first principles): engine forwards, training-side calls, weight sync, the overheads
around them, background CPU, and the output lengths by policy version (`LengthModel`). It is plain
data that round-trips through JSON (`areal-graph costs --save`, `simulate --calibrate FILE`).
"""

from __future__ import annotations

import bisect
import dataclasses
import json
import random
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from areal_graph.perfmodel.cpu import Demand, preemption
from areal_graph.perfmodel.fits import LinearFit
from areal_graph.perfmodel.speculation import Acceptance

LENGTH_WINDOW = 6  # policy versions per window of the output-length distribution
MIN_POOL = 12  # prompt groups a length sample is drawn from at least


@dataclass
class SidePlacement:
    """Where a side ran: its cores (None: unpinned) and threads per process."""

    cores: list[int] | None = None
    threads: int = 1

    def demand(self, amount: float | None = None) -> Demand:
        return Demand(self.threads if amount is None else amount, frozenset(self.cores) if self.cores else None)


@dataclass
class LengthModel:
    """The output lengths of the run's prompt groups, by the policy version that generated them.

    Groups are kept whole (prompt length and every answer's length): the answers of one prompt
    are alike, and a group's longest answer is what a synchronous step waits for."""

    window: int = LENGTH_WINDOW
    max_new_tokens: int = 0
    groups: list[list[Any]] = field(default_factory=list)  # [version, prompt_tokens, [lengths]]

    def versions(self) -> tuple[int, int]:
        vs = [g[0] for g in self.groups]
        return (min(vs), max(vs)) if vs else (0, 0)

    def pool(self, version: int) -> list[list[Any]]:
        """The groups generated within half a window of `version` (at least `MIN_POOL` of them,
        widening until there are); past the last version: the last window's groups."""
        if not self.groups:
            raise ValueError("the length model holds no groups")
        vs = [g[0] for g in self.groups]  # sorted by version (fit_costs sorts them)
        lo_v, hi_v = vs[0], vs[-1]
        v = (
            min(max(version, lo_v + self.window // 2), hi_v - self.window // 2)
            if hi_v - lo_v >= self.window
            else (lo_v + hi_v) // 2
        )
        half = self.window / 2
        while True:
            a, b = bisect.bisect_left(vs, v - half), bisect.bisect_right(vs, v + half)
            if b - a >= MIN_POOL or (a == 0 and b == len(vs)):
                return self.groups[a:b]
            half *= 1.5

    def extrapolates(self, version: int) -> bool:
        """Whether `version` lies past the versions the lengths were measured at."""
        return bool(self.groups) and version > self.groups[-1][0] + self.window

    def sample(
        self, rng: random.Random, version: int, group_size: int, max_new_tokens: int | None = None
    ) -> tuple[int, list[int]]:
        """(prompt tokens, output lengths) of one group generated at `version`."""
        pool = self.pool(version)
        g = rng.choice(pool)
        lens = list(g[2])
        if len(lens) != group_size:  # another group size: answers drawn from the window's answers
            answers = [n for h in pool for n in h[2]]
            lens = [rng.choice(answers) for _ in range(group_size)]
        cap = max_new_tokens or self.max_new_tokens
        return int(g[1]), [max(1, min(int(n), cap)) if cap else max(1, int(n)) for n in lens]

    def _by_window(self) -> dict[int, list[list[Any]]]:
        out: dict[int, list[list[Any]]] = defaultdict(list)
        for g in self.groups:
            out[g[0] // self.window].append(g)
        return dict(out)

    def drift(self) -> list[dict[str, Any]]:
        """Per window: versions, groups, mean / p90 / max output length."""
        out: list[dict[str, Any]] = []
        for key, groups in sorted(self._by_window().items()):
            lens = np.array([n for g in groups for n in g[2]], dtype=float)
            out.append(
                {
                    "versions": f"{key * self.window}-{key * self.window + self.window - 1}",
                    "groups": len(groups),
                    "mean": float(lens.mean()),
                    "p90": float(np.percentile(lens, 90)),
                    "max": float(lens.max()),
                }
            )
        return out


@dataclass
class CostModel:
    """Every cost of a run (see module docstring). Times in seconds unless a fit says ms."""

    source: str = ""
    machine_cores: list[int] = field(default_factory=list)
    calibrated: dict[str, Any] = field(default_factory=dict)  # the calibration run's settings
    inference: SidePlacement = field(default_factory=SidePlacement)
    training: SidePlacement = field(default_factory=SidePlacement)
    other: SidePlacement = field(default_factory=SidePlacement)
    decode_ms: LinearFit = field(default_factory=lambda: LinearFit.constant(1.0))
    prefill_ms: LinearFit = field(default_factory=lambda: LinearFit.constant(1.0))
    swap_s: float = 0.0
    engine_step_overhead_ms: float = 0.0  # the engine's scheduling between two forwards, per decode step
    engine_row_overhead_ms: float = 0.0  # ... and per row of that step (sampling's bookkeeping, shadow proposals)
    # per prefill forward (sampling the first tokens, joining the batched KV cache): a run that admits
    # requests one at a time (few running, a queue) pays it per request, one admitting groups once per group
    engine_prefill_overhead_ms: float = 0.0
    # a step that admits requests from the queue right after others finished waits this long before its
    # prefill (~0.4-0.5 ms here, against ~0 when nobody finished): one admission per finish at few running
    engine_admit_after_finish_ms: float = 0.0
    # the engine's work outside its forwards per request it served (leaving the batched KV cache,
    # resolving it, its spans): paid per request, so it does not grow with the steps a run takes
    engine_request_overhead_ms: float = 0.0
    interference: float = 0.0  # how much slower a forward runs while the trainer computes elsewhere (0.3 = 30%)
    # how much longer the calibration's forwards took for the background's bursts on the engine's cores
    # (cpu.py `preemption`): divided out of the fits; the simulator applies its own run's
    engine_preemption: float = 1.0
    # of the tokens in flight at a weight update, the share prefilled again: answers of one prompt
    # that are still identical (the same first tokens) share one row (engine.py prefix sharing)
    reprefill_keep: float = 1.0
    model_calls: dict[str, LinearFit] = field(default_factory=dict)  # training-side node on a model worker
    call_overhead_s: dict[str, float] = field(default_factory=dict)  # its RPC and (de)serialisation
    controller_nodes_s: dict[str, float] = field(default_factory=dict)  # training-side nodes in the controller
    generation_nodes_s: dict[str, float] = field(default_factory=dict)  # per prompt group (reward, ...)
    dispatch_s: float = 0.0  # rollout call start -> its first request reaches the server
    collect_s: float = 0.0  # the group's last answer -> the rollout call returns
    sync_s: float = 0.0  # weight sync apart from the server's swap and its wait for a step boundary
    step_overhead_s: float = 0.0  # controller bookkeeping inside a training step's span
    step_gap_s: float = 0.0  # from one step's end to the next one's start (metrics, logging; no evaluation)
    background_cpu: dict[str, dict[str, Any]] = field(default_factory=dict)  # process -> cpu_s_per_request, side
    lengths: LengthModel = field(default_factory=LengthModel)
    measured: dict[str, Any] = field(default_factory=dict)  # the calibration run's own outcome
    notes: list[str] = field(default_factory=list)
    # what speculative decoding would have accepted, by batch size (the trace's shadow counts;
    # perfmodel/speculation.py); None: not measured, and the simulator refuses to price speculation
    speculation: Acceptance | None = None
    # a verifying step's time beyond the plain decode step of its rows, fitted on the verifying steps
    # of a run that speculated (terms: extra fed tokens, x window, rows); None: priced from the
    # prefill fit alone (perfmodel/speculation.py `fed_token_ms`)
    verify_ms: LinearFit | None = None
    # the prefill-based price against those verifying steps, and the direct fit's (costs.py `_fit_verify`)
    verify_check: dict[str, float] = field(default_factory=dict)
    # the run's own decode steps against the engine's step probed alone on this machine, beyond the
    # background's preemption (costs.py `_probe_decode_shape`); None: not probed. Far from 1: something
    # outside the run used the CPU during it (or during the probe): `calibration_warning`
    probe_scale: float | None = None
    # cores that processes outside the run kept busy during it, on the cores it could use (costs.py
    # `_outside_load`); None: the trace did not record the machine's CPU
    outside_cores: float | None = None

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), indent=1)

    @classmethod
    def from_json(cls, text: str) -> CostModel:
        raw = json.loads(text)
        legacy = "engine_preemption" not in raw  # saved before cpu.preemption: its forwards' fits include it
        for key in ("alone_decode", "alone_prefill", "decode_stall_ms"):
            raw.pop(key, None)
        fits = {k: LinearFit(**raw[k]) for k in ("decode_ms", "prefill_ms")}
        # files saved before speculation was priced have neither key: nothing measured, nothing assumed
        spec = raw.get("speculation")
        verify = raw.get("verify_ms")
        sides = {k: SidePlacement(**raw[k]) for k in ("inference", "training", "other")}
        model = cls(
            **{
                **raw,
                **fits,
                **sides,
                "model_calls": {k: LinearFit(**v) for k, v in raw["model_calls"].items()},
                "lengths": LengthModel(**raw["lengths"]),
                "speculation": Acceptance.from_dict(spec) if spec else None,
                "verify_ms": LinearFit(**verify) if verify else None,
            }
        )
        if legacy:
            _drop_trainer_background(model)
            _divide_out_preemption(model)
        return model

    def save(self, path: str | Path) -> None:
        Path(path).write_text(self.to_json())

    def background_demands(
        self, rate_scale: float = 1.0, placement: dict[str, SidePlacement] | None = None
    ) -> list[Demand]:
        """The processes' CPU beyond their compute (`background_cpu`) as demands, at `rate_scale`
        times the calibration's request rate, on `placement` (side name -> where it runs; default:
        the calibration's own). The simulator passes the placement it simulates, so a background
        pinned to another core stops touching the engine."""
        sides = placement or {"inference": self.inference, "training": self.training, "other": self.other}
        return [
            sides.get(v.get("side", "other"), sides["other"]).demand(v["rate_cores"] * rate_scale)
            for v in self.background_cpu.values()
            if v.get("rate_cores", 0) > 0
        ]


def _drop_trainer_background(model: CostModel) -> None:
    """A model saved before `costs._background` read a model worker by its compute spans counted
    part of the training itself as background (its calls hop between gRPC threads, and what ran
    beyond the busiest thread was taken for overhead); a new fit of the same run finds ~0 there."""
    for proc, v in model.background_cpu.items():
        if proc.startswith("model-"):
            model.background_cpu[proc] = {**v, "rate_cores": 0.0, "cpu_s_per_request": 0.0}


def _divide_out_preemption(model: CostModel) -> None:
    """A model saved before `cpu.preemption` was fitted with the background's bursts in its forwards'
    costs; the simulator now applies them itself, at the simulated run's load. Divide the
    calibration's out of the engine's fits, so an old file is priced as a new fit of the same run."""
    p = preemption(model.inference.demand(), model.background_demands(), model.machine_cores or [0])
    model.engine_preemption = p
    for name in ("decode_ms", "prefill_ms", "verify_ms"):
        fit = getattr(model, name)
        if fit is not None:
            setattr(model, name, dataclasses.replace(fit, coef=[c / p for c in fit.coef]))
    model.engine_step_overhead_ms /= p  # the work between forwards was measured under the same bursts
    model.engine_request_overhead_ms /= p


# ============================================================================ printing
def describe_costs(model: CostModel) -> list[tuple[str, str, str]]:
    """Rows (cost, value, fit error on the calibration run) for `areal-graph costs`."""
    rows: list[tuple[str, str, str]] = []

    def fit_row(name: str, fit: LinearFit, unit: str, scale: float = 1.0) -> None:
        terms = " + ".join(
            f"{c * scale:.4g}" + ("" if t == "1" else f" x {t}") for t, c in zip(fit.terms, fit.coef) if c
        )
        rows.append(
            (
                name,
                f"{terms or '0'} {unit}",
                f"median {fit.median_rel_err:.0%} per item, total {fit.total_rel_err:+.1%} (n={fit.n})",
            )
        )

    fit_row("decode step", model.decode_ms, "ms")
    fit_row("prefill chunk", model.prefill_ms, "ms")
    dec = model.decode_ms
    for b in (1, 16, 64):
        w = 100
        ms = dec.predict(rows=b, rows_x_width_k=b * w / 1e3)
        rows.append(
            (
                f"  decode at batch {b}, context {w}",
                f"{ms:.2f} ms/step, {b / ms * 1e3:,.0f} tokens/s (the fit, nothing slowing it)",
                "",
            )
        )
    light = sum(v.get("rate_cores", 0.0) for v in model.background_cpu.values())
    rows.append(
        (
            "background bursts on the engine's cores",
            f"{light:.2f} cores of light load: forwards x{model.engine_preemption:.2f} in the run "
            "(scaled with the request rate in a simulation)",
            "",
        )
    )
    rows.append(
        (
            "engine work between forwards",
            f"{model.engine_step_overhead_ms:.2f} ms per decode step + {model.engine_row_overhead_ms * 1e3:.1f} us per "
            f"row, {model.engine_prefill_overhead_ms:.2f} ms per prefill forward (+{model.engine_admit_after_finish_ms:.2f} "
            "right after a finish), "
            f"{model.engine_request_overhead_ms:.2f} ms per request",
            "",
        )
    )
    rows.append(
        (
            "interference of a computing trainer",
            f"forwards {model.interference:.0%} slower while it computes (and it as much slower while they run)",
            "",
        )
    )
    rows.append(
        (
            "weight swap (server)",
            f"{model.swap_s * 1e3:.1f} ms; {model.reprefill_keep:.0%} of the tokens "
            "in flight prefilled again (the rest shared with an identical answer)",
            "",
        )
    )
    rows.append(("weight sync (rest)", f"{model.sync_s * 1e3:.1f} ms", ""))
    for name, fit in model.model_calls.items():
        fit_row(f"{name} (model worker)", fit, "s")
        rows.append((f"  {name} call overhead", f"{model.call_overhead_s.get(name, 0) * 1e3:.1f} ms", ""))
    for name, s in model.controller_nodes_s.items():
        rows.append((f"{name} (controller)", f"{s * 1e3:.1f} ms per step", ""))
    for name, s in model.generation_nodes_s.items():
        rows.append((f"{name} (per prompt group)", f"{s * 1e3:.1f} ms", ""))
    rows.append(("rollout dispatch / collect", f"{model.dispatch_s * 1e3:.1f} / {model.collect_s * 1e3:.1f} ms", ""))
    rows.append(
        (
            "controller overhead per step",
            f"{model.step_overhead_s * 1e3:.1f} ms in the step, {model.step_gap_s * 1e3:.1f} ms between steps",
            "",
        )
    )
    for proc, v in model.background_cpu.items():
        rows.append(
            (
                f"background CPU: {proc}",
                f"{v['cpu_s_per_request'] * 1e3:.2f} ms CPU per request ({v['rate_cores']:.2f} cores in the run)",
                "",
            )
        )
    if model.outside_cores is not None:
        rows.append(
            (
                "CPU used outside the run",
                f"{model.outside_cores:.2f} cores of the run's cores (their busy time less the run's processes')",
                "",
            )
        )
    spec = model.speculation
    if spec is None:
        rows.append(("speculative decoding", "not priceable: no shadow acceptance in the calibration's trace", ""))
    else:
        for key, counts in spec.buckets.items():
            acc = spec.at(int(key))
            if str(acc.buckets) != f"[{key}]":
                continue  # thin buckets are shown where they are pooled
            rows.append(
                (
                    f"speculation at {key} rows (shadow, 1 prompt in {spec.every})",
                    f"{acc.rate:.0%} of rows propose; accepted by position "
                    + " ".join(f"{p:.2f}" for p in acc.positions)
                    + f"; {1 + acc.expected_accepted(spec.max_draft):.2f} tokens per proposing row and forward",
                    f"{counts.get('proposals', 0)} proposals",
                )
            )
    if model.verify_ms is not None:
        fit_row("verifying step beyond its plain step", model.verify_ms, "ms")
    if model.verify_check:
        c = model.verify_check
        for key, label in (("formula", "the prefill fit"), ("probe", "the probe"), ("fit", "their own fit")):
            if f"{key}_total_rel_err" in c:
                rows.append(
                    (
                        f"  the run's verifying steps priced by {label}",
                        f"{c[f'{key}_total_rel_err']:+.1%} in total, median {c[f'{key}_median_rel_err']:.0%} per step",
                        f"n={int(c['steps'])}",
                    )
                )
    for window in model.lengths.drift():
        rows.append(
            (
                f"output length, versions {window['versions']}",
                f"mean {window['mean']:.1f}, "
                f"p90 {window['p90']:.0f}, max {window['max']:.0f} ({window['groups']} groups)",
                "",
            )
        )
    return rows


# what a calibration may lose to processes outside it before its predictions are called suspect:
# QUIET_OUTSIDE_CORES, measured directly (traces since 2026-11-30); otherwise the run's decode steps
# against the engine probed alone, beyond the preemption, past QUIET_PROBE_SCALE. That ratio was
# 1.02-1.09 for fresh calibrations of both kits and 0.82-1.12 over 15 asynchronous runs, but
# 1.28-1.39 for runs at 8 running with nothing else on the machine (the engine slows at low
# concurrency more than the model explains: docs/placement.md "What is left"), 1.32-1.75 beside a
# busy loop on one core and ~1.4 beside a type check; so it only names the clearest cases
QUIET_OUTSIDE_CORES = 0.25
QUIET_PROBE_SCALE = (0.6, 1.5)


def calibration_warning(model: CostModel) -> str | None:
    """Why this calibration's predictions are likely off throughout, or None.

    Why: a calibration is one short run, and the cost model cannot tell a machine slowed by
    something outside the run from slow work: a calibration taken beside a type check came out
    1.4x slow, and so did every prediction from it. A trace since 2026-11-30 records the busy
    time of the cores the run could use, so what others used is measured; for an older one, the
    engine probed alone right after the fit is the one measurement taken outside the run."""
    outside, scale = model.outside_cores, model.probe_scale
    lo, hi = QUIET_PROBE_SCALE
    if outside is not None and outside > QUIET_OUTSIDE_CORES:
        ratio = (
            f" (the run's decode steps took x{scale:.2f} the engine probed alone, beyond what its own processes explain)"
            if scale is not None
            else ""
        )
        return (
            f"processes outside the run kept {outside:.2f} cores busy during the calibration, on the cores it could "
            f"use{ratio}: predictions from it will be slow by about as much as that cost the run. "
            "Calibrate again on a quiet machine, or compare only runs that share the same load"
        )
    if scale is None:
        return None
    if scale < lo:  # the probe runs when the costs are fitted, after the run: the machine may be busy now
        return (
            f"the calibration's decode steps took x{scale:.2f} the engine's step probed alone now (x{lo:.1f}-{hi:.1f} "
            "without other load): the machine is busier now than during the run, and the costs fitted on the "
            "probe will be too slow. Fit them again when the machine is quiet"
        )
    if scale > hi and outside is None:  # measured quiet: slow steps are the run's own
        return (
            f"the calibration's decode steps took x{scale:.2f} the engine's step probed alone on this machine, "
            f"beyond what the run's own processes explain (x{lo:.1f}-{hi:.1f} without other load): something outside "
            "the run likely used the CPU during it, and predictions from it will be about that much slow. "
            "Calibrate again on a quiet machine, or compare only runs that share the same load"
        )
    return None


def costs_summary(model: CostModel) -> dict[str, Any]:
    """`areal-graph costs --json`: the model, and its rows as printed."""
    return {
        "calibration_warning": calibration_warning(model),
        "model": json.loads(model.to_json()),
        "rows": [{"cost": a, "value": b, "fit_error": c} for a, b, c in describe_costs(model)],
    }
