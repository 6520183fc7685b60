"""Where a cost model comes from: a run directory (fitted on its trace) or a saved model (JSON).

One place, so `costs`, `simulate` and `tune` accept the same things and say the same when a
run cannot calibrate (no trace, too few steps, a trace without the engine's step log)."""

from __future__ import annotations

from pathlib import Path

from areal_graph.perfmodel.cost_model import CostModel
from areal_graph.perfmodel.costs import CalibrationError, fit_costs
from areal_graph.trace_analysis.trace_run import load_run


def load_costs(source: str | Path) -> CostModel:
    """The cost model of `source`: a run directory, or a JSON file `areal-graph costs --save` wrote.
    Raises FileNotFoundError or ValueError (CalibrationError) with a message for the user."""
    path = Path(source)
    if path.is_file() and path.suffix == ".json" and path.name != "trace.json":
        try:
            return CostModel.from_json(path.read_text())
        except (ValueError, TypeError, KeyError) as exc:
            raise CalibrationError(f"{path}: not a cost model written by `areal-graph costs --save` ({exc})") from None
    if not path.exists():
        raise FileNotFoundError(f"{path}: no such run directory")
    if not path.is_dir() or not (path / "trace.json").exists():
        raise CalibrationError(
            f"{path}: not a run directory with a trace.json (a run with runtime.trace: false "
            "cannot calibrate the model)"
        )

    return fit_costs(load_run(path))
