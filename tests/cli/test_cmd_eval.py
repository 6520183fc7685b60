"""`areal-graph eval` (cli/cmd_eval.py) in-process: the argument checks that answer before any
model is loaded (-k, --samples, --limit, an unknown builtin model), the messages for a model
without a tokenizer and for a bad --rollout-class, and one small real evaluation of the test
kit's random model (2 problems, 4 tokens, pass@2 from 3 samples) whose table, shown answers
and --json file agree with each other. The trained-kit evaluation and the subprocess runs
are in tests/modelkit/test_evaluation.py."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

import areal_graph.modelkit.builtin as builtin
from areal_graph.cli import cmd_eval
from support.cli import parser_of

parse = parser_of(cmd_eval, "eval")


@pytest.fixture(autouse=True)
def _env(monkeypatch, tmp_path):
    monkeypatch.setenv("COLUMNS", "400")
    monkeypatch.setenv("AREAL_GRAPH_CACHE", str(tmp_path / "cache"))

    def refuse(*a, **k):
        raise AssertionError("a test of cmd_eval asked to build a builtin kit")

    monkeypatch.setattr(builtin, "ensure_kit", refuse)


def test_parser_defaults():
    args = parse("m", "--data", "d.jsonl")
    assert (args.model, args.data, args.limit, args.k, args.samples) == ("m", "d.jsonl", None, 0, None)
    # None: not given (the workflow's value, else the plain default applies: cmd_eval.settings)
    assert (args.temperature, args.max_new_tokens, args.reward, args.seed, args.show) == (1.0, None, None, 0, 3)
    assert (args.question_key, args.answer_key, args.json_out, args.rollout_class) == (None, None, None, None)
    assert args.func is cmd_eval.run
    conf = cmd_eval.settings(args, None)
    assert (conf["max_new_tokens"], conf["reward"], conf["question_key"], conf["answer_key"]) == (
        64,
        "math_verify",
        "question",
        "answer",
    )


def test_no_data_and_no_workflow_is_a_usage_error(capsys):
    assert cmd_eval.run(parse("m")) == 2
    assert "give --data FILE (or --workflow WORKFLOW.yaml with a data.eval)" in capsys.readouterr().err


@pytest.mark.parametrize(
    "argv,message",
    [
        (["-k", "-1"], "-k must be >= 0 and --samples >= k (got -k -1, --samples None)"),
        (["--samples", "0"], "-k must be >= 0 and --samples >= k (got -k 0, --samples 0)"),
        (["-k", "3", "--samples", "2"], "(got -k 3, --samples 2)"),
        (["--limit", "0"], "--limit must be >= 1, got 0"),
    ],
)
def test_bad_counts_are_usage_errors_before_loading(tmp_path, capsys, argv, message):
    # the model does not exist: the checks answer before it is looked at
    assert cmd_eval.run(parse(str(tmp_path / "no_model"), "--data", "x.jsonl", *argv)) == 2
    assert message in capsys.readouterr().err


def test_unknown_builtin_model_is_a_usage_error(capsys):
    assert cmd_eval.run(parse("builtin:nope", "--data", "x.jsonl")) == 2
    err = capsys.readouterr().err
    assert "unknown builtin model 'builtin:nope'" in err and "builtin:tiny-calc" in err


def test_model_without_tokenizer_is_exit_1(tiny_model_dir, kit, capsys):
    assert cmd_eval.run(parse(str(tiny_model_dir), "--data", str(kit / "test.jsonl"))) == 1
    err = capsys.readouterr().err
    assert f"{tiny_model_dir} has no tokenizer" in err and "Traceback" not in err


@pytest.mark.parametrize(
    "path,message",
    [
        ("no_such_module_xyz:Agent", "--rollout-class: "),
        (
            "collections:OrderedDict",
            "--rollout-class: rollout class 'collections:OrderedDict' is not a subclass of "
            "areal_graph.api.rollout.Rollout",
        ),
    ],
)
def test_bad_rollout_class_is_a_usage_error(tiny_model_dir, capsys, path, message):
    assert cmd_eval.run(parse(str(tiny_model_dir), "--data", "x.jsonl", "--rollout-class", path)) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
    if path.startswith("no_such"):
        assert "no_such_module_xyz" in err


def test_small_real_eval_table_answers_and_json_agree(kit, tmp_path, capsys):
    out = tmp_path / "deep" / "result.json"
    args = parse(
        str(kit / "model"),
        "--data",
        str(kit / "test.jsonl"),
        "--limit",
        "2",
        "--max-new-tokens",
        "4",
        "-k",
        "2",
        "--samples",
        "3",
        "--temperature",
        "0.7",
        "--show",
        "1",
        "--json",
        str(out),
    )
    assert cmd_eval.run(args) == 0
    captured = capsys.readouterr()
    result = json.loads(out.read_text())
    assert f"wrote {out}" in captured.err
    assert result["model"] == str(kit / "model") and result["data"] == str(kit / "test.jsonl")
    assert (result["prompts"], result["k"], result["n_samples"], result["temperature"]) == (2, 2, 3, 0.7)
    per = result["per_prompt"]
    assert len(per) == 2 and all(0 <= p["samples_correct"] <= 3 for p in per)
    assert result["greedy_accuracy"] == sum(p["greedy_correct"] for p in per) / 2
    assert result["sample_accuracy"] == pytest.approx(sum(p["samples_correct"] for p in per) / 6)
    text = captured.out
    assert re.search(r"│ problems\s+│\s+2 │", text)
    assert re.search(r"│ reward\s+│\s+math_verify \(picked for file data; --reward to change\) │", text)
    assert re.search(rf"│ greedy accuracy \(reward > 0\.5\)\s+│\s+{result['greedy_accuracy']:.1%} │", text)
    assert re.search(rf"│ pass@2 \(n=3, T=0\.7\)\s+│\s+{result['pass@2']:.1%} │", text)
    assert re.search(rf"│ mean sample accuracy\s+│\s+{result['sample_accuracy']:.1%} │", text)
    shown = [line for line in text.splitlines() if line[:1] in ("✓", "✗")]
    assert len(shown) == 1  # --show 1
    first = per[0]
    assert shown[0].startswith(
        ("✓" if first["greedy_correct"] else "✗") + f" {first['id']} (answer {first['answer']}, "
        f"reward {first['greedy_reward']:g}):"
    )
    assert first["greedy_turns"] == [["assistant", first["greedy"]]]  # one turn after the prompt: the answer


def test_greedy_only_has_no_pass_at_k_rows(kit, capsys):
    args = parse(
        str(kit / "model"), "--data", str(kit / "test.jsonl"), "--limit", "1", "--max-new-tokens", "2", "--show", "0"
    )
    assert cmd_eval.run(args) == 0
    text = capsys.readouterr().out
    assert re.search(r"│ problems\s+│\s+1 │", text)
    assert "pass@" not in text and "mean sample accuracy" not in text
    assert not any(line[:1] in ("✓", "✗") for line in text.splitlines())


def test_json_path_argument_is_a_path():
    assert parse("m", "--data", "d", "--json", "a/b.json").json_out == Path("a/b.json")


def test_samples_without_k_and_a_folder_as_json_are_usage_errors(tmp_path, capsys):
    assert cmd_eval.run(parse("m", "--data", "d.jsonl", "--samples", "3")) == 2
    assert "--samples 3 without -k" in capsys.readouterr().err
    assert cmd_eval.run(parse("m", "--data", "d.jsonl", "--json", str(tmp_path))) == 2
    assert f"--json {tmp_path} is a directory" in capsys.readouterr().err


def test_a_verl_parquet_file_is_evaluated_with_accuracy_per_source(kit, tmp_path, capsys):
    from support.e2e import VERL_SOURCES, write_verl_parquet

    _, test = write_verl_parquet(kit, tmp_path)
    out = tmp_path / "r.json"
    args = parse(
        str(kit / "model"),
        "--data",
        str(test),
        "--limit",
        "4",
        "--max-new-tokens",
        "4",
        "--show",
        "0",
        "--json",
        str(out),
    )
    assert cmd_eval.run(args) == 0
    result = json.loads(out.read_text())
    assert [p["source"] for p in result["per_prompt"]] == [VERL_SOURCES[i % 2] for i in range(4)]
    assert set(result["by_source"]) == set(VERL_SOURCES)
    for source, row in result["by_source"].items():
        mine = [p["greedy_correct"] for p in result["per_prompt"] if p["source"] == source]
        assert row == {"prompts": 2, "greedy_accuracy": sum(mine) / 2}
    text = capsys.readouterr().out
    for source, row in result["by_source"].items():
        assert re.search(rf"│\s+{re.escape(source)} \(2\)\s+│\s+{row['greedy_accuracy']:.1%} │", text)


def _workflow_file(tmp_path: Path, *overrides: str) -> Path:
    """ppo_async.yaml with `overrides`, written back as a workflow file (as a run's config.yaml is)."""
    from areal_graph.graph.dump import dump_workflow
    from areal_graph.graph.loader import load_workflow
    from support.paths import WORKFLOWS

    path = tmp_path / "config.yaml"
    path.write_text(dump_workflow(load_workflow(WORKFLOWS / "ppo_async.yaml", list(overrides))))
    return path


def test_speculative_is_off_by_default_and_the_flag_wins_over_the_workflow(tmp_path):
    from rich.console import Console

    err = Console(stderr=True)
    assert parse("m", "--data", "d").speculative is None  # not given: the workflow's, else off
    assert cmd_eval.settings(parse("m", "--data", "d"), err)["speculative"] == {"enabled": False}
    assert cmd_eval.settings(parse("m", "--data", "d", "--speculative", "on"), err)["speculative"] == {"enabled": True}
    on = _workflow_file(tmp_path, "inference.speculative.enabled=true", "inference.speculative.max_draft=8")
    conf = cmd_eval.settings(parse("m", "--workflow", str(on)), err)
    assert conf["speculative"] == {
        "enabled": True,
        "max_draft": 8,
        "max_rows": None,
        "min_match": 2,
        "max_match": 4,
        "history_prompts": 128,
        "history_answers": 8,
        "shadow_every": 16,
    }
    conf = cmd_eval.settings(parse("m", "--workflow", str(on), "--speculative", "off"), err)
    assert conf["speculative"]["enabled"] is False and conf["speculative"]["max_draft"] == 8
    off = _workflow_file(tmp_path, "inference.speculative.max_rows=4")
    conf = cmd_eval.settings(parse("m", "--workflow", str(off), "--speculative", "on"), err)
    assert (conf["speculative"]["enabled"], conf["speculative"]["max_rows"]) == (True, 4)  # its settings kept


def test_speculative_settings_reach_the_engine_and_the_table(tmp_path, monkeypatch, capsys):
    """`run` hands evaluate_model the engine's SpeculativeSettings (None when off), and the table
    shows the engine's tokens per answer per forward (evaluate_model replaced by a recorder)."""
    from areal_graph.engines.inference import offline_eval
    from areal_graph.engines.inference.speculation.speculator import SpeculativeSettings

    seen: list = []

    def recorder(model, data, **kwargs):
        seen.append(kwargs["speculative"])
        out = {
            "prompts": 1,
            "greedy_accuracy": 1.0,
            "greedy_reward_mean": 1.0,
            "skipped_rows": 0,
            "reward_failures": 0,
            "seconds": 1.0,
            "generated_tokens": 4,
            "generation_seconds": 1.0,
            "per_prompt": [],
        }
        if kwargs["speculative"] is not None:
            out["speculative"] = {"steps": 3, "tokens_per_forward": 1.75}
        return out

    monkeypatch.setattr(offline_eval, "evaluate_model", recorder)
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    data = tmp_path / "d.jsonl"
    data.write_text("")
    assert cmd_eval.run(parse(str(model), "--data", str(data))) == 0
    assert seen == [None] and "tokens per answer per forward" not in capsys.readouterr().out
    assert cmd_eval.run(parse(str(model), "--data", str(data), "--speculative", "on")) == 0
    assert seen[-1] == SpeculativeSettings(enabled=True)
    assert re.search(
        r"│ speculative: tokens per answer per forward\s+│\s+1\.75 \(3 verifying steps\) │", capsys.readouterr().out
    )
    workflow = _workflow_file(tmp_path, "inference.speculative.enabled=true", "inference.speculative.max_draft=2")
    assert cmd_eval.run(parse(str(model), "--workflow", str(workflow), "--data", str(data))) == 0
    assert seen[-1] == SpeculativeSettings(enabled=True, max_draft=2)


def test_speculative_eval_gives_the_same_answers_as_plain_decoding(kit, tmp_path):
    """The real engine with speculation on: greedy answers and samples (so pass@k) are the same."""
    results = {}
    for mode in ("off", "on"):
        out = tmp_path / f"{mode}.json"
        args = parse(
            str(kit / "model"),
            "--data",
            str(kit / "test.jsonl"),
            "--limit",
            "3",
            "--max-new-tokens",
            "12",
            "-k",
            "2",
            "--show",
            "0",
            "--speculative",
            mode,
            "--json",
            str(out),
        )
        assert cmd_eval.run(args) == 0
        results[mode] = json.loads(out.read_text())
    assert "speculative" not in results["off"]
    spec = results["on"]["speculative"]
    assert spec["steps"] > 0 and spec["emitted"] >= spec["steps"], spec  # it did verify proposals
    assert results["on"]["per_prompt"] == results["off"]["per_prompt"]
    assert results["on"]["generated_tokens"] == results["off"]["generated_tokens"]


RG = "reasoning_gym:basic_arithmetic?size=8&seed=2"


@pytest.mark.parametrize(
    "data, reward",
    [(RG, "reasoning_gym"), ("builtin:arith/test", "math_verify"), ("textarena:GuessTheNumber-v0", "agent")],
)
def test_without_reward_eval_picks_the_one_that_scores_the_data(data, reward):
    """`eval --data reasoning_gym:...` once scored with math-verify, which reads a number out of
    the row's JSON: 0.0% where the task's own scorer gave 5.0%, without a word."""
    conf = cmd_eval.settings(parse("m", "--data", data), None)
    assert conf["reward"] == reward
    assert conf["reward_why"].startswith("picked for ") and conf["reward_why"].endswith("; --reward to change")


def test_a_reward_that_cannot_score_the_data_is_used_as_told_with_a_warning(capsys):
    from rich.console import Console

    conf = cmd_eval.settings(parse("m", "--data", RG, "--reward", "math_verify"), Console(stderr=True, width=400))
    assert (conf["reward"], conf["reward_why"]) == ("math_verify", "--reward")
    err = capsys.readouterr().err
    assert f"warning: fn: math_verify cannot score --data ({RG})" in err
    assert "use fn: reasoning_gym (scoring with math_verify as told)" in err
    conf = cmd_eval.settings(parse("m", "--data", RG, "--reward", "reasoning_gym"), Console(stderr=True))
    assert conf["reward"] == "reasoning_gym" and capsys.readouterr().err == ""


def test_the_workflow_s_reward_is_named_as_such(tmp_path):
    conf = cmd_eval.settings(parse("m", "--workflow", str(_workflow_file(tmp_path))), None)
    assert (conf["reward"], conf["reward_why"]) == ("math_verify", "the workflow's node 'reward'")


def test_a_rollout_that_raises_is_one_line_with_the_traceback_in_the_log(kit, capsys):
    args = parse(
        str(kit / "model"),
        "--data",
        str(kit / "test.jsonl"),
        "--limit",
        "2",
        "--max-new-tokens",
        "4",
        "--rollout-class",
        "support.failing_rollout:FailingRollout",
    )
    assert cmd_eval.run(args) == 1
    err = capsys.readouterr().err.strip()
    [line] = [x for x in err.splitlines() if x.strip() and "it/s]" not in x]  # transformers' loading bar aside
    assert line.startswith("eval: the rollout class support.failing_rollout:FailingRollout failed: KeyError: ")
    assert "the rubric's answer key" in line and "Traceback" not in err
    log = Path(re.search(r"\(traceback in (\S+\.log)\)$", line).group(1))
    text = log.read_text()
    assert "Traceback (most recent call last)" in text and 'raise KeyError("the rubric' in text
    log.unlink()


def test_an_evaluation_that_succeeds_leaves_no_log_file(tmp_path, monkeypatch):
    path = tmp_path / "eval.log"
    with cmd_eval.logged_to(path):
        import logging

        logging.getLogger("areal_graph.test").info("an episode went fine")
    assert path.is_file()  # what was logged is in the file (run() removes it when nothing failed)
    with pytest.raises(RuntimeError), cmd_eval.logged_to(tmp_path / "failed.log"):
        raise RuntimeError("boom")
    assert "RuntimeError: boom" in (tmp_path / "failed.log").read_text()
