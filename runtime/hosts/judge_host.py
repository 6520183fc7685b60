"""Hosts a `judge` node: asks a served model about each trajectory and parses its verdict.

The judge is any OpenAI-compatible chat endpoint (`url`, key from `api_key_env`, read in this
process: the key never travels in the node's arguments), or one of the run's own inference
servers (`url` null; the run's token is the key). Requests go out
concurrently, at most `max_concurrency` at a time, each with `timeout_s`; the node sits on the
generation side of the sample buffer, so a slow judge slows generation only, never the trainer.

Nothing is silently 0: a request that fails (HTTP error, timeout) counts in `failures`, a reply
the rule cannot read in `unparsable` (api/judge.py), both get `on_failure` as their reward and
a warning naming how many; the node's stats carry both counts to the run's metrics.

It runs its own event loop on a thread (the worker calls `score` synchronously), with one
AsyncOpenAI client for the process's life.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
from typing import TYPE_CHECKING, Any

import torch

from areal_graph.api.judge import choose_model, parse_verdict, render
from areal_graph.api.process import run_token
from areal_graph.data.packed import PackedBatch
from areal_graph.engines.inference.backends.base import ADAPTER_PREFIX

log = logging.getLogger(__name__)


class JudgeHost:
    def __init__(
        self,
        policy_tokenizer_path: str,
        base_url: str,
        api_key_env: str | None = None,
        use_run_token: bool = False,
        model: str | None = None,
        template: str = "",
        system: str | None = None,
        verdict: str = "yes_no",
        pattern: str | None = None,
        score_max: float = 10.0,
        max_tokens: int = 32,
        temperature: float = 0.0,
        max_concurrency: int = 8,
        timeout_s: float = 60.0,
        on_failure: float = 0.0,
    ) -> None:
        import openai
        from transformers import AutoTokenizer

        api_key = run_token() if use_run_token else os.environ.get(api_key_env) if api_key_env else None
        if api_key_env and not api_key:
            raise ValueError(
                f"judge: the environment variable {api_key_env} (api_key_env) is not set in the judge's process"
            )

        self.tokenizer = AutoTokenizer.from_pretrained(policy_tokenizer_path)
        self.model, self.template, self.system = model, template, system
        self.own_server = use_run_token
        self.verdict, self.pattern, self.score_max = verdict, pattern, score_max
        self.max_tokens, self.temperature, self.on_failure = max_tokens, temperature, on_failure
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="judge-loop", daemon=True)
        self._thread.start()
        self.client = openai.AsyncOpenAI(base_url=base_url, api_key=api_key or "none", timeout=timeout_s, max_retries=0)
        self._gate = asyncio.run_coroutine_threadsafe(self._make_gate(max_concurrency), self.loop).result()

    @staticmethod
    async def _make_gate(n: int) -> asyncio.Semaphore:
        return asyncio.Semaphore(n)  # created on the loop that awaits it

    def texts(self, batch: PackedBatch) -> list[tuple[str, str]]:
        """(prompt, response) text of each trajectory: the tokens before the first generated
        one, and the generated ones (loss_mask 1)."""
        ids, mask, cu = batch["input_ids"], batch["loss_mask"].bool(), batch.cu_seqlens.tolist()
        out = []
        for a, b in zip(cu[:-1], cu[1:]):
            m = mask[a:b]
            first = int(m.nonzero()[0]) if m.any() else b - a
            out.append(
                (
                    self.tokenizer.decode(ids[a : a + first].tolist(), skip_special_tokens=True).strip(),
                    self.tokenizer.decode(ids[a:b][m].tolist(), skip_special_tokens=True),
                )
            )
        return out

    async def _served_model(self) -> str:
        """`model`, or (none given) the one the endpoint lists, asked per batch: under LoRA adapter
        sync the run's server lists a newer adapter after every sync."""
        if self.model is not None:
            return self.model
        listed = [m.id async for m in self.client.models.list()]
        return choose_model(listed, ADAPTER_PREFIX, self.own_server)

    async def _ask(self, content: str, model: str) -> str:
        messages: list[Any] = ([{"role": "system", "content": self.system}] if self.system else []) + [
            {"role": "user", "content": content}
        ]
        async with self._gate:
            reply = await self.client.chat.completions.create(
                model=model, messages=messages, max_tokens=self.max_tokens, temperature=self.temperature
            )
        return reply.choices[0].message.content or ""

    async def _ask_all(self, contents: list[str]) -> list[Any]:
        import openai

        try:
            model = await self._served_model()
        except openai.OpenAIError as err:  # the endpoint is down: every request of the batch failed
            return [err] * len(contents)
        return await asyncio.gather(*(self._ask(c, model) for c in contents), return_exceptions=True)

    def score(self, batch: PackedBatch, out_key: str = "judge_reward") -> tuple[PackedBatch, dict[str, float]]:
        """`out_key` per sequence; stats: failures, unparsable replies, seconds waited."""
        answers = batch.meta.get("answer") or [""] * batch.num_seqs
        contents = [render(self.template, p, r, str(a)) for (p, r), a in zip(self.texts(batch), answers)]
        t0 = time.perf_counter()
        replies = asyncio.run_coroutine_threadsafe(self._ask_all(contents), self.loop).result()
        rewards, failures, unparsable = [], 0, 0
        for reply in replies:
            if isinstance(reply, BaseException):
                failures += 1
                rewards.append(self.on_failure)
                continue
            value = parse_verdict(reply, self.verdict, self.pattern, self.score_max)
            if value is None:
                unparsable += 1
            rewards.append(self.on_failure if value is None else value)
        if failures or unparsable:
            kinds = sorted({type(r).__name__ for r in replies if isinstance(r, BaseException)})
            log.warning(
                "judge: %d of %d requests failed%s, %d replies unparsable; scored %s",
                failures,
                len(replies),
                f" ({', '.join(kinds)})" if kinds else "",
                unparsable,
                self.on_failure,
            )
        out = PackedBatch(batch.cu_seqlens.clone(), seqs={out_key: torch.tensor(rewards, dtype=torch.float32)})
        return out, {"failures": float(failures), "unparsable": float(unparsable), "seconds": time.perf_counter() - t0}

    def close(self) -> None:
        asyncio.run_coroutine_threadsafe(self.client.close(), self.loop).result(timeout=10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=10)


if TYPE_CHECKING:  # the type checker holds the class to what the owner calls on it (tests/test_types.py)
    from areal_graph.runtime.hosts.protocols import RewardService

    def _serves(host: JudgeHost) -> RewardService:
        return host
