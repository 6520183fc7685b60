"""The reward node: decodes each trajectory's generated tokens and scores them.

Hosted in a reward worker. Scoring runs in a process pool with a per-item timeout
(`RewardPool`): a reward function that raises or hangs scores 0, is counted in
`reward_failed`, and never fails the batch.
"""

from __future__ import annotations

import logging

import torch

from areal_graph.data.packed import PackedBatch
from areal_graph.nodes.math_reward import RewardPool

log = logging.getLogger(__name__)


class RewardNode:
    def __init__(self, tokenizer_path: str, fn: str = "math_verify", timeout_s: float = 5.0, num_workers: int = 2) -> None:
        from transformers import AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(tokenizer_path)
        self.pool = RewardPool(fn=fn, timeout_s=timeout_s, num_workers=num_workers)

    def completions(self, batch: PackedBatch) -> list[str]:
        """The text the policy generated in each trajectory (loss_mask == 1 tokens)."""
        if "loss_mask" not in batch or "answer" not in batch:
            raise KeyError("the reward node reads input_ids and loss_mask (to find the answer text) "
                           "and the rollout's implicit `answer`; add loss_mask to its `reads`")
        texts = []
        for i in range(batch.num_seqs):
            ids = batch.sequence(i, "input_ids")
            mask = batch.sequence(i, "loss_mask").bool()
            texts.append(self.tokenizer.decode(ids[mask].tolist(), skip_special_tokens=True))
        return texts

    def score(self, batch: PackedBatch) -> PackedBatch:
        results = self.pool.score(self.completions(batch), batch.meta["answer"])
        failed = [r.status != "ok" for r in results]
        if any(failed):
            log.warning("%d of %d rewards failed (%s); scored 0", sum(failed), len(results),
                        sorted({r.status for r in results if r.status != "ok"}))
        return PackedBatch(
            batch.cu_seqlens.clone(),
            seqs={
                "rewards": torch.tensor([r.reward for r in results], dtype=torch.float32),
                "reward_failed": torch.tensor(failed, dtype=torch.bool),
            },
        )

    def close(self) -> None:
        self.pool.close()
