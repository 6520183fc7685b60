"""`areal-graph plot` (cli/cmd_plot.py) in-process: the workflows recorded by the trace fixture
runs (tests/fixtures/trace_runs/*/config.yaml, files `areal-graph run` wrote) drawn as DOT,
Mermaid and SVG whose nodes and edges are the graph's; --set renaming the output files; and
the exit code and message when the output folder cannot be written or the workflow is
missing. The shipped-workflow plot and a broken workflow are in tests/cli/test_graph_cli.py."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from areal_graph.cli import cmd_plot
from areal_graph.graph.dag import build_graph
from areal_graph.graph.loader import load_workflow
from support.cli import parser_of
from support.paths import FIXTURES

RUN_CONFIGS = sorted((FIXTURES / "trace_runs").glob("*/config.yaml"))


parse = parser_of(cmd_plot, "plot")


@pytest.fixture(autouse=True)
def _wide(monkeypatch):
    monkeypatch.setenv("COLUMNS", "400")  # each "wrote PATH" stays on one line


def test_parser_defaults():
    args = parse("wf.yaml")
    assert args.workflow == Path("wf.yaml") and args.outdir == Path(".") and args.overrides == []
    assert args.func is cmd_plot.run
    assert parse("wf.yaml", "-o", "d", "--set", "a=1", "--set", "b=2").overrides == ["a=1", "b=2"]


def test_fixture_runs_exist():
    assert [p.parent.name for p in RUN_CONFIGS] == ["async", "sync"]


@pytest.mark.parametrize("config", RUN_CONFIGS, ids=lambda p: p.parent.name)
def test_run_config_is_drawn_with_the_graph_nodes_and_edges(config, tmp_path, capsys):
    out_dir = tmp_path / "plots" / "deeper"  # made, parents too
    assert cmd_plot.run(parse(str(config), "-o", str(out_dir))) == 0
    spec = load_workflow(config)
    graph = build_graph(spec)
    paths = [out_dir / f"{spec.name}.{ext}" for ext in ("dot", "mmd", "svg")]
    assert sorted(out_dir.iterdir()) == sorted(paths)
    assert capsys.readouterr().out.splitlines() == [f"wrote {p}" for p in paths]

    dot = paths[0].read_text(encoding="utf-8")
    assert dot.startswith(f'digraph "{spec.name}" {{') and dot.rstrip().endswith("}")
    for u, v, data in graph.edges(data=True):
        assert f'"{u}" -> "{v}" [label="{", ".join(data["keys"])}"];' in dot
    for train, rollout in graph.graph["weight_update"]:
        assert f'"{train}" -> "{rollout}" [label="new weights (v+1)", style=dashed, constraint=false];' in dot
    assert sum(" -> " in line for line in dot.splitlines()) == graph.number_of_edges() + len(
        graph.graph["weight_update"]
    )

    mmd = paths[1].read_text(encoding="utf-8").splitlines()
    assert mmd[0] == "flowchart TD"
    for name in graph.nodes:
        assert any(line.strip().startswith(f'n_{name}["{name}<br/>') for line in mmd), name
    assert sum("-->" in line for line in mmd) == graph.number_of_edges()
    assert sum("-.->" in line for line in mmd) == len(graph.graph["weight_update"])

    svg = ET.parse(paths[2]).getroot()
    assert svg.tag.endswith("svg")
    texts = {t.text for t in svg.iter() if t.tag.endswith("text")}
    assert set(graph.nodes) <= texts


def test_set_override_renames_the_outputs(tmp_path, capsys):
    config = FIXTURES / "trace_runs" / "sync" / "config.yaml"
    assert cmd_plot.run(parse(str(config), "-o", str(tmp_path), "--set", "name=renamed")) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["renamed.dot", "renamed.mmd", "renamed.svg"]
    assert (tmp_path / "renamed.dot").read_text().startswith('digraph "renamed" {')


def test_default_outdir_is_the_current_folder(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert cmd_plot.run(parse(str(FIXTURES / "minimal.yaml"))) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["minimal.dot", "minimal.mmd", "minimal.svg"]
    assert "wrote minimal.dot" in capsys.readouterr().out


def test_outdir_that_is_a_file_is_exit_1_naming_it(tmp_path, capsys):
    blocker = tmp_path / "a_file"
    blocker.write_text("x")
    assert cmd_plot.run(parse(str(FIXTURES / "minimal.yaml"), "-o", str(blocker))) == 1
    out = capsys.readouterr().out
    assert f"cannot write to {blocker}: File exists" in out and "wrote" not in out
    assert blocker.read_text() == "x"


def test_missing_workflow_is_exit_1_naming_the_file(tmp_path, capsys):
    missing = tmp_path / "gone.yaml"
    assert cmd_plot.run(parse(str(missing), "-o", str(tmp_path / "out"))) == 1
    out = capsys.readouterr().out
    assert f"{missing}: 1 problem(s)" in out and "cannot read workflow file" in out
    assert not (tmp_path / "out").exists()


def test_bad_override_is_reported_and_nothing_written(tmp_path, capsys):
    args = parse(str(FIXTURES / "minimal.yaml"), "-o", str(tmp_path), "--set", "runtime.batch_size=-4")
    assert cmd_plot.run(args) == 1
    assert "runtime.batch_size" in capsys.readouterr().out
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("name", ["../escaped", "a/b", ".hidden"])
def test_a_name_that_is_not_a_file_name_is_refused(tmp_path, capsys, name):
    """The workflow's name names the output files (and the run folder): it cannot hold a path."""
    out = tmp_path / "p" / "out"
    args = parse(str(FIXTURES / "minimal.yaml"), "-o", str(out), "--set", f"name={name}")
    assert cmd_plot.run(args) == 1
    assert "a file name" in capsys.readouterr().out
    assert list(tmp_path.iterdir()) == []
