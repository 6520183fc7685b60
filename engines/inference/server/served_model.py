"""One server's model as the OpenAI-compatible routes see it: text in, engine requests out.

Why an object of its own: the chat and completions routes (`server/chat_routes.py`) and the
Responses routes (`responses_routes.py`) turn checked requests into engine calls by the same
rules (the prompt-size refusal before tokenizing, OpenAI's max_tokens default, constrained
decoding for tools and formats, n seeded choices that a departed client aborts); each holds
this object, so neither routes module reaches into the other.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
from typing import Any

from areal_graph.api.sampling import SamplingParams
from areal_graph.engines.openai import chat_format as fmt
from areal_graph.engines.openai.chat_requests import ChatRequest, OpenAIRequestError, SamplingRequest
from areal_graph.engines.openai.structured_output import added_token_texts, output_constraint

__all__ = ["ServedModel", "CHARS_PER_TOKEN_LIMIT"]

# A prompt of more characters than this per token of context is refused untokenized: text
# averages 3-5 characters a token, and a token of more than 32 is rare in any vocabulary.
CHARS_PER_TOKEN_LIMIT = 32


class ServedModel:
    """The server's engine and tokenizer, and the rules for turning a request into engine calls."""

    def __init__(self, server: Any) -> None:
        self.server = server

    @property
    def model_id(self) -> str:
        """The served model's name in /v1/models (`--served-model-name`, see `default_served_name`)."""
        return str(self.server.served_model_name)

    @property
    def max_prompt_chars(self) -> int:
        limit = getattr(self.server, "max_prompt_chars", None)
        return int(limit) if limit else CHARS_PER_TOKEN_LIMIT * int(self.server.engine.max_context)

    def check_chars(self, n_chars: int, field: str) -> None:
        """Refuse a prompt whose text alone shows it cannot fit, without tokenizing it."""
        if n_chars > self.max_prompt_chars:
            raise OpenAIRequestError(
                f"the prompt has {n_chars} characters, more than this server tokenizes ({self.max_prompt_chars}: "
                f"{CHARS_PER_TOKEN_LIMIT} per token of its {int(self.server.engine.max_context)}-token context; "
                "--max-prompt-chars)",
                field,
                code="context_length_exceeded",
            )

    async def encode(self, text: str, field: str) -> list[int]:
        self.check_chars(len(text), field)
        return await asyncio.to_thread(fmt.encode_text, self.tokenizer(), text)

    @functools.cached_property
    def _token_texts(self) -> dict[str, int]:
        """The served tokenizer's single added tokens (structured_output.added_token_texts), once."""
        return added_token_texts(self.tokenizer())

    def tokenizer(self) -> Any:
        if self.server.tokenizer is None:
            raise OpenAIRequestError(
                "this server has no tokenizer, so it cannot serve text; send token ids to /generate"
            )
        return self.server.tokenizer

    def sampling(self, request: SamplingRequest, prompt_len: int, prompt_field: str) -> SamplingParams:
        """The engine's SamplingParams; max_tokens defaults to what the context leaves (OpenAI's rule).
        `prompt_field` is the request's field an over-long prompt is blamed on."""
        context = int(self.server.engine.max_context)
        if prompt_len >= context:
            raise OpenAIRequestError(
                f"the prompt has {prompt_len} tokens; this model's context is {context}",
                prompt_field,
                code="context_length_exceeded",
            )
        max_new = request.max_tokens if request.max_tokens is not None else context - prompt_len
        if prompt_len + max_new > context:
            raise OpenAIRequestError(
                f"the prompt ({prompt_len} tokens) + max_tokens ({max_new}) exceeds this "
                f"model's context of {context} tokens",
                "max_tokens",
                code="context_length_exceeded",
            )
        temperature = 1.0 if request.temperature is None else request.temperature
        return SamplingParams(
            max_new_tokens=max_new,
            temperature=temperature,
            greedy=temperature == 0,
            top_p=1.0 if request.top_p is None else request.top_p,
            top_k=-1 if request.top_k is None else request.top_k,
            stop=list(request.stop),
            seed=request.seed,
            ignore_eos=request.ignore_eos,
            frequency_penalty=request.frequency_penalty,
            presence_penalty=request.presence_penalty,
            repetition_penalty=request.repetition_penalty,
        )

    async def constrained(self, chat: ChatRequest, params: SamplingParams) -> SamplingParams:
        """`params` holding the answer to what `response_format` / `tool_choice` require
        (`structured_output.py`); a schema the engine cannot compile is a 400 naming the field."""
        wanted = output_constraint(
            chat.tools, chat.tool_choice, chat.parallel_tool_calls, chat.response_format, self._token_texts
        )
        if wanted is None:
            return params
        params = dataclasses.replace(params, json_schema=wanted.json_schema, grammar=wanted.grammar)
        check = getattr(self.server.engine, "check_constraint", None)
        if check is not None:
            problem = await asyncio.to_thread(check, params)
            if problem is not None:
                field = (
                    "response_format" if chat.response_format is not None and chat.tool_choice == "auto" else "tools"
                )
                raise OpenAIRequestError(f"{field}: {problem}", field)
        return params

    async def generate(
        self, prompt_ids: list[int], params: SamplingParams, n: int, top_logprobs: int, rid: str, first_index: int = 0
    ) -> list[fmt.GeneratedChoice]:
        """`n` engine requests for one prompt; a client that goes away aborts all of them."""
        engine = self.server.engine
        rids = [f"{rid}-{first_index + i}" for i in range(n)]
        kwargs = {"top_logprobs": top_logprobs} if top_logprobs else {}

        def choice_params(i: int) -> SamplingParams:
            return params if params.seed is None else dataclasses.replace(params, seed=params.seed + i)

        tasks = [
            asyncio.ensure_future(engine.generate(prompt_ids, choice_params(i), rid=r, **kwargs))
            for i, r in enumerate(rids)
        ]
        try:
            results = await asyncio.gather(*tasks)
        except BaseException:
            for r, t in zip(rids, tasks):
                if not t.done():
                    engine.abort(r)
                    t.cancel()
            raise
        return [
            fmt.GeneratedChoice(
                first_index + i,
                list(res.output_ids),
                list(res.output_logprobs),
                list(res.output_versions),
                res.finish_reason,
                getattr(res, "output_top_logprobs", None),
            )
            for i, res in enumerate(results)
        ]
