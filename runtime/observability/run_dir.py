"""The run directory: everything a run leaves behind, in one place with fixed names.

    <root>/
      config.yaml            the workflow as it ran (after overrides)
      metrics.jsonl          one JSON object per training step
      tb/                    TensorBoard scalars (runtime.loggers: tensorboard, when it is installed)
      wandb/offline-run-*/   W&B offline runs (runtime.loggers: wandb; `wandb sync` uploads them)
      mlruns/                MLflow's file store (runtime.loggers: mlflow, default tracking URI)
      trace.json             Chrome trace (areal-graph trace <root>)
      checkpoints/step_00000010/ ... COMPLETE   a checkpoint is usable only once COMPLETE exists
      end_state.json         the counters at the run's stop: finished or not, restarts, work not trained
      weights/v000003/       weights exported for the inference servers
      final_model/           the trained model (save_pretrained layout)
      logs/                  worker process logs

Why a marker file: a checkpoint is several files written by several processes; a crash
half-way leaves a directory that looks like a checkpoint. The marker is written last (and
fsynced), so `latest_checkpoint()` only ever returns one that was finished.

Old checkpoints are deleted only by `prune_checkpoints` (runtime.keep_checkpoints), in a way a
crash cannot turn into a half-deleted checkpoint that looks usable: the directory is first
renamed out of the `step_N` namespace (`.deleting-step_N.<pid>`, atomic), then removed, and
such leftovers are swept by the next prune. A resume marks the checkpoint it loads
(`reading_checkpoint`: a READING.<pid> file) and a prune leaves it alone while that pid lives.

Metrics are written in one place, `log_metrics`: a line of metrics.jsonl, then the numbers to
TensorBoard and to the experiment trackers the run opened (trackers.py), so every logger sees
the same steps and values. They are read back in one place too, `read_metrics_file` (the resume's
`truncate_metrics`, `areal-graph trace`, the benchmarks): a line cut off by a crash is skipped and
counted there, the same way for every reader.
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import json
import logging
import math
import os
import re
import shutil
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

from areal_graph.api.full_disk import naming_the_file
from areal_graph.runtime.observability.trackers import Tracker

log = logging.getLogger(__name__)

TRACE_FILENAME = "trace.json"
CONFIG_FILENAME = "config.yaml"
METRICS_FILENAME = "metrics.jsonl"
COMPLETE_MARKER = "COMPLETE"
READING_MARKER = "READING"  # READING.<pid> in a checkpoint a process is loading (reading_checkpoint)
DELETING_PREFIX = ".deleting-"  # a checkpoint being removed: out of the step_N namespace first
# what the run's counters at its stop are written to (Controller), finished or not; runs written
# before the rename have LEGACY_END_STATE_FILENAME instead, which readers take when it is the only one
END_STATE_FILENAME = "end_state.json"
LEGACY_END_STATE_FILENAME = "unfinished.json"
_CKPT_RE = re.compile(r"^step_(\d+)$")


class RunDir:
    def __init__(self, root: str | os.PathLike, tensorboard: bool = True) -> None:
        self.path = Path(root)
        if self.path.exists() and not self.path.is_dir():
            raise ValueError(f"run directory {self.path} exists and is not a directory")
        self.path.mkdir(parents=True, exist_ok=True)
        self._want_tb = tensorboard
        self._tb: Any = None
        self._tb_purge_step: int | None = None  # set on resume: TensorBoard hides events from this step on
        self._tb_checked = False
        self.trackers: list[Tracker] = []  # experiment trackers (set_loggers): W&B, MLflow

    # ------------------------------------------------------------------ fixed paths
    @property
    def config_path(self) -> Path:
        return self.path / CONFIG_FILENAME

    @property
    def metrics_path(self) -> Path:
        return self.path / METRICS_FILENAME

    @property
    def trace_path(self) -> Path:
        return self.path / TRACE_FILENAME

    @property
    def final_model_dir(self) -> Path:
        return self.path / "final_model"

    @property
    def logs_dir(self) -> Path:
        return self.path / "logs"

    @property
    def end_state_path(self) -> Path:
        return self.path / END_STATE_FILENAME

    @property
    def checkpoints_root(self) -> Path:
        return self.path / "checkpoints"

    def checkpoint_dir(self, step: int) -> Path:
        """Directory for the checkpoint after `step` (created; complete only once marked)."""
        if step < 0:
            raise ValueError(f"checkpoint step must be >= 0, got {step}")
        d = self.checkpoints_root / f"step_{step:08d}"
        d.mkdir(parents=True, exist_ok=True)
        return d

    def weights_dir(self, version: int, group: str | None = None) -> Path:
        """Where weights of `version` are exported for the inference servers (not created);
        `group`: a lagged model's servers, which keep versions of their own (weights/<group>/)."""
        root = self.path / "weights"
        return (root / group if group else root) / f"v{version:06d}"

    # ------------------------------------------------------------------ config, json
    def write_config(self, config: Any) -> Path:
        """Snapshot the configuration as YAML (a dict, a dataclass, or an object with to_dict)."""
        import yaml

        data = _plain(_as_mapping(config))
        _atomic_write(self.config_path, yaml.safe_dump(data, sort_keys=False, allow_unicode=True))
        return self.config_path

    def read_config(self) -> dict[str, Any]:
        import yaml

        return yaml.safe_load(self.config_path.read_text())

    def write_text(self, name: str, text: str) -> Path:
        path = self.path / name
        _atomic_write(path, text)
        return path

    def write_json(self, name: str, obj: Any) -> Path:
        path = self.path / name
        _atomic_write(path, json.dumps(_plain(obj), indent=2) + "\n")
        return path

    @property
    def links(self) -> dict[str, str]:
        """Absolute paths of what a tracker's run should point at: the run directory, and the
        trace, metrics, checkpoints and final model that exist."""
        out = {"run_dir": str(self.path.resolve())}
        for name, path in (
            ("trace", self.trace_path),
            ("metrics", self.metrics_path),
            ("checkpoints", self.checkpoints_root),
            ("final_model", self.final_model_dir),
        ):
            if path.exists():
                out[name] = str(path.resolve())
        return out

    # ------------------------------------------------------------------ metrics
    def set_loggers(self, tensorboard: bool, trackers: Sequence[Tracker] = ()) -> None:
        """Where metrics go besides metrics.jsonl (runtime.loggers): TensorBoard, and trackers
        already opened with their config (trackers.py: `open_trackers`). Call before the first
        step; `close` ends them."""
        if self._tb is None:
            self._want_tb, self._tb_checked = tensorboard, False
        self.trackers = list(trackers)

    def log_metrics(self, step: int, metrics: Mapping[str, Any]) -> None:
        """Append one JSONL line {"step", "time", **metrics}; mirror the numbers (not bools,
        not strings) to TensorBoard and the trackers."""
        record = {"step": int(step), "time": time.time()}
        # floats stay floats (NaN included: json writes NaN, Python and pandas read it back)
        record.update({str(k): v if isinstance(v, float) else _plain(v) for k, v in metrics.items() if k != "step"})
        with naming_the_file(self.metrics_path), open(self.metrics_path, "a") as f:
            f.write(json.dumps(record, allow_nan=True) + "\n")
        numbers = {
            k: float(v)
            for k, v in record.items()
            if k not in ("step", "time") and not isinstance(v, bool) and isinstance(v, (int, float))
        }
        writer = self._tensorboard()
        if writer is not None:
            for k, v in numbers.items():
                writer.add_scalar(k, v, int(step))
            writer.flush()
        for tracker in list(self.trackers):
            self._forward(tracker, int(step), numbers)

    def _forward(self, tracker: Tracker, step: int, numbers: Mapping[str, float]) -> None:
        """A tracker that fails mid-run is reported and dropped: the run goes on, and
        metrics.jsonl (written first) still has every step."""
        try:
            tracker.log_metrics(step, numbers)
        except Exception:  # noqa: BLE001 - a tracker's disk or service must not stop training
            log.error(
                "experiment tracker %s failed in log_metrics; it gets no more metrics (metrics.jsonl has them all)",
                type(tracker).__name__,
                exc_info=True,
            )
            self.trackers.remove(tracker)
            try:
                tracker.close(failed=True)
            except Exception as err:  # noqa: BLE001
                _tracker_failed(tracker, "close", err)

    def truncate_metrics(self, last_step: int) -> int:
        """Drop the metrics lines of steps after `last_step` (logged after the checkpoint a run
        resumes from; the resumed run logs those steps again): how many lines went. TensorBoard
        event files are append-only: the next writer opens with `purge_step`, which makes
        TensorBoard hide the earlier events of those steps."""
        self._tb_purge_step = last_step + 1
        if not self.metrics_path.exists():
            return 0
        keep, dropped = [], 0
        for line, record in _metrics_lines(self.metrics_path):
            if record is not None and int(record["step"]) <= last_step:
                keep.append(line)
            else:
                dropped += 1  # a later step, or a line cut off by the crash
        if dropped:
            _atomic_write(self.metrics_path, "".join(line + "\n" for line in keep))
        return dropped

    def _tensorboard(self) -> Any:
        if self._tb_checked:
            return self._tb
        self._tb_checked = True
        if not self._want_tb:
            return None
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:
            log.info("tensorboard is not installed: metrics go to %s only (pip install tensorboard)", self.metrics_path)
            return None
        self._tb = SummaryWriter(log_dir=str(self.path / "tb"), purge_step=self._tb_purge_step)
        return self._tb

    def close(self, failed: bool = False) -> None:
        """End the run's loggers: each tracker gets the links (trace, checkpoints, final model)
        and is closed, as failed when `failed`; TensorBoard's file is closed. A later
        `log_metrics` opens TensorBoard again (the trackers are gone)."""
        trackers, self.trackers = self.trackers, []
        links = self.links if trackers else {}
        for tracker in trackers:
            try:
                tracker.log_links(links)
            except Exception as err:  # noqa: BLE001 - still close it, and the others
                _tracker_failed(tracker, "record the run's paths", err)
            try:
                tracker.close(failed=failed)
            except Exception as err:  # noqa: BLE001
                # (after Ctrl-C the tracker's own service process may be gone already)
                _tracker_failed(tracker, "close", err)
        if self._tb is not None:
            try:
                self._tb.close()
            except OSError as err:  # a full disk: the run's own error is the one to see
                log.warning("closing TensorBoard's event file failed: %s", err)
            self._tb = None
            self._tb_checked = False

    # ------------------------------------------------------------------ checkpoints and resume
    def mark_checkpoint_complete(self, ckpt_dir: str | os.PathLike, info: Mapping[str, Any] | None = None) -> None:
        """Call after *everything* of a checkpoint is written: only then can it be resumed."""
        ckpt_dir = Path(ckpt_dir)
        if not ckpt_dir.is_dir():
            raise FileNotFoundError(f"checkpoint directory {ckpt_dir} does not exist")
        marker = ckpt_dir / COMPLETE_MARKER
        payload = json.dumps({"time": time.time(), **_plain(dict(info or {}))})
        with naming_the_file(marker), open(marker, "w") as f:
            f.write(payload + "\n")
            f.flush()
            os.fsync(f.fileno())

    def checkpoints(self, complete_only: bool = True) -> list[tuple[int, Path]]:
        """(step, dir) of the checkpoints, oldest first."""
        if not self.checkpoints_root.is_dir():
            return []
        found = []
        for d in self.checkpoints_root.iterdir():
            m = _CKPT_RE.match(d.name)
            if m and d.is_dir() and (not complete_only or (d / COMPLETE_MARKER).exists()):
                found.append((int(m.group(1)), d))
        return sorted(found)

    def latest_checkpoint(self) -> Path | None:
        """The newest checkpoint whose marker exists, or None; incomplete ones are logged."""
        complete = self.checkpoints(complete_only=True)
        newer_incomplete = [
            d
            for s, d in self.checkpoints(complete_only=False)
            if not (d / COMPLETE_MARKER).exists() and (not complete or s > complete[-1][0])
        ]
        for d in newer_incomplete:
            log.warning("ignoring incomplete checkpoint %s (no %s marker)", d, COMPLETE_MARKER)
        return complete[-1][1] if complete else None

    @contextlib.contextmanager
    def reading_checkpoint(self, ckpt_dir: str | os.PathLike) -> Iterator[Path]:
        """Mark `ckpt_dir` as being read by this process while the block runs (READING.<pid>), so
        that `prune_checkpoints` of any process leaves it alone until the load is done."""
        ckpt_dir = Path(ckpt_dir)
        marker = ckpt_dir / f"{READING_MARKER}.{os.getpid()}"
        _atomic_write(marker, f"{os.getpid()}\n")
        try:
            yield ckpt_dir
        finally:
            marker.unlink(missing_ok=True)

    def prune_checkpoints(
        self, keep_last: int, keep_every: int | None = None, protect: Iterable[str | os.PathLike] = ()
    ) -> list[Path]:
        """Delete the checkpoints runtime.keep_checkpoints does not keep; the directories removed.

        Kept: the newest `keep_last` complete checkpoints; every complete one whose step is a
        multiple of `keep_every` (milestones); the newest complete one whatever else says; those
        in `protect`; and any a live process is reading (READING.<pid>). Removed besides: an
        incomplete directory older than the newest complete checkpoint (a save that crashed: it
        can never be resumed, latest_checkpoint passes over it) and `.deleting-*` leftovers of a
        prune that crashed. An incomplete directory newer than the newest complete one is left:
        it may be a save in progress. A directory that cannot be removed is logged, not raised:
        an old checkpoint left on disk must not stop training."""
        if keep_last < 1:
            raise ValueError(f"keep_last must be >= 1 (the newest complete checkpoint is always kept), got {keep_last}")
        swept = self._sweep_deleting()
        entries = self.checkpoints(complete_only=False)
        complete = [s for s, d in entries if (d / COMPLETE_MARKER).exists()]
        if not complete:
            return []
        newest = complete[-1]
        keep = set(complete[-keep_last:]) | {s for s in complete if keep_every and s % keep_every == 0}
        unwanted = {s for s, _ in entries if s not in keep and (s in complete or s < newest)}
        spared = {Path(p).name for p in protect}
        doomed = [d for s, d in entries if s in unwanted and d.name not in spared and not _being_read(d)]
        removed = [d for d in doomed if self._discard(d)]
        if removed or swept:
            log.info(
                "checkpoints pruned (keep_checkpoints %d%s): removed %s%s; newest kept %s",
                keep_last,
                f", milestones every {keep_every}" if keep_every else "",
                ", ".join(d.name for d in removed) or "none",
                f", and {swept} leftover(s) of an interrupted removal" if swept else "",
                f"step_{newest:08d}",
            )
        return removed

    def _discard(self, ckpt_dir: Path) -> bool:
        """Rename out of the step_N namespace (atomic: from then on no reader takes it for a
        checkpoint), then delete; True once renamed (a failed delete is swept by a later prune)."""
        tomb = ckpt_dir.with_name(f"{DELETING_PREFIX}{ckpt_dir.name}.{os.getpid()}")
        try:
            if tomb.exists():
                shutil.rmtree(tomb)
            os.rename(ckpt_dir, tomb)
        except OSError as err:
            log.warning("could not remove checkpoint %s: %s", ckpt_dir, err)
            return False
        shutil.rmtree(tomb, ignore_errors=True)
        return True

    def _sweep_deleting(self) -> int:
        """Remove what an interrupted prune left (renamed, not yet deleted): how many."""
        if not self.checkpoints_root.is_dir():
            return 0
        leftovers = [d for d in self.checkpoints_root.iterdir() if d.name.startswith(DELETING_PREFIX)]
        for d in leftovers:
            if d.is_dir() and not d.is_symlink():
                shutil.rmtree(d, ignore_errors=True)
            else:
                d.unlink(missing_ok=True)
        return len(leftovers)

    def __repr__(self) -> str:
        return f"RunDir({str(self.path)!r})"


class MetricsFile(NamedTuple):
    """What `read_metrics_file` read: the steps' records in file order, and the damaged lines it skipped."""

    records: list[dict[str, Any]]
    damaged: int


def read_metrics_file(path: str | os.PathLike) -> MetricsFile:
    """The one reader of metrics.jsonl (`RunDir.log_metrics` writes it): every step's record, and
    how many lines were damaged and skipped: cut off by a crash, not JSON, or not a step's record
    (an object with a number at "step"). Blank lines are neither. No file reads as no steps."""
    if not Path(path).is_file():
        return MetricsFile([], 0)
    records, damaged = [], 0
    for _, record in _metrics_lines(Path(path)):
        if record is None:
            damaged += 1
        else:
            records.append(record)
    return MetricsFile(records, damaged)


def metrics_record(line: str) -> dict[str, Any] | None:
    """One line of metrics.jsonl as its step's record, or None for a damaged line (see
    `read_metrics_file`; for a reader of part of the file, as of its end while the run writes it)."""
    try:
        record = json.loads(line)
    except json.JSONDecodeError:
        return None
    step = record.get("step") if isinstance(record, dict) else None
    return record if isinstance(step, int) or (isinstance(step, float) and math.isfinite(step)) else None


def _metrics_lines(path: Path) -> Iterator[tuple[str, dict[str, Any] | None]]:
    """(line, its record or None when damaged) for every non-blank line of metrics.jsonl."""
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        if line.strip():
            yield line, metrics_record(line)


def end_state_file(root: str | os.PathLike) -> Path:
    """The run's end-state file: end_state.json, or an older run's unfinished.json when that is the
    only one (a run from before the rename, resumed or read by `areal-graph trace`)."""
    new = Path(root) / END_STATE_FILENAME
    old = new.with_name(LEGACY_END_STATE_FILENAME)
    return old if not new.exists() and old.exists() else new


def _being_read(ckpt_dir: Path) -> bool:
    """A live process marked `ckpt_dir` (READING.<pid>); a marker left by a dead one is ignored."""
    for marker in ckpt_dir.glob(f"{READING_MARKER}.*"):
        pid = marker.name.rpartition(".")[2]
        if pid.isdigit() and _pid_alive(int(pid)):
            return True
    return False


def _pid_alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)  # signal 0: is there such a process (no signal is sent)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # it exists, owned by someone else
    except OSError:
        return False
    return True


def _tracker_failed(tracker: Tracker, what: str, err: Exception) -> None:
    log.warning("experiment tracker %s failed to %s: %s: %s", type(tracker).__name__, what, type(err).__name__, err)
    log.debug("the tracker's error", exc_info=True)


def _as_mapping(config: Any) -> Any:
    if isinstance(config, Mapping):
        return dict(config)
    for attr in ("to_dict", "model_dump", "as_dict"):
        fn = getattr(config, attr, None)
        if callable(fn):
            return fn()
    if dataclasses.is_dataclass(config) and not isinstance(config, type):
        return dataclasses.asdict(config)
    raw = getattr(config, "raw", None)
    if isinstance(raw, Mapping):
        return dict(raw)
    raise TypeError(
        f"write_config: cannot turn a {type(config).__name__} into a mapping "
        "(pass a dict, a dataclass, or an object with to_dict())"
    )


def _plain(obj: Any) -> Any:
    """YAML/JSON-safe plain data: paths and enums as strings, tuples as lists, tensors as numbers."""
    if obj is None or isinstance(obj, (bool, int, str)):
        return obj
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else str(obj)
    if isinstance(obj, enum.Enum):
        return _plain(obj.value)
    if isinstance(obj, os.PathLike):
        return os.fspath(obj)
    if isinstance(obj, Mapping):
        return {str(k): _plain(v) for k, v in obj.items()}
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return _plain(dataclasses.asdict(obj))
    if isinstance(obj, (list, tuple, set, frozenset)):
        return [_plain(v) for v in obj]
    if hasattr(obj, "item") and callable(obj.item):
        try:
            return _plain(obj.item())
        except Exception:
            pass
    if hasattr(obj, "tolist"):
        return _plain(obj.tolist())
    return str(obj)


def _atomic_write(path: Path, text: str) -> None:
    """Write to a temporary file, then rename: a reader never sees half a file."""
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    with naming_the_file(path):
        tmp.write_text(text)
    os.replace(tmp, path)
