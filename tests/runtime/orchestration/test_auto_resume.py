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

    def latest_checkpoint(self) -> Path | None:
        return self.checkpoint


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
    return calls


def test_resumable_failures_go_on_from_the_latest_checkpoint(monkeypatch):
    ckpt = Path("/runs/x/checkpoints/step-4")
    calls = scripted(monkeypatch, [RunFailed("model died", True), RunFailed("again", True), "state"])
    told = []
    state = run_module.run_with_auto_resume(spec_with(2), FakeRunDir(ckpt), resume_from=None,
                                            on_resume=lambda err, c, n: told.append((str(err), c, n)))
    assert state == "state" and calls == [None, ckpt, ckpt]
    assert told == [("model died", ckpt, 1), ("again", ckpt, 2)]


def test_past_the_limit_the_failure_is_raised_with_the_count(monkeypatch):
    scripted(monkeypatch, [RunFailed("died", True), RunFailed("died again", True)])
    with pytest.raises(RunFailed, match="died again") as info:
        run_module.run_with_auto_resume(spec_with(1), FakeRunDir(Path("/c")))
    assert info.value.resumes == 1


@pytest.mark.parametrize("failure,checkpoint", [(RunFailed("node failed", False), Path("/c")),
                                                (RunFailed("died", True), None),
                                                (ValueError("bad"), Path("/c"))])
def test_what_is_not_resumable_is_raised_at_once(monkeypatch, failure, checkpoint):
    calls = scripted(monkeypatch, [failure])
    with pytest.raises(type(failure)):
        run_module.run_with_auto_resume(spec_with(3), FakeRunDir(checkpoint))
    assert len(calls) == 1
