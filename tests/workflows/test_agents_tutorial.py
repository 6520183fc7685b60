"""docs/agents.md runs as written: its Python blocks are executed against a real server.

The tool model (openai_tool_model.py) has learned to answer ADD_QUESTION with an `add` tool
call; the tutorial's calculator code answers that call (an error observation: no
`expression`), so each episode is prompt -> policy turn -> tool turn -> policy turn(s), which
is the layout under test.
"""

from __future__ import annotations

import asyncio
import re
import types

import pytest

from areal_graph.api.episode import Episode, Turn
from areal_graph.api.sampling import SamplingParams
from support.openai_tool_model import ADD_QUESTION, ADD_TURN1, ids
from support.paths import REPO

DOC = REPO / "docs" / "agents.md"
GREEDY = SamplingParams(max_new_tokens=48, temperature=0.0)


def doc_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", DOC.read_text(), re.S)


def doc_module(marker: str) -> types.ModuleType:
    """The tutorial block containing `marker`, executed as a module."""
    (code,) = [b for b in doc_blocks() if marker in b]
    module = types.ModuleType(f"tutorial_{abs(hash(marker))}")
    exec(compile(code, str(DOC), "exec"), module.__dict__)
    return module


class _Prompt:
    def __init__(self, input_ids, answer="5"):
        self.id, self.input_ids, self.answer, self.text = "q1", input_ids, answer, ADD_QUESTION


def _masked_runs(traj) -> list[tuple[int, int]]:
    runs, start = [], None
    for i, m in enumerate(traj.loss_mask + [1]):
        if m == 0 and start is None:
            start = i
        elif m == 1 and start is not None:
            runs.append((start, i))
            start = None
    return runs


def test_the_plain_rollout_api_example_runs_and_masks_the_tool_output(server, model_dirs, tokenizer):
    from areal_graph.engines.inference.client import InferenceClient

    mod = doc_module("class CalcRollout")
    rollout = mod.CalcRollout(str(model_dirs[0]), max_turns=2)

    async def go():
        client = InferenceClient(server)
        try:
            return await rollout.run(_Prompt(ids(tokenizer, ADD_TURN1[0])), client, 2, GREEDY)
        finally:
            await client.close()

    trajs = asyncio.run(go())
    assert [t.sample_id for t in trajs] == [0, 1]
    for t in trajs:
        assert t.info["tool_calls"] == 1
        prompt_run, tool_run = _masked_runs(t)[:2]
        assert prompt_run == (0, len(ids(tokenizer, ADD_TURN1[0])))
        tool_text = tokenizer.decode(t.input_ids[tool_run[0] : tool_run[1]])
        assert tool_text.startswith("\n<|im_start|>tool\nError:") and tool_text.endswith("<|im_start|>assistant\n")
        assert all(v == -1 for v in t.versions[tool_run[0] : tool_run[1]])
        assert all(v == 0 for v, m in zip(t.versions, t.loss_mask) if m)


def test_the_openai_agent_example_records_one_trajectory(server, model_dirs, tokenizer):
    from areal_graph.engines.inference.client import InferenceClient
    from areal_graph.workflows.rollout.openai_agent import AgentPrompt, RecordingOpenAI

    mod = doc_module("async def calculator_agent")
    prompt = AgentPrompt("q1", [{"role": "user", "content": ADD_QUESTION}], "5", ids(tokenizer, ADD_TURN1[0]))

    async def go():
        client = InferenceClient(server)
        recorder = RecordingOpenAI(client, tokenizer, sampling=GREEDY)
        try:
            assert await mod.calculator_agent(recorder, prompt) is None
            return recorder.export_trajectories()
        finally:
            await recorder.close()
            await client.close()

    (traj,) = asyncio.run(go())
    assert traj.info["tool_calls"] >= 1 and traj.info["turns"] >= 2
    text = tokenizer.decode(traj.input_ids)
    assert text.startswith(ADD_TURN1[0]) and '"name": "add"' in text and "<|im_start|>tool\nError:" in text
    tool_at = text.index("<|im_start|>tool")
    n_before = len(tokenizer(text[:tool_at], add_special_tokens=False).input_ids)
    assert traj.loss_mask[n_before] == 0  # the tool message is not trained on


def test_the_episode_reward_example_reads_the_tool_calls():
    mod = doc_module("def answer_with_tool")
    with_tool = Episode(
        "so it is 20126",
        "20126",
        (Turn("prompt", "q"), Turn("assistant", "a"), Turn("environment", "20126"), Turn("assistant", "b")),
    )
    assert mod.answer_with_tool("so it is 20126", "20126", with_tool) == pytest.approx(1.1)
    assert mod.answer_with_tool("so it is 20126", "20126", Episode("x", "20126")) == 1.0
    assert mod.answer_with_tool("no", "20126", with_tool) == 0.0
