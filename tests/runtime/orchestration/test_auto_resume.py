"""runtime.auto_resume holds for a Python caller too: run_with_auto_resume, the loop
`areal-graph run` uses, against a stand-in for one run (the real crash-and-resume runs in
tests/e2e/test_run.py and tests/runtime/orchestration/test_train_dp_run.py)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

import areal_graph.runtime.orchestration.run as run_module
from areal_graph.runtime.orchestration.controller import RunFailed


class FakeRunDir:
    def __init__(self, checkpoint: Path | None) -> None:
        self.checkpoint = checkpoint
        self.closed: list[bool] = []  # close(failed) calls: the run's loggers end once, with the run

    def latest_checkpoint(self) -> Path | None:
        return self.checkpoint

    def close(self, failed: bool = False) -> None:
        self.closed.append(failed)


def spec_with(auto_resume: int) -> SimpleNamespace:
    return SimpleNamespace(runtime=SimpleNamespace(auto_resume=auto_resume))


def scripted(monkeypatch, outcomes: list) -> list:
    """run_workflow raises or returns `outcomes` in turn; returns the resume_from of each call."""
    calls = []

    def fake(spec, run_dir, display=None, resume_from=None):
        calls.append(resume_from)
        out = outcomes.pop(0)
        if isinstance(out, Exception):
            raise out
        return out

    monkeypatch.setattr(run_module, "run_workflow", fake)
    monkeypatch.setattr(run_module, "start_loggers", lambda spec, run_dir: calls.append("loggers"))
    return calls


def test_resumable_failures_go_on_from_the_latest_checkpoint(monkeypatch):
    ckpt = Path("/runs/x/checkpoints/step-4")
    calls = scripted(monkeypatch, [RunFailed("model died", True), RunFailed("again", True), "state"])
    told = []
    run_dir = FakeRunDir(ckpt)
    state = run_module.run_with_auto_resume(
        spec_with(2), run_dir, resume_from=None, on_resume=lambda err, c, n: told.append((str(err), c, n))
    )
    assert state == "state" and calls == ["loggers", None, ckpt, ckpt]  # loggers opened once for every part
    assert run_dir.closed == [False]
    assert told == [("model died", ckpt, 1), ("again", ckpt, 2)]


def test_past_the_limit_the_failure_is_raised_with_the_count(monkeypatch):
    scripted(monkeypatch, [RunFailed("died", True), RunFailed("died again", True)])
    with pytest.raises(RunFailed, match="died again") as info:
        run_module.run_with_auto_resume(spec_with(1), FakeRunDir(Path("/c")))
    assert info.value.resumes == 1


@pytest.mark.parametrize(
    "failure,checkpoint",
    [(RunFailed("node failed", False), Path("/c")), (RunFailed("died", True), None), (ValueError("bad"), Path("/c"))],
)
def test_what_is_not_resumable_is_raised_at_once(monkeypatch, failure, checkpoint):
    calls = scripted(monkeypatch, [failure])
    run_dir = FakeRunDir(checkpoint)
    with pytest.raises(type(failure)):
        run_module.run_with_auto_resume(spec_with(3), run_dir)
    assert len(calls) == 2
    assert run_dir.closed == [True]  # the trackers hear that the run failed


def test_the_loggers_start_with_the_config_the_run_wrote(tmp_path, monkeypatch):
    """runtime.loggers picks TensorBoard and the trackers; they get config.yaml as their config."""
    from areal_graph.graph.loader import load_workflow
    from areal_graph.runtime.observability import trackers
    from areal_graph.runtime.observability.run_dir import RunDir
    from support.paths import WORKFLOWS

    opened = []
    monkeypatch.setattr(
        run_module,
        "open_trackers",
        lambda loggers, settings, config: opened.append((list(loggers), settings, config)) or ["tracker"],
    )
    spec = load_workflow(WORKFLOWS / "ppo_async.yaml", overrides=["runtime.loggers=[jsonl,mlflow]"])
    run_dir = RunDir(tmp_path / "run")
    run_dir.write_config({"name": "from-config-yaml"})
    run_module.start_loggers(spec, run_dir)
    ((loggers, settings, config),) = opened
    assert loggers == ["jsonl", "mlflow"] and config == {"name": "from-config-yaml"}
    assert settings == trackers.TrackerSettings.for_run(spec, run_dir.path) and settings.run_name == "run"
    assert run_dir.trackers == ["tracker"]
    run_dir.trackers = []
    run_dir.log_metrics(1, {"loss": 1.0})
    assert not (run_dir.path / "tb").exists()  # tensorboard is not in runtime.loggers
