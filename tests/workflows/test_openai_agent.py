"""RecordingOpenAI and OpenAIAgentRollout: agents written for the `openai` package, recorded for training.

Episodes run against a real inference server (a subprocess with the embedded engine) through
the rollout's own InferenceClient, with the tiny model that knows a tool conversation by heart
(`openai_tool_model.py`). The trajectory checks compare with the conversation written out by
hand; the interruption test swaps the server's weights in the middle of an answer.
"""

from __future__ import annotations

import asyncio
import json
import urllib.request

import openai
import pytest
from openai.types import Completion
from openai.types.chat import ChatCompletion, ChatCompletionChunk

from areal_graph.api.sampling import SamplingParams
from areal_graph.engines.openai.chat_requests import ChatRequest
from areal_graph.workflows.rollout.openai_agent import OpenAIAgentRollout, RecordingOpenAI
from areal_graph.workflows.rollout.openai_recording import CompletionLog, RecordedCompletion
from support.openai_tool_model import (
    ADD_ANSWER,
    ADD_QUESTION,
    ADD_TOOL,
    ADD_TURN1,
    ADD_TURN2,
    HELLO_ANSWER,
    HELLO_QUESTION,
    add_agent,
    add_prompt,
    ids,
    with_client,
)

GREEDY = SamplingParams(max_new_tokens=64, temperature=0.0)


# --------------------------------------------------------------------------- one episode
def test_two_turn_tool_episode_is_one_trajectory(server, tokenizer):
    async def episode(inference):
        recorder = RecordingOpenAI(inference, tokenizer, sampling=GREEDY)
        assert isinstance(recorder, openai.AsyncOpenAI)
        reward = await add_agent(recorder, add_prompt(tokenizer))
        recorder.set_final_reward(reward, turn_discount=0.9)
        generated = await inference.generate(ids(tokenizer, ADD_TURN2[0]), GREEDY)
        return recorder.export_trajectories(), recorder.completions_recorded, generated

    [traj], records, reference = with_client(server, episode)
    p1, a1 = ids(tokenizer, ADD_TURN1[0]), ids(tokenizer, ADD_TURN1[1])
    tool_part = ids(tokenizer, ADD_TURN2[0])[len(p1) + len(a1) :]
    a2 = ids(tokenizer, ADD_TURN2[1])
    assert traj.input_ids == ids(tokenizer, ADD_TURN2[0] + ADD_TURN2[1]) == p1 + a1 + tool_part + a2
    assert traj.loss_mask == [0] * len(p1) + [1] * len(a1) + [0] * len(tool_part) + [1] * len(a2)
    v = records[0].output_versions[0]  # the server's weight version (no update during this episode)
    assert traj.versions == [-1] * len(p1) + [v] * len(a1) + [-1] * len(tool_part) + [v] * len(a2)
    policy = [lp for lp, m in zip(traj.behav_logprobs, traj.loss_mask) if m]
    assert all(lp == 0.0 for lp, m in zip(traj.behav_logprobs, traj.loss_mask) if not m)
    assert policy == records[0].output_logprobs + records[1].output_logprobs
    assert all(lp < 0.0 for lp in policy)
    # the second turn's behaviour log-probs are what /generate reports for that exact prompt
    assert records[1].output_ids == reference.output_ids
    assert records[1].output_logprobs == pytest.approx(reference.output_logprobs, abs=1e-5)
    assert traj.finish_reason == "stop"
    assert traj.info["turns"] == 2 and traj.info["tool_calls"] == 1
    assert traj.info["reward"] == 1.0 and traj.info["turn_rewards"] == pytest.approx([0.9, 1.0])
    assert traj.info["completion_ids"] == [r.completion_id for r in records]


def test_a_forced_tool_calls_forced_tokens_are_context_and_its_chosen_ones_trained(server, tokenizer):
    """tool_choice naming the function: the call is drawn under a grammar. The tokens it left as
    the only choice (the tags, the name, the keys) are context (loss mask 0); the arguments the
    model chose are trained with their masked-distribution log-probs; so is the free answer after
    the tool's result."""

    async def episode(inference):
        recorder = RecordingOpenAI(inference, tokenizer, sampling=GREEDY)
        messages = [{"role": "user", "content": ADD_QUESTION}]
        first = await recorder.chat.completions.create(
            model="m",
            messages=messages,
            tools=[ADD_TOOL],
            tool_choice={"type": "function", "function": {"name": "add"}},
        )
        call = first.choices[0].message.tool_calls[0]
        messages += [
            first.choices[0].message.model_dump(exclude_none=True),
            {"role": "tool", "tool_call_id": call.id, "content": "5"},
        ]
        second = await recorder.chat.completions.create(model="m", messages=messages, tools=[ADD_TOOL])
        return first, second, recorder.export_trajectories(), recorder.completions_recorded

    first, second, [traj], records = with_client(server, episode)
    assert json.loads(first.choices[0].message.tool_calls[0].function.arguments) == {"a": 2, "b": 3}
    assert second.choices[0].message.content == ADD_ANSWER
    call, forced = records[0].output_ids, records[0].forced
    assert len(forced) == len(call) and any(forced) and not all(forced) and not any(records[1].forced)
    chosen = [t for t, f in zip(call, forced) if not f]
    chosen_text, forced_text = tokenizer.decode(chosen), tokenizer.decode([t for t, f in zip(call, forced) if f])
    assert "2" in chosen_text and "3" in chosen_text  # the argument values were the model's choice
    assert "<tool_call>" in forced_text and "add" in forced_text and "add" not in chosen_text
    p1, a2 = ids(tokenizer, ADD_TURN1[0]), ids(tokenizer, ADD_TURN2[1])
    trained = [t for t, m in zip(traj.input_ids, traj.loss_mask) if m]
    assert trained == chosen + a2 and traj.input_ids[-len(a2) :] == a2
    assert traj.input_ids[len(p1) : len(p1) + len(call)] == call
    assert all(v == -1 for v, m in zip(traj.versions, traj.loss_mask) if not m)


def test_rewritten_history_gives_separate_trajectories_with_discounted_rewards(server, tokenizer):
    async def episode(inference):
        recorder = RecordingOpenAI(inference, tokenizer, sampling=GREEDY)
        first = await recorder.chat.completions.create(
            model="m", messages=[{"role": "user", "content": ADD_QUESTION}], tools=[ADD_TOOL]
        )
        # the agent forgets the call and starts over with another question
        second = await recorder.chat.completions.create(
            model="m", messages=[{"role": "user", "content": HELLO_QUESTION}]
        )
        recorder.set_final_reward(1.0, turn_discount=0.5)
        return first, second, recorder.export_trajectories()

    first, second, trajs = with_client(server, episode)
    assert isinstance(first, ChatCompletion) and first.choices[0].finish_reason == "tool_calls"
    assert second.choices[0].message.content == HELLO_ANSWER
    assert [t.info["turns"] for t in trajs] == [1, 1]
    assert [t.info["reward"] for t in trajs] == [0.5, 1.0]
    assert [t.info["tool_calls"] for t in trajs] == [1, 0]
    assert trajs[1].input_ids[: sum(1 for m in trajs[1].loss_mask if not m)] == ids(
        tokenizer, f"<|bos|><|im_start|>user\n{HELLO_QUESTION}<|im_end|>\n<|im_start|>assistant\n"
    )


@pytest.mark.parametrize("pause_mode", ["in_place", "abort"])
def test_weight_update_mid_answer_is_survived_and_versions_change_inside_it(server, model_dirs, tokenizer, pause_mode):
    """The embedded way (the engine pauses, swaps, re-prefills) and SGLang's (in-flight requests come
    back aborted and are resubmitted with the tokens so far): the answer is whole, its first tokens
    carry the version before the update, its last tokens the version after."""
    budget = 300

    base = int(json.loads(urllib.request.urlopen(server + "/get_weight_version", timeout=10).read())["weight_version"])

    async def episode(inference):
        recorder = RecordingOpenAI(inference, tokenizer, sampling=SamplingParams(max_new_tokens=budget, seed=5))
        task = asyncio.ensure_future(
            recorder.chat.completions.create(
                model="m", messages=[{"role": "user", "content": "Count forever."}], extra_body={"ignore_eos": True}
            )
        )
        await _wait_for_tokens(server, 20)
        if pause_mode == "in_place":
            await inference.update_weights_from_disk(str(model_dirs[1]), base + 1)
        else:
            for path, body in [
                ("/pause_generation", {"mode": "abort"}),
                ("/update_weights_from_disk", {"model_path": str(model_dirs[1]), "weight_version": str(base + 1)}),
                ("/continue_generation", {}),
            ]:
                await asyncio.to_thread(_post, server, path, body)
        reply = await task
        await inference.update_weights_from_disk(str(model_dirs[0]), base + 2)  # back to the model the others expect
        return reply, recorder.export_trajectories(), recorder.completions_recorded[0]

    reply, [traj], record = with_client(server, episode)
    versions = record.output_versions
    assert len(record.output_ids) == budget and reply.choices[0].finish_reason == "length"
    assert versions[0] == base and versions[-1] == base + 1 and versions == sorted(versions)
    assert 0 < versions.index(base + 1) < budget
    assert [v for v, m in zip(traj.versions, traj.loss_mask) if m] == versions
    assert traj.info["interruptions"] == (1 if pause_mode == "abort" else 0)


async def _wait_for_tokens(url: str, at_least: int, timeout: float = 60.0) -> None:
    """Until the server has generated `at_least` more tokens than when called."""
    start = _tokens_generated(url)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while await asyncio.to_thread(_tokens_generated, url) < start + at_least:
        assert loop.time() < deadline, "the server generated nothing"
        await asyncio.sleep(0.005)


def _tokens_generated(url: str) -> int:
    with urllib.request.urlopen(url + "/get_server_info", timeout=10) as resp:
        return int(json.loads(resp.read())["internal_states"][0]["tokens_generated"])


def _post(url: str, path: str, body: dict) -> dict:
    req = urllib.request.Request(
        url + path, data=json.dumps(body).encode(), method="POST", headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=60) as resp:
        return json.loads(resp.read())


# --------------------------------------------------------------------------- the client's surface
def test_streaming_text_completions_and_refusals_look_like_openai(server, tokenizer):
    async def calls(inference):
        recorder = RecordingOpenAI(inference, tokenizer, sampling=GREEDY)
        stream = await recorder.chat.completions.create(
            model="m", messages=[{"role": "user", "content": HELLO_QUESTION}], stream=True
        )
        chunks = [c async for c in stream]
        text = await recorder.completions.create(model="m", prompt=ADD_TURN2[0], max_tokens=20)
        refused = []
        for kwargs in (dict(n=99), dict(logprobs=True, top_logprobs=2), dict(tool_choice="required")):
            try:
                await recorder.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}], **kwargs)
            except openai.BadRequestError as err:
                refused.append((err.status_code, err.body["param"]))
        with pytest.raises(
            openai.NotFoundError, match="records chat.completions.create, completions.create and responses.create only"
        ):
            await recorder.embeddings.create(model="m", input="x")
        return chunks, text, refused, recorder.export_trajectories()

    chunks, text, refused, trajs = with_client(server, calls)
    assert all(isinstance(c, ChatCompletionChunk) for c in chunks)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == HELLO_ANSWER
    assert isinstance(text, Completion) and text.choices[0].text == ADD_ANSWER
    assert refused == [(400, "n"), (400, "top_logprobs"), (400, "tool_choice")]
    assert [t.info["turns"] for t in trajs] == [1, 1]  # refused calls record nothing


def test_workflow_sampling_wins_unless_the_agent_is_honoured(tokenizer):
    base = SamplingParams(temperature=1.0, max_new_tokens=50, seed=11, stop=["!"])
    asked = ChatRequest(temperature=0.2, max_tokens=80, stop=["?"], seed=99)
    params = RecordingOpenAI(None, tokenizer, sampling=base, answer_index=2)._params(asked, 10, 3)
    assert (params.temperature, params.max_new_tokens, params.stop, params.seed) == (1.0, 50, ["!", "?"], 11 + 2003)
    honoured = RecordingOpenAI(None, tokenizer, sampling=base, honor_agent_sampling=True, max_total_tokens=40)._params(
        asked, 10, 0
    )
    assert (honoured.temperature, honoured.max_new_tokens) == (0.2, 30)
    with pytest.raises(openai.BadRequestError, match="max_total_tokens"):
        RecordingOpenAI(None, tokenizer, sampling=base, max_total_tokens=10)._params(asked, 10, 0)


# --------------------------------------------------------------------------- the rollout
def test_openai_agent_rollout_runs_an_unchanged_agent(server, tokenizer, model_dirs):
    from areal_graph.workflows.rollout.base import pack_trajectories

    class Row:  # what the rollout host hands a rollout class: ids only, no text
        id, text, answer = "row-7", "", "5"
        input_ids = ids(tokenizer, ADD_TURN1[0])

    rollout = OpenAIAgentRollout(str(model_dirs[0]), agent="support.openai_tool_model:add_agent", turn_discount=0.5)
    trajs = with_client(server, lambda inference: rollout.run(Row(), inference, 3, GREEDY))
    assert [t.sample_id for t in trajs] == [0, 1, 2]
    for t in trajs:
        assert t.input_ids == ids(tokenizer, ADD_TURN2[0] + ADD_TURN2[1])
        assert t.input_ids[: len(Row.input_ids)] == Row.input_ids  # the agent's first prompt is the dataset's
        assert t.info["reward"] == 1.0 and t.info["turn_rewards"] == [0.5, 1.0]
        assert (t.info["turns"], t.info["tool_calls"], t.info["dropped_trajectories"]) == (2, 1, 0)
        assert t.answer == "5" and t.info["prompt_id"] == "row-7"
    batch = pack_trajectories(trajs)
    assert batch["tool_calls"].tolist() == [1, 1, 1] and batch.num_seqs == 3


def test_rollout_without_an_agent_says_so(model_dirs):
    with pytest.raises(ValueError, match="package.module"):
        OpenAIAgentRollout(str(model_dirs[0]), agent="no_colon_here")
    rollout = OpenAIAgentRollout(str(model_dirs[0]))
    with pytest.raises(TypeError, match="override run_agent"):
        asyncio.run(rollout.run_agent(None, None))


# --------------------------------------------------------------------------- the log, without a server
def _record(turn: int, prompt: list[int], output: list[int], choice: int = 0) -> RecordedCompletion:
    return RecordedCompletion(
        f"c{turn}", choice, turn, prompt, output, [-0.5] * len(output), [turn] * len(output), "stop"
    )


def test_branches_are_never_trained_twice_and_discount_is_per_call():
    log = CompletionLog()
    log.add(_record(0, [1, 2], [3, 4]))
    log.add(_record(1, [1, 2, 3, 4, 5], [6]))  # continues call 0
    log.add(_record(2, [1, 2, 3, 4, 7], [8]))  # a second continuation of call 0: a branch
    log.add(_record(3, [1, 2, 3, 4, 5, 6, 9], [10]))  # continues call 1
    log.add(_record(4, [1, 2, 3, 4, 7, 8, 11], [12], choice=0))  # continues the branch; two choices
    log.add(_record(4, [1, 2, 3, 4, 7, 8, 11], [13], choice=1))  # (its sibling: a branch again)
    trajs = log.export_trajectories()
    assert [t.info["completion_ids"] for t in trajs] == [["c0", "c1", "c3"], ["c2", "c4"], ["c4:1"]]
    assert trajs[0].input_ids == [1, 2, 3, 4, 5, 6, 9, 10]
    assert trajs[0].loss_mask == [0, 0, 1, 1, 0, 1, 0, 1]
    assert trajs[1].loss_mask == [0, 0, 0, 0, 0, 1, 0, 1]  # the shared prefix is context here
    assert trajs[1].versions == [-1, -1, -1, -1, -1, 2, -1, 4]
    assert sum(sum(t.loss_mask) for t in trajs) == sum(len(r.output_ids) for r in log.records)
    log.set_reward("c4", 2.0, choice=1)
    log.set_reward("c4", 1.0, choice=0)
    log.apply_reward_discount(0.5)
    log.apply_reward_discount(0.5)  # recomputed, not discounted twice
    rewards = {r.key: r.final_reward for r in log.records}
    assert rewards["c4"] == 1.0 and rewards["c4:1"] == 2.0
    assert rewards["c3"] == pytest.approx(0.75) and rewards["c2"] == pytest.approx(0.375)
    assert rewards["c1"] == pytest.approx(0.1875) and rewards["c0"] == pytest.approx(0.09375)  # 1.5 * 0.5 ** k
    with pytest.raises(KeyError, match="nope"):
        log.set_reward("nope", 1.0)
    with pytest.raises(ValueError, match="turn_discount"):
        log.apply_reward_discount(1.5)
