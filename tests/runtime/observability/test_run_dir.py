"""RunDir: config snapshot, metrics JSONL (+ TensorBoard when installed), checkpoints, resume."""

from __future__ import annotations

import json
import logging
import math
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch

from areal_graph.runtime.observability.run_dir import COMPLETE_MARKER, RunDir, metrics_record, read_metrics_file


@dataclass
class _Runtime:
    batch_size: int = 32
    run_dir: Path = Path("runs/x")


@dataclass
class _Spec:
    name: str = "ppo"
    runtime: _Runtime = field(default_factory=_Runtime)
    stages: tuple = ("a", "b")


def test_layout_and_config_snapshot(tmp_path):
    rd = RunDir(tmp_path / "a" / "run")
    assert rd.path.is_dir()
    rd.write_config({"name": "ppo", "runtime": {"batch_size": 8, "lr": 2e-5}})
    assert rd.read_config() == {"name": "ppo", "runtime": {"batch_size": 8, "lr": 2e-5}}
    rd.write_config(_Spec())
    assert rd.read_config() == {"name": "ppo", "runtime": {"batch_size": 32, "run_dir": "runs/x"}, "stages": ["a", "b"]}
    assert rd.trace_path == rd.path / "trace.json"
    assert rd.final_model_dir == rd.path / "final_model"
    assert rd.weights_dir(3) == rd.path / "weights" / "v000003" and not rd.weights_dir(3).exists()
    with pytest.raises(TypeError, match="cannot turn a int"):
        rd.write_config(5)
    (tmp_path / "file").write_text("x")
    with pytest.raises(ValueError, match="not a directory"):
        RunDir(tmp_path / "file")


def test_metrics_jsonl(tmp_path, caplog):
    rd = RunDir(tmp_path)
    with caplog.at_level(logging.INFO):
        rd.log_metrics(1, {"loss": 0.5, "reward/mean": torch.tensor(0.25), "note": "hi", "bad": float("nan")})
        rd.log_metrics(2, {"loss": 0.25})
    lines = rd.metrics_path.read_text().splitlines()
    assert len(lines) == 2
    first = json.loads(lines[0])
    assert first["step"] == 1 and first["loss"] == 0.5 and first["reward/mean"] == 0.25 and first["note"] == "hi"
    assert math.isnan(first["bad"])
    assert [m["step"] for m in read_metrics_file(rd.metrics_path).records] == [1, 2]
    import importlib.util

    has_tb = importlib.util.find_spec("tensorboard") is not None
    if has_tb:
        assert list((tmp_path / "tb").glob("events.out.tfevents.*"))
    else:
        tb_logs = [r for r in caplog.records if "tensorboard is not installed" in r.getMessage()]
        assert len(tb_logs) == 1  # said once, not on every step
    rd.close()


def test_damaged_metrics_line_is_skipped(tmp_path):
    rd = RunDir(tmp_path)
    rd.log_metrics(1, {"a": 1.0})
    with open(rd.metrics_path, "a") as f:
        f.write('{"step": 2, "a"')  # a crash mid-write
    assert [m["step"] for m in read_metrics_file(rd.metrics_path).records] == [1]
    assert read_metrics_file(rd.metrics_path).damaged == 1


def test_metrics_lines_are_read_one_way_for_every_reader(tmp_path):
    """read_metrics_file is the one reader: a line that is not JSON, not an object or has no
    number at "step" is damaged (skipped and counted), a blank line is nothing, no file is no
    steps; truncate_metrics (a resume) drops the damaged lines with the later steps."""
    rd = RunDir(tmp_path)
    rd.log_metrics(1, {"a": 1.0})
    with open(rd.metrics_path, "a") as f:
        f.write('\n[1, 2]\n{"a": 2}\n{"step": "3"}\n{"step": NaN}\n')
    rd.log_metrics(2, {"a": 2.0})
    rd.log_metrics(3, {"a": 3.0})
    with open(rd.metrics_path, "a") as f:
        f.write('{"step": 4, "a')
    read = read_metrics_file(rd.metrics_path)
    assert [m["step"] for m in read.records] == [1, 2, 3] and read.damaged == 5
    assert metrics_record('{"step": 2.0}') == {"step": 2.0} and metrics_record('{"step": null}') is None
    assert read_metrics_file(tmp_path / "nowhere.jsonl") == ([], 0)
    assert rd.truncate_metrics(2) == 6  # step 3 and the five damaged lines
    read = read_metrics_file(rd.metrics_path)
    assert [m["step"] for m in read.records] == [1, 2] and read.damaged == 0


def test_latest_checkpoint_needs_the_marker(tmp_path):
    rd = RunDir(tmp_path)
    assert rd.latest_checkpoint() is None
    c10 = rd.checkpoint_dir(10)
    (c10 / "model.safetensors").write_text("w")
    rd.mark_checkpoint_complete(c10)
    c20 = rd.checkpoint_dir(20)
    rd.mark_checkpoint_complete(c20, {"step": 20})
    c30 = rd.checkpoint_dir(30)  # crashed before the marker
    (c30 / "model.safetensors").write_text("half")
    c5 = rd.checkpoint_dir(5)
    rd.mark_checkpoint_complete(c5)
    assert rd.latest_checkpoint() == c20
    assert json.loads((c20 / COMPLETE_MARKER).read_text())["step"] == 20
    assert [s for s, _ in rd.checkpoints()] == [5, 10, 20]
    assert [s for s, _ in rd.checkpoints(complete_only=False)] == [5, 10, 20, 30]
    # resuming: a second RunDir on the same root sees the same
    assert RunDir(tmp_path).latest_checkpoint() == c20
    with pytest.raises(FileNotFoundError):
        rd.mark_checkpoint_complete(tmp_path / "nope")


def test_write_json_is_atomic_and_plain(tmp_path):
    rd = RunDir(tmp_path)
    p = rd.write_json("end_state.json", {"n": torch.tensor(3), "path": Path("/x"), "t": (1, 2)})
    assert json.loads(p.read_text()) == {"n": 3, "path": "/x", "t": [1, 2]}
    assert not list(tmp_path.glob(".*tmp*"))


def test_a_resume_hides_the_superseded_steps_from_tensorboard(tmp_path):
    """Steps 1-4 logged, the run resumes from step 2 and logs 3-4 again: TensorBoard shows each step once."""
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    first = RunDir(tmp_path / "run")
    for step in range(1, 5):
        first.log_metrics(step, {"loss": float(step)})
    first.close()
    resumed = RunDir(tmp_path / "run")
    assert resumed.truncate_metrics(2) == 2
    for step in (3, 4):
        resumed.log_metrics(step, {"loss": 10.0 * step})
    resumed.close()
    acc = EventAccumulator(str(tmp_path / "run" / "tb"), purge_orphaned_data=True)
    acc.Reload()
    seen = [(e.step, e.value) for e in acc.Scalars("loss")]
    assert seen == [(1, 1.0), (2, 2.0), (3, 30.0), (4, 40.0)]


class _Recorder:
    """A tracker (runtime/observability/trackers.py: Tracker) that records what it is told."""

    def __init__(self, fail_on: str = "") -> None:
        self.calls: list[tuple] = []
        self.fail_on = fail_on

    def _record(self, *call) -> None:
        self.calls.append(call)
        if call[0] == self.fail_on:
            raise OSError(f"{self.fail_on}: disk full")

    def log_config(self, config):
        self._record("config", dict(config))

    def log_metrics(self, step, metrics):
        self._record("metrics", step, dict(metrics))

    def log_links(self, links):
        self._record("links", dict(links))

    def close(self, failed=False):
        self._record("close", failed)


def test_trackers_get_every_step_as_numbers_then_the_links_and_the_close(tmp_path):
    rd = RunDir(tmp_path / "run", tensorboard=True)
    tracker = _Recorder()
    rd.set_loggers(tensorboard=False, trackers=[tracker])
    rd.log_metrics(
        1,
        {
            "loss": 0.5,
            "reward/mean": torch.tensor(0.25),
            "n": 3,
            "note": "hi",
            "flag": True,
            "bad": float("nan"),
            "step": 99,
        },
    )
    rd.log_metrics(2, {"loss": 0.25})
    rd.trace_path.write_text("[]")
    rd.close(failed=True)
    assert not (tmp_path / "run" / "tb").exists()  # runtime.loggers without tensorboard
    (metrics1,), (metrics2,) = [c[2:] for c in tracker.calls[:2]]
    assert [c[:2] for c in tracker.calls[:2]] == [("metrics", 1), ("metrics", 2)]
    assert set(metrics1) == {"loss", "reward/mean", "n", "bad"} and metrics1["n"] == 3.0
    assert metrics1["reward/mean"] == 0.25 and math.isnan(metrics1["bad"]) and metrics2 == {"loss": 0.25}
    root = str((tmp_path / "run").resolve())
    assert tracker.calls[2:] == [
        ("links", {"run_dir": root, "trace": f"{root}/trace.json", "metrics": f"{root}/metrics.jsonl"}),
        ("close", True),
    ]
    assert rd.trackers == []
    rd.log_metrics(3, {"loss": 0.1})  # after the close: metrics.jsonl only
    assert len(tracker.calls) == 4 and [m["step"] for m in read_metrics_file(rd.metrics_path).records] == [1, 2, 3]


def test_a_tracker_that_fails_mid_run_is_dropped_and_the_run_goes_on(tmp_path, caplog):
    rd = RunDir(tmp_path, tensorboard=False)
    broken, fine = _Recorder(fail_on="metrics"), _Recorder()
    rd.set_loggers(tensorboard=False, trackers=[broken, fine])
    with caplog.at_level(logging.ERROR):
        rd.log_metrics(1, {"loss": 0.5})
        rd.log_metrics(2, {"loss": 0.25})
    assert broken.calls == [("metrics", 1, {"loss": 0.5}), ("close", True)]
    assert [c[1] for c in fine.calls] == [1, 2] and rd.trackers == [fine]
    assert any("_Recorder failed in log_metrics" in r.getMessage() for r in caplog.records)
    assert [m["step"] for m in read_metrics_file(rd.metrics_path).records] == [1, 2]
    rd.close()
    assert fine.calls[-1] == ("close", False)
