"""Hosts a `reward_model` node: a sequence-classification model that scores whole trajectories.

Any Hugging Face `AutoModelForSequenceClassification` directory: the model reads prompt and
answer together (a trained reward model's input) and its head gives one score per sequence.
It lives in its own worker process (`rm-<node>`), on the generation side of the sample buffer
like the rule reward, so a slow reward model slows generation, never the trainer.

Tokens. When the reward model's tokenizer has the policy's vocabulary, the trajectory's ids go
in as they are; otherwise each trajectory is decoded with the policy's tokenizer and encoded
with the reward model's (`retokenize: auto` decides by comparing vocabularies).

Micro-batches. Sequences go in length order, right-padded, at most `max_tokens_per_mb` padded
tokens a forward; with right padding and the attention mask every score equals the sequence's
score alone (causal attention never reads the padding; HF pools the last non-pad token). A
model without a pad token gets one sequence per forward.

Scores. `output: auto` gives the logit of a one-label head (the usual Bradley-Terry reward
model) and the probability of label 1 for a two-label classifier; `logit`, `sigmoid` and
`prob` ask for one.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import torch

from areal_graph.data.packed import PackedBatch

log = logging.getLogger(__name__)

OUTPUTS = ("auto", "logit", "sigmoid", "prob")


class RewardModelHost:
    def __init__(
        self,
        path: str,
        policy_tokenizer_path: str,
        device: str = "cpu",
        dtype: str = "float32",
        output: str = "auto",
        retokenize: str = "auto",
        threads: int | None = None,
    ) -> None:
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        if output not in OUTPUTS:
            raise ValueError(f"output must be one of {', '.join(OUTPUTS)}, got {output!r}")
        if threads:
            torch.set_num_threads(threads)
        self.device = torch.device(device)
        self.model = AutoModelForSequenceClassification.from_pretrained(path, dtype=getattr(torch, dtype)).to(
            self.device
        )
        self.model.eval()
        labels = int(self.model.config.num_labels)
        self.output = ("logit" if labels == 1 else "prob") if output == "auto" else output
        if self.output == "prob" and labels != 2:
            raise ValueError(f"output 'prob' needs a two-label classifier; {path} has {labels} label(s)")
        if self.output in ("logit", "sigmoid") and labels != 1:
            raise ValueError(f"output {self.output!r} needs a one-label head; {path} has {labels} labels (use prob)")
        self.policy_tokenizer = AutoTokenizer.from_pretrained(policy_tokenizer_path)
        self.tokenizer = AutoTokenizer.from_pretrained(path)
        same = self.tokenizer.get_vocab() == self.policy_tokenizer.get_vocab()
        self.retokenize = {"auto": not same, "always": True, "never": False}[retokenize]
        if retokenize == "never" and not same:
            log.warning(
                "reward model %s: its tokenizer's vocabulary differs from the policy's, but retokenize "
                "is 'never': ids go in unchanged",
                path,
            )
        self.pad_id = self.model.config.pad_token_id

    def sequences(self, batch: PackedBatch) -> list[list[int]]:
        """Each trajectory as the reward model's token ids."""
        ids, cu = batch["input_ids"].tolist(), batch.cu_seqlens.tolist()
        seqs = [ids[a:b] for a, b in zip(cu[:-1], cu[1:])]
        if not self.retokenize:
            return seqs
        texts = self.policy_tokenizer.batch_decode(seqs, skip_special_tokens=False)
        return [self.tokenizer(t, add_special_tokens=False).input_ids for t in texts]

    @torch.no_grad()
    def logits(self, seqs: list[list[int]], max_tokens_per_mb: int) -> tuple[torch.Tensor, int]:
        """The head's output per sequence ([n, num_labels], fp32), in `seqs` order, and the forwards it took."""
        out = torch.zeros(len(seqs), int(self.model.config.num_labels))
        groups = length_groups([len(s) for s in seqs], max_tokens_per_mb if self.pad_id is not None else 0)
        for group in groups:
            width = max(len(seqs[i]) for i in group)
            ids = torch.full((len(group), width), self.pad_id if self.pad_id is not None else 0, dtype=torch.long)
            mask = torch.zeros((len(group), width), dtype=torch.long)
            for row, i in enumerate(group):
                ids[row, : len(seqs[i])] = torch.tensor(seqs[i])
                mask[row, : len(seqs[i])] = 1
            logits = self.model(input_ids=ids.to(self.device), attention_mask=mask.to(self.device)).logits
            out[group] = logits.float().cpu()
        return out, len(groups)

    def score(
        self, batch: PackedBatch, out_key: str = "rm_reward", max_tokens_per_mb: int = 4096
    ) -> tuple[PackedBatch, dict[str, float]]:
        """`out_key` per sequence; stats: the forwards it took and the mean score."""
        seqs = self.sequences(batch)
        logits, forwards = self.logits(seqs, max_tokens_per_mb)
        if self.output == "prob":
            scores = torch.softmax(logits, -1)[:, 1]
        elif self.output == "sigmoid":
            scores = torch.sigmoid(logits[:, 0])
        else:
            scores = logits[:, 0]
        return (
            PackedBatch(batch.cu_seqlens.clone(), seqs={out_key: scores.float()}),
            {"forwards": float(forwards), "mean": float(scores.mean()) if len(seqs) else 0.0},
        )


def length_groups(lengths: list[int], max_tokens: int) -> list[list[int]]:
    """Indices in forwards of similar length: sorted by length, a forward holds sequences while
    its padded size (count x longest) stays within `max_tokens` (a longer sequence goes alone;
    `max_tokens` 0: one sequence each)."""
    order = sorted(range(len(lengths)), key=lambda i: (lengths[i], i))
    groups: list[list[int]] = []
    for i in order:
        if groups and max_tokens > 0 and (len(groups[-1]) + 1) * lengths[i] <= max_tokens:
            groups[-1].append(i)
        else:
            groups.append([i])
    return groups


if TYPE_CHECKING:  # the type checker holds the class to what the owner calls on it (tests/test_types.py)
    from areal_graph.runtime.hosts.protocols import RewardModelService

    def _serves(host: RewardModelHost) -> RewardModelService:
        return host
