"""RecordingProxy: the recording client behind loopback HTTP, driven by the real `openai` package.

What an out-of-process environment (verifiers in its own venv) sees is an OpenAI server; what
is trained must still be exactly what the policy sampled. Against a real inference server with
the tiny model that knows a tool conversation by heart (support/openai_tool_model.py): the same
agent gives over HTTP the trajectory it gives in process, streaming included; the proxy refuses
requests without its token, for an episode that is not running, and bad bodies, as OpenAI's
API does. And the continuation rule under a chat template that re-renders earlier turns (item 5
of issue 34): the trained tokens are the sampled ones, never the template's re-tokenization.
"""

from __future__ import annotations

import asyncio
import copy
import urllib.error
import urllib.request

import openai
import pytest

from areal_graph.api.sampling import SamplingParams
from areal_graph.workflows.rollout.openai_agent import AgentPrompt, RecordingOpenAI
from areal_graph.workflows.rollout.recording_proxy import UNTRAINED, RecordingProxy
from support.openai_tool_model import (
    ADD_QUESTION,
    ADD_TURN1,
    ADD_TURN2,
    HELLO_ANSWER,
    HELLO_QUESTION,
    add_agent,
    add_agent_responses,
    ids,
)

GREEDY = SamplingParams(max_new_tokens=64, temperature=0.0)

# Earlier assistant turns rendered differently from the last one (as templates that drop an
# earlier turn's reasoning do): a conversation's prompt is then not its last prompt + answer.
RERENDERING_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "{% if message['role'] == 'assistant' and not loop.last %}<|im_start|>assistant\n(earlier) "
    "{{ message['content'] }}<|im_end|>\n"
    "{% else %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n{% endif %}"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def with_proxy(url: str, tokenizer, body):
    """Run `body(proxy, recorder, http_client_for)` with a started proxy over a fresh InferenceClient."""
    from areal_graph.engines.inference.client import InferenceClient

    async def run():
        inference = InferenceClient(url)
        proxy = RecordingProxy(untrained_client=lambda: RecordingOpenAI(inference, tokenizer, sampling=GREEDY))
        await proxy.start()
        recorder = RecordingOpenAI(inference, tokenizer, sampling=GREEDY)
        key = proxy.register(recorder)

        def http_client(api_key: str = proxy.api_key, episode: str = key) -> openai.AsyncOpenAI:
            return openai.AsyncOpenAI(base_url=proxy.url(episode), api_key=api_key, max_retries=0)

        try:
            return await body(proxy, recorder, http_client)
        finally:
            await proxy.close()
            await inference.close()

    return asyncio.run(run())


def test_an_agent_over_http_records_what_it_records_in_process(server, tokenizer):
    async def episode(proxy, recorder, http_client):
        client = http_client()
        prompt = AgentPrompt("q1", [{"role": "user", "content": ADD_QUESTION}], "5", ids(tokenizer, ADD_TURN1[0]))
        reward = await add_agent(client, prompt)
        stream = await client.chat.completions.create(
            model="policy", stream=True, messages=[{"role": "user", "content": HELLO_QUESTION}]
        )
        streamed = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
        models = await client.models.list()
        await client.close()
        return reward, recorder.export_trajectories(), recorder.completions_recorded, streamed, models

    reward, trajs, records, streamed, models = with_proxy(server, tokenizer, episode)
    assert reward == 1.0 and streamed == HELLO_ANSWER and [m.id for m in models.data] == ["policy"]
    add, hello = trajs  # the tool episode is one trajectory; the new conversation starts another
    p1, a1 = ids(tokenizer, ADD_TURN1[0]), ids(tokenizer, ADD_TURN1[1])
    tool_part = ids(tokenizer, ADD_TURN2[0])[len(p1) + len(a1) :]
    a2 = ids(tokenizer, ADD_TURN2[1])
    assert add.input_ids == p1 + a1 + tool_part + a2
    assert add.loss_mask == [0] * len(p1) + [1] * len(a1) + [0] * len(tool_part) + [1] * len(a2)
    assert [lp for lp, m in zip(add.behav_logprobs, add.loss_mask) if m] == (
        records[0].output_logprobs + records[1].output_logprobs
    )
    assert (
        tokenizer.decode([t for t, m in zip(hello.input_ids, hello.loss_mask) if m], skip_special_tokens=True)
        == HELLO_ANSWER
    )


def test_a_responses_agent_over_http_records_the_chat_agents_trajectory(server, tokenizer):
    """The Responses API through the proxy (an Agents SDK in another venv): the same tokens as
    the chat agent in process, and a streamed response arrives as OpenAI's typed events."""
    prompt = AgentPrompt("q1", [{"role": "user", "content": ADD_QUESTION}], "5", ids(tokenizer, ADD_TURN1[0]))

    async def episode(proxy, recorder, http_client):
        client = http_client()
        reward = await add_agent_responses(client, prompt)
        stream = await client.responses.create(model="policy", input=HELLO_QUESTION, stream=True)
        events = [e async for e in stream]
        await client.close()
        return reward, recorder.export_trajectories(), events

    async def in_process(proxy, recorder, http_client):
        await add_agent(recorder, prompt)
        return recorder.export_trajectories()

    reward, trajs, events = with_proxy(server, tokenizer, episode)
    [reference] = with_proxy(server, tokenizer, in_process)
    assert reward == 1.0 and trajs[0].input_ids == reference.input_ids and trajs[0].loss_mask == reference.loss_mask
    assert trajs[0].behav_logprobs == pytest.approx(reference.behav_logprobs, abs=1e-5)
    assert events[-1].type == "response.completed" and events[-1].response.output_text == HELLO_ANSWER
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == HELLO_ANSWER


def test_the_proxy_refuses_what_an_openai_server_refuses(server, tokenizer):
    async def calls(proxy, recorder, http_client):
        hello = [{"role": "user", "content": HELLO_QUESTION}]
        outcomes = {}
        for name, client, extra in (
            ("no token", http_client(api_key="guess"), {}),
            ("ended episode", http_client(episode="nope"), {}),
            ("too many choices", http_client(), {"n": 1000}),
        ):
            try:
                await client.chat.completions.create(model="policy", messages=hello, **extra)
                outcomes[name] = None
            except openai.APIStatusError as err:
                outcomes[name] = (err.status_code, str(err))
            await client.close()
        request = urllib.request.Request(
            f"{proxy.url(proxy.register(recorder))}/chat/completions",
            data=b"not json",
            method="POST",
            headers={"Authorization": f"Bearer {proxy.api_key}"},
        )
        try:
            await asyncio.to_thread(urllib.request.urlopen, request)
        except urllib.error.HTTPError as err:
            outcomes["bad body"] = (err.code, err.read().decode())
        untrained = http_client(episode=UNTRAINED)
        answer = await untrained.chat.completions.create(model="policy", messages=hello)
        await untrained.close()
        return outcomes, answer.choices[0].message.content, len(recorder.completions_recorded)

    outcomes, untrained_answer, recorded = with_proxy(server, tokenizer, calls)
    assert outcomes["no token"][0] == 401 and "bearer token" in outcomes["no token"][1]
    assert outcomes["ended episode"][0] == 404 and "'nope'" in outcomes["ended episode"][1]
    assert outcomes["too many choices"][0] == 400 and "n" in outcomes["too many choices"][1]
    assert outcomes["bad body"][0] == 400 and "not JSON" in outcomes["bad body"][1]
    assert untrained_answer == HELLO_ANSWER and recorded == 0  # the untrained seat generates, nothing recorded


def _two_turns(tokenizer, url: str):
    async def episode(proxy, recorder, http_client):
        client = http_client()
        messages = [{"role": "user", "content": HELLO_QUESTION}]
        first = await client.chat.completions.create(model="policy", messages=messages)
        messages += [
            {"role": "assistant", "content": first.choices[0].message.content},
            {"role": "user", "content": HELLO_QUESTION},
        ]
        await client.chat.completions.create(model="policy", messages=messages)
        await client.close()
        return recorder.export_trajectories(), recorder.completions_recorded

    return with_proxy(url, tokenizer, episode)


@pytest.mark.parametrize("template", ["growing prefix", "re-renders earlier turns"])
def test_trained_tokens_are_the_sampled_ones_whatever_the_template_does(server, tokenizer, template):
    """Over the proxy, two turns of one conversation. With a template whose prompts grow by
    appending, one trajectory holds both answers, each as sampled. With one that re-renders the
    earlier answer, the second prompt is the template's text (context), and each answer is still
    trained exactly once, as the ids the policy sampled."""
    tok = copy.deepcopy(tokenizer)
    if template != "growing prefix":
        tok.chat_template = RERENDERING_TEMPLATE
    trajs, records = _two_turns(tok, server)
    sampled = [r.output_ids for r in records]
    trained = [[t for t, m in zip(traj.input_ids, traj.loss_mask) if m] for traj in trajs]
    assert sum(map(len, trained)) == sum(map(len, sampled))  # nothing trained twice, nothing missing
    if template == "growing prefix":
        assert trained == [sampled[0] + sampled[1]]
        assert trajs[0].input_ids[: len(records[1].prompt_ids)] == records[1].prompt_ids
    else:
        assert trained == sampled and len(trajs) == 2
        context = tok.decode([t for t, m in zip(trajs[1].input_ids, trajs[1].loss_mask) if not m])
        assert f"(earlier) {HELLO_ANSWER}" in context
        assert trajs[1].input_ids == records[1].prompt_ids + records[1].output_ids
