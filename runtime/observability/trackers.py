"""Experiment trackers (`runtime.loggers`): W&B in offline mode and MLflow, beside metrics.jsonl.

Why a Protocol and a table: the run directory (run_dir.py: `RunDir.log_metrics`) forwards every
step to the trackers a run opened and knows nothing of their packages. A tracker is one class
here and one entry in `TRACKERS`, plus its name in `RuntimeSpec.loggers` (graph/spec.py; a test
checks the two agree). "jsonl" and "tensorboard" are the run directory's own (`BUILT_IN`).

Why the imports are lazy: `import wandb` costs about 1 s and `import mlflow` about 2 s on this
machine; a run with the default loggers imports neither. A tracker that was asked for and does
not import stops the run before it starts, naming `runtime.loggers` and the pip command
(`cli/preflight.py` says so before a run folder exists): a run that silently tracks nothing
is found out after it has finished.

Why W&B offline: training machines often have no network, and a run must not wait on a
remote service. The run is written under <run_dir>/wandb/offline-run-*/ and uploaded later
with `wandb sync`. MLflow writes to `runtime.mlflow_tracking_uri`, by default a file store in
<run_dir>/mlruns: no server, no network.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import logging
import os
import re
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from areal_graph.graph.spec import WorkflowSpec

log = logging.getLogger(__name__)

BUILT_IN: tuple[str, ...] = ("jsonl", "tensorboard")  # written by RunDir itself
PIP_EXTRA = "pip install 'areal-graph[trackers]'"


class Tracker(Protocol):
    """One experiment tracker of a run: told the config once, every step's numbers, the run's
    paths at the end, then closed (also when the run failed)."""

    def log_config(self, config: Mapping[str, Any]) -> None: ...

    def log_metrics(self, step: int, metrics: Mapping[str, float]) -> None: ...

    def log_links(self, links: Mapping[str, str]) -> None: ...

    def close(self, failed: bool = False) -> None: ...


class TrackerClass(Protocol):
    """What `TRACKERS` holds: a tracker class, the module it imports and how to install it."""

    package: str
    pip: str

    def __call__(self, settings: TrackerSettings) -> Tracker: ...


class TrackerUnavailable(ValueError):
    """A tracker named in runtime.loggers cannot start here (its package is missing)."""


@dataclass(frozen=True)
class TrackerSettings:
    """What a tracker needs to know about the run (from the workflow's runtime section)."""

    run_dir: Path
    run_name: str  # the run directory's name: the run's name in W&B and MLflow
    workflow: str  # the workflow's name: the default MLflow experiment
    wandb_project: str = "areal-graph"
    mlflow_tracking_uri: str | None = None
    mlflow_experiment: str | None = None

    @property
    def mlflow_uri(self) -> str:
        """runtime.mlflow_tracking_uri, or the file store <run_dir>/mlruns."""
        return self.mlflow_tracking_uri or (self.run_dir / "mlruns").as_uri()

    @classmethod
    def for_run(cls, spec: WorkflowSpec, run_dir: str | os.PathLike) -> TrackerSettings:
        path = Path(run_dir).resolve()
        rt = spec.runtime
        return cls(path, path.name, spec.name, rt.wandb_project, rt.mlflow_tracking_uri, rt.mlflow_experiment)


# ---------------------------------------------------------------------------------- W&B
class WandbTracker:
    """W&B in offline mode: `wandb.init(mode="offline", dir=<run_dir>)` writes
    <run_dir>/wandb/offline-run-<time>-<id>/run-<id>.wandb; `wandb sync` uploads it to
    `runtime.wandb_project`. Config goes to the run's config, each step to its history at that
    step, the links to its summary (links/<name>)."""

    package = "wandb"
    pip = f"{PIP_EXTRA} (or: pip install wandb)"

    def __init__(self, settings: TrackerSettings) -> None:
        import wandb

        # console off: the run's own display (rich) stays as it is and nothing wraps stdout;
        # silent: the commands to upload are logged here (and printed by `areal-graph run`).
        # reinit create_new: a wandb run the caller already has (a notebook) is left alone.
        self._run = wandb.init(
            mode="offline",
            dir=str(settings.run_dir),
            project=settings.wandb_project,
            name=settings.run_name,
            reinit="create_new",
            settings=wandb.Settings(console="off", silent=True),
        )
        self._last_step = -1
        self._warned_rewind = False
        self.run_path = Path(self._run.dir).parent  # <run_dir>/wandb/offline-run-*/ (its dir is files/)
        log.info("W&B offline run in %s; upload it with: wandb sync %s", self.run_path, self.run_path)

    def log_config(self, config: Mapping[str, Any]) -> None:
        self._run.config.update(dict(config), allow_val_change=True)

    def log_metrics(self, step: int, metrics: Mapping[str, float]) -> None:
        if step < self._last_step:
            # a run resumed in this process logs again the steps after its checkpoint; W&B's
            # history only goes forwards (it would drop them with a warning of its own)
            if not self._warned_rewind:
                log.warning(
                    "W&B keeps the values first logged for steps %d..%d (the run resumed from a "
                    "checkpoint); metrics.jsonl has the resumed ones",
                    step,
                    self._last_step,
                )
                self._warned_rewind = True
            return
        self._last_step = step
        self._run.log(dict(metrics), step=step)

    def log_links(self, links: Mapping[str, str]) -> None:
        self._run.summary.update({f"links/{k}": v for k, v in links.items()})

    def close(self, failed: bool = False) -> None:
        self._run.finish(exit_code=1 if failed else 0)


# ---------------------------------------------------------------------------------- MLflow
_MLFLOW_BAD_CHARS = re.compile(r"[^\w.\- :/]")
_MLFLOW_KEY_MAX = 250  # mlflow.utils.validation.MAX_ENTITY_KEY_LENGTH
_MLFLOW_PARAM_MAX = 6000  # MAX_PARAM_VAL_LENGTH
_MLFLOW_PARAMS_PER_BATCH = 100  # MAX_PARAMS_TAGS_PER_BATCH
_MLFLOW_METRICS_PER_BATCH = 1000  # MAX_METRICS_PER_BATCH


class MlflowTracker:
    """MLflow through `MlflowClient` (mlflow-skinny is enough): one run in the experiment
    `runtime.mlflow_experiment` (default: the workflow's name) at `runtime.mlflow_tracking_uri`
    (default: file:<run_dir>/mlruns). Config goes to params (dotted keys, as the YAML nests them)
    and to the artifact config.yaml, each step to metrics at that step, the links to tags
    (link.<name>). A client rather than `mlflow.start_run`: no process-wide active run."""

    package = "mlflow"
    pip = f"{PIP_EXTRA} (or: pip install mlflow-skinny)"

    def __init__(self, settings: TrackerSettings) -> None:
        self.tracking_uri = settings.mlflow_uri
        if is_file_store(self.tracking_uri):
            # MLflow 3 refuses its file store unless told otherwise (it suggests a database, which
            # needs the full mlflow and SQLAlchemy); a local folder beside the run is the point here.
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        from mlflow.tracking import MlflowClient

        self._client = MlflowClient(tracking_uri=self.tracking_uri)
        name = settings.mlflow_experiment or settings.workflow
        self.experiment_id = self._experiment(name)
        run = self._client.create_run(
            self.experiment_id,
            run_name=settings.run_name,
            tags={"areal_graph.run_dir": str(settings.run_dir), "areal_graph.workflow": settings.workflow},
        )
        self.run_id: str = run.info.run_id
        log.info(
            "MLflow run %s in experiment %r at %s; look at it with: mlflow ui --backend-store-uri %s",
            self.run_id,
            name,
            self.tracking_uri,
            self.tracking_uri,
        )

    def _experiment(self, name: str) -> str:
        from mlflow.exceptions import MlflowException

        found = self._client.get_experiment_by_name(name)
        if found is not None:
            return str(found.experiment_id)
        try:
            return str(self._client.create_experiment(name))
        except MlflowException:  # another run created it in the meantime
            again = self._client.get_experiment_by_name(name)
            if again is None:
                raise
            return str(again.experiment_id)

    def log_config(self, config: Mapping[str, Any]) -> None:
        from mlflow.entities import Param

        params = [Param(_mlflow_key(k), _param_text(k, v)) for k, v in flatten(config)]
        for i in range(0, len(params), _MLFLOW_PARAMS_PER_BATCH):
            self._client.log_batch(self.run_id, params=params[i : i + _MLFLOW_PARAMS_PER_BATCH])
        self._client.log_dict(self.run_id, dict(config), "config.yaml")

    def log_metrics(self, step: int, metrics: Mapping[str, float]) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        batch = [Metric(_mlflow_key(k), float(v), now, int(step)) for k, v in metrics.items()]
        for i in range(0, len(batch), _MLFLOW_METRICS_PER_BATCH):
            self._client.log_batch(self.run_id, metrics=batch[i : i + _MLFLOW_METRICS_PER_BATCH])

    def log_links(self, links: Mapping[str, str]) -> None:
        from mlflow.entities import RunTag

        self._client.log_batch(self.run_id, tags=[RunTag(f"link.{_mlflow_key(k)}", v) for k, v in links.items()])

    def close(self, failed: bool = False) -> None:
        self._client.set_terminated(self.run_id, "FAILED" if failed else "FINISHED")


def is_file_store(uri: str) -> bool:
    """file:/path, or a plain path (MLflow reads those as file stores)."""
    return uri.startswith("file:") or "://" not in uri


def _mlflow_key(key: str) -> str:
    """A metric or param name MLflow takes: its characters, no empty or relative path parts
    (the file store makes them folders), at most 250 characters."""
    parts = [p for p in _MLFLOW_BAD_CHARS.sub("_", str(key)).split("/") if p not in ("", ".", "..")]
    return ("/".join(parts) or "_")[:_MLFLOW_KEY_MAX]


def _param_text(key: str, value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    if len(text) > _MLFLOW_PARAM_MAX:
        log.debug(
            "MLflow param %s cut to %d characters (the whole config is the artifact config.yaml)",
            key,
            _MLFLOW_PARAM_MAX,
        )
        text = text[: _MLFLOW_PARAM_MAX - 3] + "..."
    return text


def flatten(config: Mapping[str, Any], prefix: str = "") -> Iterator[tuple[str, Any]]:
    """(dotted key, leaf) of a nested mapping: {"a": {"b": 1}} -> ("a.b", 1); lists are leaves."""
    for k, v in config.items():
        key = f"{prefix}{k}"
        if isinstance(v, Mapping) and v:
            yield from flatten(v, key + ".")
        else:
            yield key, v


# ---------------------------------------------------------------------------------- the table
TRACKERS: dict[str, TrackerClass] = {
    "wandb": WandbTracker,
    "mlflow": MlflowTracker,
}


def missing_packages(loggers: Sequence[str]) -> list[str]:
    """One message per tracker in `loggers` whose package is not installed here (looked up,
    not imported: cheap enough for `areal-graph validate`)."""
    out = []
    for name in loggers:
        cls = TRACKERS.get(name)
        if cls is not None and importlib.util.find_spec(cls.package) is None:
            out.append(
                f"runtime.loggers: '{name}' needs the {cls.package} package, which is not installed here: {cls.pip}"
            )
    return out


def open_trackers(loggers: Sequence[str], settings: TrackerSettings, config: Mapping[str, Any]) -> list[Tracker]:
    """Start the trackers `loggers` names (in its order; "jsonl" and "tensorboard" are the run
    directory's own) and give each the run's config. TrackerUnavailable when a package does not
    import; whatever started before a failure is closed again."""
    opened: list[Tracker] = []
    try:
        for name in loggers:
            if name in BUILT_IN:
                continue
            cls = TRACKERS.get(name)
            if cls is None:
                raise TrackerUnavailable(
                    f"runtime.loggers: unknown logger {name!r}; known: {', '.join((*BUILT_IN, *TRACKERS))}"
                )
            try:
                importlib.import_module(cls.package)
            except ImportError as err:
                raise TrackerUnavailable(
                    f"runtime.loggers: '{name}' needs the {cls.package} package, which does "
                    f"not import here ({err}): {cls.pip}"
                ) from err
            tracker = cls(settings)
            opened.append(tracker)
            tracker.log_config(config)
    except BaseException:
        for tracker in opened:
            try:
                tracker.close(failed=True)
            except Exception:  # noqa: BLE001 - the error that stopped the start is the one to report
                log.debug("closing %s after a failed start", type(tracker).__name__, exc_info=True)
        raise
    return opened
