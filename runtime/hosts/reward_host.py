"""Hosts a reward node: decodes each trajectory's generated tokens and scores them.

Hosted in the reward worker process. A reward function that takes an `episode` parameter
also gets the trajectory's turns, tool calls and the rollout's `info` (api/episode.py). Scoring runs in a process pool with a per-item
timeout (`tools/reward_pool.py`): an answer whose reward function raises or hangs scores 0 and
is counted in the node's `failures` stat (the rest of the batch still counts). When every
answer of a call fails, the call fails (`RewardFailed`): the controller retries the prompt
group and, as for a rollout that keeps raising, stops the run when groups keep failing, with
the function's own exception on the console. A reward that is always wrong is a bug to show,
not a zero to train on.
"""

from __future__ import annotations

import json
import logging
from functools import partial
from typing import TYPE_CHECKING

import torch

from areal_graph.api.episode import Episode, episode_from_tokens
from areal_graph.data.packed import PackedBatch
from areal_graph.tools.reward_pool import RewardPool

log = logging.getLogger(__name__)


class RewardFailed(RuntimeError):
    """Every answer of a reward call failed: the message is the function's own error."""


class RewardHost:
    def __init__(
        self, tokenizer_path: str, fn: str = "math_verify", timeout_s: float = 5.0, num_workers: int = 2
    ) -> None:
        from transformers import AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(tokenizer_path)
        self.pool = RewardPool(fn=fn, timeout_s=timeout_s, num_workers=num_workers)

    def completions(self, batch: PackedBatch) -> list[str]:
        """The text the policy generated in each trajectory (loss_mask == 1 tokens)."""
        if "loss_mask" not in batch or "answer" not in batch:
            raise KeyError(
                "the reward node reads input_ids and loss_mask (to find the answer text) "
                "and the rollout's implicit `answer`; add loss_mask to its `reads`"
            )
        ids, mask, cu = batch["input_ids"], batch["loss_mask"].bool(), batch.cu_seqlens.tolist()
        return self.tokenizer.batch_decode(
            [ids[a:b][mask[a:b]].tolist() for a, b in zip(cu[:-1], cu[1:])], skip_special_tokens=True
        )

    def episodes(self, batch: PackedBatch, completions: list[str]) -> list[Episode]:
        """Each trajectory as an Episode: its turns split where loss_mask changes, and its info."""
        ids, mask, cu = batch["input_ids"].tolist(), batch["loss_mask"].tolist(), batch.cu_seqlens.tolist()
        infos = batch.meta.get("info") or ["{}"] * batch.num_seqs
        truncated = batch["seq_no_eos"].tolist() if "seq_no_eos" in batch else [False] * batch.num_seqs
        decode = partial(self.tokenizer.batch_decode, skip_special_tokens=True)
        return [
            episode_from_tokens(
                decode,
                ids[a:b],
                mask[a:b],
                completions[i],
                batch.meta["answer"][i],
                json.loads(infos[i] or "{}"),
                bool(truncated[i]),
            )
            for i, (a, b) in enumerate(zip(cu[:-1], cu[1:]))
        ]

    def score(self, batch: PackedBatch, out_key: str = "rewards") -> tuple[PackedBatch, dict[str, float]]:
        """`out_key` per sequence; stats: how many items failed (scored 0)."""
        completions = self.completions(batch)
        episodes = self.episodes(batch, completions) if self.pool.wants_episode else None
        results = self.pool.score(completions, batch.meta["answer"], episodes)
        failed = [r.status != "ok" for r in results]
        if failed and all(failed):
            first = next(r for r in results if r.status != "ok")
            raise RewardFailed(
                f"reward fn {self.pool.fn!r} failed on all {len(results)} answers ({first.status}): {first.detail}"
            )
        if any(failed):
            log.warning(
                "%d of %d rewards failed (%s); scored 0",
                sum(failed),
                len(results),
                sorted({r.status for r in results if r.status != "ok"}),
            )
        out = PackedBatch(
            batch.cu_seqlens.clone(), seqs={out_key: torch.tensor([r.reward for r in results], dtype=torch.float32)}
        )
        return out, {"failures": float(sum(failed))}

    def close(self) -> None:
        self.pool.close()


if TYPE_CHECKING:  # the type checker holds the class to what the owner calls on it (tests/test_types.py)
    from areal_graph.runtime.hosts.protocols import RewardService

    def _serves(host: RewardHost) -> RewardService:
        return host
