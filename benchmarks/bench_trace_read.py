"""How long `areal-graph trace` takes, and how much memory, on a trace of any size (up to 1 GB and more).

A real run's trace (`--source RUN_DIR`, else a 200-step run of the main job made first) is
grown to `--size-mb` by repeating its events, each copy shifted in time past the previous one
(a run of that many steps, as far as a reader can tell). `areal-graph trace` then reads it in
a subprocess, and its wall time and peak RSS are measured; so is a whole read of the source
(`--read-mb` large enough to hold it: what every read was before windows).

    python benchmarks/bench_trace_read.py                       # 1 GB, ~2 min
    python benchmarks/bench_trace_read.py --source runs/X --size-mb 2048
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
_TS = re.compile(rb'"ts":(\d+)')


def make_source(tmp: Path) -> Path:
    run = tmp / "source"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "areal_graph.cli.main",
            "run",
            str(ROOT / "workflows" / "ppo_async.yaml"),
            "--run-dir",
            str(run),
            "runtime.steps=200",
            "runtime.trace_max_mb=null",
        ],
        check=True,
        capture_output=True,
    )
    return run


def grow(source: Path, out: Path, size_mb: int) -> int:
    """Write `out`: the source trace's events repeated, shifted in time, until `size_mb`; returns bytes."""
    lines = source.read_bytes().splitlines(keepends=True)
    body = [ln for ln in lines[1:] if ln.startswith(b"{") and b'"ph":"M"' not in ln]
    meta = [ln.rstrip().rstrip(b",") for ln in lines if b'"ph":"M"' in ln]
    stamps = [int(m.group(1)) for ln in body[:: max(len(body) // 1000, 1)] if (m := _TS.search(ln))]
    span = (max(stamps) - min(stamps)) + 10**6 if stamps else 10**6
    chunk = b"".join(body)
    with open(out, "wb") as f:
        f.write(b"[\n")
        k = 0
        while f.tell() < size_mb * 2**20:
            shift = k * span
            f.write(_TS.sub(lambda m: b'"ts":%d' % (int(m.group(1)) + shift), chunk) if k else chunk)
            k += 1
        f.write(b",\n".join(meta) + b"\n]\n")
        return f.tell()


_PEAK = (
    "import resource, subprocess, sys; done = subprocess.run(sys.argv[1:], capture_output=True, text=True); "
    "sys.stdout.write(done.stdout); print('PEAK_KB', resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss); "
    "sys.exit(done.returncode)"
)


def measure(path: Path, read_mb: int) -> dict:
    """`areal-graph trace PATH --read-mb N` in a fresh process: wall seconds and peak RSS (its own,
    reported by a parent of its own: one measurement never sees another's peak)."""
    t0 = time.perf_counter()
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            _PEAK,
            sys.executable,
            "-m",
            "areal_graph.cli.main",
            "trace",
            str(path),
            "--read-mb",
            str(read_mb),
            "--by",
            "name",
            "--top",
            "5",
        ],
        capture_output=True,
        text=True,
        env={**os.environ, "COLUMNS": "200"},
    )
    wall = time.perf_counter() - t0
    peak = [int(ln.split()[1]) for ln in done.stdout.splitlines() if ln.startswith("PEAK_KB")]
    notes = [ln.strip() for ln in done.stdout.splitlines() if "note:" in ln and "streamed" in ln]
    return {
        "file_mb": round(path.stat().st_size / 2**20, 1),
        "read_mb": read_mb,
        "wall_s": round(wall, 2),
        "peak_rss_mb": round(peak[0] / 1024) if peak else None,
        "returncode": done.returncode,
        "streamed_note": notes[0] if notes else "",
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--source", type=Path, help="a run directory or trace file (default: a 200-step run made first)")
    ap.add_argument("--size-mb", type=int, default=1024)
    ap.add_argument("--read-mb", type=int, default=48)
    ap.add_argument("--out", type=Path, default=RESULTS / "trace_read.json")
    args = ap.parse_args()
    console = Console()
    with tempfile.TemporaryDirectory() as tmp_s:
        tmp = Path(tmp_s)
        source = args.source or make_source(tmp)
        trace = source / "trace.json" if source.is_dir() else source
        big = tmp / "big" / "trace.json"
        big.parent.mkdir()
        grow(trace, big, args.size_mb)
        rows = [
            ("source, read whole", measure(trace, 1 << 14)),
            (f"{args.size_mb} MB, windows", measure(big, args.read_mb)),
        ]
    table = Table(title="areal-graph trace: time and memory by trace size")
    for col in ("what", "file MB", "read MB", "wall s", "peak RSS MB"):
        table.add_column(col, justify="left" if col == "what" else "right")
    for what, r in rows:
        table.add_row(
            what,
            f"{r['file_mb']:,.0f}",
            str(min(r["read_mb"], int(r["file_mb"]) + 1)),
            f"{r['wall_s']:.1f}",
            f"{r['peak_rss_mb']:,.0f}" if r["peak_rss_mb"] else "?",
        )
    console.print(table)
    for _, r in rows:
        if r["returncode"]:
            console.print(f"[red]areal-graph trace exited {r['returncode']}[/]")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"rows": dict(rows)}, indent=1))
    console.print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
