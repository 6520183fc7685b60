"""trace_analysis/trace_png.py: `write_pngs` writes the utilisation and learning-curve
pictures of one run or several as real PNG files of the size their figures ask for (one
utilisation panel per run, three learning-curve panels), off-screen, and says clearly when
matplotlib is missing.

Nothing else calls it in the tests (the CLI's --png goes through it); the pictures are read
back with matplotlib to check they are not blank."""

from __future__ import annotations

import importlib.util
import json
import struct
import sys

import pytest

from areal_graph.trace_analysis.trace_png import LEARNING_CURVE_PNG, UTILISATION_PNG, PlotsUnavailable, write_pngs
from areal_graph.trace_analysis.trace_run import load_run
from support.ci import missing
from support.paths import FIXTURES

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
DPI = 110


@pytest.fixture
def needs_matplotlib() -> None:
    """An optional dependency (`areal-graph[plots]`) that the dev install has."""
    if importlib.util.find_spec("matplotlib") is None:
        missing("matplotlib", "pip install 'areal-graph[plots]'")


def _png_size(path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == PNG_SIGNATURE and data[12:16] == b"IHDR", path
    return struct.unpack(">II", data[16:24])


def _colours(path) -> int:
    import matplotlib.pyplot as plt
    import numpy as np

    pixels = plt.imread(path)
    return len(np.unique(pixels.reshape(-1, pixels.shape[-1]), axis=0))


@pytest.mark.usefixtures("needs_matplotlib")
def test_two_runs_give_one_utilisation_panel_each_and_one_learning_curve(tmp_path):
    runs = [load_run(FIXTURES / "trace_runs" / "sync", "sync"), load_run(FIXTURES / "trace_runs" / "async", "async")]
    out = tmp_path / "new" / "pictures"  # made if missing
    paths = write_pngs(runs, out, bins=40)
    assert paths == [out / UTILISATION_PNG, out / LEARNING_CURVE_PNG]
    assert sorted(p.name for p in out.iterdir()) == ["learning_curve.png", "utilisation.png"]
    assert _png_size(paths[0]) == (11 * DPI, round((2.6 * 2 + 0.6) * DPI))  # figsize (11, 2.6 per run + 0.6)
    assert _png_size(paths[1]) == (9 * DPI, round(7.5 * DPI))
    assert _colours(paths[0]) > 20 and _colours(paths[1]) > 20  # lines and text drawn, not a blank canvas


@pytest.mark.usefixtures("needs_matplotlib")
def test_a_bare_trace_without_metrics_still_gets_both_pictures(tmp_path):
    events = [
        {"name": "work", "cat": "compute", "ph": "X", "ts": k * 1000.0, "dur": 500.0, "pid": 1, "tid": 1}
        for k in range(20)
    ]
    (tmp_path / "trace.json").write_text(json.dumps(events))
    run = load_run(tmp_path / "trace.json")
    assert run.metrics == []
    util, curve = write_pngs([run], tmp_path / "png", bins=10)
    assert _png_size(util) == (11 * DPI, round(3.2 * DPI)) and _png_size(curve) == (9 * DPI, round(7.5 * DPI))


def test_no_runs_is_an_error(tmp_path):
    with pytest.raises(ValueError, match="no runs"):
        write_pngs([], tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_without_matplotlib_the_error_says_how_to_install_it(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # `import matplotlib` raises ImportError
    run = load_run(FIXTURES / "trace_runs" / "sync" / "trace.json")
    with pytest.raises(PlotsUnavailable, match=r"pip install 'areal-graph\[plots\]'"):
        write_pngs([run], tmp_path / "png")
    assert not (tmp_path / "png").exists()
