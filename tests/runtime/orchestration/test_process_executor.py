"""ProcessExecutor's decisions when a process dies (runtime/orchestration/process_executor.py),
without processes: which restart budget it keeps (from runtime.max_restarts and
runtime.restart_window_s), and the message that stops the run when a process keeps dying.
Restarts of real processes: tests/e2e/test_run.py, test_fault_injection.py and
test_restore_during_sync.py; under Ray, tests/runtime/launchers/test_ray.py."""

from __future__ import annotations

from areal_graph.graph.loader import load_workflow
from areal_graph.graph.plan import build_plan
from areal_graph.runtime.launchers import ProcessDied
from areal_graph.runtime.launchers.restart_budget import RestartBudget
from areal_graph.runtime.observability.run_dir import RunDir
from areal_graph.runtime.orchestration.process_executor import ProcessExecutor
from support.paths import WORKFLOWS


def executor(tmp_path, *overrides: str) -> tuple[ProcessExecutor, list[tuple[str, bool]]]:
    spec = load_workflow(WORKFLOWS / "ppo_async.yaml", list(overrides))
    ex = ProcessExecutor(build_plan(spec), RunDir(tmp_path / "run", tensorboard=False))
    failures: list[tuple[str, bool]] = []
    ex._on_failure = lambda message, resumable=False: failures.append((message, resumable))
    return ex, failures


def test_the_budget_is_the_workflows_rate_and_its_totals_are_the_restarts_the_run_reports(tmp_path):
    ex, _ = executor(tmp_path, "runtime.max_restarts=5", "runtime.restart_window_s=30")
    assert (ex.restart_budget.max_restarts, ex.restart_budget.window_s) == (5, 30.0)
    ex.restart_budget.spend("rollout")
    assert ex.restarts == {"rollout": 1}  # what end_state.json's process_restarts reads
    lifetime, _ = executor(tmp_path / "b", "runtime.restart_window_s=null")
    assert lifetime.restart_budget.window_s is None and lifetime.restart_budget.max_restarts == 3


def test_a_process_that_keeps_dying_stops_the_run_saying_why(tmp_path):
    ex, failures = executor(tmp_path)
    now = [0.0]
    ex.restart_budget = RestartBudget(3, 600.0, clock=lambda: now[0])
    for _ in range(3):  # three earlier deaths, each restarted
        assert ex.restart_budget.spend("rollout").allowed
        now[0] += 10.0
    ex._on_death(ProcessDied("rollout", "rollout", -9, "SIGKILL", "last words"))
    assert len(failures) == 1
    message, resumable = failures[0]
    assert message.startswith(
        "process 'rollout' (role rollout, hosting nodes ['rollout']) died: exit code -9, signal SIGKILL"
    )
    assert "last words" in message and not resumable
    assert message.endswith(
        "(not restarted again: it keeps dying, restarted 3 times in the last 30 s; "
        "runtime.max_restarts is 3 within any runtime.restart_window_s of 600 s)"
    )
    assert ex._deaths == 0 and ex.restarts == {"rollout": 3}  # nothing was restarted


def test_a_model_workers_death_is_resumable_and_spends_no_restart(tmp_path):
    ex, failures = executor(tmp_path)
    ex._on_death(ProcessDied("model-actor", "model", -9, "SIGKILL", ""))
    assert len(failures) == 1 and failures[0][1] is True
    assert "the run can go on from its last complete checkpoint" in failures[0][0]
    assert ex.restarts == {}


def test_the_machines_cpu_is_read_over_the_cores_the_run_may_use():
    """The cpu_time span carries the busy time of the run's cores, whoever used them, so the cost
    model can tell what processes outside the run took (perfmodel/costs.py `_outside_load`): it
    counts at least what this process used on them, grows as one of them computes, and an
    affinity naming no core the machine has falls back to all of them."""
    import time

    import psutil

    from areal_graph.runtime.orchestration.process_executor import _machine_cpu

    cores = sorted(psutil.Process().cpu_affinity())
    before = _machine_cpu({"me": {"cores": cores}})
    spent = time.process_time()
    while time.process_time() - spent < 0.3:  # 0.3 s of CPU on the run's cores
        pass
    after = _machine_cpu({"me": {"cores": cores}})
    assert before["cores"] == cores and after["cpu_s"] - before["cpu_s"] >= 0.25
    assert _machine_cpu({"me": {"cores": [10_000]}})["cores"] == list(range(len(psutil.cpu_times(percpu=True))))
