"""Agents written for the official `openai` package, trained unchanged: the recording client and its rollout.

`RecordingOpenAI` is an `openai.AsyncOpenAI` whose `chat.completions.create`,
`completions.create` and `responses.create` (the Responses API: `openai_responses.py`) never
touch the network (nor does anything else: other endpoints answer 404): they render the request with the model's chat template
(`engines/openai/chat_format.py`), generate through the rollout's own client
(an `InferenceClient` or `ServerPool`) with `generate_interruptible` (a weight update in the
middle of an answer is survived, each token keeps the policy version that produced it), and
return real `openai.types` objects (`ChatCompletion`, `Completion`, `Response`, or an async
iterator of chunks or events for `stream=True`). Every choice is recorded (`openai_recording.py`); after the
episode the workflow sets rewards and calls `export_trajectories()`. The same request rules
as the server's `/v1` routes apply (`engines/openai/chat_requests.py`); a refused request raises
`openai.BadRequestError`, as the real client would.

Sampling during RL belongs to the workflow: its `sampling:` settings are the defaults, and
temperature / top_p / top_k asked by the agent are ignored (with a warning, once) unless
`honor_agent_sampling=True`, since the trainer recomputes log-probs at the workflow's
temperature. max_tokens is capped by the workflow's max_new_tokens; stop strings add up;
with a workflow seed, call k of answer j is seeded as `SamplingParams.for_answer(j, k)`.

`OpenAIAgentRollout` runs `async def agent(client, prompt) -> reward | None` once per answer
of a group, each with its own recording client, and returns one Trajectory per answer.

    async def agent(client: AsyncOpenAI, prompt) -> float:
        messages = list(prompt.messages)
        reply = await client.chat.completions.create(model="policy", messages=messages, tools=TOOLS)
        ...  # run the tool calls, append the results, ask again
        return 1.0 if solved else 0.0
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import inspect
import itertools
import logging
import re
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import openai
from openai._models import construct_type
from openai.pagination import AsyncCursorPage
from openai.resources.chat import AsyncChat
from openai.resources.chat.completions import AsyncCompletions as AsyncChatCompletions
from openai.resources.completions import AsyncCompletions as AsyncTextCompletions
from openai.types import Completion
from openai.types.chat import ChatCompletion, ChatCompletionChunk
from openai.types.responses import ResponseItem

from areal_graph.api.imports import import_object
from areal_graph.api.rollout import PromptLike, Rollout, Trajectory
from areal_graph.api.sampling import SamplingParams
from areal_graph.engines.inference.client import RequestRejected
from areal_graph.engines.inference.interruptible import generate_interruptible
from areal_graph.engines.openai import chat_format as fmt
from areal_graph.engines.openai import responses_format as rfmt
from areal_graph.engines.openai.chat_requests import (
    ChatRequest,
    OpenAIRequestError,
    SamplingRequest,
    parse_chat_request,
    parse_completion_request,
)
from areal_graph.engines.openai.responses_requests import parse_responses_request
from areal_graph.engines.openai.responses_store import ResponseStore, StoredResponse
from areal_graph.engines.openai.structured_output import added_token_texts, output_constraint
from areal_graph.workflows.rollout.openai_recording import CompletionLog, RecordedCompletion, continuation_ids
from areal_graph.workflows.rollout.openai_responses import RecordingResponses, typed_events, typed_response

log = logging.getLogger(__name__)

__all__ = ["RecordingOpenAI", "OpenAIAgentRollout", "AgentPrompt"]

_PER_CALL_OPTIONS = ("extra_headers", "extra_query", "timeout")  # transport options: nothing to transport
_CHOICE_SEED_STRIDE = 1_000_003  # choice i of a call with workflow seeds (turns step +1, answers +1000)


def _http() -> Any:
    """The HTTP library the installed `openai` is built on."""
    try:
        import httpx2 as http
    except ImportError:  # openai releases built on httpx
        import httpx as http  # type: ignore[no-redef]
    return http


def _offline_http_client() -> Any:
    """The recording client's transport: answers every request it is asked to send with a 404 naming it.

    Why: only the two create() calls are recorded; anything else (embeddings, files, ...) must fail
    clearly instead of reaching a network. And it is cheap: the default transport builds an SSL
    context, ~80 ms per client, which one client per episode would pay every time."""
    http = _http()

    def refuse(request: Any) -> Any:
        message = (
            f"RecordingOpenAI records chat.completions.create, completions.create and responses.create only; "
            f"{request.method} {request.url.path} is not available"
        )
        return http.Response(
            404,
            json={"error": {"message": message, "type": "invalid_request_error", "param": None, "code": "not_found"}},
        )

    return http.AsyncClient(transport=http.MockTransport(refuse))


def _bad_request(message: str, param: str | None = None, code: str | None = None) -> openai.BadRequestError:
    """The exception the real client raises for a 400, with OpenAI's error body."""
    http = _http()
    request = http.Request("POST", "http://recording-client.invalid/v1")
    body = {"message": message, "type": "invalid_request_error", "param": param, "code": code}
    return openai.BadRequestError(message, response=http.Response(400, request=request), body=body)


def _given(kwargs: dict[str, Any]) -> dict[str, Any]:
    """The parameters the caller actually set (frameworks pass NOT_GIVEN / omit for the rest)."""
    return {
        k: v
        for k, v in kwargs.items()
        if v is not None and not isinstance(v, (openai.NotGiven, openai.Omit)) and k not in _PER_CALL_OPTIONS
    }


class _ChunkStream:
    """What `create(stream=True)` returns: an async iterator of chunk objects (openai's AsyncStream protocol)."""

    def __init__(self, chunks: list[Any]) -> None:
        self._chunks = iter(chunks)

    def __aiter__(self) -> _ChunkStream:
        return self

    async def __anext__(self) -> Any:
        try:
            return next(self._chunks)
        except StopIteration:
            raise StopAsyncIteration from None

    async def close(self) -> None:
        self._chunks = iter(())

    async def __aenter__(self) -> _ChunkStream:
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()


class _RecordingChatCompletions(AsyncChatCompletions):
    async def create(self, **kwargs: Any) -> Any:  # type: ignore[override]
        """OpenAI's `chat.completions.create`, generated by the policy and recorded."""
        return await self._client._chat(kwargs)  # type: ignore[attr-defined]


class _RecordingChat(AsyncChat):
    @cached_property
    def completions(self) -> _RecordingChatCompletions:  # type: ignore[override]
        return _RecordingChatCompletions(self._client)


class _RecordingTextCompletions(AsyncTextCompletions):
    async def create(self, **kwargs: Any) -> Any:  # type: ignore[override]
        """OpenAI's legacy `completions.create`, generated by the policy and recorded."""
        return await self._client._text(kwargs)  # type: ignore[attr-defined]


class RecordingOpenAI(openai.AsyncOpenAI):
    """A drop-in `AsyncOpenAI` that generates with the policy being trained and records every token."""

    def __init__(
        self,
        client: Any,
        tokenizer: Any,
        *,
        sampling: SamplingParams | None = None,
        answer_index: int = 0,
        model: str = "policy",
        max_total_tokens: int | None = None,
        honor_agent_sampling: bool = False,
        max_interruptions: int = 100,
        **openai_kwargs: Any,
    ) -> None:
        """client: InferenceClient or ServerPool; tokenizer: the policy's (with its chat template).
        max_total_tokens caps prompt + answer of every call (longer prompts raise a 400 with code
        context_length_exceeded, as OpenAI's API does)."""
        openai_kwargs.setdefault("api_key", "recording-client")  # never sent anywhere
        openai_kwargs.setdefault("base_url", "http://recording-client.invalid/v1")
        openai_kwargs.setdefault("http_client", _offline_http_client())  # other endpoints: a clear 404
        openai_kwargs.setdefault("max_retries", 0)
        super().__init__(**openai_kwargs)
        self.inference = client
        self.tokenizer = tokenizer
        self.sampling = sampling or SamplingParams()
        self.answer_index = answer_index
        self.model_name = model
        self.max_total_tokens = max_total_tokens
        self.honor_agent_sampling = honor_agent_sampling
        self.max_interruptions = max_interruptions
        self.log = CompletionLog()
        self.responses_store = ResponseStore(max_responses=256)  # previous_response_id within the episode
        self._turns = itertools.count()
        self._warned: set[str] = set()
        self._stop_ids = {int(t) for t in self.sampling.stop_token_ids}
        if getattr(tokenizer, "eos_token_id", None) is not None:
            self._stop_ids.add(int(tokenizer.eos_token_id))

    @cached_property
    def chat(self) -> _RecordingChat:  # type: ignore[override]
        return _RecordingChat(self)

    @cached_property
    def completions(self) -> _RecordingTextCompletions:  # type: ignore[override]
        return _RecordingTextCompletions(self)

    @cached_property
    def responses(self) -> RecordingResponses:  # type: ignore[override]
        return RecordingResponses(self)

    # ------------------------------------------------------------------ rewards and export
    def set_reward(self, completion: Any, reward: float, choice: int | None = None) -> None:
        """Reward one completion (a ChatCompletion / Completion or its id); all its choices unless `choice`."""
        self.log.set_reward(getattr(completion, "id", completion), reward, choice)

    def set_last_reward(self, reward: float) -> None:
        self.log.set_last_reward(reward)

    def apply_reward_discount(self, turn_discount: float = 1.0) -> None:
        self.log.apply_reward_discount(turn_discount)

    def set_final_reward(self, reward: float, turn_discount: float = 1.0) -> None:
        """The episode's outcome on the last call, discounted back to earlier calls (gamma per call)."""
        self.log.set_last_reward(reward)
        self.log.apply_reward_discount(turn_discount)

    def export_trajectories(self) -> list[Trajectory]:
        return self.log.export_trajectories()

    @property
    def completions_recorded(self) -> list[RecordedCompletion]:
        return self.log.ordered()

    # ------------------------------------------------------------------ generation
    @cached_property
    def _token_texts(self) -> dict[str, int]:
        """The policy tokenizer's single added tokens (structured_output.added_token_texts), once."""
        return added_token_texts(self.tokenizer)

    def _params(self, request: SamplingRequest, prompt_len: int, turn: int) -> SamplingParams:
        """The workflow's sampling, with what the agent may change (see the module docstring)."""
        base = self.sampling
        changes: dict[str, Any] = {}
        for name in ("temperature", "top_p", "top_k"):
            asked = getattr(request, name)
            if asked is None or asked == getattr(base, name):
                continue
            if self.honor_agent_sampling:
                changes[name] = asked
            elif name not in self._warned:
                self._warned.add(name)
                log.warning(
                    "the agent asked for %s=%s; the workflow's %s=%s is used (honor_agent_sampling=False)",
                    name,
                    asked,
                    name,
                    getattr(base, name),
                )
        if "temperature" in changes:
            changes["greedy"] = changes["temperature"] == 0
        budget = base.max_new_tokens if request.max_tokens is None else min(request.max_tokens, base.max_new_tokens)
        if self.max_total_tokens is not None:
            if prompt_len >= self.max_total_tokens:
                raise _bad_request(
                    f"the prompt has {prompt_len} tokens; this rollout allows {self.max_total_tokens} "
                    "tokens per call (max_total_tokens)",
                    "messages",
                    "context_length_exceeded",
                )
            budget = min(budget, self.max_total_tokens - prompt_len)
        changes.update(
            max_new_tokens=budget,
            stop=list(base.stop) + [s for s in request.stop if s not in base.stop],
            ignore_eos=base.ignore_eos or request.ignore_eos,
        )
        params = dataclasses.replace(base, **changes)
        if base.seed is not None:
            return params.for_answer(self.answer_index, turn)
        return dataclasses.replace(params, seed=request.seed)

    async def _generate(
        self, prompt_ids: list[int], params: SamplingParams, n: int, rid: str
    ) -> list[tuple[fmt.GeneratedChoice, int, list[bool]]]:
        # the agent's own seed: choice i gets seed + i, as on the server; the workflow's seeds already
        # step by turn and answer, so its choices step far apart
        stride = _CHOICE_SEED_STRIDE if self.sampling.seed is not None else 1

        def choice_params(i: int) -> SamplingParams:
            if params.seed is None or i == 0:
                return params
            return dataclasses.replace(params, seed=params.seed + i * stride)

        try:
            gens = await asyncio.gather(
                *(
                    generate_interruptible(
                        self.inference,
                        prompt_ids,
                        choice_params(i),
                        rid=f"{rid}-{i}",
                        max_interruptions=self.max_interruptions,
                    )
                    for i in range(n)
                )
            )
        except RequestRejected as err:
            raise _bad_request(f"the inference server refused the request: {err}") from err
        return [
            (
                fmt.GeneratedChoice(i, g.output_ids, g.output_logprobs, g.output_versions, g.finish_reason),
                g.num_interruptions,
                list(g.output_forced),
            )
            for i, g in enumerate(gens)
        ]

    def _chat_prompt_ids(self, messages: list[dict], tools: list[dict]) -> list[int]:
        parent = self.log.chat_parent(messages, tools)
        if parent is not None:
            ids = continuation_ids(self.tokenizer, messages, tools, parent, self._stop_ids)
            if ids is not None:
                return ids
        return fmt.encode_text(self.tokenizer, fmt.render_chat_prompt(self.tokenizer, messages, tools))

    def _body(self, kwargs: dict[str, Any]) -> dict[str, Any]:
        """The request body a create() call stands for: what was given, extra_body over it, a model."""
        body = {**_given(kwargs), **(kwargs.get("extra_body") or {})}
        body.pop("extra_body", None)
        body.setdefault("model", self.model_name)
        return body

    def _chat_prompt(self, request: ChatRequest) -> list[int]:
        if request.top_logprobs:
            raise OpenAIRequestError(
                "top_logprobs is not available through the recording client "
                "(the inference client returns the sampled tokens' log-probs only)",
                "top_logprobs",
            )
        return self._chat_prompt_ids(request.messages, request.tools)

    async def _chat_turn(
        self, request: ChatRequest, prompt_ids: list[int], cid: str
    ) -> tuple[list[fmt.GeneratedChoice], list[dict[str, Any]]]:
        """Generate a chat turn with the policy and record each choice; (choices, their chat JSON)."""
        turn = next(self._turns)
        params = self._params(request, len(prompt_ids), turn)
        wanted = output_constraint(
            request.tools, request.tool_choice, request.parallel_tool_calls, request.response_format, self._token_texts
        )
        if wanted is not None:  # its tokens are recorded as context, never trained (see openai_recording.py)
            params = dataclasses.replace(params, json_schema=wanted.json_schema, grammar=wanted.grammar)
        request.stop = list(params.stop)  # the workflow's stop strings are cut from the text too
        generated = await self._generate(prompt_ids, params, request.n, cid)
        choices = [c for c, _, _ in generated]
        choice_json = [fmt.chat_choice_json(self.tokenizer, c, request) for c in choices]
        for (c, interruptions, forced), cj in zip(generated, choice_json):
            message = {k: v for k, v in cj["message"].items() if k in ("role", "content", "tool_calls")}
            self.log.add(
                RecordedCompletion(
                    cid,
                    c.index,
                    turn,
                    list(prompt_ids),
                    c.output_ids,
                    c.output_logprobs,
                    c.output_versions,
                    c.finish_reason,
                    messages=request.messages,
                    tools=list(request.tools),
                    message=message,
                    text=cj["message"]["content"] or "",
                    tool_calls=len(message.get("tool_calls") or []),
                    interruptions=interruptions,
                    forced=forced,
                )
            )
        return choices, choice_json

    async def _chat(self, kwargs: dict[str, Any]) -> Any:
        try:
            request = parse_chat_request(self._body(kwargs))
            prompt_ids = self._chat_prompt(request)
        except OpenAIRequestError as err:
            raise _bad_request(err.message, err.param, err.code) from None
        cid = f"chatcmpl-{uuid.uuid4().hex}"
        choices, choice_json = await self._chat_turn(request, prompt_ids, cid)
        created = int(time.time())
        if request.stream:
            chunks = fmt.chat_chunks(self.tokenizer, cid, created, request.model, choices, request, len(prompt_ids))
            return _ChunkStream([ChatCompletionChunk.construct(**c) for c in chunks])
        body = fmt.chat_completion_json(
            cid,
            created,
            request.model,
            choice_json,
            prompt_ids,
            sum(len(c.output_ids) for c in choices),
            request.return_token_ids,
        )
        return ChatCompletion.construct(**body)

    async def _responses(self, kwargs: dict[str, Any]) -> Any:
        """`responses.create`: the request as a chat turn (responses_requests.py), recorded like one."""
        try:
            request = parse_responses_request(self._body(kwargs))
            history = self.responses_store.history(request.previous_response_id)
            request.chat.messages = request.conversation(history)
            prompt_ids = self._chat_prompt(request.chat)
        except OpenAIRequestError as err:
            raise _bad_request(err.message, err.param, err.code) from None
        rid = rfmt.new_id("resp")
        [choice], [cj] = await self._chat_turn(request.chat, prompt_ids, rid)
        body = rfmt.turn_response(rid, request, cj, choice.finish_reason, len(prompt_ids), len(choice.output_ids))
        self.responses_store.remember(request, history, body)
        if request.stream:
            top_n = request.chat.top_logprobs if request.include_logprobs else None
            return _ChunkStream(typed_events(rfmt.whole_response_events(self.tokenizer, choice, body, top_n)))
        return typed_response(body)

    def _stored_response(self, response_id: str) -> StoredResponse:
        stored = self.responses_store.get(response_id)
        if stored is None:
            http = _http()
            message = f"no stored response {response_id!r} in this episode's recording client"
            raise openai.NotFoundError(
                message,
                response=http.Response(
                    404, request=http.Request("GET", f"http://recording-client.invalid/v1/responses/{response_id}")
                ),
                body=None,
            )
        return stored

    async def _response_input_items(self, response_id: str, kwargs: dict[str, Any]) -> Any:
        items = list(self._stored_response(response_id).input_items)
        if _given(kwargs).get("order", "desc") == "desc":
            items.reverse()
        data = [construct_type(value=item, type_=ResponseItem) for item in items]
        return AsyncCursorPage.construct(data=data, has_more=False)

    def _text_prompt_ids(self, prompt: str | list[int]) -> tuple[list[int], str | None]:
        if isinstance(prompt, list):
            return list(prompt), None
        parent = self.log.text_parent(prompt, self.tokenizer)
        if parent is not None:
            rest = prompt[len(parent.prompt_text or "") + len(parent.text) :]
            return parent.full_ids + fmt.encode_text(self.tokenizer, rest), prompt
        return fmt.encode_text(self.tokenizer, prompt), prompt

    async def _text(self, kwargs: dict[str, Any]) -> Any:
        try:
            request = parse_completion_request(self._body(kwargs))
        except OpenAIRequestError as err:
            raise _bad_request(err.message, err.param, err.code) from None
        if request.logprobs:
            raise _bad_request(
                "logprobs > 0 (top alternatives) is not available through the recording client; use logprobs=0",
                "logprobs",
            )
        cid, created = f"cmpl-{uuid.uuid4().hex}", int(time.time())
        choices, choice_json, prompt_tokens = [], [], 0
        for k, prompt in enumerate(request.prompts):
            ids, text = self._text_prompt_ids(prompt)
            if not ids:
                raise _bad_request(f"prompt[{k}] encodes to no tokens", "prompt")
            prompt_tokens += len(ids)
            turn = next(self._turns)
            params = self._params(request, len(ids), turn)
            request.stop = list(params.stop)  # the workflow's stop strings are cut from the text too
            for c, interruptions, _ in await self._generate(ids, params, request.n, f"{cid}-p{k}"):
                c.index = k * request.n + c.index
                cj = fmt.completion_choice_json(self.tokenizer, c, request)
                choices.append(c)
                choice_json.append(cj)
                self.log.add(
                    RecordedCompletion(
                        cid,
                        c.index,
                        turn,
                        ids,
                        c.output_ids,
                        c.output_logprobs,
                        c.output_versions,
                        c.finish_reason,
                        prompt_text=text,
                        text=cj["text"],
                        interruptions=interruptions,
                    )
                )
        if request.stream:
            chunks = fmt.completion_chunks(self.tokenizer, cid, created, request.model, choices, request, prompt_tokens)
            return _ChunkStream([Completion.construct(**c) for c in chunks])
        return Completion.construct(
            **fmt.completion_json(
                cid, created, request.model, choice_json, prompt_tokens, sum(len(c.output_ids) for c in choices)
            )
        )


# --------------------------------------------------------------------------- the rollout
@dataclass
class AgentPrompt:
    """What an agent gets for one sample: the conversation so far, and the dataset row's fields."""

    id: str
    messages: list[dict[str, str]]
    answer: str
    input_ids: list[int]

    @property
    def question(self) -> str:
        """The last user message's text (the dataset's question)."""
        users = [m["content"] for m in self.messages if m["role"] == "user"]
        return users[-1] if users else ""


_CHATML = re.compile(r"<\|im_start\|>(\w+)\n(.*?)<\|im_end\|>", re.S)


def prompt_messages(prompt: PromptLike, tokenizer: Any) -> list[dict[str, str]]:
    """The prompt as chat messages: its own `messages` if it has them, else read back from its ChatML
    tokens (the builtin kits and Qwen templates), else one user message holding its decoded text."""
    messages = getattr(prompt, "messages", None)
    if messages:
        return [dict(m) for m in messages]
    text = tokenizer.decode(list(prompt.input_ids), skip_special_tokens=False)
    found = [{"role": role, "content": content} for role, content in _CHATML.findall(text)]
    if found:
        return found
    return [{"role": "user", "content": tokenizer.decode(list(prompt.input_ids), skip_special_tokens=True)}]


def episode_trajectory(trajectories: list[Trajectory]) -> Trajectory | None:
    """What an episode trains: its last trajectory, the one holding the final answer (a group must
    keep its size), with the others counted in `info["dropped_trajectories"]`; None: no call made."""
    if not trajectories:
        return None
    traj = trajectories[-1]
    traj.info["dropped_trajectories"] = len(trajectories) - 1
    return traj


AgentFn = Callable[[openai.AsyncOpenAI, AgentPrompt], Awaitable["float | None"]]


class OpenAIAgentRollout(Rollout):
    """Runs an OpenAI-package agent once per answer; one Trajectory per answer.

    `agent`: "package.module:function" naming `async def agent(client, prompt) -> reward | None`
    (or subclass and override `run_agent`). A returned reward is set on the last call and
    discounted back by `turn_discount` per call; it lands in `info["reward"]` (None: the
    workflow's reward node scores the answer). An episode that leaves several trajectories
    (the agent rewrote its history) contributes its last one, the one holding the final
    answer; `info["dropped_trajectories"]` counts the others (a group must keep its size).
    """

    def __init__(
        self,
        tokenizer_path: str,
        agent: str | None = None,
        turn_discount: float = 1.0,
        max_total_tokens: int | None = None,
        honor_agent_sampling: bool = False,
        max_interruptions: int = 100,
        model: str = "policy",
    ) -> None:
        from transformers import AutoTokenizer

        if not 0.0 <= turn_discount <= 1.0:
            raise ValueError(f"turn_discount must be in [0, 1], got {turn_discount}")
        self.tokenizer = AutoTokenizer.from_pretrained(tokenizer_path)
        self.agent_fn: AgentFn | None = import_object(agent, what="agent") if agent else None
        self.turn_discount = turn_discount
        self.client_args: dict[str, Any] = dict(
            max_total_tokens=max_total_tokens,
            honor_agent_sampling=honor_agent_sampling,
            max_interruptions=max_interruptions,
            model=model,
        )

    @classmethod
    def check_args(cls, rollout_args: dict[str, Any]) -> str | None:
        """`agent` must name an async function taking (client, prompt): checked at validate time."""
        agent = rollout_args.get("agent")
        if agent is None:
            return (
                None
                if cls.run_agent is not OpenAIAgentRollout.run_agent
                else (
                    "rollout_args.agent: name the agent, 'package.module:function' (or subclass and override run_agent)"
                )
            )
        try:
            fn = import_object(str(agent), what="agent")
        except Exception as err:  # noqa: BLE001 - any import failure is the user's to see
            return f"rollout_args.agent: {err}"
        if not inspect.iscoroutinefunction(fn):
            return f"rollout_args.agent: {agent} must be an async function `async def agent(client, prompt)`"
        try:
            inspect.signature(fn).bind(None, None)
        except TypeError as err:
            return (
                f"rollout_args.agent: {agent}{inspect.signature(fn)} cannot be called as agent(client, prompt): {err}"
            )
        return None

    async def run_agent(self, client: openai.AsyncOpenAI, prompt: AgentPrompt) -> float | None:
        """One episode; returns its reward or None. Default: the `agent` function."""
        if self.agent_fn is None:
            raise TypeError(f"{type(self).__name__}: give agent='package.module:function' or override run_agent")
        return await self.agent_fn(client, prompt)

    async def _episode(self, prompt: AgentPrompt, client: Any, sampling: SamplingParams, j: int) -> Trajectory:
        recorder = RecordingOpenAI(client, self.tokenizer, sampling=sampling, answer_index=j, **self.client_args)
        try:
            reward = await self.run_agent(recorder, prompt)
            if reward is not None:
                recorder.set_final_reward(float(reward), turn_discount=self.turn_discount)
            trajectories = recorder.export_trajectories()
        finally:
            await recorder.close()
        traj = episode_trajectory(trajectories)
        if traj is None:
            raise RuntimeError(f"the agent made no completion for prompt {prompt.id!r}: nothing to train on")
        return traj

    async def run(self, prompt: PromptLike, client: Any, group_size: int, sampling: SamplingParams) -> list[Trajectory]:
        if group_size < 1:
            raise ValueError(f"group_size must be >= 1, got {group_size}")
        view = AgentPrompt(
            str(getattr(prompt, "id", "")),
            prompt_messages(prompt, self.tokenizer),
            str(getattr(prompt, "answer", "")),
            [int(t) for t in prompt.input_ids],
        )
        # each episode gets its own copy: an agent may append to prompt.messages
        trajs = await asyncio.gather(
            *(self._episode(copy.deepcopy(view), client, sampling, j) for j in range(group_size))
        )
        for j, t in enumerate(trajs):
            t.sample_id, t.answer = j, view.answer
            t.info["prompt_id"] = view.id
        dropped = sum(t.info["dropped_trajectories"] for t in trajs)
        if dropped:
            log.warning(
                "prompt %s: %d trajectories dropped (agents that rewrote their history); each answer keeps its last",
                view.id,
                dropped,
            )
        return list(trajs)
