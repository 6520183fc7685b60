"""`areal-graph validate` (cli/cmd_validate.py) called in-process through its own parser: every
shipped workflow passes and its summary states the counts the graph has, the models/nodes
tables say what is trained, frozen and fused, a missing file is a listed problem naming the
file, and `print_problems` prints YAML-ish text verbatim. The subprocess runs and the broken
fixtures are checked in tests/cli/test_graph_cli.py and tests/graph/test_validation.py."""

from __future__ import annotations

import io
import re
from pathlib import Path

import pytest
from rich.console import Console

from areal_graph.cli import cmd_validate
from areal_graph.graph.dag import build_graph
from areal_graph.graph.loader import load_workflow
from areal_graph.graph.plan import build_plan
from support.cli import parser_of
from support.paths import FIXTURES, WORKFLOWS

SHIPPED = sorted(WORKFLOWS.glob("*.yaml"))


parse = parser_of(cmd_validate, "validate")


@pytest.fixture(autouse=True)
def _wide(monkeypatch):
    monkeypatch.setenv("COLUMNS", "240")  # table cells stay whole


def rows(out: str) -> list[list[str]]:
    """The cells of every table row in `out`."""
    found = []
    for line in out.splitlines():
        if line.startswith("│"):
            found.append([c.strip() for c in line.strip().strip("│").split("│")])
    return found


def row(out: str, first_cell: str) -> list[str]:
    """The cells of the first table row whose first cell is `first_cell`."""
    for cells in rows(out):
        if cells[0] == first_cell:
            return cells
    raise AssertionError(f"no row {first_cell!r} in:\n{out}")


def test_parser_defaults_and_repeatable_set():
    args = parse("wf.yaml", "--set", "a=1", "--set", "b.c=2")
    assert args.workflow == Path("wf.yaml") and args.overrides == ["a=1", "b.c=2"] and args.schema is False
    assert args.func is cmd_validate.run
    bare = parse()
    assert bare.workflow is None and bare.overrides == []


def test_shipped_workflows_exist():
    assert len(SHIPPED) >= 5, SHIPPED


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.stem)
def test_every_shipped_workflow_validates_with_its_counts(path, capsys):
    from areal_graph.data import verifiers_tasks

    try:
        verifiers_tasks.python()
        has_venv = True
    except verifiers_tasks.VerifiersError:
        has_venv = False
    if "verifiers:" in path.read_text() and not has_venv:
        # without verifiers' own venv (CI): the workflow is fine, this machine lacks the venv, and says how
        assert cmd_validate.run(parse(str(path))) == 1
        out = " ".join(capsys.readouterr().out.split())
        assert "data.train: verifiers environments run in verifiers' own virtualenv" in out
        assert "make install-verifiers" in out
        return
    assert cmd_validate.run(parse(str(path))) == 0
    out = capsys.readouterr().out
    spec = load_workflow(path)
    graph = build_graph(spec)
    assert out.splitlines()[0] == (
        f"OK {path}: workflow {spec.name}, {len(spec.nodes)} nodes, {graph.number_of_edges()} edges"
    )
    for name, node in spec.nodes.items():
        assert row(out, name)[1] == node.kind
    rt = spec.runtime
    assert (
        f"runtime: batch {rt.batch_size} trajectories/step, max staleness {rt.max_staleness}, "
        f"{rt.steps} steps, backend {spec.inference.backend}"
    ) in out


def test_tables_show_trained_frozen_and_fused(capsys):
    path = FIXTURES / "minimal.yaml"
    assert cmd_validate.run(parse(str(path))) == 0
    out = capsys.readouterr().out
    assert row(out, "actor")[1:] == ["builtin:tiny-arith", "lr 1e-05"]
    assert row(out, "ref")[1:] == ["builtin:tiny-arith", "frozen"]
    plan = build_plan(load_workflow(path))
    assert plan.fused == {"prox_logp": "train"}  # what the nodes table must say
    prox = row(out, "prox_logp")
    assert prox[1:4] == ["logprob", "actor", plan.phase["prox_logp"]] and prox[4] == "(fused into train)"
    ref = row(out, "ref_logp")
    assert ref[4] == plan.hosting["ref_logp"].process and ref[5:] == ["input_ids", "ref_logprobs"]
    assert row(out, "train")[6] == "-"  # a train node writes nothing
    edges = [r for r in rows(out) if len(r) == 3]
    assert ["train", "rollout", "new weights (implicit, not a DAG edge)"] in edges
    assert ["rollout", "reward", "input_ids, loss_mask"] in edges


def test_overrides_reach_the_summary(capsys):
    args = parse(
        str(FIXTURES / "minimal.yaml"),
        "--set",
        "runtime.batch_size=8",
        "--set",
        "runtime.steps=3",
        "--set",
        "models.actor.train.lr=0.5",
    )
    assert cmd_validate.run(args) == 0
    out = capsys.readouterr().out
    assert "runtime: batch 8 trajectories/step, max staleness 2, 3 steps, backend embedded" in out
    assert "KV cache at weight updates: keep" in out  # `auto`, asynchronous on the embedded engine
    assert row(out, "actor")[2] == "lr 0.5"


def test_the_summary_says_what_kv_on_update_resolved_to(capsys):
    args = parse(str(FIXTURES / "minimal.yaml"), "--set", "runtime.max_staleness=0")
    assert cmd_validate.run(args) == 0
    assert "KV cache at weight updates: recompute" in capsys.readouterr().out  # synchronous


def test_missing_file_is_a_problem_naming_it(tmp_path, capsys):
    path = tmp_path / "nope.yaml"
    assert cmd_validate.run(parse(str(path))) == 1
    out = capsys.readouterr().out
    assert out.splitlines()[0] == f"{path}: 1 problem(s)"
    assert re.search(rf"- {re.escape(str(path))}.*cannot read workflow file: No such file or directory", out), out
    assert "Traceback" not in out


def test_print_problems_counts_and_prints_verbatim():
    buf = io.StringIO()
    console = Console(file=buf, width=200, color_system=None)
    cmd_validate.print_problems(console, Path("wf.yaml"), ["field 'x': got [a, b]", "[bold]not markup[/]"])
    assert buf.getvalue().splitlines() == [
        "wf.yaml: 2 problem(s)",
        "  - field 'x': got [a, b]",
        "  - [bold]not markup[/]",
    ]


def test_an_unknown_builtin_model_fails_validation(capsys):
    from areal_graph.cli import cmd_validate as cv

    args = parse(str(WORKFLOWS / "ppo_async.yaml"), "--set", "models.actor.path=builtin:nope")
    assert cv.run(args) == 1
    assert "unknown builtin model 'builtin:nope'" in capsys.readouterr().out


def test_the_readmes_shortest_workflow_validates_and_plans_as_the_readme_says(tmp_path, capsys):
    """The README's "Write a workflow" example is a newcomer's first file: it must validate, and
    the plan must be the one the paragraph after it describes (prox_logp fused into train)."""
    from support.paths import REPO

    text = (REPO / "README.md").read_text(encoding="utf-8")
    section = text.split("## Write a workflow", 1)[1].split("\n## ", 1)[0]
    yaml_text = section.split("```yaml\n", 1)[1].split("```", 1)[0]
    path = tmp_path / "my_grpo.yaml"
    path.write_text(yaml_text, encoding="utf-8")
    assert cmd_validate.run(parse(str(path))) == 0, capsys.readouterr().out
    plan = build_plan(load_workflow(path))
    assert plan.fused == {"prox_logp": "train"} and "fused into `train`" in " ".join(section.split())
    assert {plan.phase["reward"], plan.phase["train"]} == {"generation", "training"}
