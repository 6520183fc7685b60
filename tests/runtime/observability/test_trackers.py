"""Experiment trackers (runtime/observability/trackers.py): what W&B offline and MLflow hold
after a run's directory logged to them, read back with each one's own reader; what happens
when a package is missing; and the workflow rules of runtime.loggers."""

from __future__ import annotations

import glob
import importlib.util
import logging
import math
import os
import socket
import subprocess
import sys
import typing
from pathlib import Path
from urllib.parse import urlparse

import pytest
import yaml

from areal_graph.graph.loader import WorkflowError, load_workflow
from areal_graph.graph.spec import RuntimeSpec
from areal_graph.runtime.observability.run_dir import RunDir, read_metrics_file
from areal_graph.runtime.observability.trackers import (
    BUILT_IN,
    TRACKERS,
    MlflowTracker,
    TrackerSettings,
    TrackerUnavailable,
    WandbTracker,
    flatten,
    missing_packages,
    open_trackers,
)
from support.ci import missing
from support.paths import REPO, WORKFLOWS
from support.wandb_records import read_offline_run

PPO = WORKFLOWS / "ppo_async.yaml"
CONFIG = {
    "name": "ppo",
    "models": {"actor": {"path": "/m", "train": {"lr": 2e-5, "betas": [0.9, 0.999]}}},
    "runtime": {"batch_size": 8, "loggers": ["jsonl", "wandb", "mlflow"], "ray_address": None},
}
STEPS = {
    1: {"loss": 0.5, "reward/mean": 0.25, "eval/by_source/gsm8k/accuracy": 1.0},
    2: {"loss": 0.125, "reward/mean": 0.75},
    3: {"loss": 1 / 3, "reward/mean": 1e-9, "time/step": 12.5},
}


def need(package: str) -> None:
    if importlib.util.find_spec(package) is None:
        missing(package, "pip install 'areal-graph[trackers]'")


@pytest.fixture
def no_network(monkeypatch, tmp_path):
    """W&B offline and a file-store MLflow must not reach the network: any socket this process
    connects to anything but a Unix socket or loopback fails the test; W&B's settings and
    cache go to tmp, and its server address is a closed loopback port."""
    real = socket.socket.connect

    def connect(self, address):
        if self.family != socket.AF_UNIX and not str(address[0]).startswith(("127.", "::1", "localhost")):
            raise AssertionError(f"network connection attempted to {address}")
        return real(self, address)

    monkeypatch.setattr(socket.socket, "connect", connect)
    for var, value in {
        "WANDB_SILENT": "true",
        "WANDB_MODE": "offline",
        "WANDB_BASE_URL": "http://127.0.0.1:9",
        "WANDB_CONFIG_DIR": str(tmp_path / "wandb-config"),
        "WANDB_CACHE_DIR": str(tmp_path / "wandb-cache"),
        "WANDB_DATA_DIR": str(tmp_path / "wandb-data"),
    }.items():
        monkeypatch.setenv(var, value)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    # absent during the test (the tracker sets it for its file store) and removed again after:
    # setenv records "absent" to restore, delenv then takes it away for the test
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "unset below")
    monkeypatch.delenv("MLFLOW_ALLOW_FILE_STORE")


def settings(run_dir: Path, **kw) -> TrackerSettings:
    return TrackerSettings(run_dir.resolve(), run_dir.name, "ppo", **kw)


def log_a_run(
    rd: RunDir, trackers: list, failed: bool = False, tensorboard: bool = False, resumed: dict[int, dict] | None = None
) -> None:
    """Three steps (with a string and a bool that only metrics.jsonl keeps), steps logged again
    after a resume, a trace, a checkpoint folder and a final model, then the run's end."""
    rd.set_loggers(tensorboard=tensorboard, trackers=trackers)
    for step, metrics in STEPS.items():
        rd.log_metrics(step, {**metrics, "note": "text", "flag": True})
    for step, metrics in (resumed or {}).items():
        rd.log_metrics(step, metrics)
    rd.trace_path.write_text("[]")
    rd.checkpoint_dir(2)
    rd.final_model_dir.mkdir()
    rd.close(failed=failed)


def test_the_table_names_what_the_spec_allows():
    allowed = typing.get_args(typing.get_args(typing.get_type_hints(RuntimeSpec)["loggers"])[0])
    assert set(allowed) == set(BUILT_IN) | set(TRACKERS) == {"jsonl", "tensorboard", "wandb", "mlflow"}
    assert RuntimeSpec().loggers == ["jsonl", "tensorboard"]
    assert TRACKERS["wandb"] is WandbTracker and TRACKERS["mlflow"] is MlflowTracker


def test_wandb_offline_run_holds_the_config_every_step_and_the_links(tmp_path, no_network, caplog):
    need("wandb")
    import wandb

    rd = RunDir(tmp_path / "ppo-run")
    try:
        with caplog.at_level(logging.WARNING):  # step 2 again, as after a resume: W&B keeps the first
            log_a_run(
                rd,
                open_trackers(["jsonl", "wandb"], settings(rd.path, wandb_project="proj"), CONFIG),
                resumed={2: {"loss": 99.0}},
            )
    finally:
        wandb.teardown()  # the service process: a later test in this process may signal every child
    files = glob.glob(str(rd.path / "wandb" / "offline-run-*" / "run-*.wandb"))
    assert len(files) == 1, files
    run = read_offline_run(Path(files[0]))
    assert (run.name, run.project) == ("ppo-run", "proj")
    assert {k: run.config[k] for k in CONFIG} == CONFIG  # nested as given
    assert sorted(run.history) == [1, 2, 3]
    for step, metrics in STEPS.items():
        row = run.history[step]
        assert row["_step"] == step
        assert {k: row[k] for k in metrics} == metrics  # floats exact, after a JSON round trip
        assert "note" not in row and "flag" not in row  # not numbers: metrics.jsonl only
    assert run.summary["links/trace"] == str(rd.trace_path.resolve())
    assert run.summary["links/checkpoints"] == str(rd.checkpoints_root.resolve())
    assert run.summary["links/final_model"] == str(rd.final_model_dir.resolve())
    assert run.summary["links/run_dir"] == str(rd.path.resolve())
    assert run.exit_code == 0
    assert [r.get("note") for r in read_metrics_file(rd.metrics_path).records] == ["text"] * 3 + [None]
    assert any("W&B keeps the values first logged for steps 2..3" in r.getMessage() for r in caplog.records)


def test_mlflow_file_store_holds_params_the_metric_history_and_link_tags(tmp_path, no_network):
    need("mlflow")
    from mlflow.tracking import MlflowClient

    rd = RunDir(tmp_path / "ppo-run")
    log_a_run(
        rd, open_trackers(["jsonl", "tensorboard", "mlflow"], settings(rd.path), CONFIG), failed=True, tensorboard=True
    )
    assert os.environ["MLFLOW_ALLOW_FILE_STORE"] == "true"  # MLflow 3 refuses a file store without it
    uri = (rd.path / "mlruns").resolve().as_uri()  # the default: a file store in the run directory
    client = MlflowClient(tracking_uri=uri)
    experiment = client.get_experiment_by_name("ppo")  # the workflow's name
    runs = client.search_runs([experiment.experiment_id])
    assert len(runs) == 1
    run = runs[0]
    assert run.info.run_name == "ppo-run" and run.info.status == "FAILED"
    params = run.data.params
    assert params["models.actor.train.lr"] == "2e-05" and params["runtime.batch_size"] == "8"
    assert params["models.actor.train.betas"] == "[0.9, 0.999]" and params["runtime.ray_address"] == "null"
    assert params["runtime.loggers"] == '["jsonl", "wandb", "mlflow"]'
    assert len(params) == len(list(flatten(CONFIG)))
    for key in ("loss", "reward/mean", "eval/by_source/gsm8k/accuracy", "time/step"):
        history = sorted((m.step, m.value) for m in client.get_metric_history(run.info.run_id, key))
        assert history == [(step, metrics[key]) for step, metrics in STEPS.items() if key in metrics], key
    assert "note" not in run.data.metrics and "flag" not in run.data.metrics
    tags = run.data.tags
    assert tags["link.trace"] == str(rd.trace_path.resolve())
    assert tags["link.checkpoints"] == str(rd.checkpoints_root.resolve())
    assert tags["link.final_model"] == str(rd.final_model_dir.resolve())
    assert tags["link.run_dir"] == tags["areal_graph.run_dir"] == str(rd.path.resolve())
    artifact = Path(urlparse(run.info.artifact_uri).path) / "config.yaml"
    assert yaml.safe_load(artifact.read_text()) == CONFIG
    assert list((rd.path / "tb").glob("events.out.tfevents.*"))  # tensorboard beside it, as asked


def test_mlflow_takes_a_tracking_uri_and_experiment_and_odd_metric_names(tmp_path, no_network):
    need("mlflow")
    from mlflow.tracking import MlflowClient

    store = tmp_path / "shared-store"
    rd = RunDir(tmp_path / "run")
    (tracker,) = open_trackers(
        ["jsonl", "mlflow"], settings(rd.path, mlflow_tracking_uri=store.as_uri(), mlflow_experiment="sweep"), {"a": {}}
    )
    tracker.log_metrics(4, {"reward/by_source/open?ai//gsm8k/mean": 0.5, "x": math.nan})
    tracker.close()
    assert not (rd.path / "mlruns").exists()
    client = MlflowClient(tracking_uri=store.as_uri())
    run = client.search_runs([client.get_experiment_by_name("sweep").experiment_id])[0]
    assert run.info.status == "FINISHED" and run.data.params == {"a": "{}"}
    assert [
        (m.step, m.value) for m in client.get_metric_history(run.info.run_id, "reward/by_source/open_ai/gsm8k/mean")
    ] == [(4, 0.5)]
    assert math.isnan(run.data.metrics["x"])


class Recorder:
    """A tracker that records its calls (stands in for a real one where the package is beside the point)."""

    package = "json"
    pip = "pip install nothing"
    made: list[Recorder] = []

    def __init__(self, settings: TrackerSettings) -> None:
        self.settings, self.calls = settings, []
        Recorder.made.append(self)

    def log_config(self, config):
        self.calls.append(("config", dict(config)))

    def log_metrics(self, step, metrics):
        self.calls.append(("metrics", step, dict(metrics)))

    def log_links(self, links):
        self.calls.append(("links", dict(links)))

    def close(self, failed=False):
        self.calls.append(("close", failed))


def test_a_missing_package_stops_the_start_naming_the_field_and_the_pip_command(tmp_path, monkeypatch):
    monkeypatch.setitem(TRACKERS, "mlflow", Recorder)
    monkeypatch.setitem(sys.modules, "wandb", None)  # `import wandb` raises ImportError
    Recorder.made.clear()
    with pytest.raises(TrackerUnavailable) as err:
        open_trackers(["jsonl", "mlflow", "wandb"], settings(tmp_path), {"a": 1})
    assert isinstance(err.value, ValueError)
    assert str(err.value).startswith("runtime.loggers: 'wandb' needs the wandb package")
    assert "pip install 'areal-graph[trackers]'" in str(err.value)
    # what had started is closed again, as failed: a half-started set of trackers leaks nothing
    assert Recorder.made[0].calls == [("config", {"a": 1}), ("close", True)]
    assert missing_packages(["jsonl", "tensorboard", "wandb"]) == [
        "runtime.loggers: 'wandb' needs the wandb package, which is not installed here: "
        "pip install 'areal-graph[trackers]' (or: pip install wandb)"
    ]


def test_the_default_loggers_import_no_tracker_package():
    """A run with the default loggers (and `validate` with any) pays nothing for W&B or MLflow."""
    code = (
        "import sys; from pathlib import Path\n"
        "from areal_graph.runtime.observability.trackers import TrackerSettings, missing_packages, open_trackers\n"
        "from areal_graph.runtime.observability.run_dir import RunDir\n"
        "assert open_trackers(['jsonl', 'tensorboard'], TrackerSettings(Path('.'), 'r', 'w'), {}) == []\n"
        "missing_packages(['jsonl', 'wandb', 'mlflow'])\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('wandb', 'mlflow')))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


@pytest.mark.parametrize(
    "override,fragment",
    [
        (
            "runtime.loggers=[jsonl,wandbb]",
            "item 1: must be one of 'jsonl', 'tensorboard', 'wandb', 'mlflow', "
            "got a string 'wandbb' (did you mean 'wandb'?)",
        ),
        ("runtime.loggers=[tensorboard,wandb]", "must include 'jsonl'"),
        ("runtime.loggers=[jsonl,mlflow,mlflow]", "names 'mlflow' more than once"),
        (
            "runtime.mlflow_experiment=sweep",
            "is used only with 'mlflow' in runtime.loggers (it is [jsonl, tensorboard])",
        ),
    ],
)
def test_bad_loggers_name_the_field_and_the_value(override, fragment):
    with pytest.raises(WorkflowError) as err:
        load_workflow(PPO, overrides=[override])
    problems = [str(p) for p in err.value.problems]
    assert len(problems) == 1 and fragment in problems[0], problems
    assert "field 'runtime." in problems[0]


def test_all_four_loggers_load():
    spec = load_workflow(
        PPO,
        overrides=[
            "runtime.loggers=[jsonl,tensorboard,wandb,mlflow]",
            "runtime.mlflow_tracking_uri=sqlite:///m.db",
            "runtime.wandb_project=p",
        ],
    )
    assert spec.runtime.loggers == ["jsonl", "tensorboard", "wandb", "mlflow"]
    s = TrackerSettings.for_run(spec, "runs/x")
    assert (s.run_name, s.workflow, s.wandb_project, s.mlflow_uri) == ("x", spec.name, "p", "sqlite:///m.db")
    assert TrackerSettings.for_run(load_workflow(PPO), "runs/x").mlflow_uri == (
        Path("runs/x/mlruns").resolve().as_uri()
    )
