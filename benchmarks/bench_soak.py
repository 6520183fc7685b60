"""A soak run: does a long run stay healthy? Memory, open files and disk of every process over N steps.

Real RL runs go on for days. This runs a workflow for `--steps` steps (`areal-graph run`, the
owner, in a subprocess) and every `--sample-s` seconds samples, for each process of the run
(the owner, model workers, rollout and reward workers, inference servers, the reward pool):
resident memory and open file descriptors, plus the run folder's size and the trace's. It
prints, per process, RSS at 1,000 steps and at the end and the growth per 1,000 steps (a
least-squares slope over the samples after `--warmup` steps), and writes every sample as JSON.

With `--kill`, the fault-injection kills run during the soak: at random intervals (seeded) a
random process of the run is SIGKILLed (rollout, reward, an inference server: restarted in
place; the model worker: the run goes on from its last checkpoint). At the end the ledger is
checked: every step logged once, staleness never above the bound, every prompt group trained
once with none lost (ledger.jsonl).

    python benchmarks/bench_soak.py --steps 10000                  # ~40 min on 2 cores
    python benchmarks/bench_soak.py --steps 10000 --kill           # with random kills
    python benchmarks/bench_soak.py --steps 300 --sample-s 5       # a quick look
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil
from rich.console import Console
from rich.table import Table

from areal_graph.runtime.observability.disk_full import dir_bytes
from areal_graph.runtime.observability.run_dir import METRICS_FILENAME, metrics_record, read_metrics_file

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
KILLABLE = ("rollout", "reward", "inference-0", "model-actor")


def role(p: psutil.Process, owner: int) -> str | None:
    """The process's part in the run, from its command line."""
    try:
        cmd = p.cmdline()
    except psutil.Error:
        return None
    if p.pid == owner:
        return "owner"
    if "--name" in cmd:
        return cmd[cmd.index("--name") + 1]
    if any("http_server" in c for c in cmd):
        return "inference-0"
    if any("forkserver" in c for c in cmd):
        return "reward-pool"
    return None


def sample(owner: psutil.Process) -> dict[str, dict[str, float]]:
    """role -> {rss_mb, fds} summed over the processes of that role (a pool has several)."""
    out: dict[str, dict[str, float]] = {}
    try:
        procs = [owner, *owner.children(recursive=True)]
    except psutil.Error:
        return out
    for p in procs:
        r = role(p, owner.pid)
        if r is None:
            continue
        try:
            rss, fds = p.memory_info().rss / 2**20, p.num_fds()
        except psutil.Error:
            continue
        acc = out.setdefault(r, {"rss_mb": 0.0, "fds": 0.0, "procs": 0.0})
        acc["rss_mb"] += rss
        acc["fds"] += fds
        acc["procs"] += 1
    return out


def last_step(run_dir: Path) -> int:
    """The last step in metrics.jsonl, read from the file's end (it grows with the run)."""
    path = run_dir / METRICS_FILENAME
    try:
        with open(path, "rb") as f:
            f.seek(max(f.seek(0, 2) - 65536, 0))
            lines = f.read().decode(errors="replace").splitlines()
    except OSError:
        return 0
    for line in reversed(lines):
        rec = metrics_record(line)  # None for the line the read began inside of, or one cut off
        if rec is not None and "time/step" in rec:
            return int(rec["step"])
    return 0


def trace_mb(run_dir: Path) -> float:
    files = [run_dir / "trace.json", *(run_dir / "trace_segments").glob("*.json")]
    return sum(p.stat().st_size for p in files if p.exists()) / 2**20


def slope_per_1k(points: list[tuple[int, float]]) -> float:
    """Least-squares growth per 1,000 steps."""
    if len(points) < 3:
        return float("nan")
    n = len(points)
    mx = sum(s for s, _ in points) / n
    my = sum(v for _, v in points) / n
    var = sum((s - mx) ** 2 for s, _ in points)
    return 1000 * sum((s - mx) * (v - my) for s, v in points) / var if var else float("nan")


def kill_one(owner: psutil.Process, rng: random.Random, run_dir: Path) -> dict[str, Any] | None:
    victims = [p for p in owner.children(recursive=True) if role(p, owner.pid) in KILLABLE]
    if not (run_dir / "checkpoints").exists() or not any((run_dir / "checkpoints").glob("step_*/COMPLETE")):
        victims = [p for p in victims if role(p, owner.pid) != "model-actor"]  # nothing to resume from yet
    if not victims:
        return None
    v = rng.choice(victims)
    r = role(v, owner.pid)
    try:
        v.send_signal(signal.SIGKILL)
    except psutil.Error:
        return None
    return {"victim": r, "pid": v.pid, "step": last_step(run_dir), "t": time.time()}


def check_ledger(run_dir: Path, steps: int, eta: int) -> dict[str, Any]:
    """Nothing lost, nothing trained twice, staleness within the bound (from the run folder alone)."""
    from areal_graph.runtime.observability.ledger import read_ledger, reconcile

    metrics = [rec for rec in read_metrics_file(run_dir / METRICS_FILENAME).records if "time/step" in rec]
    logged = [m["step"] for m in metrics]
    account = reconcile(read_ledger(run_dir / "ledger.jsonl"))
    stale = max((m.get("staleness/max", 0.0) for m in metrics), default=0.0)
    return {
        "steps_in_order": logged == list(range(1, steps + 1)),
        "staleness_max": stale,
        "staleness_within_bound": stale <= eta,
        "trained_twice": len(account.trained_twice),
        "unaccounted": len(account.unaccounted()),
        "failed": len(account.failed),
        "dropped": len(account.dropped),
        "groups_trained": len(account.trained),
    }


def soak(args: argparse.Namespace) -> dict[str, Any]:
    run_dir = Path(args.run_dir or f"/tmp/areal-soak-{int(time.time())}")
    cmd = [
        sys.executable,
        "-m",
        "areal_graph.cli.main",
        "run",
        args.workflow,
        "--run-dir",
        str(run_dir),
        f"runtime.steps={args.steps}",
        f"runtime.eval_every={args.eval_every}",
        f"runtime.save_every={args.save_every}",
        *args.overrides,
    ]
    if args.kill:
        cmd.append("runtime.auto_resume=1000")
        cmd.append("runtime.max_restarts=1000")
    console = Console()
    console.print(f"[bold]soak[/]: {' '.join(cmd[3:])}")
    log = open(run_dir.parent / f"{run_dir.name}.console.log", "w") if run_dir.parent.exists() else subprocess.DEVNULL
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "COLUMNS": "200"})
    owner = psutil.Process(proc.pid)
    rng = random.Random(args.seed)
    next_kill = time.time() + rng.expovariate(1 / args.kill_every_s) if args.kill else float("inf")
    samples, kills, t0 = [], [], time.time()
    while proc.poll() is None:
        time.sleep(args.sample_s)
        step = last_step(run_dir)
        samples.append(
            {
                "t": round(time.time() - t0, 1),
                "step": step,
                "procs": sample(owner),
                "run_mb": round(dir_bytes(run_dir) / 2**20, 2),
                "trace_mb": round(trace_mb(run_dir), 2),
            }
        )
        if time.time() >= next_kill and step > 2:
            k = kill_one(owner, rng, run_dir)
            if k is not None:
                kills.append(k)
                console.print(f"  killed {k['victim']} (pid {k['pid']}) after step {k['step']}")
            next_kill = time.time() + rng.expovariate(1 / args.kill_every_s)
    wall = time.time() - t0
    result: dict[str, Any] = {
        "workflow": args.workflow,
        "steps": args.steps,
        "kill": args.kill,
        "wall_s": round(wall, 1),
        "returncode": proc.returncode,
        "run_dir": str(run_dir),
        "kills": kills,
        "samples": samples,
        "growth": growth(samples, args.warmup),
    }
    if proc.returncode == 0:
        result["ledger"] = check_ledger(run_dir, args.steps, args.max_staleness)
    return result


def growth(samples: list[dict[str, Any]], warmup: int) -> dict[str, dict[str, float]]:
    """Per role: RSS near 1,000 steps and at the end, growth per 1,000 steps after warm-up, fds."""
    roles = sorted({r for s in samples for r in s["procs"]})
    out = {}
    for r in roles:
        pts = [(s["step"], s["procs"][r]["rss_mb"]) for s in samples if r in s["procs"] and s["step"] >= warmup]
        fds = [s["procs"][r]["fds"] for s in samples if r in s["procs"] and s["step"] >= warmup]
        at_1k = min(
            ((abs(s["step"] - 1000), s["procs"][r]["rss_mb"]) for s in samples if r in s["procs"]),
            default=(0, float("nan")),
        )[1]
        out[r] = {
            "rss_1k_mb": round(at_1k, 1),
            "rss_end_mb": round(pts[-1][1], 1) if pts else float("nan"),
            "rss_mb_per_1k_steps": round(slope_per_1k(pts), 2),
            "fds_first": fds[0] if fds else float("nan"),
            "fds_last": fds[-1] if fds else float("nan"),
        }
    return out


def show(result: dict[str, Any], console: Console) -> None:
    table = Table(
        title=f"soak: {result['workflow']}, {result['steps']} steps"
        f"{' with kills' if result['kill'] else ''}, {result['wall_s']:.0f} s"
    )
    for col in ("process", "RSS at ~1k steps (MB)", "RSS at end (MB)", "growth per 1k steps (MB)", "open files"):
        table.add_column(col, justify="right" if col != "process" else "left")
    for r, g in result["growth"].items():
        table.add_row(
            r,
            f"{g['rss_1k_mb']:.0f}",
            f"{g['rss_end_mb']:.0f}",
            f"{g['rss_mb_per_1k_steps']:+.1f}",
            f"{g['fds_first']:.0f} -> {g['fds_last']:.0f}",
        )
    console.print(table)
    last = result["samples"][-1] if result["samples"] else {}
    console.print(
        f"run folder {last.get('run_mb', 0):.0f} MB, trace {last.get('trace_mb', 0):.0f} MB; "
        f"exit {result['returncode']}; kills: {len(result['kills'])}"
    )
    if "ledger" in result:
        console.print(f"ledger: {result['ledger']}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workflow", default=str(ROOT / "workflows" / "ppo_async.yaml"))
    ap.add_argument("--steps", type=int, default=10_000)
    ap.add_argument("--eval-every", type=int, default=1000)
    ap.add_argument("--save-every", type=int, default=250)
    ap.add_argument("--max-staleness", type=int, default=4, help="the workflow's bound, for the ledger check")
    ap.add_argument("--sample-s", type=float, default=20.0)
    ap.add_argument("--warmup", type=int, default=500, help="steps before growth is measured")
    ap.add_argument("--kill", action="store_true", help="SIGKILL random processes of the run during the soak")
    ap.add_argument("--kill-every-s", type=float, default=180.0, help="mean seconds between kills")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--run-dir")
    ap.add_argument("--out", default=None)
    ap.add_argument("overrides", nargs="*", help="workflow overrides (runtime.trace_max_mb=64 ...)")
    args = ap.parse_args()
    result = soak(args)
    show(result, Console())
    out = Path(args.out or RESULTS / f"soak_{args.steps}{'_kill' if args.kill else ''}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1))
    Console().print(f"wrote {out}")
    if result["returncode"] != 0:
        sys.exit(result["returncode"])


if __name__ == "__main__":
    main()
