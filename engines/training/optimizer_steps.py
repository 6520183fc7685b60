"""What one optimizer step is around the forwards, for every training backend.

`TrainEngine` (engines/training/train_engine.py) and `MegatronTrainEngine`
(engines/training/megatron/engine.py) differ in how a forward runs and where the weights live,
not in the step around it: the same lr schedule (`lr_factor`, from the base lr and `version`),
gradients cleared, the global norm clipped, a step skipped when that norm is not finite,
`version` + 1, and the same stats keys. `OptimizerSteps` holds that state and behaviour once;
both engines derive from it, so `train_step` in each is only its own forwards between
`_begin_step` and `_take_step` / `_step_stats`.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable

import torch

from areal_graph.data.packed import PackedBatch

log = logging.getLogger(__name__)


def start_step(optimizer: torch.optim.Optimizer, lr: float) -> float:
    """Set this step's learning rate and clear the gradients; returns the rate."""
    for group in optimizer.param_groups:
        group["lr"] = lr
    optimizer.zero_grad(set_to_none=True)
    return lr


def clip_and_step(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    grad_clip: float,
    version: int,
    local: Callable[[torch.Tensor], torch.Tensor] = lambda t: t,
) -> torch.Tensor:
    """Clip the gradients' global norm to `grad_clip` (0: no clipping) and step, unless the norm
    is not finite (then the step is skipped and said so: one bad batch must not poison the
    weights). `local` turns a sharded norm (FSDP's DTensor) into a plain tensor. Returns the norm."""
    params = [p for p in model.parameters() if p.grad is not None]
    grad_norm = local(torch.nn.utils.clip_grad_norm_(params, grad_clip if grad_clip else float("inf")))
    if torch.isfinite(grad_norm):
        optimizer.step()
    else:
        log.warning("non-finite grad norm %s at version %d: step skipped", grad_norm, version)
    return grad_norm


def lr_factor(step: int, warmup_steps: int, total_steps: int, schedule: str) -> float:
    """Multiplier of the base lr at optimizer step `step` (0-based)."""
    if warmup_steps and step < warmup_steps:
        return (step + 1) / warmup_steps
    if schedule == "constant":
        return 1.0
    progress = min(max(step - warmup_steps, 0) / max(total_steps - warmup_steps, 1), 1.0)
    if schedule == "linear":
        return 1.0 - progress
    if schedule == "cosine":
        return 0.5 * (1.0 + math.cos(math.pi * progress))
    raise ValueError(f"unknown lr_schedule {schedule!r} (constant, linear, cosine)")


def adamw(
    model: torch.nn.Module, lr: float, betas: tuple[float, float], weight_decay: float, fused: bool
) -> torch.optim.Optimizer:
    """AdamW, fused where torch has the kernel (CPU and CUDA): one pass over all parameters
    instead of a dozen small ops per tensor (~4x faster on the 1.7M-parameter kit model, same
    values to ~3e-8). FSDP's sharded parameters keep the default implementation."""
    params = [p for p in model.parameters() if p.requires_grad]  # LoRA: the adapters only
    if fused:
        try:
            return torch.optim.AdamW(params, lr=lr, betas=betas, weight_decay=weight_decay, fused=True)
        except (RuntimeError, ValueError) as err:  # a device or dtype without the fused kernel
            log.debug("fused AdamW unavailable (%s): default implementation", err)
    return torch.optim.AdamW(params, lr=lr, betas=betas, weight_decay=weight_decay)


class OptimizerSteps:
    """The optimizer, lr schedule, grad clip and `version` of a training engine.

    A subclass sets `model`, calls `__init__` before it builds its optimizer (None: a frozen
    engine), and runs a step as `_begin_step`, its forwards and backwards, `_take_step`,
    `_step_stats`."""

    model: torch.nn.Module

    def __init__(self, *, lr: float, grad_clip: float, warmup_steps: int, lr_schedule: str, total_steps: int) -> None:
        self.grad_clip = grad_clip
        self.base_lr = lr
        self.warmup_steps = warmup_steps
        self.lr_schedule = lr_schedule
        self.total_steps = total_steps
        self.version = 0
        self.optimizer: torch.optim.Optimizer | None = None

    def _trainable_optimizer(self) -> torch.optim.Optimizer:
        if self.optimizer is None:
            raise RuntimeError("this engine was built with trainable=False")
        return self.optimizer

    def _begin_step(self) -> tuple[float, float]:
        """Refuse a frozen engine, set this step's learning rate, clear the gradients; returns
        (the step's start, `time.perf_counter`; its learning rate)."""
        optimizer = self._trainable_optimizer()
        t0 = time.perf_counter()
        lr = start_step(
            optimizer, self.base_lr * lr_factor(self.version, self.warmup_steps, self.total_steps, self.lr_schedule)
        )
        return t0, lr

    def _take_step(self, local: Callable[[torch.Tensor], torch.Tensor] = lambda t: t) -> torch.Tensor:
        """Clip and step (`clip_and_step`), then `version` + 1; returns the gradient norm."""
        grad_norm = clip_and_step(self.model, self._trainable_optimizer(), self.grad_clip, self.version, local)
        self.version += 1
        return grad_norm

    @staticmethod
    def _step_stats(
        totals: dict[str, float],
        batch: PackedBatch,
        t0: float,
        lr: float,
        loss: float,
        grad_norm: torch.Tensor,
        n_microbatches: int,
        n_forwards: int,
    ) -> dict[str, float]:
        """`totals` (the loss callback's summed stats) with the step's own: what `train_step` returns."""
        elapsed = time.perf_counter() - t0
        totals.update(
            {
                "loss": loss,
                "grad_norm": float(grad_norm),
                "lr": lr,
                "tokens": float(batch.num_tokens),
                "tokens_per_s": batch.num_tokens / max(elapsed, 1e-9),
                "n_microbatches": float(n_microbatches),
                "n_forwards": float(n_forwards),
                "time_s": elapsed,
            }
        )
        return totals
