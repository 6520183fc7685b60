"""The training engine: a HF CausalLM trained on packed batches, with no padding.

Sequences of a micro-batch are packed into a few rows of at most `row_tokens` tokens
(ENVIRONMENT.md: 16 rows of 512 train ~4x faster on CPU than one 8192-token row), with
`position_ids` restarting at every sequence and `use_cache=False`; transformers then keeps
attention inside each sequence (tests/test_train_engine.py proves it against running each
sequence alone). Short rows are padded at their *end*, which causal attention never lets
real tokens see.

`train_step` sums the loss callback over the planner's micro-batches: the callback returns
each micro-batch's share of the batch loss (normalised with batch-level totals), so the
update does not depend on how the batch was split.
"""

from __future__ import annotations

import logging
import math
import os
import shutil
import time
from pathlib import Path
from typing import Callable

import torch

from areal_graph.data.packed import PackedBatch
from areal_graph.runtime.microbatch_planner import plan_microbatches

log = logging.getLogger(__name__)

LossFn = Callable[[torch.Tensor, torch.Tensor, PackedBatch], "tuple[torch.Tensor, dict[str, float]]"]


def pack_rows(seqlens: list[int], row_tokens: int) -> list[list[int]]:
    """Sequence indices per row, first-fit decreasing; a sequence longer than a row gets its own."""
    rows: list[list[int]] = []
    loads: list[int] = []
    for i in sorted(range(len(seqlens)), key=lambda i: -seqlens[i]):
        for r, load in enumerate(loads):
            if load + seqlens[i] <= row_tokens:
                rows[r].append(i)
                loads[r] += seqlens[i]
                break
        else:
            rows.append([i])
            loads.append(seqlens[i])
    return rows


def packed_logprobs(model: torch.nn.Module, batch: PackedBatch, row_tokens: int = 1024,
                    with_entropy: bool = False, temperature: float = 1.0,
                    ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Per-token log-probs (and entropy) of `batch["input_ids"]`, aligned per data/packed.py.

    Position t holds log p(token t | tokens < t); the first token of every sequence holds 0.
    """
    device = next(model.parameters()).device
    ids = batch["input_ids"].to(device)
    cu = batch.cu_seqlens.tolist()
    lens = [cu[i + 1] - cu[i] for i in range(batch.num_seqs)]
    out_lp = torch.zeros(batch.num_tokens, device=device, dtype=torch.float32)
    out_ent = torch.zeros(batch.num_tokens, device=device, dtype=torch.float32) if with_entropy else None
    if batch.num_tokens == 0:
        return out_lp, out_ent
    rows = pack_rows(lens, row_tokens)
    width = max(sum(lens[i] for i in row) for row in rows)
    input_ids = torch.zeros(len(rows), width, dtype=torch.long, device=device)
    position_ids = torch.zeros(len(rows), width, dtype=torch.long, device=device)
    # (row, column) of each packed token, for scattering results back in batch order
    src_row, src_col, dst = [], [], []
    for r, row in enumerate(rows):
        col = 0
        for i in row:
            n = lens[i]
            input_ids[r, col:col + n] = ids[cu[i]:cu[i] + n]
            position_ids[r, col:col + n] = torch.arange(n, device=device)
            src_row.append(torch.full((n - 1,), r, dtype=torch.long))
            src_col.append(torch.arange(col, col + n - 1))
            dst.append(torch.arange(cu[i] + 1, cu[i] + n))
            col += n
        if col < width:  # padding at the end of a row: its own "sequence", never attended to
            position_ids[r, col:] = torch.arange(width - col, device=device)
    logits = model(input_ids=input_ids, position_ids=position_ids, use_cache=False).logits.float()
    if temperature != 1.0:
        logits = logits / temperature
    rr = torch.cat(src_row).to(device)
    cc = torch.cat(src_col).to(device)
    dd = torch.cat(dst).to(device)
    pred = logits[rr, cc]  # logits that predict the next token
    logp_all = torch.log_softmax(pred, dim=-1)
    out_lp = out_lp.index_put((dd,), logp_all.gather(-1, ids[dd].unsqueeze(-1)).squeeze(-1))
    if with_entropy:
        ent = -(logp_all.exp() * logp_all).sum(-1)
        out_ent = out_ent.index_put((dd,), ent)
    return out_lp, out_ent


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


class TrainEngine:
    def __init__(self, model: str | Path | torch.nn.Module, *, lr: float = 2e-5, weight_decay: float = 0.0,
                 grad_clip: float = 1.0, betas: tuple[float, float] = (0.9, 0.999), warmup_steps: int = 0,
                 lr_schedule: str = "constant", total_steps: int = 1, device: str = "cpu",
                 dtype: torch.dtype = torch.float32, row_tokens: int = 1024, trainable: bool = True) -> None:
        if isinstance(model, (str, Path)):
            from transformers import AutoModelForCausalLM

            model = AutoModelForCausalLM.from_pretrained(str(model), dtype=dtype)
        self.model = model.to(device)
        self.device = torch.device(device)
        self.row_tokens = row_tokens
        self.grad_clip = grad_clip
        self.base_lr = lr
        self.warmup_steps = warmup_steps
        self.lr_schedule = lr_schedule
        self.total_steps = total_steps
        self.version = 0
        self.optimizer = None
        if trainable:
            self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=lr, betas=tuple(betas),
                                               weight_decay=weight_decay)
        else:
            self.model.eval().requires_grad_(False)
        # dropout stays off: log-probs of the same weights must be reproducible (prox == behav)
        self.model.eval()

    # ------------------------------------------------------------------ inference-side passes
    @torch.no_grad()
    def compute_logprobs(self, batch: PackedBatch, max_tokens_per_mb: int = 8192, temperature: float = 1.0) -> torch.Tensor:
        out = torch.zeros(batch.num_tokens, dtype=torch.float32)
        for idx in plan_microbatches(batch.seqlens().tolist(), max_tokens_per_mb)[0]:
            if not idx:
                continue
            mb = batch.select(idx)
            lp, _ = packed_logprobs(self.model, mb, self.row_tokens, temperature=temperature)
            out[_token_index(batch, idx)] = lp.cpu()
        return out

    # ------------------------------------------------------------------ training
    def train_step(self, batch: PackedBatch, loss_fn: LossFn, max_tokens_per_mb: int = 8192,
                   temperature: float = 1.0) -> dict[str, float]:
        """One optimizer step. `temperature` must be the rollout's: the inference engine reports
        log-probs of the temperature-scaled distribution it sampled from (as SGLang does)."""
        if self.optimizer is None:
            raise RuntimeError("this engine was built with trainable=False")
        t0 = time.perf_counter()
        lr = self.base_lr * lr_factor(self.version, self.warmup_steps, self.total_steps, self.lr_schedule)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        self.optimizer.zero_grad(set_to_none=True)
        plan = plan_microbatches(batch.seqlens().tolist(), max_tokens_per_mb)[0]
        totals: dict[str, float] = {}
        loss_sum = 0.0
        n_mb = 0
        for idx in plan:
            if not idx:
                continue
            mb = batch.select(idx).to(self.device)
            lp, ent = packed_logprobs(self.model, mb, self.row_tokens, with_entropy=True, temperature=temperature)
            loss, stats = loss_fn(lp, ent, mb)
            loss.backward()
            loss_sum += float(loss.detach())
            n_mb += 1
            for k, v in stats.items():
                totals[k] = totals.get(k, 0.0) + float(v)
        params = [p for p in self.model.parameters() if p.grad is not None]
        grad_norm = torch.nn.utils.clip_grad_norm_(params, self.grad_clip if self.grad_clip else float("inf"))
        if torch.isfinite(grad_norm):
            self.optimizer.step()
        else:
            log.warning("non-finite grad norm %s at version %d: step skipped", grad_norm, self.version)
        self.version += 1
        elapsed = time.perf_counter() - t0
        totals.update({"loss": loss_sum, "grad_norm": float(grad_norm), "lr": lr, "tokens": float(batch.num_tokens),
                       "tokens_per_s": batch.num_tokens / max(elapsed, 1e-9), "n_microbatches": float(n_mb),
                       "time_s": elapsed})
        return totals

    # ------------------------------------------------------------------ weights and checkpoints
    def state_dict_for_sync(self) -> dict[str, torch.Tensor]:
        return {k: v.detach().to("cpu", copy=True) for k, v in self.model.state_dict().items()}

    def export_hf(self, path: str | Path) -> Path:
        """save_pretrained (safetensors) into `path` atomically: readers never see a half-written dir."""
        path = Path(path)
        tmp = path.with_name(path.name + f".tmp{os.getpid()}")
        shutil.rmtree(tmp, ignore_errors=True)
        self.model.save_pretrained(tmp, safe_serialization=True)
        if path.exists():
            shutil.rmtree(path)
        tmp.rename(path)
        return path

    def save_checkpoint(self, path: str | Path) -> Path:
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        self.export_hf(path / "model")
        state = {"version": self.version}
        if self.optimizer is not None:
            state["optimizer"] = self.optimizer.state_dict()
        torch.save(state, path / "trainer_state.pt")
        return path

    def load_checkpoint(self, path: str | Path) -> None:
        from safetensors.torch import load_file

        path = Path(path)
        weights = load_file(str(path / "model" / "model.safetensors"))
        missing, unexpected = self.model.load_state_dict(weights, strict=False)
        if unexpected or any(not k.endswith("lm_head.weight") for k in missing):
            raise ValueError(f"checkpoint {path} does not match the model: missing {missing}, unexpected {unexpected}")
        self.model.tie_weights()
        state = torch.load(path / "trainer_state.pt", weights_only=True)
        self.version = int(state["version"])
        if self.optimizer is not None and "optimizer" in state:
            self.optimizer.load_state_dict(state["optimizer"])


def _token_index(batch: PackedBatch, idx: list[int]) -> torch.Tensor:
    cu = batch.cu_seqlens
    return torch.cat([torch.arange(int(cu[i]), int(cu[i + 1])) for i in idx])
