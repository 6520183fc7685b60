"""End to end: `areal-graph run` with every logger of runtime.loggers (metrics.jsonl,
TensorBoard, W&B offline, MLflow's file store); each tracker holds what metrics.jsonl holds.
The trackers' own contracts are tested without a run in tests/runtime/observability/test_trackers.py."""

from __future__ import annotations

import glob
import importlib.util
import math
from pathlib import Path

import pytest

from support.ci import missing
from support.e2e import SMALL, read_metrics, run_cli, write_workflow
from support.wandb_records import read_offline_run


def numbers_by_step(metrics: list[dict]) -> dict[int, dict[str, float]]:
    """metrics.jsonl's numbers per step, lines of the same step merged (an evaluation is a line of its own)."""
    out: dict[int, dict[str, float]] = {}
    for line in metrics:
        out.setdefault(line["step"], {}).update(
            {
                k: float(v)
                for k, v in line.items()
                if k not in ("step", "time") and isinstance(v, (int, float)) and not isinstance(v, bool)
            }
        )
    return out


@pytest.mark.slow  # ~40 s: a whole run (the e2e suite runs the same workflow by default without trackers)
def test_a_run_with_every_logger_writes_the_same_steps_to_each(kit, tmp_path, monkeypatch):
    for package in ("wandb", "mlflow"):
        if importlib.util.find_spec(package) is None:
            missing(package, "pip install 'areal-graph[trackers]'")
    for var, value in {
        "WANDB_SILENT": "true",
        "WANDB_MODE": "offline",
        "WANDB_BASE_URL": "http://127.0.0.1:9",
        "WANDB_CONFIG_DIR": str(tmp_path / "wandb-config"),
        "WANDB_CACHE_DIR": str(tmp_path / "wandb-cache"),
    }.items():
        monkeypatch.setenv(var, value)  # the run's processes inherit them (support.paths.child_env)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    wf = write_workflow(kit, tmp_path)
    run_dir = tmp_path / "run"
    proc = run_cli(wf, run_dir, *SMALL, "runtime.loggers=[jsonl,tensorboard,wandb,mlflow]")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert f"wandb sync {run_dir / 'wandb'}/offline-run-*" in proc.stdout
    assert "mlflow ui --backend-store-uri file://" in proc.stdout
    expected = numbers_by_step(read_metrics(run_dir))
    assert sorted(expected) == [0, 1, 2, 3] and "reward/mean" in expected[3]
    assert list((run_dir / "tb").glob("events.out.tfevents.*"))

    (wandb_file,) = glob.glob(str(run_dir / "wandb" / "offline-run-*" / "run-*.wandb"))
    wb = read_offline_run(Path(wandb_file))
    assert wb.exit_code == 0 and wb.name == "run" and wb.project == "areal-graph"
    assert wb.config["runtime"]["loggers"] == ["jsonl", "tensorboard", "wandb", "mlflow"]
    assert sorted(wb.history) == sorted(expected)
    for step, numbers in expected.items():
        row = wb.history[step]
        assert all(row[k] == v or (math.isnan(v) and math.isnan(row[k])) for k, v in numbers.items()), step
    assert wb.summary["links/final_model"] == str((run_dir / "final_model").resolve())

    from mlflow.tracking import MlflowClient

    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # what the run's tracker set for itself
    client = MlflowClient(tracking_uri=(run_dir / "mlruns").resolve().as_uri())
    (run,) = client.search_runs([client.get_experiment_by_name("ppo_async").experiment_id])
    assert run.info.status == "FINISHED" and run.data.params["runtime.batch_size"] == "8"
    history = {m.step: m.value for m in client.get_metric_history(run.info.run_id, "reward/mean")}
    assert history == {s: n["reward/mean"] for s, n in expected.items() if "reward/mean" in n}
    assert run.data.tags["link.trace"] == str((run_dir / "trace.json").resolve())
