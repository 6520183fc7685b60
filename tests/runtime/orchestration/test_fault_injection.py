"""Fault injection: kill the run's processes at random points; the run finishes and nothing is lost.

A seeded plan SIGKILLs the reward, rollout and inference processes (restarted in place) and
the model worker (the run goes on from its last checkpoint in fresh processes), one after
another, each at a random moment after a random step; a second test kills the controller
itself and resumes with `--resume`, a third kills it in the middle of a checkpoint save. The
invariants are read from the run directory alone: every step logged once and in order up to
the last, staleness never above eta, and by the ledger every prompt-stream position trained
exactly once with none lost on the way.

`AREAL_FAULT_SEED=N pytest tests/runtime/orchestration/test_fault_injection.py -s` replays one plan and prints
its table; the slow test runs several seeds.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest

from support.e2e import SMALL, read_metrics, write_workflow
from support.paths import child_env

STATELESS = ("reward", "rollout", "inference-0")
STEPS, ETA, GROUPS_PER_STEP = 60, 2, 2  # SMALL: batch 8 = 2 groups of 4


@dataclass
class Kill:
    victim: str
    steps_later: int  # steps after the previous kill's recovery (the first: after step 2)
    delay_s: float
    after_step: int = -1
    pid: int = -1
    outcome: str = ""
    recovered_s: float = float("nan")


def kill_plan(rng: random.Random) -> list[Kill]:
    """Each stateless process once and the model worker once, in a random order, 1-2 steps apart."""
    victims = [*STATELESS, "model-actor"]
    rng.shuffle(victims)
    return [Kill(v, rng.randint(1, 2), round(rng.uniform(0.0, 0.6), 2)) for v in victims]


def _last_step(run_dir: Path) -> int:
    metrics = run_dir / "metrics.jsonl"
    if not metrics.exists():
        return 0
    steps = [
        json.loads(line).get("step", 0)
        for line in metrics.read_text().splitlines()
        if line.strip() and "time/step" in line
    ]
    return steps[-1] if steps else 0


def _wait(cond, what: str, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def _children(proc: subprocess.Popen) -> list[psutil.Process]:
    try:
        return psutil.Process(proc.pid).children(recursive=True)
    except psutil.Error:  # the run itself has ended
        return []


def _find(proc: subprocess.Popen, name: str) -> psutil.Process | None:
    for child in _children(proc):
        try:
            if f"--name {name} " in " ".join(child.cmdline()) + " ":
                return child
        except psutil.NoSuchProcess:
            continue
    return None


def _names(proc: subprocess.Popen) -> list[str]:
    """The --name of every live process of the run (for messages)."""
    names = []
    for child in _children(proc):
        try:
            cmd = child.cmdline()
        except psutil.Error:
            continue
        if "--name" in cmd:
            names.append(cmd[cmd.index("--name") + 1])
    return names


def _start(
    wf: Path, run_dir: Path, *extra: str, steps: int = STEPS, env_extra: dict[str, str] | None = None
) -> subprocess.Popen:
    cmd = [
        sys.executable,
        "-m",
        "areal_graph.cli.main",
        "run",
        str(wf),
        "--run-dir",
        str(run_dir),
        *SMALL,
        f"runtime.steps={steps}",
        f"runtime.max_staleness={ETA}",
        "runtime.save_every=2",
        "runtime.eval_every=0",
        *extra,
    ]
    env = {**os.environ, "COLUMNS": "400", "PYTHONPATH": child_env()["PYTHONPATH"], **(env_extra or {})}
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)


def assert_nothing_lost(run_dir: Path, steps: int = STEPS) -> None:
    """The invariants, from the run directory alone."""
    from areal_graph.runtime.observability.ledger import read_ledger, reconcile

    metrics = [m for m in read_metrics(run_dir) if "time/step" in m]
    assert [m["step"] for m in metrics] == list(range(1, steps + 1)), "steps repeat, skip or stop short"
    assert max(m["staleness/max"] for m in metrics) <= ETA
    account = reconcile(read_ledger(run_dir / "ledger.jsonl"))
    assert account.trained_twice == [], "trained more than once"
    assert account.unaccounted() == [], "prompt groups lost"
    assert sorted(account.trained) == list(range(steps * GROUPS_PER_STEP))
    assert not account.failed and not account.dropped
    assert list(account.trained_steps) == sorted(account.trained_steps)


def run_kill_plan(kit_dir: Path, tmp_path: Path, seed: int) -> tuple[list[Kill], str]:
    plan = kill_plan(random.Random(seed))
    wf = write_workflow(kit_dir, tmp_path)
    run_dir = tmp_path / "run"
    proc = _start(wf, run_dir)
    try:
        step = 2
        for k in plan:
            k.after_step = step = step + k.steps_later
            _wait(lambda: _last_step(run_dir) >= k.after_step or proc.poll() is not None, f"step {k.after_step}")
            if proc.poll() is not None:
                raise AssertionError(
                    f"the run ended before the planned kill of {k.victim} after step {step}:\n"
                    + proc.stdout.read()[-3000:]
                )
            if k.victim == "model-actor":
                _wait(lambda: any((run_dir / "checkpoints").glob("step_*/COMPLETE")), "a checkpoint")
            time.sleep(k.delay_s)
            # the victim may be between lives (restarted after an earlier kill): wait for it
            _wait(
                lambda: _find(proc, k.victim) is not None or proc.poll() is not None,
                f"a live {k.victim} (alive: {_names(proc)})",
                60,
            )
            victim = _find(proc, k.victim)
            if victim is None:
                raise AssertionError(
                    f"the run ended before {k.victim} could be killed after step {step}:\n" + proc.stdout.read()[-3000:]
                )
            k.pid, killed_at, step_at_kill = victim.pid, time.monotonic(), _last_step(run_dir)
            victim.send_signal(signal.SIGKILL)
            _wait(lambda: _last_step(run_dir) > step_at_kill or proc.poll() is not None, "progress after the kill")
            k.recovered_s = round(time.monotonic() - killed_at, 1)
            step = _last_step(run_dir)
        out, _ = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    for k in plan:
        k.outcome = (
            "auto-resumed from its last checkpoint"
            if k.victim == "model-actor" and "auto-resume 1" in out
            else "restarted, its calls redone"
            if f"'{k.victim}'" in out and "restarting it" in out
            else "?"
        )
    assert proc.returncode == 0, out[-4000:]
    # counted over the whole run, across the auto-resume after the model worker's death
    restarts = json.loads((run_dir / "end_state.json").read_text())["process_restarts"]
    assert restarts == {v: 1 for v in STATELESS}, restarts
    return plan, out


def _table(seed: int, plan: list[Kill]) -> str:
    lines = [f"seed {seed}: process killed | after step (+delay) | what happened | next step logged after"]
    lines += [
        f"  {k.victim:12s} | {k.after_step:2d} (+{k.delay_s:.2f} s) | {k.outcome} | {k.recovered_s} s" for k in plan
    ]
    return "\n".join(lines)


@pytest.mark.slow  # ~65 s; a kill of the rollout worker mid-run is checked on every `make test`
# (tests/e2e/test_run.py), random kills of every kind of process with `make test-slow`
def test_random_kills_of_every_kind_of_process_lose_nothing(kit, tmp_path):
    seed = int(os.environ.get("AREAL_FAULT_SEED", "11"))
    plan, out = run_kill_plan(kit, tmp_path, seed)
    print(_table(seed, plan))
    assert all(k.outcome != "?" for k in plan), out[-3000:]
    assert_nothing_lost(tmp_path / "run")


@pytest.mark.slow  # ~25-45 s of a whole run: `make test-slow`
def test_a_killed_controller_resumes_with_nothing_lost(kit, tmp_path):
    """SIGKILL the controller (`areal-graph run` itself) at a random point; `--resume` finishes the run."""
    rng = random.Random(int(os.environ.get("AREAL_FAULT_SEED", "5")))
    wf = write_workflow(kit, tmp_path)
    run_dir = tmp_path / "run"
    steps = 16
    proc = _start(wf, run_dir, steps=steps)
    try:
        after = rng.randrange(3, steps - 4)
        _wait(
            lambda: _last_step(run_dir) >= after and any((run_dir / "checkpoints").glob("step_*/COMPLETE")),
            f"step {after}",
        )
        time.sleep(rng.uniform(0.0, 0.6))
    finally:
        _kill_controller(proc, run_dir)
    resumed = _start(wf, run_dir, "--resume", str(run_dir), steps=steps)
    out, _ = resumed.communicate(timeout=300)
    assert resumed.returncode == 0, out[-4000:]
    assert_nothing_lost(run_dir, steps)
    # one trace across both parts (what the killed part had not flushed yet died with it)
    trace = json.loads((run_dir / "trace.json").read_text())
    assert [e["name"] for e in trace if e.get("name") == "resume"] == ["resume"]
    assert sum(e.get("name") == "plan" for e in trace) >= 1


@pytest.mark.slow  # ~40-60 s of two short runs: `make test-slow`
def test_a_controller_killed_mid_save_resumes_from_the_previous_complete_checkpoint(kit, tmp_path):
    """SIGKILL `areal-graph run` while it saves the step-4 checkpoint (the models' files written,
    the COMPLETE marker not yet: the controller's test hook holds it there). The step-2 checkpoint
    is still whole and is what `--resume` continues from; the run finishes every step once, and
    runtime.keep_checkpoints 1 leaves only the last checkpoint, nothing half-removed."""
    from areal_graph.runtime.observability.ledger import read_ledger
    from areal_graph.runtime.observability.run_dir import RunDir
    from areal_graph.runtime.orchestration.controller import SAVE_DELAY_ENV

    wf = write_workflow(kit, tmp_path)
    run_dir = tmp_path / "run"
    steps = 6
    saving = run_dir / "checkpoints" / "step_00000004"
    proc = _start(wf, run_dir, "runtime.keep_checkpoints=1", steps=steps, env_extra={SAVE_DELAY_ENV: "4"})
    try:
        # the model worker's last file of the save is there, the marker is not: mid-save
        _wait(lambda: (saving / "actor" / "trainer_state.pt").exists() or proc.poll() is not None, "the step-4 save")
        assert proc.poll() is None and not (saving / "COMPLETE").exists(), proc.stdout.read()[-3000:]
    finally:
        _kill_controller(proc, run_dir)
    assert RunDir(run_dir, tensorboard=False).latest_checkpoint() == run_dir / "checkpoints" / "step_00000002"
    assert not (saving / "COMPLETE").exists()

    resumed = _start(wf, run_dir, "--resume", str(run_dir), "runtime.keep_checkpoints=1", steps=steps)
    out, _ = resumed.communicate(timeout=300)
    assert resumed.returncode == 0, out[-4000:]
    assert [e["prompt"] for e in read_ledger(run_dir / "ledger.jsonl") if e["event"] == "resumed"] == ["step_00000002"]
    assert_nothing_lost(run_dir, steps)
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == ["step_00000006"]
    end_state = json.loads((run_dir / "end_state.json").read_text())
    assert end_state["finished"] is True and end_state["step"] == steps


def _kill_controller(proc: subprocess.Popen, run_dir: Path) -> None:
    """SIGKILL `areal-graph run` itself and wait until every process of the run has exited."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=30)
    _wait(lambda: _find_any(run_dir) == [], "the run's processes to exit after the controller died", 30)


def _find_any(run_dir: Path) -> list[psutil.Process]:
    found = []
    for p in psutil.process_iter(["cmdline"]):
        if str(run_dir) in " ".join(p.info["cmdline"] or []):
            found.append(p)
    return found


@pytest.mark.slow
@pytest.mark.parametrize("seed", [1, 2, 3, 4])
def test_random_kill_plans_over_several_seeds(kit, tmp_path, seed):
    plan, _ = run_kill_plan(kit, tmp_path, seed)
    print(_table(seed, plan))
    assert_nothing_lost(tmp_path / "run")
