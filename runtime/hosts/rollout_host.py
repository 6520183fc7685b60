"""Hosts a rollout node: runs its rollout class against the inference servers.

Hosted in the rollout worker process. gRPC calls arrive on server threads and block until their prompt
group is done, so many groups are in flight at once; all of them share one asyncio loop (and
one connection pool) running in a background thread.

A workflow's lagged models (`models.<name>.lagged`) have servers of their own: the host makes
one pool per model and gives them to a rollout class whose constructor takes `served_models`
(their clients track their own versions, so the policy pool's are untouched).
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import threading
from dataclasses import fields
from typing import TYPE_CHECKING, Any

from areal_graph.api.imports import import_object
from areal_graph.api.process import run_token
from areal_graph.api.rollout import Rollout
from areal_graph.api.sampling import SamplingParams
from areal_graph.data.packed import PackedBatch
from areal_graph.engines.inference.client import InferenceClient, ServerPool
from areal_graph.engines.inference.request_tags import enter_group
from areal_graph.workflows.rollout.base import pack_trajectories


def load_rollout_class(path: str) -> type[Rollout]:
    cls = import_object(path, what="rollout_class")
    if not (isinstance(cls, type) and issubclass(cls, Rollout)):
        raise TypeError(f"{path} is not a Rollout subclass")
    return cls


class _PromptView:
    """What a rollout class reads from a prompt (api/rollout.PromptLike, and `question`), as the
    controller's prompt batch carries it."""

    def __init__(self, pid: str, input_ids: list[int], answer: str, text: str = "", question: str = "") -> None:
        self.id, self.input_ids, self.answer, self.text, self.question = pid, input_ids, answer, text, question


class RolloutHost:
    # its calls mostly wait on the inference servers: not compute in the trace's accounting
    span_category = "rollout"

    def __init__(
        self,
        server_urls: list[str],
        backend: str,
        rollout_class: str,
        group_size: int,
        sampling: dict[str, Any],
        rollout_args: dict[str, Any] | None = None,
        tokenizer_path: str | None = None,
        request_timeout_s: float = 600.0,
        lora_adapters: bool = False,
        served_urls: dict[str, list[str]] | None = None,
    ) -> None:
        self.group_size = group_size
        self.sampling = sampling
        cls = load_rollout_class(rollout_class)
        args = dict(rollout_args or {})

        def pool(urls: list[str], adapters: bool) -> ServerPool:
            return ServerPool(
                [
                    InferenceClient(
                        url, backend=backend, timeout=request_timeout_s, api_key=run_token(), lora_adapters=adapters
                    )
                    for url in urls
                ]
            )

        # a lagged copy loads merged weights only (adapters by name: not built, workflow_rules.py)
        self.served = {name: pool(urls, False) for name, urls in (served_urls or {}).items()}
        takes = inspect.signature(cls).parameters
        # Rollouts that decode or encode text (multi-turn agents) get the policy's tokenizer.
        if "tokenizer_path" in takes and "tokenizer_path" not in args:
            args["tokenizer_path"] = tokenizer_path
        if "served_models" in takes and "served_models" not in args:
            args["served_models"] = dict(self.served)
        self.rollout = cls(**args)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="rollout-loop", daemon=True)
        self._thread.start()
        self.pool = pool(server_urls, lora_adapters)

    def _sampling(self, overrides: dict[str, Any] | None) -> SamplingParams:
        known = {f.name for f in fields(SamplingParams)}
        merged = {k: v for k, v in {**self.sampling, **(overrides or {})}.items() if k in known}
        return SamplingParams(**merged)

    def run(self, batch: PackedBatch, group_size: int | None = None, sampling: dict | None = None) -> PackedBatch:
        """Generate `group_size` trajectories for every prompt of `batch`; block until all are done."""
        g = group_size or self.group_size
        params = self._sampling(sampling)
        prompts = [
            _PromptView(
                batch.meta["prompt_id"][i],
                batch.sequence(i, "input_ids").tolist(),
                batch.meta["answer"][i],
                *(batch.meta[k][i] if k in batch.meta else "" for k in ("text", "question")),
            )
            for i in range(batch.num_seqs)
        ]
        group_ids = batch["group_id"].tolist()

        async def one(prompt: _PromptView, gid: int) -> list:
            enter_group(gid)  # its requests carry group, episode and turn in the trace
            return await self.rollout.run(prompt, self.pool, g, params)

        async def _all():
            groups = await asyncio.gather(*(one(p, gid) for p, gid in zip(prompts, group_ids)))
            trajs = []
            for gid, (prompt, group) in enumerate(zip(prompts, groups)):
                for j, t in enumerate(group):
                    t.group_id = group_ids[gid]
                    t.sample_id = group_ids[gid] * g + j
                    t.answer = prompt.answer
                    trajs.append(t)
            return trajs

        trajs = asyncio.run_coroutine_threadsafe(_all(), self._loop).result()
        return pack_trajectories(trajs)

    def close(self) -> None:
        try:
            asyncio.run_coroutine_threadsafe(self.rollout.aclose(), self._loop).result(timeout=30)
        except Exception:  # noqa: BLE001 - shutting down: what it held goes with the process anyway
            logging.getLogger(__name__).warning("rollout %s: aclose failed", type(self.rollout).__name__, exc_info=True)
        for pool in (self.pool, *self.served.values()):
            asyncio.run_coroutine_threadsafe(pool.close(), self._loop).result(timeout=5)
        self._loop.call_soon_threadsafe(self._loop.stop)


if TYPE_CHECKING:  # the type checker holds the class to what the owner calls on it (tests/test_types.py)
    from areal_graph.runtime.hosts.protocols import RolloutService

    def _serves(host: RolloutHost) -> RolloutService:
        return host
