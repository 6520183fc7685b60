"""Multi-turn masking of PythonToolAgent: policy tokens trained on, tool output not.

The generation client here replays scripted policy turns (what a model *would* write), so
the test checks the workflow's bookkeeping and the real sandbox; the engine and its HTTP
client are tested for real in their own tests.
"""

import asyncio

import pytest

from areal_graph.engines.inference.sampling import SamplingParams
from areal_graph.workflows.rollout.base import pack_trajectories
from areal_graph.workflows.rollout.python_tool_agent import PythonToolAgent


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory):
    from areal_graph.modelkit.tokenizer import save_tokenizer, train_tokenizer

    texts = ["<python>print(6*7)</python>", "<output>\n42\n</output>", "The answer is \\boxed{42}."] * 50
    path = tmp_path_factory.mktemp("tok")
    save_tokenizer(train_tokenizer(texts, vocab_size=300), path)
    return path


class ScriptedClient:
    """Returns the next scripted turn for each request, with made-up log-probs and version 3."""

    def __init__(self, tokenizer, turns):
        self.tok, self.turns, self.prompts = tokenizer, list(turns), []

    def abort_epoch(self):
        return 0

    def was_aborted_by_user(self, rid, epoch=None):
        return False

    async def wait_weights_ready(self, timeout=None):
        return None

    async def generate(self, input_ids, params, rid=None):
        from areal_graph.engines.inference.sampling import GenerationResult

        self.prompts.append(list(input_ids))
        ids = self.tok.encode(self.turns.pop(0), add_special_tokens=False)
        return GenerationResult(
            rid=rid,
            output_ids=ids,
            output_logprobs=[-0.5] * len(ids),
            output_versions=[3] * len(ids),
            finish_reason="stop",
            prompt_len=len(input_ids),
        )


def test_tool_output_is_masked_and_really_executed(tokenizer_dir):
    agent = PythonToolAgent(str(tokenizer_dir), max_turns=3)
    tok = agent.tokenizer
    turns = ["<python>print(6*7)</python>", "The answer is \\boxed{42}."]
    client = ScriptedClient(tok, turns)

    class P:
        id, text, answer = "q1", "", "42"
        input_ids = tok.encode("What is 6*7?", add_special_tokens=False)

    [traj] = asyncio.run(agent.run(P(), client, 1, SamplingParams(max_new_tokens=64)))
    turn1 = tok.encode(turns[0], add_special_tokens=False)
    turn2 = tok.encode(turns[1], add_special_tokens=False)
    obs = tok.encode("\n<output>\n42\n</output>\n", add_special_tokens=False)
    p = len(P.input_ids)
    assert traj.input_ids == P.input_ids + turn1 + obs + turn2
    assert traj.loss_mask == [0] * p + [1] * len(turn1) + [0] * len(obs) + [1] * len(turn2)
    assert traj.versions == [-1] * p + [3] * len(turn1) + [-1] * len(obs) + [3] * len(turn2)
    assert traj.behav_logprobs == [0.0] * p + [-0.5] * len(turn1) + [0.0] * len(obs) + [-0.5] * len(turn2)
    # the second turn was conditioned on the real sandbox output
    assert client.prompts[1] == P.input_ids + turn1 + obs
    assert traj.info["tool_calls"] == 1
    packed = pack_trajectories([traj])
    assert int(packed["loss_mask"].sum()) == len(turn1) + len(turn2)


def test_episode_ends_after_max_turns(tokenizer_dir):
    agent = PythonToolAgent(str(tokenizer_dir), max_turns=2)
    client = ScriptedClient(agent.tokenizer, ["<python>print(1)</python>"] * 2)

    class P:
        id, text, answer = "q", "", "1"
        input_ids = [5, 6, 7]

    [traj] = asyncio.run(agent.run(P(), client, 1, SamplingParams(max_new_tokens=16)))
    assert traj.info["tool_calls"] == 2 and len(client.prompts) == 2
