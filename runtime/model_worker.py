"""A model hosted in a worker process: the logprob, value and train nodes of one model.

One object per model so that the proximal log-probs (`prox_logprobs`) come from exactly the
weights the train node is about to update, with no transfer in between.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import torch

from areal_graph.data.packed import PackedBatch
from areal_graph.graph.node_kinds import TrainParams
from areal_graph.nodes.train import build_loss_fn
from areal_graph.runtime.train_engine import TrainEngine

log = logging.getLogger(__name__)


class ModelWorker:
    def __init__(self, model_path: str, optim: dict[str, Any] | None = None, total_steps: int = 1,
                 seed: int = 1, threads: int | None = None) -> None:
        if threads:
            torch.set_num_threads(threads)
        torch.manual_seed(seed)
        self.model_path = model_path
        self.trainable = optim is not None
        self.engine = TrainEngine(model_path, **(optim or {}), total_steps=max(total_steps, 1), trainable=self.trainable)
        self.last_stats: dict[str, float] = {}

    def logprob(self, batch: PackedBatch, out_key: str, max_tokens_per_mb: int, temperature: float = 1.0) -> PackedBatch:
        lp = self.engine.compute_logprobs(batch, max_tokens_per_mb=max_tokens_per_mb, temperature=temperature)
        return PackedBatch(batch.cu_seqlens.clone(), {out_key: lp.float()})

    def train(self, batch: PackedBatch, params: dict[str, Any], max_tokens_per_mb: int,
              temperature: float = 1.0) -> PackedBatch:
        if not self.trainable:
            raise RuntimeError("this model has no `train:` section in the workflow; it is frozen")
        loss_fn = build_loss_fn(TrainParams(**params), batch)
        self.last_stats = {k: float(v) for k, v in self.engine.train_step(batch, loss_fn, max_tokens_per_mb=max_tokens_per_mb,
                                                                    temperature=temperature).items()
                           if isinstance(v, (int, float))}
        return PackedBatch(batch.cu_seqlens.clone())

    def train_stats(self) -> dict[str, float]:
        return self.last_stats

    def export_weights(self, path: str, with_tokenizer: bool = False) -> str:
        """HF safetensors; with the tokenizer too when the directory is meant for people (final model)."""
        self.engine.export_hf(Path(path))
        if with_tokenizer:
            from transformers import AutoTokenizer

            AutoTokenizer.from_pretrained(self.model_path).save_pretrained(path)
        return path

    def save_checkpoint(self, path: str) -> str:
        self.engine.save_checkpoint(Path(path))
        return path

    def load_checkpoint(self, path: str) -> str:
        self.engine.load_checkpoint(Path(path))
        return path
