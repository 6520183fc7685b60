"""What tracing costs: one span, one request's spans in the engine, and a whole run on vs off.

Tracing is on by default (`runtime.trace`): it wraps every node call, records 5-8 spans per
generation request in the inference server and draws an arrow per prompt group. The target
is at most 3% of a run's wall time. Four measurements:

- one `with tracer.span(...)` against an empty loop;
- one request's whole life in the engine's hooks (engine_spans.py), including the
  `take()` that turns its spans into dicts for `/get_spans`;
- the embedded engine in this process on an RL-shaped load (the builtin kit, 4 prompts x 8
  answers, a weight swap mid-way), traced and not, alternating: the inference side's cost
  without the noise of a whole run;
- interleaved rounds of `areal-graph run workflows/ppo_async.yaml runtime.steps=N` with
  `runtime.trace=true` and `false` (order alternates per round; the machine is shared,
  so read the spread, not only the medians). "loop s" is the training loop (first to last
  metrics line: steps and the evals in them), "wall s" the whole command with startup,
  "cpu s" the CPU time of every process of the run (less disturbed by other people's load).

    python benchmarks/bench_tracing.py                       # micro + 2 rounds of 60 steps (~7 min)
    python benchmarks/bench_tracing.py --steps 40 --rounds 3
    python benchmarks/bench_tracing.py --micro-only          # no whole runs
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

from rich.console import Console
from rich.table import Table

from areal_graph.api.spans import SpanRecorder
from areal_graph.engines.inference.engine_spans import EngineSpans
from areal_graph.runtime.observability.run_dir import METRICS_FILENAME, read_metrics_file
from areal_graph.runtime.observability.tracing import Tracer

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"


def span_cost(n: int = 20_000) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        tr = Tracer(Path(tmp) / "t.json", flush_every=10**9)
        t0 = time.perf_counter()
        for i in range(n):
            with tr.span("step", cat="c", step=i):
                pass
        traced = (time.perf_counter() - t0) / n
        tr.close()
    t0 = time.perf_counter()
    for _ in range(n):
        pass
    empty = (time.perf_counter() - t0) / n
    return {"spans": n, "per_span_us": traced * 1e6, "empty_loop_us": empty * 1e6}


def request_spans_cost(n: int = 5_000, tokens: int = 64) -> dict:
    """One interrupted request's hooks (submit, prefill, swap, re-prefill, finish) plus `take()`."""
    rec = SpanRecorder("inference-0", enabled=True)
    hooks = EngineSpans(rec)
    t0 = time.perf_counter()
    for i in range(n):
        r = SimpleNamespace(rid=f"r{i}", prompt=[1] * 32, output_ids=[], versions=[], finish_reason=None, timeline=None)
        hooks.submitted(r)
        hooks.prefill_started([r], time.perf_counter())
        r.output_ids.extend(range(tokens // 2))
        r.versions.extend([0] * (tokens // 2))
        hooks.prefill_done([r], time.perf_counter())
        hooks.interrupted([r], time.perf_counter(), 0, 1)
        hooks.prefill_started([r], time.perf_counter())
        hooks.prefill_done([r], time.perf_counter())
        r.output_ids.extend(range(tokens // 2))
        r.versions.extend([1] * (tokens // 2))
        r.finish_reason = "length"
        hooks.finished(r)
    recorded = time.perf_counter() - t0
    spans = len(rec)
    t0 = time.perf_counter()
    out = rec.take()
    taken = time.perf_counter() - t0
    t0 = time.perf_counter()
    body = json.dumps({"spans": out})
    encoded = time.perf_counter() - t0
    with tempfile.TemporaryDirectory() as tmp:  # the controller's side: merge, format, write
        tr = Tracer(Path(tmp) / "t.json", flush_every=10**9)
        t0 = time.perf_counter()
        tr.merge(json.loads(body)["spans"])
        tr.flush()
        written = time.perf_counter() - t0
    return {
        "requests": n,
        "spans_per_request": spans / n,
        "record_us_per_request": recorded / n * 1e6,
        "take_us_per_request": taken / n * 1e6,
        "json_us_per_request": encoded / n * 1e6,
        "json_bytes_per_request": len(body) / n,
        "controller_us_per_request": written / n * 1e6,
    }


def engine_ab(rounds: int = 10, new_tokens: int = 64) -> dict:
    """The same batches through one engine, tracing on and off in turn; on includes `take()` + JSON."""
    import torch

    from areal_graph.engines.inference.engine import EmbeddedEngine
    from areal_graph.engines.inference.sampling import SamplingParams
    from areal_graph.modelkit.builtin import resolve_model_path

    torch.set_num_threads(1)
    engine = EmbeddedEngine(resolve_model_path("builtin:tiny-arith"), seed=0)
    state = {k: v.clone() for k, v in engine.model.state_dict().items()}
    prompts = [[1 + (7 * i + j) % 200 for j in range(24 + i)] for i in range(4)]
    on, off = SpanRecorder("bench", enabled=True), SpanRecorder("bench", enabled=False)
    times: dict[bool, list[tuple[float, float]]] = {True: [], False: []}
    with engine:
        for k in range(2 * rounds + 1):
            traced = k % 4 in (1, 2)  # off, on, on, off, off, on, ...; round 0 warms up
            engine.trace_into(on if traced else off)
            w0, c0 = time.perf_counter(), time.process_time()
            futs = [
                engine.submit(
                    p, SamplingParams(max_new_tokens=new_tokens, temperature=1.0, ignore_eos=True, seed=100 * k + j)
                )
                for p in prompts
                for j in range(8)
            ]
            while engine.stats()["tokens_generated"] < 32 * new_tokens * k + 32 * new_tokens // 2:
                time.sleep(0.001)
            engine.update_weights_from_state_dict(state, version=k + 1)
            [f.result() for f in futs]
            if traced:
                json.dumps({"spans": on.take()})
            if k:
                times[traced].append((time.perf_counter() - w0, time.process_time() - c0))
    med = {t: (statistics.median(w for w, _ in v), statistics.median(c for _, c in v)) for t, v in times.items()}
    return {
        "rounds": rounds,
        "requests_per_round": 32,
        "new_tokens": new_tokens,
        "wall_s": {"on": med[True][0], "off": med[False][0]},
        "cpu_s": {"on": med[True][1], "off": med[False][1]},
        "wall_overhead": med[True][0] / med[False][0] - 1,
        "cpu_overhead": med[True][1] / med[False][1] - 1,
    }


def one_run(steps: int, trace: bool, workdir: Path, workflow: Path) -> dict:
    run_dir = workdir / f"{'on' if trace else 'off'}-{time.monotonic_ns()}"
    cmd = [
        sys.executable,
        "-m",
        "areal_graph.cli.main",
        "run",
        str(workflow),
        f"runtime.steps={steps}",
        f"runtime.trace={'true' if trace else 'false'}",
        "--run-dir",
        str(run_dir),
    ]
    t0, cpu0 = time.perf_counter(), _children_cpu_s()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    wall, cpu = time.perf_counter() - t0, _children_cpu_s() - cpu0
    if proc.returncode != 0:
        raise RuntimeError(f"run failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    metrics = read_metrics_file(run_dir / METRICS_FILENAME).records
    trace_path = run_dir / "trace.json"
    events = json.loads(trace_path.read_text()) if trace_path.exists() else []
    return {
        "trace": trace,
        "wall_s": wall,
        "cpu_s": cpu,
        "loop_s": metrics[-1]["time"] - metrics[0]["time"],
        "steps": sum(1 for m in metrics if "time/step" in m),
        "trace_bytes": trace_path.stat().st_size if trace_path.exists() else 0,
        "trace_events": len(events),
    }


def _children_cpu_s() -> float:
    """CPU seconds of every finished descendant (the run's controller reaps its own processes)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run_cost(steps: int, rounds: int, workflow: Path, console: Console) -> list[dict]:
    runs = []
    with tempfile.TemporaryDirectory(prefix="areal-bench-trace-") as tmp:
        for k in range(rounds):
            for trace in (True, False) if k % 2 == 0 else (False, True):
                console.print(f"round {k + 1}/{rounds}: tracing {'on' if trace else 'off'}, {steps} steps ...")
                r = one_run(steps, trace, Path(tmp), workflow)
                r["round"] = k
                runs.append(r)
                console.print(
                    f"  wall {r['wall_s']:.1f} s, loop {r['loop_s']:.1f} s, cpu {r['cpu_s']:.1f} s, "
                    f"trace {r['trace_bytes'] / 1e6:.1f} MB"
                )
    return runs


def summarize(runs: list[dict]) -> dict:
    def med(trace: bool, key: str) -> float:
        return statistics.median(r[key] for r in runs if r["trace"] == trace)

    out = {}
    for key in ("wall_s", "loop_s", "cpu_s"):
        on, off = med(True, key), med(False, key)
        out[key] = {"on": on, "off": off, "overhead": (on - off) / off}
    # per round (on and off ran back to back): the spread of the paired differences
    pairs = {}
    for r in runs:
        pairs.setdefault(r["round"], {})[r["trace"]] = r
    out["loop_overhead_per_round"] = [
        (p[True]["loop_s"] - p[False]["loop_s"]) / p[False]["loop_s"] for p in pairs.values() if len(p) == 2
    ]
    return out


def print_tables(
    console: Console, micro: dict, req: dict, eng: dict | None, runs: list[dict], summary: dict | None
) -> None:
    table = Table(title="Tracing cost, micro (one run, shared machine)")
    for col in ("what", "us"):
        table.add_column(col, justify="right")
    table.add_row("with tr.span(...): pass", f"{micro['per_span_us']:.1f}")
    table.add_row("empty loop", f"{micro['empty_loop_us']:.2f}")
    table.add_row(
        f"engine: one interrupted request, record ({req['spans_per_request']:.0f} spans)",
        f"{req['record_us_per_request']:.1f}",
    )
    table.add_row("engine: take() per request", f"{req['take_us_per_request']:.1f}")
    table.add_row(
        f"engine: JSON per request ({req['json_bytes_per_request']:.0f} bytes)", f"{req['json_us_per_request']:.1f}"
    )
    table.add_row("controller: merge + format + write, per request", f"{req['controller_us_per_request']:.1f}")
    console.print(table)
    if eng is not None:
        table = Table(
            title=f"Embedded engine in-process, 32 requests x {eng['new_tokens']} tokens + a weight swap, "
            f"median of {eng['rounds']} rounds each"
        )
        for col in ("tracing", "wall s", "cpu s"):
            table.add_column(col, justify="right")
        for mode in ("off", "on"):
            table.add_row(mode, f"{eng['wall_s'][mode]:.3f}", f"{eng['cpu_s'][mode]:.3f}")
        table.add_row("on / off - 1", f"{100 * eng['wall_overhead']:+.1f}%", f"{100 * eng['cpu_overhead']:+.1f}%")
        console.print(table)
        server_us = req["record_us_per_request"] + req["take_us_per_request"] + req["json_us_per_request"]
        per_request_us = eng["cpu_s"]["off"] / eng["requests_per_round"] * 1e6
        console.print(
            f"inference server: tracing {server_us:.0f} us per request (record + take + JSON) against "
            f"{per_request_us:.0f} us of engine CPU per request untraced: "
            f"{100 * server_us / per_request_us:.1f}%"
        )
    if not runs:
        return
    table = Table(title="Whole runs, tracing on vs off (interleaved; shared 2-core machine)")
    for col in ("round", "trace", "steps", "wall s", "loop s", "cpu s", "trace MB", "events"):
        table.add_column(col, justify="right")
    for r in runs:
        table.add_row(
            str(r["round"] + 1),
            "on" if r["trace"] else "off",
            str(r["steps"]),
            f"{r['wall_s']:.1f}",
            f"{r['loop_s']:.1f}",
            f"{r['cpu_s']:.1f}",
            f"{r['trace_bytes'] / 1e6:.2f}",
            str(r["trace_events"]),
        )
    console.print(table)
    for key in ("wall_s", "loop_s", "cpu_s"):
        s = summary[key]
        console.print(f"median {key}: on {s['on']:.1f}, off {s['off']:.1f} -> overhead {100 * s['overhead']:+.1f}%")
    per_round = summary["loop_overhead_per_round"]
    console.print("loop overhead per round: " + ", ".join(f"{100 * x:+.1f}%" for x in per_round))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=60, help="steps per run")
    ap.add_argument("--rounds", type=int, default=2, help="rounds of (on, off) runs, order alternating")
    ap.add_argument("--workflow", type=Path, default=ROOT / "workflows" / "ppo_async.yaml")
    ap.add_argument("--micro-only", action="store_true", help="skip the whole runs")
    ap.add_argument("--no-engine", action="store_true", help="skip the in-process engine comparison")
    args = ap.parse_args()
    console = Console()
    micro, req = span_cost(), request_spans_cost()
    eng = None if args.no_engine else engine_ab()
    runs = [] if args.micro_only else run_cost(args.steps, args.rounds, args.workflow, console)
    summary = summarize(runs) if runs else None
    print_tables(console, micro, req, eng, runs, summary)
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = RESULTS / ("tracing_micro.json" if args.micro_only else "tracing.json")
    out.write_text(
        json.dumps(
            {
                "micro": micro,
                "engine_request": req,
                "engine_ab": eng,
                "runs": runs,
                "summary": summary,
                "steps": args.steps,
                "rounds": args.rounds,
                "workflow": str(args.workflow),
            },
            indent=2,
        )
    )
    console.print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
