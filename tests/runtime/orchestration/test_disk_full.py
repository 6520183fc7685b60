"""A full disk mid-run, on a real small filesystem (a size-limited tmpfs as the run folder).

The run is stopped with a message that says the disk is full, which write failed, where, and
how to go on; the last complete checkpoint is intact; after space is freed, `--resume`
finishes the run with nothing lost (the ledger and the metrics, read from the run folder).
Mounting needs root with CAP_SYS_ADMIN: elsewhere the test is skipped, saying so.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from support.e2e import SMALL, read_metrics, write_workflow
from support.paths import child_env
from support.small_disk import small_tmpfs

STEPS, ETA = 12, 2


@pytest.fixture
def small_disk(tmp_path):
    with small_tmpfs(tmp_path / "disk", "24m") as mnt:
        yield mnt


def _start(wf: Path, run_dir: Path, *extra: str) -> subprocess.Popen:
    cmd = [
        sys.executable,
        "-m",
        "areal_graph.cli.main",
        "run",
        *([str(wf)] if wf else []),
        "--run-dir",
        str(run_dir),
        *SMALL,
        f"runtime.steps={STEPS}",
        f"runtime.max_staleness={ETA}",
        "runtime.save_every=2",
        "runtime.eval_every=0",
        "runtime.loggers=[jsonl]",
        *extra,
    ]
    return subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=child_env(COLUMNS="400")
    )


def _steps_logged(run_dir: Path) -> int:
    path = run_dir / "metrics.jsonl"
    return sum('"time/step"' in line for line in path.read_text().splitlines()) if path.exists() else 0


def _fill(disk: Path, leave: int) -> Path:
    """Fill the filesystem, then give back `leave` bytes: the run's next large write fails."""
    filler = disk / "filler"
    with open(filler, "wb") as f:
        block = b"\0" * (1 << 20)
        try:
            while True:
                f.write(block)
                f.flush()
        except OSError:
            pass
    size = filler.stat().st_size
    os.truncate(filler, max(size - leave, 0))
    return filler


@pytest.mark.slow  # ~60 s: two short runs; `make test-slow`
def test_a_full_disk_stops_the_run_with_the_path_and_resume_loses_nothing(kit, tmp_path, small_disk):
    from areal_graph.runtime.observability.ledger import read_ledger, reconcile
    from areal_graph.runtime.observability.run_dir import RunDir

    wf = write_workflow(kit, tmp_path)
    run_dir = small_disk / "run"
    proc = _start(wf, run_dir)
    try:
        deadline = time.monotonic() + 180
        while not (_steps_logged(run_dir) >= 4 and any((run_dir / "checkpoints").glob("step_*/COMPLETE"))):
            assert proc.poll() is None and time.monotonic() < deadline, proc.stdout.read()[-3000:]
            time.sleep(0.05)
        filler = _fill(small_disk, leave=96 << 10)
        out, _ = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode != 0, out[-3000:]
    said = " ".join(out.split())
    assert "the disk is full:" in said and "No space left on device" in said, out[-3000:]
    assert str(run_dir) in said and f"areal-graph run --resume {run_dir}" in said and "MB free" in said
    assert "Traceback" not in out

    # the last complete checkpoint is whole: its controller state parses, its tensors load
    latest = RunDir(run_dir, tensorboard=False).latest_checkpoint()
    assert latest is not None
    state = json.loads((latest / "controller_state.json").read_text())
    assert state["step"] == int(latest.name.split("_")[1])
    torch.load(latest / "actor" / "trainer_state.pt", weights_only=True)
    failed_at = _steps_logged(run_dir)

    filler.unlink()  # space freed: the run goes on where its last checkpoint was
    resumed = _start(None, run_dir, "--resume", str(run_dir))
    out2, _ = resumed.communicate(timeout=300)
    assert resumed.returncode == 0, out2[-3000:]
    metrics = [m for m in read_metrics(run_dir) if "time/step" in m]
    assert [m["step"] for m in metrics] == list(range(1, STEPS + 1)), "steps repeat, skip or stop short"
    assert max(m["staleness/max"] for m in metrics) <= ETA
    account = reconcile(read_ledger(run_dir / "ledger.jsonl"))
    assert account.trained_twice == [] and account.unaccounted() == [], "prompt groups lost or trained twice"
    assert sorted(account.trained) == list(range(STEPS * 2))
    end_state = json.loads((run_dir / "end_state.json").read_text())
    assert end_state["finished"] is True
    print(
        f"disk full after step {failed_at}; resumed from {latest.name}; console said:\n"
        + "\n".join(line for line in out.splitlines() if "disk is full" in line or "run failed" in line)
    )


def test_a_trace_that_fills_the_disk_asks_the_run_to_stop_naming_the_file(small_disk):
    """The tracer writes from its flush thread: a full disk there becomes `problem` (the controller
    stops the run with it after the step) and the trace written so far stays readable."""
    from areal_graph.runtime.observability.tracing import Tracer
    from areal_graph.trace_analysis.trace_model import load_timeline

    _fill(small_disk, leave=256 << 10)
    tr = Tracer(small_disk / "run" / "trace.json", flush_interval_s=1e9)
    t = time.perf_counter()
    for step in range(4000):  # ~1 MB of spans: past the room left
        tr.record("generate", t, t + 0.001, cat="node", node="rollout", worker="rollout", step=step, rid=f"r{step}")
        if step % 200 == 0:
            tr._flush_logged()  # what the flush thread runs
    tr.close()
    assert tr.problem is not None
    assert tr.problem.startswith("the disk is full: the trace could not be written to ")
    assert str(small_disk / "run" / "trace.json") in tr.problem and "MB free" in tr.problem
    spans = load_timeline(small_disk / "run").spans
    steps = [s["args"]["step"] for s in spans if s["name"] == "generate"]
    assert 0 < len(steps) < 4000 and steps == sorted(steps)


def test_a_full_disk_names_the_file_of_the_run_that_could_not_be_written(small_disk):
    """metrics.jsonl, the ledger and the run's JSON files each fail with an error naming the file,
    and the message the run stops with names it (it used to say only the run folder: "a file
    of the run could not be written to RUN")."""
    from types import SimpleNamespace

    from areal_graph.runtime.observability.ledger import SampleLedger
    from areal_graph.runtime.observability.run_dir import RunDir
    from areal_graph.runtime.orchestration.controller import Controller

    run = RunDir(small_disk / "run", tensorboard=False)
    ledger = SampleLedger(run.path / "ledger.jsonl")
    _fill(small_disk, leave=0)
    failed = {}
    for name, write in (
        ("metrics.jsonl", lambda: run.log_metrics(1, {"note": "x" * 8192})),
        ("ledger.jsonl", lambda: [ledger.record("generated", g, g, "p" * 4096, 0, 0) for g in range(8)]),
        ("end_state.json", lambda: run.write_json("end_state.json", {"note": "x" * 8192})),
    ):
        with pytest.raises(OSError) as info:
            write()
        failed[name] = info.value
    assert {name: err.filename for name, err in failed.items()} == {
        name: str(run.path / name) for name in ("metrics.jsonl", "ledger.jsonl", "end_state.json")
    }
    said = Controller._disk_full_message(SimpleNamespace(_saving=None, run_dir=run), failed["metrics.jsonl"])
    assert said.startswith(f"the disk is full: a file of the run could not be written to {run.path / 'metrics.jsonl'} ")
    nameless = Controller._disk_full_message(SimpleNamespace(_saving=None, run_dir=run), OSError(28, "No space"))
    assert "the error names none: OSError: [Errno 28] No space" in nameless
