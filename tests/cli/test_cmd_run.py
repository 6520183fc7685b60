"""`areal-graph run` (cli/cmd_run.py) up to the point where it launches processes: the RL loop
itself (`run_with_auto_resume`) is replaced by a fake that records what it was given, so these
tests check what the command builds from its arguments without starting a server or worker:
the spec after KEY=VALUE overrides (also where argparse leaves them after an option), the
config.yaml it writes into the run directory and its header, --resume (a missing config, no
checkpoint, a differing workflow, overrides given in the WORKFLOW slot), the messages for a
failed run, and the per-step lines of `RunDisplay` on the metrics of a recorded run. Whole
runs are in tests/e2e/ and tests/runtime/."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from rich.console import Console

import areal_graph.modelkit.builtin as builtin
import areal_graph.runtime.orchestration.run as orchestration_run
from areal_graph.cli import cmd_run
from areal_graph.cli.main import main
from areal_graph.graph.dump import dump_workflow
from areal_graph.graph.loader import load_workflow, load_workflow_text
from areal_graph.runtime.observability.run_dir import RunDir
from areal_graph.runtime.orchestration.controller import RunFailed, RunState
from support.cli import parser_of
from support.e2e import read_metrics
from support.paths import FIXTURES, WORKFLOWS

TRACE_RUN = FIXTURES / "trace_runs" / "async"


parse = parser_of(cmd_run, "run")


def local_paths(text: str, root: Path) -> str:
    """Workflow text with the builtin kit paths replaced by local ones, which exist (run checks
    that) but are never read."""
    (root / "model").mkdir(parents=True, exist_ok=True)
    for name in ("train.jsonl", "test.jsonl"):
        (root / name).touch()
    return (
        text.replace("builtin:tiny-arith", str(root / "model"))
        .replace("builtin:arith/train", str(root / "train.jsonl"))
        .replace("builtin:arith/test", str(root / "test.jsonl"))
    )


@pytest.fixture(autouse=True)
def _no_kit_builds(monkeypatch, tmp_path):
    """Nothing here may build or install a builtin kit (minutes): fail loudly if one is asked for."""
    monkeypatch.setenv("AREAL_GRAPH_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("COLUMNS", "400")

    def refuse(*a, **k):
        raise AssertionError("a test of cmd_run asked to build a builtin kit")

    monkeypatch.setattr(builtin, "ensure_kit", refuse)


class FakeRunner:
    """Stands in for run_with_auto_resume: records its call, returns `state` or raises `error`."""

    def __init__(self, state: RunState | None = None, error: Exception | None = None, resume_note=None):
        self.state = state or RunState(
            step=3, trajectories_trained=48, history=[{"eval/accuracy": 0.1}, {"eval/accuracy": 0.3}]
        )
        self.error = error
        self.resume_note = resume_note
        self.calls: list[dict] = []

    def __call__(self, spec, run_dir, display=None, resume_from=None, on_resume=None):
        self.calls.append({"spec": spec, "run_dir": run_dir, "display": display, "resume_from": resume_from})
        if self.resume_note is not None:
            on_resume(*self.resume_note)
        if self.error is not None:
            raise self.error
        return self.state


@pytest.fixture
def runner(monkeypatch):
    fake = FakeRunner()
    monkeypatch.setattr(orchestration_run, "run_with_auto_resume", fake)
    return fake


@pytest.fixture
def workflow(tmp_path):
    """grpo_sync.yaml pointed at local (never read) paths."""
    path = tmp_path / "grpo.yaml"
    path.write_text(local_paths((WORKFLOWS / "grpo_sync.yaml").read_text(), tmp_path / "kit"))
    return path


@pytest.fixture
def finished_run(tmp_path):
    """A run directory as a run leaves it: the recorded config.yaml (local paths) and, with
    `checkpoint=True`, one complete checkpoint."""

    def make(checkpoint: bool) -> RunDir:
        run_dir = RunDir(tmp_path / "old_run")
        run_dir.write_text("config.yaml", local_paths((TRACE_RUN / "config.yaml").read_text(), tmp_path / "kit"))
        if checkpoint:
            run_dir.mark_checkpoint_complete(run_dir.checkpoint_dir(2))
        return run_dir

    return make


# ---------------------------------------------------------------- arguments


def test_parser_collects_overrides_and_options():
    args = parse("wf.yaml", "runtime.steps=3", "nodes.train.clip_eps=0.1", "--run-dir", "d")
    assert args.workflow == Path("wf.yaml") and args.run_dir == Path("d") and args.resume is None
    assert args.overrides == ["runtime.steps=3", "nodes.train.clip_eps=0.1"]
    assert args.func is cmd_run.run
    bare = parse("--resume", "r")
    assert bare.workflow is None and bare.overrides == [] and bare.resume == Path("r")


def test_no_workflow_and_no_resume_is_a_usage_error(runner, capsys):
    assert cmd_run.run(parse()) == 2
    assert "give a WORKFLOW file (or --resume RUN_DIR)" in capsys.readouterr().out
    assert runner.calls == []


def test_invalid_workflow_lists_each_problem_and_writes_nothing(runner, tmp_path, capsys):
    path = FIXTURES / "broken" / "unknown_model.yaml"
    run_dir = tmp_path / "never"
    assert cmd_run.run(parse(str(path), "runtime.steps=0", "--run-dir", str(run_dir))) == 1
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == f"{path}: the workflow has 2 problem(s):"
    assert len([line for line in lines if line.startswith("  - ")]) == 2
    assert any("unknown model 'actr'" in line for line in lines)
    assert not run_dir.exists() and runner.calls == []


# ---------------------------------------------------------------- a fresh run


def test_fresh_run_writes_config_and_hands_the_overridden_spec_to_the_loop(runner, workflow, tmp_path, capsys):
    run_dir = tmp_path / "run"
    overrides = ["runtime.steps=3", "runtime.batch_size=16"]
    assert cmd_run.run(parse(str(workflow), *overrides, "--run-dir", str(run_dir))) == 0
    [call] = runner.calls
    spec = call["spec"]
    assert (spec.name, spec.runtime.steps, spec.runtime.batch_size) == ("grpo_sync", 3, 16)
    assert call["run_dir"].path == run_dir and call["resume_from"] is None
    assert isinstance(call["display"], cmd_run.RunDisplay) and call["display"].total == 3
    config = (run_dir / "config.yaml").read_text()
    assert config.splitlines()[:2] == [
        f"# the workflow this run ran: {workflow} with runtime.steps=3 runtime.batch_size=16",
        "# repeat it: areal-graph run <this file>; continue it: areal-graph run --resume <run dir>",
    ]
    # the config is the spec that ran: loading it back gives the same workflow
    assert dump_workflow(load_workflow(run_dir / "config.yaml")) == dump_workflow(spec)
    out = capsys.readouterr().out
    assert f"areal-graph run grpo_sync: 3 steps, batch 16, max staleness 0 -> {run_dir}" in out
    assert "3 steps, 48 trajectories trained; greedy test accuracy 0.100 -> 0.300" in out
    assert f"run directory: {run_dir}  (trace: areal-graph trace {run_dir})" in out


def test_overrides_after_an_option_reach_the_run_through_main(runner, workflow, tmp_path):
    run_dir = tmp_path / "run"
    assert main(["run", str(workflow), "--run-dir", str(run_dir), "runtime.steps=2", "runtime.seed=9"]) == 0
    spec = runner.calls[0]["spec"]
    assert (spec.runtime.steps, spec.runtime.seed) == (2, 9)
    assert "with runtime.steps=2 runtime.seed=9" in (run_dir / "config.yaml").read_text().splitlines()[0]


def test_unrecognized_option_after_an_option_is_refused(runner, workflow, tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["run", str(workflow), "--run-dir", str(tmp_path / "r"), "--no-such-flag"])
    assert exit_info.value.code == 2
    assert "unrecognized arguments: --no-such-flag" in capsys.readouterr().err
    assert runner.calls == []


@pytest.mark.parametrize("held", ["config.yaml", "metrics.jsonl", "checkpoints"])
def test_a_run_dir_that_holds_a_run_is_refused(runner, workflow, tmp_path, capsys, held):
    """Two runs in one folder would append metrics (steps 1..5 then 1 again) and let --resume pick
    the old run's checkpoint under the new config."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / held).mkdir() if held == "checkpoints" else (run_dir / held).write_text("x")
    assert cmd_run.run(parse(str(workflow), "--run-dir", str(run_dir))) == 2
    out = capsys.readouterr().out
    assert f"{run_dir} already holds a run ({held})" in out and f"areal-graph run --resume {run_dir}" in out
    assert runner.calls == [] and sorted(p.name for p in run_dir.iterdir()) == [held]


def test_an_empty_run_dir_is_used(runner, workflow, tmp_path):
    (tmp_path / "run").mkdir()
    assert cmd_run.run(parse(str(workflow), "--run-dir", str(tmp_path / "run"))) == 0
    assert (tmp_path / "run" / "config.yaml").is_file()


def test_an_option_for_a_workflow_field_gets_the_run_usage_and_the_key_value_hint(runner, workflow, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["run", str(workflow), "--steps", "3"])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and err.startswith("usage: areal-graph run")
    assert "unrecognized arguments: --steps 3 (a workflow field is set as KEY=VALUE, e.g. runtime.steps=3" in err


def test_default_run_dir_comes_from_runtime_run_dir(runner, workflow, tmp_path):
    pattern = str(tmp_path / "runs" / "{name}-x")
    assert cmd_run.run(parse(str(workflow), f"runtime.run_dir={pattern}")) == 0
    assert runner.calls[0]["run_dir"].path == tmp_path / "runs" / "grpo_sync-x"
    assert (tmp_path / "runs" / "grpo_sync-x" / "config.yaml").is_file()


def test_history_without_evaluations_has_no_accuracy_in_the_summary(monkeypatch, workflow, tmp_path, capsys):
    monkeypatch.setattr(orchestration_run, "run_with_auto_resume", FakeRunner(RunState(step=1, trajectories_trained=8)))
    assert cmd_run.run(parse(str(workflow), "--run-dir", str(tmp_path / "r"))) == 0
    out = capsys.readouterr().out
    assert "1 steps, 8 trajectories trained" in out and "greedy test accuracy" not in out


def test_unknown_builtin_model_is_exit_1_before_the_loop(runner, workflow, tmp_path, capsys):
    rc = cmd_run.run(parse(str(workflow), "models.actor.path=builtin:nope", "--run-dir", str(tmp_path / "r")))
    assert rc == 1
    assert "unknown builtin model 'builtin:nope'" in capsys.readouterr().out
    assert runner.calls == []
    assert not (tmp_path / "r").exists()  # found before the run folder is made


def _kit_workflow(kit: Path, tmp_path: Path, max_new_tokens: int) -> Path:
    """grpo_sync.yaml on the test kit (a real tokenizer, a 512-token context) with `max_new_tokens`."""
    path = tmp_path / "kit.yaml"
    text = (
        (WORKFLOWS / "grpo_sync.yaml")
        .read_text()
        .replace("builtin:tiny-arith", str(kit / "model"))
        .replace("builtin:arith/train", str(kit / "train.jsonl"))
        .replace("builtin:arith/test", str(kit / "test.jsonl"))
    )
    path.write_text(text)
    spec = load_workflow(path, [f"nodes.rollout.sampling.max_new_tokens={max_new_tokens}"])
    path.write_text(dump_workflow(spec))
    return path


def test_prompts_that_cannot_fit_the_context_stop_the_run_before_its_folder(runner, kit, tmp_path, capsys):
    rc = cmd_run.run(parse(str(_kit_workflow(kit, tmp_path, 600)), "--run-dir", str(tmp_path / "r")))
    assert rc == 1 and runner.calls == []
    out = capsys.readouterr().out
    assert f"data.train ({kit / 'train.jsonl'}): the longest sampled prompt" in out
    assert "with nodes.rollout.sampling.max_new_tokens 600 it needs" in out
    assert not (tmp_path / "r").exists()


def test_a_kit_built_by_the_run_has_its_prompts_checked_once_built(runner, kit, tmp_path, capsys, monkeypatch):
    """The kit is not built at `run`'s first check (nothing to tokenize with): checked after building."""
    monkeypatch.setenv("AREAL_GRAPH_CACHE", str(tmp_path / "empty"))
    built = load_workflow(_kit_workflow(kit, tmp_path, 600))
    monkeypatch.setattr(cmd_run, "_resolve_builtins", lambda spec, console: built)
    wf = tmp_path / "builtin.yaml"
    wf.write_text(dump_workflow(load_workflow(WORKFLOWS / "grpo_sync.yaml")))
    rc = cmd_run.run(parse(str(wf), "--run-dir", str(tmp_path / "r")))
    assert rc == 1 and runner.calls == []
    assert "with nodes.rollout.sampling.max_new_tokens 600 it needs" in capsys.readouterr().out


def test_resolve_builtins_leaves_local_paths_alone_and_resolves_builtin_ones(monkeypatch, workflow):
    console = Console(file=io.StringIO())
    spec = load_workflow(workflow)
    assert cmd_run._resolve_builtins(spec, console) is spec  # nothing builtin: the same object
    seen = []
    monkeypatch.setattr(builtin, "resolve_builtin_paths", lambda s, progress: seen.append((s, progress)) or "resolved")
    spec = load_workflow(WORKFLOWS / "grpo_sync.yaml")
    assert cmd_run._resolve_builtins(spec, console) == "resolved"
    assert seen[0][0] is spec and callable(seen[0][1])


# ---------------------------------------------------------------- failures


def test_a_failure_is_a_message_and_exit_1(monkeypatch, workflow, tmp_path, capsys):
    def fail_after_starting(spec, run_dir, **kwargs):
        run_dir.logs_dir.mkdir()
        run_dir.write_json("end_state.json", {})
        raise RuntimeError("boom [x]")

    monkeypatch.setattr(orchestration_run, "run_with_auto_resume", fail_after_starting)
    run_dir = tmp_path / "r"
    assert cmd_run.run(parse(str(workflow), "--run-dir", str(run_dir))) == 1
    out = capsys.readouterr().out
    assert "run failed: RuntimeError: boom [x]" in out  # printed verbatim, not as markup
    assert f"process logs: {run_dir / 'logs'}; end state: {run_dir / 'end_state.json'}" in out
    assert "not resumed automatically" not in out  # not a resumable failure


def test_a_failure_before_any_process_names_no_files_it_never_wrote(monkeypatch, workflow, tmp_path, capsys):
    monkeypatch.setattr(orchestration_run, "run_with_auto_resume", FakeRunner(error=RuntimeError("no tokenizer")))
    assert cmd_run.run(parse(str(workflow), "--run-dir", str(tmp_path / "r"))) == 1
    out = capsys.readouterr().out
    assert "run failed: RuntimeError: no tokenizer" in out and "process logs" not in out and "end state" not in out


def test_resumable_failure_without_checkpoint_says_why_it_was_not_resumed(monkeypatch, workflow, tmp_path, capsys):
    monkeypatch.setattr(
        orchestration_run, "run_with_auto_resume", FakeRunner(error=RunFailed("model worker died", resumable=True))
    )
    assert cmd_run.run(parse(str(workflow), "--run-dir", str(tmp_path / "r"))) == 1
    out = capsys.readouterr().out
    assert "run failed: RunFailed: model worker died" in out
    assert "not resumed automatically: no complete checkpoint (runtime.save_every)" in out


def test_resumable_failure_past_the_limit_says_how_often_it_resumed(monkeypatch, workflow, tmp_path, capsys):
    err = RunFailed("model worker died again", resumable=True)
    err.resumes = 2

    def checkpoint_then_fail(spec, run_dir, **kwargs):
        run_dir.mark_checkpoint_complete(run_dir.checkpoint_dir(4))
        raise err

    monkeypatch.setattr(orchestration_run, "run_with_auto_resume", checkpoint_then_fail)
    assert cmd_run.run(parse(str(workflow), "runtime.auto_resume=2", "--run-dir", str(tmp_path / "r"))) == 1
    assert "not resumed automatically: runtime.auto_resume is 2 and was used 2 times" in capsys.readouterr().out


def test_auto_resume_is_announced(monkeypatch, workflow, tmp_path, capsys):
    note = (RunFailed("worker 1 died", resumable=True), tmp_path / "checkpoints" / "step_00000006", 1)
    monkeypatch.setattr(orchestration_run, "run_with_auto_resume", FakeRunner(resume_note=note))
    assert cmd_run.run(parse(str(workflow), "runtime.auto_resume=3", "--run-dir", str(tmp_path / "r"))) == 0
    out = capsys.readouterr().out
    assert "run failed: RunFailed: worker 1 died" in out
    assert "auto-resume 1 of at most 3: going on from step_00000006 in fresh processes" in out


# ---------------------------------------------------------------- --resume


def test_resume_of_a_folder_without_config_is_exit_1(runner, tmp_path, capsys):
    folder = tmp_path / "not_a_run"
    folder.mkdir()
    assert cmd_run.run(parse("--resume", str(folder))) == 1
    assert f"{folder}: not a run directory (no config.yaml)" in capsys.readouterr().out
    assert runner.calls == []


def test_resume_of_a_mistyped_folder_creates_nothing(runner, tmp_path, capsys):
    typo = tmp_path / "typo_dir"
    assert cmd_run.run(parse("--resume", str(typo))) == 1
    assert f"{typo}: not a run directory (no config.yaml)" in capsys.readouterr().out
    assert not typo.exists()


def test_resume_without_a_complete_checkpoint_is_exit_1(runner, finished_run, capsys):
    run_dir = finished_run(checkpoint=False)
    assert cmd_run.run(parse("--resume", str(run_dir.path))) == 1
    assert f"{run_dir.path}: no complete checkpoint to resume from" in capsys.readouterr().out
    assert runner.calls == []


def test_resume_continues_the_recorded_workflow_from_its_checkpoint(runner, finished_run, capsys):
    run_dir = finished_run(checkpoint=True)
    before = (run_dir.config_path).read_text()
    assert cmd_run.run(parse("--resume", str(run_dir.path))) == 0
    [call] = runner.calls
    assert call["resume_from"] == run_dir.checkpoints_root / "step_00000002"
    assert call["run_dir"].path == run_dir.path
    assert (call["spec"].name, call["spec"].runtime.steps, call["spec"].runtime.batch_size) == ("ppo_async", 4, 16)
    assert run_dir.config_path.read_text() == before  # no overrides: config.yaml stays as it was
    assert f"ppo_async: 4 steps, batch 16, max staleness 4 -> {run_dir.path}" in capsys.readouterr().out


def test_resume_with_an_override_in_the_workflow_slot(runner, finished_run):
    """`run --resume DIR runtime.steps=20`: argparse puts the override where WORKFLOW goes."""
    run_dir = finished_run(checkpoint=True)
    args = parse("--resume", str(run_dir.path), "runtime.steps=20", "runtime.seed=5")
    assert args.workflow == Path("runtime.steps=20")
    assert cmd_run.run(args) == 0
    spec = runner.calls[0]["spec"]
    assert (spec.runtime.steps, spec.runtime.seed) == (20, 5)
    config = run_dir.config_path.read_text()
    assert config.splitlines()[0] == "# resumed with runtime.steps=20 runtime.seed=5"
    assert load_workflow_text(config).runtime.steps == 20  # the config says what the run continues under


def test_resume_with_the_same_workflow_file_is_accepted(runner, finished_run):
    run_dir = finished_run(checkpoint=True)
    assert cmd_run.run(parse(str(run_dir.config_path), "--resume", str(run_dir.path))) == 0
    assert len(runner.calls) == 1


def test_resume_with_a_differing_workflow_is_refused(runner, finished_run, workflow, capsys):
    run_dir = finished_run(checkpoint=True)
    assert cmd_run.run(parse(str(workflow), "--resume", str(run_dir.path))) == 2
    out = capsys.readouterr().out
    assert f"--resume continues the workflow {run_dir.path} ran ({run_dir.config_path}), and {workflow} differs" in out
    assert runner.calls == []


# ---------------------------------------------------------------- RunDisplay


def recorded_metrics() -> list[dict]:
    return read_metrics(TRACE_RUN)


def test_display_prints_one_line_per_step_when_not_a_terminal():
    buf = io.StringIO()
    console = Console(file=buf, width=400, force_terminal=False)
    rows = recorded_metrics()
    with cmd_run.RunDisplay(console, total_steps=len(rows)) as display:
        assert display.live is None
        for row in rows:
            display.on_step(row["step"], row)
        display.on_eval(4, 0.25)
    lines = buf.getvalue().splitlines()
    assert len(lines) == len(rows) + 1 and list(display.rows) == rows[-12:] and display.last_acc == 0.25
    assert display.steps == rows[-1]["step"]  # only the rows shown are kept: a long run's memory stays flat
    first = rows[0]
    expected = [f"{title}={fmt.format(first[key])}" for key, title, fmt in cmd_run.RunDisplay.COLUMNS if key in first]
    assert lines[0] == "  ".join(expected)
    assert lines[0].startswith("step=1  ") and f"reward={first['reward/mean']:.3f}" in lines[0]
    assert lines[-1] == "eval step 4: greedy test accuracy 0.250"


def test_display_table_keeps_the_last_twelve_steps_and_blanks_missing_values():
    console = Console(file=io.StringIO(), width=400, force_terminal=True)
    display = cmd_run.RunDisplay(console, total_steps=20)
    assert display.live is not None  # a terminal gets the live table (not started here)
    for step in range(1, 16):
        display.on_step(step, {"step": step, "reward/mean": step / 10})
    table = display._table()
    assert table.title.startswith("areal-graph  step 15/20  ")
    assert table.row_count == 12
    assert [c.header for c in table.columns] == [title for _, title, _ in cmd_run.RunDisplay.COLUMNS]
    assert list(table.columns[0].cells) == [str(s) for s in range(4, 16)]
    assert list(table.columns[2].cells)[-1] == "1.500"
    assert set(table.columns[3].cells) == {""}  # no eval/accuracy in these rows
