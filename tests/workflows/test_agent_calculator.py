"""The calculator tool and CalculatorAgent: safe evaluation, the Hermes call format, the
multi-turn layout (tool output masked) against a real engine, the packed `tool_calls` key and
its metrics, evaluation through the agent; and (slow) the shipped workflow learning to call."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from areal_graph.api.sampling import SamplingParams
from areal_graph.api.tool_calls import parse_tool_calls, render_tool_call, tool_turn_text
from areal_graph.tools.calculator import CalculatorError, CalculatorLimits, calculate, evaluate_expression
from areal_graph.workflows.rollout.base import pack_trajectories
from areal_graph.workflows.rollout.calculator_agent import CalculatorAgent, answer_call
from support.e2e import read_metrics
from support.paths import REPO

WORKFLOW = REPO / "workflows" / "agent_calculator.yaml"


# ------------------------------------------------------------------------------ the calculator
@pytest.mark.parametrize(
    "expression, value",
    [
        ("347 * 58", "20126"),
        ("347*58 + 61", "20187"),
        ("(2 + 3) * -4", "-20"),
        ("7 / 2", "3.5"),
        ("8 / 2", "4"),
        ("7 // 2", "3"),
        ("-7 % 3", "2"),
        ("2 ** 10", "1024"),
        ("2 ** -1", "0.5"),
        ("1.5 * 4", "6"),
        ("  12  ", "12"),
        ("+3", "3"),
        ("999999 * 999999", "999998000001"),
    ],
)
def test_calculator_evaluates_arithmetic(expression, value):
    assert calculate(expression) == value


@pytest.mark.parametrize(
    "expression, why",
    [
        ("9**9**9", "too large"),  # would take forever and all memory
        ("10**1000", "too large"),
        ("2**256 * 2**256", "too large"),
        ("9" * 90 + " * 2", "too large"),  # an operand past the integer bound
        ("1e308 * 10", "too large"),
        ("(-8) ** 0.5", "complex"),
        ("__import__('os').system('echo hi')", "not allowed"),
        ("x + 1", "not allowed"),
        ("(1).__class__", "not allowed"),
        ("[1, 2][0]", "not allowed"),
        ("abs(-3)", "not allowed"),
        ("1 if 1 else 2", "not allowed"),
        ("1 < 2", "not allowed"),
        ("'a' * 3", "not allowed"),
        ("True + 1", "not allowed"),
        ("1 / 0", "division by zero"),
        ("5 % 0", "division by zero"),
        ("0 ** -1", "division by zero"),
        ("1 << 10", "not supported"),
        ("", "empty"),
        ("1 +", "not a valid expression"),
        ("1" + " + 1" * 100, "longer than"),
        ("(" * 150 + "1" + ")" * 150, "longer than"),
        ("-" * 150 + "1", "more than 64 parts"),
    ],
)
def test_calculator_refuses_hostile_expressions_with_an_error_observation(expression, why):
    t0 = time.perf_counter()
    out = calculate(expression)
    assert out.startswith("Error: ") and why in out, out
    assert time.perf_counter() - t0 < 0.5
    with pytest.raises(CalculatorError):
        evaluate_expression(expression)


def test_calculator_limits_bound_nodes_and_accept_non_strings():
    assert calculate("+".join(["1"] * 40), CalculatorLimits(max_chars=500, max_nodes=64)).startswith("Error: ")
    assert calculate("+".join(["1"] * 20), CalculatorLimits(max_chars=500, max_nodes=64)) == "20"
    assert calculate(None).startswith("Error: ")  # type: ignore[arg-type]
    assert calculate(12).startswith("Error: ")  # type: ignore[arg-type]


# ------------------------------------------------------------------------------ the call format
def test_tool_calls_render_and_parse_in_the_hermes_format():
    text = render_tool_call("calculator", {"expression": "347 * 58"})
    assert text == '<tool_call>\n{"name": "calculator", "arguments": {"expression": "347 * 58"}}\n</tool_call>'
    [call] = parse_tool_calls("thinking... " + text + " trailing")
    assert (call.name, call.arguments, call.error) == ("calculator", {"expression": "347 * 58"}, None)
    openai_style = '<tool_call>{"name": "calculator", "arguments": "{\\"expression\\": \\"1+1\\"}"}</tool_call>'
    assert parse_tool_calls(openai_style)[0].arguments == {"expression": "1+1"}
    assert parse_tool_calls("<tool_call>{not json</tool_call>")[0].error
    assert parse_tool_calls('<tool_call>{"arguments": {}}</tool_call>')[0].error
    assert parse_tool_calls('<tool_call>{"name": "c", "arguments": [1]}</tool_call>')[0].error
    assert parse_tool_calls("<tool_call>{}") == []  # never closed: no call
    assert len(parse_tool_calls(text * 9)) == 4  # bounded per turn
    assert tool_turn_text(["1", "2"]) == (
        "\n<|im_start|>tool\n1<|im_end|>\n<|im_start|>tool\n2<|im_end|>\n<|im_start|>assistant\n"
    )


def test_answer_call_names_what_is_wrong():
    [good] = parse_tool_calls(render_tool_call("calculator", {"expression": "6*7"}))
    assert answer_call(good) == "42"
    [other] = parse_tool_calls(render_tool_call("search", {"q": "x"}))
    assert answer_call(other).startswith("Error: unknown tool 'search'")
    [no_expr] = parse_tool_calls(render_tool_call("calculator", {"expr": "1"}))
    assert answer_call(no_expr).startswith("Error: the calculator needs")
    [hostile] = parse_tool_calls(render_tool_call("calculator", {"expression": "9**9**9"}))
    assert answer_call(hostile) == "Error: number too large"


# ------------------------------------------------------------------------------ against a real engine
@pytest.fixture(scope="module")
def memorised(memorised_calc):
    """A tiny model (hidden 64, 2 layers) fitted to one calculator episode with the kit's
    tokenizer: greedy decoding replays it, so a real engine makes a real tool call
    (tests/support/calc_memorised.py, built once per session and shared with the MCP agent's tests)."""
    return memorised_calc


def _run_agent(model_dir: Path, prompt_ids: list[int], answer: str, group: int, sampling: SamplingParams):
    from areal_graph.engines.inference.engine import EmbeddedEngine
    from areal_graph.engines.inference.rollout_eval import LocalEngineClient

    class Prompt:
        id, text = "q0", ""

    Prompt.input_ids, Prompt.answer = prompt_ids, answer
    agent = CalculatorAgent(str(model_dir))
    engine = EmbeddedEngine(str(model_dir), max_running=8, seed=0)

    async def go():
        return await agent.run(Prompt(), LocalEngineClient(engine), group, sampling)

    with engine:
        return agent, asyncio.run(go())


def test_agent_episode_masks_the_real_tool_output(memorised):
    from areal_graph.data.calc import IGNORE

    root, row, (ids, labels) = memorised
    prompt_len = next(i for i, label in enumerate(labels) if label != IGNORE)
    agent, [traj] = _run_agent(
        root / "model", ids[:prompt_len], row["answer"], 1, SamplingParams(max_new_tokens=48, temperature=0.0)
    )
    tok = agent.tokenizer
    # the engine replayed the memorised episode: the same tokens, and the same mask as SFT's labels
    assert traj.input_ids == ids
    assert traj.loss_mask == [int(label != IGNORE) for label in labels]
    assert traj.info["tool_calls"] == 1 and traj.finish_reason == "stop"
    masked = [t for t, m in zip(traj.input_ids[prompt_len:], traj.loss_mask[prompt_len:]) if not m]
    assert tok.decode(masked) == tool_turn_text([row["answer"]])  # the calculator's real answer, masked
    assert all(v == -1 and lp == 0.0 for v, lp, m in zip(traj.versions, traj.behav_logprobs, traj.loss_mask) if not m)
    assert all(v == 0 and lp <= 0.0 for v, lp, m in zip(traj.versions, traj.behav_logprobs, traj.loss_mask) if m)
    policy = tok.decode([t for t, m in zip(traj.input_ids, traj.loss_mask) if m], skip_special_tokens=True)
    assert policy.startswith("<tool_call>\n") and policy.endswith(f"\\boxed{{{row['answer']}}}.")
    batch = pack_trajectories([traj])
    assert batch["tool_calls"].tolist() == [1] and int(batch["loss_mask"].sum()) == traj.num_generated


def test_agent_group_ends_every_episode_within_the_budget(memorised):
    root, row, (ids, labels) = memorised
    from areal_graph.data.calc import IGNORE

    prompt_len = next(i for i, label in enumerate(labels) if label != IGNORE)
    _, group = _run_agent(
        root / "model", ids[:prompt_len], row["answer"], 6, SamplingParams(max_new_tokens=16, temperature=1.0, seed=3)
    )
    assert len(group) == 6
    for traj in group:
        assert traj.input_ids[:prompt_len] == ids[:prompt_len] and len(traj.input_ids) <= 256
        assert 0 <= traj.info["tool_calls"] <= 3 * 4
        assert traj.finish_reason in ("stop", "length")
    assert pack_trajectories(group)["tool_calls"].tolist() == [t.info["tool_calls"] for t in group]


def test_offline_eval_through_the_agent_scores_the_episode(memorised):
    from areal_graph.engines.inference.offline_eval import evaluate_model
    from areal_graph.engines.inference.rollout_eval import make_rollout

    root, row, _ = memorised
    agent = make_rollout("areal_graph.workflows.rollout.calculator_agent:CalculatorAgent", str(root / "model"))
    result = evaluate_model(root / "model", root / "test.jsonl", max_new_tokens=48, rollout=agent)
    assert result["greedy_accuracy"] == 1.0 and result["greedy_tool_call_rate"] == 1.0
    assert result["per_prompt"][0]["greedy"].endswith(f"\\boxed{{{row['answer']}}}.")
    # without the agent the same model stops after its call: no answer, scored 0
    plain = evaluate_model(root / "model", root / "test.jsonl", max_new_tokens=48)
    assert plain["greedy_accuracy"] == 0.0 and "greedy_tool_call_rate" not in plain
    with pytest.raises(TypeError, match="not a subclass"):
        make_rollout("areal_graph.tools.calculator:CalculatorLimits", str(root / "model"))


def test_eval_command_takes_a_rollout_class(memorised, tmp_path, capsys):
    from areal_graph.cli.main import main

    root, _, _ = memorised
    out = tmp_path / "eval.json"
    agent = "areal_graph.workflows.rollout.calculator_agent:CalculatorAgent"
    assert (
        main(
            [
                "eval",
                str(root / "model"),
                "--data",
                str(root / "test.jsonl"),
                "--max-new-tokens",
                "48",
                "--rollout-class",
                agent,
                "--json",
                str(out),
            ]
        )
        == 0
    )
    result = json.loads(out.read_text())
    assert result["greedy_accuracy"] == 1.0 and result["greedy_tool_call_rate"] == 1.0
    assert "calling a tool" in capsys.readouterr().out
    assert (
        main(["eval", str(root / "model"), "--data", str(root / "test.jsonl"), "--rollout-class", "areal_graph.nope:X"])
        == 2
    )


def test_controller_logs_the_tool_call_rate():
    from areal_graph.api.rollout import Trajectory
    from areal_graph.runtime.orchestration.controller import tool_call_stats

    trajs = [Trajectory([1, 2], [0, 1], [0.0, -1.0], [-1, 0], info={"tool_calls": n}) for n in (0, 2, 1, 0)]
    stats = tool_call_stats(pack_trajectories(trajs), "rollout")
    assert stats == {"rollout/tool_call_rate": 0.5, "rollout/tool_calls_mean": 0.75}
    plain = pack_trajectories([Trajectory([1, 2], [0, 1], [0.0, -1.0], [-1, 0])])
    assert "tool_calls" not in plain and tool_call_stats(plain, "eval") == {}


# ------------------------------------------------------------------------------ the workflow
def test_agent_calculator_workflow_validates():
    env = {**os.environ, "COLUMNS": "200", "NO_COLOR": "1"}
    out = subprocess.run(
        [sys.executable, "-m", "areal_graph.cli.main", "validate", str(WORKFLOW)],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "OK" in out.stdout and "agent_calculator" in out.stdout


def test_agent_calculator_workflow_settings():
    from areal_graph.graph.loader import load_workflow
    from areal_graph.modelkit.builtin import BUILTIN_KITS

    spec = load_workflow(WORKFLOW)
    assert spec.models["actor"].path == "builtin:tiny-calc"
    assert spec.data.train == "builtin:calc/train" and spec.data.eval == "builtin:calc/test"
    rollout = spec.nodes["rollout"].params
    assert rollout.rollout_class.endswith("calculator_agent:CalculatorAgent")
    assert rollout.rollout_args["max_total_tokens"] <= BUILTIN_KITS["tiny-calc"].model.max_position_embeddings
    assert rollout.sampling.max_new_tokens >= BUILTIN_KITS["tiny-calc"].eval_max_new_tokens
    assert list(spec.nodes["reward"].reads) == ["input_ids", "loss_mask"]  # scores the policy's own tokens


# ------------------------------------------------------------------------------ learning (slow)
@pytest.mark.slow
def test_agent_calculator_learns_to_call_the_calculator(tmp_path):
    """The issue's bar: greedy test accuracy (the tool available) rises by >= 15 points within
    10 minutes of `areal-graph run`, and the tool-call rate rises with it."""
    from areal_graph.modelkit.builtin import resolve_model_path

    resolve_model_path("builtin:tiny-calc")  # the one-off kit build is not part of the 10 minutes
    run_dir = tmp_path / "run"
    cmd = [
        sys.executable,
        "-m",
        "areal_graph.cli.main",
        "run",
        str(WORKFLOW),
        "--run-dir",
        str(run_dir),
        "data.eval_size=500",
    ]
    t0 = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900, env={**os.environ, "COLUMNS": "200"})
    wall = time.monotonic() - t0
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    metrics = read_metrics(run_dir)
    evals = [m for m in metrics if "eval/accuracy" in m]
    accs = [m["eval/accuracy"] for m in evals]
    calls = [m["eval/tool_call_rate"] for m in evals]
    assert accs[-1] - accs[0] >= 0.15, accs
    assert calls[-1] - calls[0] >= 0.15, calls
    trained = [m["rollout/tool_call_rate"] for m in metrics if "rollout/tool_call_rate" in m]
    assert sum(trained[-10:]) / 10 > sum(trained[:10]) / 10, trained
    assert wall < 600, f"{wall:.0f} s"
