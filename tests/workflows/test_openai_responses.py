"""RecordingOpenAI.responses: agents on the Responses API recorded for training, token for token.

Episodes run against a real inference server through the rollout's own InferenceClient, with
the tiny model that knows a tool conversation by heart (`openai_tool_model.py`). The reference
is the same episode on chat completions (`add_agent`): the Responses agent must give the very
same trajectory, whether it sends the history back as items or continues with
`previous_response_id`.
"""

from __future__ import annotations

import json

import openai
import pytest
from openai.types.responses import Response, ResponseCompletedEvent, ResponseFunctionToolCall

from areal_graph.api.sampling import SamplingParams
from areal_graph.workflows.rollout.openai_agent import OpenAIAgentRollout, RecordingOpenAI
from areal_graph.workflows.rollout.openai_responses import RecordingResponses
from support.openai_tool_model import (
    ADD_ANSWER,
    ADD_FUNCTION,
    ADD_QUESTION,
    ADD_TURN1,
    ADD_TURN2,
    HELLO_ANSWER,
    HELLO_QUESTION,
    add_agent,
    add_agent_responses,
    add_prompt,
    ids,
    with_client,
)

GREEDY = SamplingParams(max_new_tokens=64, temperature=0.0)


async def add_agent_previous_id(client, prompt) -> float:
    """The same agent continuing with previous_response_id (only the tool's output is sent)."""
    first = await client.responses.create(
        model="policy", input=list(prompt.messages), tools=[ADD_FUNCTION], instructions=None
    )
    outputs = [
        {
            "type": "function_call_output",
            "call_id": item.call_id,
            "output": str(sum(json.loads(item.arguments).values())),
        }
        for item in first.output
        if item.type == "function_call"
    ]
    final = await client.responses.create(
        model="policy", input=outputs, previous_response_id=first.id, tools=[ADD_FUNCTION]
    )
    return 1.0 if final.output_text == ADD_ANSWER else 0.0


@pytest.mark.parametrize("agent", [add_agent_responses, add_agent_previous_id], ids=["items", "previous_id"])
def test_a_responses_episode_is_the_same_trajectory_as_on_chat(server, tokenizer, agent):
    async def episode(inference, run_agent):
        recorder = RecordingOpenAI(inference, tokenizer, sampling=GREEDY)
        reward = await run_agent(recorder, add_prompt(tokenizer))
        recorder.set_final_reward(reward, turn_discount=0.9)
        return recorder.export_trajectories(), recorder.completions_recorded

    [traj], records = with_client(server, lambda inference: episode(inference, agent))
    [chat_traj], chat_records = with_client(server, lambda inference: episode(inference, add_agent))
    p1, a1 = ids(tokenizer, ADD_TURN1[0]), ids(tokenizer, ADD_TURN1[1])
    tool_part = ids(tokenizer, ADD_TURN2[0])[len(p1) + len(a1) :]
    a2 = ids(tokenizer, ADD_TURN2[1])
    assert traj.input_ids == chat_traj.input_ids == p1 + a1 + tool_part + a2
    assert traj.loss_mask == chat_traj.loss_mask == [0] * len(p1) + [1] * len(a1) + [0] * len(tool_part) + [1] * len(a2)
    assert traj.versions == chat_traj.versions
    assert traj.behav_logprobs == pytest.approx(chat_traj.behav_logprobs, abs=1e-5)
    assert records[1].prompt_ids == p1 + a1 + tool_part  # the continuation: the sampled tokens, not re-tokenized
    assert traj.info["reward"] == 1.0 and traj.info["turn_rewards"] == pytest.approx([0.9, 1.0])
    assert traj.info["turns"] == 2 and traj.info["tool_calls"] == 1
    assert [r.completion_id[:5] for r in records] == ["resp_", "resp_"] and len(chat_records) == 2


def test_responses_objects_streams_and_store_look_like_openai(server, tokenizer):
    async def episode(inference):
        recorder = RecordingOpenAI(inference, tokenizer, sampling=GREEDY)
        assert isinstance(recorder.responses, RecordingResponses)
        r = await recorder.responses.create(
            model="policy", input=HELLO_QUESTION, include=["message.output_text.logprobs"]
        )
        events = [
            e
            async for e in await recorder.responses.create(
                model="policy", input=ADD_QUESTION, tools=[ADD_FUNCTION], stream=True
            )
        ]
        got = await recorder.responses.retrieve(r.id)
        listed = await recorder.responses.input_items.list(r.id)
        await recorder.responses.delete(r.id)
        with pytest.raises(openai.NotFoundError):
            await recorder.responses.retrieve(r.id)
        with pytest.raises(openai.BadRequestError) as refused:
            await recorder.responses.create(model="policy", input="x", tools=[{"type": "web_search"}])
        with pytest.raises(openai.BadRequestError) as missing:
            await recorder.responses.create(model="policy", input="x", previous_response_id="resp_nope")
        return r, events, got, listed, refused.value, missing.value, recorder.completions_recorded

    r, events, got, listed, refused, missing, records = with_client(server, episode)
    assert isinstance(r, Response) and r.output_text == HELLO_ANSWER and r.status == "completed"
    lps = [lp.logprob for lp in r.output[0].content[0].logprobs]
    assert lps == pytest.approx(records[0].output_logprobs, abs=1e-6) and len(lps) == len(records[0].output_ids)
    assert isinstance(events[-1], ResponseCompletedEvent) and [e.sequence_number for e in events] == list(
        range(len(events))
    )
    [call] = events[-1].response.output
    assert isinstance(call, ResponseFunctionToolCall) and json.loads(call.arguments) == {"a": 2, "b": 3}
    assert got.id == r.id and [(i.type, i.role) for i in listed.data] == [("message", "user")]
    assert refused.param == "tools[0]" and missing.code == "previous_response_not_found"
    assert len(records) == 2  # refused calls record nothing


def test_an_agent_on_the_responses_api_runs_in_the_rollout(server, tokenizer, model_dirs):
    class Row:
        id, text, answer = "row-3", "", "5"
        input_ids = ids(tokenizer, ADD_TURN1[0])

    rollout = OpenAIAgentRollout(str(model_dirs[0]), agent="support.openai_tool_model:add_agent_responses")
    trajs = with_client(server, lambda inference: rollout.run(Row(), inference, 2, GREEDY))
    assert [t.input_ids for t in trajs] == [ids(tokenizer, ADD_TURN2[0] + ADD_TURN2[1])] * 2
    assert all(t.info["reward"] == 1.0 and t.info["turns"] == 2 for t in trajs)
