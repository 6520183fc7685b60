"""Everything `areal-graph trace` reads about one run: trace parts, metrics, workflow and its plan.

Why one loader: the text summary, the PNGs and the HTML page read the same things and must
say the same about what is missing. A run directory may be damaged (a killed run, a file cut
mid-write) or older than the code reading it (its `config.yaml` written by a schema that has
moved on since), so each part that cannot be read becomes a note, not an exception; only a
run with no trace at all is an error. A bare trace file (no run directory around it) is
accepted too: then there are no metrics and no graph, and the notes say so.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from areal_graph.runtime.observability.run_dir import (
    CONFIG_FILENAME,
    END_STATE_FILENAME,
    METRICS_FILENAME,
    end_state_file,
    read_metrics_file,
)
from areal_graph.trace_analysis.trace_model import Timeline, load_timeline
from areal_graph.trace_analysis.trace_stats import guess_sides
from areal_graph.trace_analysis.trace_windows import DEFAULT_READ_MB

log = logging.getLogger(__name__)
UNFINISHED_FILENAME = END_STATE_FILENAME  # end_state.json; an older run's unfinished.json is read instead


@dataclass
class RunMaterial:
    """One run as read for `areal-graph trace` (see module docstring)."""

    label: str
    path: Path
    timeline: Timeline
    metrics: list[dict[str, Any]] = field(default_factory=list)
    spec: Any = None  # graph.spec.WorkflowSpec, when config.yaml loaded
    plan: Any = None  # graph.plan.ExecutionPlan, when config.yaml loaded
    generation_nodes: tuple[str, ...] = ()
    training_nodes: tuple[str, ...] = ()
    sides_from: str = "plan"  # "plan" (config.yaml) or "call counts" (guessed from the trace)
    restarts: dict[str, int] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    @property
    def run_dir(self) -> Path | None:
        return self.path if self.path.is_dir() else None


def load_run(
    path: str | os.PathLike, label: str | None = None, max_read_bytes: int = DEFAULT_READ_MB * 2**20
) -> RunMaterial:
    """Read a run directory (or a single trace file); raises FileNotFoundError/ValueError only
    when there is no readable trace. A trace past `max_read_bytes` is read in windows."""
    path = Path(path)
    tl = load_timeline(path, max_read_bytes)
    run = RunMaterial(label=label or _default_label(path), path=path, timeline=tl, notes=list(tl.notes))
    if run.run_dir is None:
        run.notes.append(
            "a bare trace file: no metrics.jsonl or config.yaml beside it (no graph, staleness or learning curve)"
        )
    else:
        run.metrics = _read_metrics(path / METRICS_FILENAME, run.notes)
        run.spec, run.plan = _load_workflow(path / CONFIG_FILENAME, run.notes)
        run.restarts = _read_restarts(path / UNFINISHED_FILENAME, run.notes)
    if run.plan is not None:
        run.generation_nodes = (run.plan.source, *run.plan.generation)
        run.training_nodes = tuple(run.plan.training)
    else:
        gen, train = guess_sides(tl)
        run.generation_nodes, run.training_nodes, run.sides_from = (
            tuple(sorted(gen)),
            tuple(sorted(train)),
            "call counts",
        )
    for proc, n in sorted(run.restarts.items()):
        if n:
            run.notes.append(
                f"{proc} died and was restarted {n} time(s) ({UNFINISHED_FILENAME}): spans it recorded "
                "after its last collection before dying are lost"
            )
    return run


def _default_label(path: Path) -> str:
    return path.name if path.is_dir() else f"{path.parent.name}/{path.name}"


def _read_metrics(path: Path, notes: list[str]) -> list[dict[str, Any]]:
    """metrics.jsonl's steps (the recorder's reader: a damaged line is skipped and counted), and
    a note on what is missing or was skipped."""
    if not path.is_file():
        notes.append(f"no {METRICS_FILENAME}: no staleness, packing or learning curve")
        return []
    read = read_metrics_file(path)
    if read.damaged:
        notes.append(f"{METRICS_FILENAME}: {read.damaged} damaged line(s) skipped")
    return read.records


def _load_workflow(path: Path, notes: list[str]) -> tuple[Any, Any]:
    """(spec, plan) from the run's config.yaml; a config an older schema wrote is retried with its
    graph sections only (name, models, data, nodes), since the graph is all this needs."""
    if not path.is_file():
        notes.append(f"no {CONFIG_FILENAME}: the workflow graph is not drawn")
        return None, None
    import yaml

    from areal_graph.graph.loader import WorkflowError, load_workflow, load_workflow_text
    from areal_graph.graph.plan import build_plan

    try:
        spec = load_workflow(path)
    except WorkflowError as err:
        try:
            raw = yaml.safe_load(path.read_text(encoding="utf-8"))
            keep = {k: raw[k] for k in ("name", "models", "data", "nodes") if k in raw}
            spec = load_workflow_text(yaml.safe_dump(keep, sort_keys=False), file=str(path))
            notes.append(
                f"{CONFIG_FILENAME} does not load with today's schema ({_first_problem(err)}); "
                "its graph sections did, with default runtime settings"
            )
        except (WorkflowError, yaml.YAMLError, TypeError, AttributeError) as err2:
            notes.append(f"{CONFIG_FILENAME} does not load ({_first_problem(err2)}): the workflow graph is not drawn")
            return None, None
    except (OSError, ValueError) as err:
        notes.append(f"{CONFIG_FILENAME} cannot be read ({err}): the workflow graph is not drawn")
        return None, None
    try:
        return spec, build_plan(spec)
    except Exception as err:  # noqa: BLE001 - a plan we cannot build only loses the sides, not the page
        notes.append(f"the plan of {CONFIG_FILENAME} cannot be built ({err}); node sides guessed from call counts")
        return spec, None


def _first_problem(err: Exception) -> str:
    problems = getattr(err, "problems", None)
    return str(problems[0]) if problems else str(err).splitlines()[0]


def _read_restarts(path: Path, notes: list[str]) -> dict[str, int]:
    path = end_state_file(path.parent)  # a run from before the rename has unfinished.json
    if not path.is_file():
        notes.append(f"no {UNFINISHED_FILENAME}: the run did not stop cleanly (killed?) or is still running")
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, OSError) as err:
        notes.append(f"{path.name} is damaged ({err})")
        return {}
    restarts = data.get("process_restarts") if isinstance(data, dict) else None
    return {str(k): int(v) for k, v in (restarts or {}).items() if isinstance(v, int)}
