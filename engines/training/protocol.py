"""What a model host drives in a training engine, whatever the backend.

Why a Protocol: the host (runtime/hosts/model_host.py) is written against these methods
alone, so a second backend (Megatron-Core, issue 23) is a class that satisfies them, not an
edit of the host. `TrainEngine` (HF model, AdamW, packed micro-batches) is the one backend
today and `ValueEngine` its critic variant; the `if TYPE_CHECKING` blocks at the end of their
modules make the type checker (tests/test_types.py) hold each class to its Protocol.

The contract every backend keeps (the rest of the engine relies on it):
- batches arrive whole and packed (data/packed.py:PackedBatch); per-token outputs come back
  in the batch's token order, 0 at each sequence's first token (nothing predicts it);
- `train_step` calls `loss_fn` once per forward with that forward's log-probs, entropy and
  micro-batch, sums the returned shares of the batch loss, takes one optimizer step and adds
  one to `version`;
- under data parallelism every rank calls the same methods with the same whole batch.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Protocol

import torch

from areal_graph.data.packed import PackedBatch

# (per-token log-probs, per-token entropy, micro-batch) -> (its share of the batch loss, stats)
LossFn = Callable[[torch.Tensor, torch.Tensor, PackedBatch], "tuple[torch.Tensor, dict[str, float]]"]


class TrainingEngine(Protocol):
    """A trainable (or frozen reference) causal LM on packed batches."""

    version: int  # optimizer steps taken (restored by load_checkpoint)
    total_steps: int  # the lr schedule's horizon, in optimizer steps (the host sets it)
    parallel: str  # how it spans the ranks of its process group: none, ddp or fsdp

    def compute_logprobs(
        self, batch: PackedBatch, max_tokens_per_mb: int = 8192, temperature: float = 1.0
    ) -> torch.Tensor:
        """Per-token log-probs of `batch` under the current weights (no gradient)."""
        ...

    def train_step(
        self, batch: PackedBatch, loss_fn: LossFn, max_tokens_per_mb: int = 8192, temperature: float = 1.0
    ) -> dict[str, float]:
        """One optimizer step over `batch`; the summed stats of `loss_fn` and the step's own
        (loss, grad norm, lr, micro-batch and forward counts)."""
        ...

    def state_dict_for_sync(self, copy: bool = True) -> dict[str, torch.Tensor]:
        """The full weights in HF names and layout, as the inference side loads them."""
        ...

    def export_hf(self, path: str | Path) -> Path:
        """A directory `from_pretrained` loads (the final model)."""
        ...

    def export_adapter(self, path: str | Path) -> Path:
        """LoRA: the adapters alone in peft's layout (servers that load adapters per version)."""
        ...

    def save_checkpoint(self, path: str | Path) -> Path:
        """Weights, optimizer state and version: what `load_checkpoint` resumes from exactly."""
        ...

    def load_checkpoint(self, path: str | Path) -> None: ...


class ValueTrainingEngine(TrainingEngine, Protocol):
    """A critic: the same engine with a scalar value head."""

    def compute_values(self, batch: PackedBatch, max_tokens_per_mb: int = 8192) -> torch.Tensor:
        """Per-token values of `batch` (no gradient)."""
        ...
