"""The training engine: a HF CausalLM trained on packed batches, with no padding.

Two forward paths give the same values up to float rounding. For the Qwen2 / Qwen3 / Llama
family (data parallelism off) the lean forward (engines/training/lean_train.py,
`lean_logprobs`) runs each micro-batch as one flat stream of token positions: no padding in
the linear layers, common prefixes of its sequences (a GRPO group's prompt) computed once,
attention per sequence. Everything else (other architectures, the critic, DDP/FSDP, whose
wrappers must see every forward) runs the HF forward over packed rows, as follows.

Sequences of a micro-batch are packed into rows, with `position_ids` restarting at every
sequence and `use_cache=False`; transformers then keeps attention inside each sequence
(tests/engines/training/test_train_engine.py proves it against running each sequence alone). Short rows are
padded at their *end*, which causal attention never lets real tokens see.

The row layout and the scoring of packed sequences live in
engines/training/packed_scoring.py.

Only the positions that are trained on reach the LM head's log-softmax in `train_step`
(those where `loss_mask` is set): the loss reads nothing else, and on an RL batch about half
the tokens are prompt.

`train_step` sums the loss callback over the forwards of the planner's micro-batches: the
callback returns each part's share of the batch loss (normalised with batch-level totals), so the
update does not depend on how the batch was split.

Data parallelism (engines/training/data_parallel.py: DDP on CPU, FSDP2 with bf16 on CUDA) keeps that
design unchanged: **every rank is given the whole batch** and builds the same loss callback
from it, so the normalisers (token counts, sequence counts, Dr.GRPO's constant) are global
by construction and no extra collective is needed to compute them. The planner then hands
each rank a token-balanced share (`split_across_ranks` inside `plan_microbatches`) packed
into the same number of micro-batches on every rank; a rank runs only its share, the
reducer sums the shares' gradients, and one step gives the parameters a single process
would get. Copying the batch to every rank costs little: a batch is token ids and a few
floats per token, tiny next to the forward and backward it feeds. Every rank runs the same
number of forwards: where a rank has run out of sequences it runs a one-token forward (and
backward) whose loss is multiplied by 0, because the collectives inside DDP/FSDP must line
up across ranks.

The critic (engines/training/value_model.py `ValueEngine`) is this engine with a value model: it
reuses the planner, `row_layout` and every piece above, and overrides only what one forward
yields (`_train_forward`) and how checkpointed weights are read (`_read_weights`).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from areal_graph.api.full_disk import naming_the_file
from areal_graph.data.packed import PackedBatch
from areal_graph.engines.lora_weights import adapter_tensors, attach_lora, merged_tensors
from areal_graph.engines.training import data_parallel as dp
from areal_graph.engines.training.lean_train import LeanTrainForward, unsupported_reason
from areal_graph.engines.training.microbatch_planner import plan_microbatches
from areal_graph.engines.training.optimizer_steps import OptimizerSteps, adamw
from areal_graph.engines.training.packed_scoring import (
    ROW_TOKENS,
    lean_logprobs,
    row_forwards,
    rows_logprobs,
)
from areal_graph.engines.training.protocol import LossFn, TrainingEngine
from areal_graph.engines.training.state_file import save_state
from areal_graph.engines.training.step_stats import add_stats

log = logging.getLogger(__name__)

LORA_ADAPTER_DIR = "adapter"  # inside an exported model: peft's adapter_config.json + adapter_model.safetensors


Unit = tuple[list[int], list[list[int]]]  # one forward: (sequence indices, rows of positions in them)


def read_safetensors_dir(path: str | Path) -> dict[str, torch.Tensor]:
    """Every tensor `save_pretrained` wrote into `path`: one model.safetensors, or the shards
    its model.safetensors.index.json lists (large models are saved in several files)."""
    from safetensors.torch import load_file

    path = Path(path)
    index = path / "model.safetensors.index.json"
    files = (
        sorted(set(json.loads(index.read_text())["weight_map"].values())) if index.exists() else ["model.safetensors"]
    )
    state: dict[str, torch.Tensor] = {}
    for name in files:
        state.update(load_file(str(path / name)))
    return state


class TrainEngine(OptimizerSteps):
    """A HF CausalLM, its AdamW optimizer and lr schedule, trained on packed batches.

    `parallel` ("auto", "none", "ddp", "fsdp") chooses data parallelism when a
    torch.distributed process group with more than one rank exists ("auto": FSDP2 on CUDA,
    DDP otherwise; see engines/training/data_parallel.py). Under data parallelism every rank must call
    `train_step`, `compute_logprobs` and the weight/checkpoint methods together, with the
    same whole batch. `mixed_precision` (default: bf16 under FSDP on CUDA, else off) is the
    compute dtype: FSDP's MixedPrecisionPolicy casts parameters to it, one process or DDP
    autocasts to it; master weights, optimizer state and gradient reduction stay fp32.
    `precision` ("fp32"/"bf16", the workflow's field) overrides it when given.

    `lean` (default on) runs forwards of a supported architecture (Qwen2/Qwen3/Llama, see
    engines/training/lean_train.py) without HF's module stack and without padding, each
    micro-batch as one pass, common prefixes of its sequences computed once; other models,
    and data parallelism (whose wrappers must see every forward), use the HF forward over
    packed rows. Both give the same values up to float rounding. `share_prefixes=False` makes
    the lean path compute every sequence's prefix itself (for measurements).
    """

    def __init__(
        self,
        model: str | Path | torch.nn.Module,
        *,
        lr: float = 2e-5,
        weight_decay: float = 0.0,
        grad_clip: float = 1.0,
        betas: tuple[float, float] = (0.9, 0.999),
        warmup_steps: int = 0,
        lr_schedule: str = "constant",
        total_steps: int = 1,
        device: str = "cpu",
        dtype: torch.dtype = torch.float32,
        row_tokens: int = ROW_TOKENS,
        trainable: bool = True,
        parallel: str = "auto",
        mixed_precision: torch.dtype | None | str = "auto",
        lean: bool = True,
        share_prefixes: bool = True,
        lora: dict[str, Any] | None = None,
        precision: str | None = None,
    ) -> None:
        self.parallel = dp.resolve_mode(parallel, torch.device(device))
        self.rank, self.world_size = dp.world() if self.parallel != "none" else (0, 1)
        self.device = dp.local_device(device, self.parallel)
        if isinstance(model, (str, Path)):
            from transformers import AutoModelForCausalLM

            model = AutoModelForCausalLM.from_pretrained(str(model), dtype=dtype)
        self.model = model.to(self.device)
        # LoRA (engines/lora_weights.py): peft wraps the model; the optimizer sees the adapters only
        self.lora_sync: str | None = None
        if lora is not None:
            if self.parallel != "none":
                raise ValueError("LoRA with data parallelism (dp_size > 1) is not built yet")
            self.lora_sync = str(lora.get("sync", "adapter"))
            self.model = attach_lora(
                self.model,
                int(lora["r"]),
                int(lora["alpha"]),
                float(lora.get("dropout", 0.0)),
                list(lora["target_modules"]),
            )
        self.row_tokens = row_tokens
        super().__init__(
            lr=lr, grad_clip=grad_clip, warmup_steps=warmup_steps, lr_schedule=lr_schedule, total_steps=total_steps
        )
        # dropout stays off: log-probs of the same weights must be reproducible (prox == behav)
        self.model.eval()
        if not trainable:
            self.model.requires_grad_(False)
        # `_forward` is what micro-batches run through (the DDP wrapper, or the model itself)
        self._forward: torch.nn.Module = self.model
        if precision is not None:  # the workflow's `models.<name>.precision` wins over the default
            if precision not in ("fp32", "bf16"):
                raise ValueError(f"precision must be fp32 or bf16, got {precision!r}")
            mixed_precision = torch.bfloat16 if precision == "bf16" else None
        if mixed_precision == "auto":
            mixed_precision = torch.bfloat16 if self.parallel == "fsdp" and self.device.type == "cuda" else None
        if isinstance(mixed_precision, str):
            raise ValueError(f"mixed_precision must be 'auto', a torch dtype or None, got {mixed_precision!r}")
        # one process (or DDP): the weights stay fp32 and matrix products run in the compute
        # dtype under autocast; FSDP2 does the same through its MixedPrecisionPolicy
        self._autocast_dtype = mixed_precision if self.parallel != "fsdp" else None
        if self.parallel == "fsdp":
            dp.shard_fsdp(self.model, mixed_precision)
        elif self.parallel == "ddp" and trainable:
            self._forward = dp.wrap_ddp(self.model, self.device)
        elif self.parallel == "ddp":  # frozen: no gradients to reduce, but replicas must agree
            dp.broadcast_from_rank0(self.model)
        if trainable:
            self.optimizer = adamw(self.model, lr, (betas[0], betas[1]), weight_decay, fused=self.parallel != "fsdp")
        self._lean = self._make_lean() if lean and self.parallel == "none" and lora is None else None
        self.share_prefixes = share_prefixes
        if self.parallel != "none":
            log.info(
                "rank %d/%d: %s data parallelism on %s%s",
                self.rank,
                self.world_size,
                self.parallel,
                self.device,
                f", compute in {mixed_precision}" if mixed_precision else "",
            )

    def _make_lean(self) -> LeanTrainForward | None:
        reason = unsupported_reason(self.model)
        if reason is not None:
            log.debug("lean training forward off: %s", reason)
            return None
        return LeanTrainForward(self.model)

    def _compute_precision(self) -> contextlib.AbstractContextManager:
        """Autocast to the mixed-precision compute dtype (bf16 products, fp32 master weights,
        fp32 log-softmax), or nothing when training runs in fp32 or FSDP2 does the casting."""
        if self._autocast_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=self._autocast_dtype)

    def _lean_now(self) -> LeanTrainForward | None:
        """The lean forward if forwards run through it now (the model may have been put in
        training mode since: dropout needs the HF modules), else None."""
        return self._lean if not self.model.training else None

    def _units(self, batch: PackedBatch, max_tokens_per_mb: int) -> tuple[list[Unit], int, int]:
        """This rank's forward passes, how many every rank must run, and its micro-batch count.

        A unit is one forward: the sequences it covers (ascending batch indices) and its rows
        (positions in that list). Every rank holds the whole batch and the plan is
        deterministic, so each rank can count the other ranks' forwards itself: FSDP gathers
        parameters in every forward, so all ranks must run the same number (idle ones pad).
        """
        lens = batch.seqlens().tolist()
        plan = plan_microbatches(lens, max_tokens_per_mb, dp_size=self.world_size)
        lean = self._lean_now() is not None
        counts = []
        mine: list[Unit] = []
        for rank, rank_plan in enumerate(plan):
            units: list[Unit] = []
            for idx in rank_plan:
                if lean and idx:  # one pass per micro-batch; "rows": every sequence alone
                    units.append((sorted(idx), [[k] for k in range(len(idx))]))
                    continue
                for rows in row_forwards([lens[i] for i in idx], self.row_tokens):
                    seqs = sorted(idx[j] for row in rows for j in row)
                    local = {s: k for k, s in enumerate(seqs)}
                    units.append((seqs, [[local[idx[j]] for j in row] for row in rows]))
            counts.append(len(units))
            if rank == self.rank:
                mine = units
                n_mb = sum(1 for idx in rank_plan if idx)
        return mine, max(counts), n_mb

    def _idle_pass(self, backward: bool) -> None:
        """A one-token forward (and a zero backward) for a micro-batch this rank has no data
        for: FSDP gathers parameters in every forward and both reducers reduce in the last
        backward, so each rank must make the same calls."""
        ids = torch.zeros(1, 1, dtype=torch.long, device=self.device)
        logits = self._forward(input_ids=ids, position_ids=torch.zeros_like(ids), use_cache=False).logits
        if backward:
            (logits.float().sum() * 0.0).backward()

    # ------------------------------------------------------------------ inference-side passes
    @torch.no_grad()
    def compute_logprobs(
        self, batch: PackedBatch, max_tokens_per_mb: int = 8192, temperature: float = 1.0
    ) -> torch.Tensor:
        """Per-token log-probs of the batch. Under data parallelism each rank computes its share
        and a sum over ranks assembles the whole (every token comes from exactly one rank)."""
        if (lean := self._lean_now()) is not None:
            return self._per_token(
                batch,
                max_tokens_per_mb,
                lambda mb, rows: lean_logprobs(lean, mb, temperature=temperature, share_prefixes=self.share_prefixes)[
                    0
                ],
            )
        return self._per_token(
            batch, max_tokens_per_mb, lambda mb, rows: rows_logprobs(self.model, mb, rows, temperature=temperature)[0]
        )

    def _per_token(
        self, batch: PackedBatch, max_tokens_per_mb: int, score: Callable[[PackedBatch, list[list[int]]], torch.Tensor]
    ) -> torch.Tensor:
        """A per-token quantity of the whole batch, `score(sub_batch, rows)` run over this rank's
        forwards (the planner's micro-batches and rows) and assembled in batch order."""
        out = torch.zeros(batch.num_tokens, dtype=torch.float32)
        units, n_units, _ = self._units(batch, max_tokens_per_mb)
        for u in range(n_units):
            if u >= len(units):
                if self.parallel == "fsdp":
                    self._idle_pass(backward=False)
                continue
            seqs, rows = units[u]
            with self._compute_precision():
                scored = score(batch.select(seqs), rows)
            out[_token_index(batch, seqs)] = scored.float().cpu()
        if self.world_size > 1:
            out = dp.all_reduce_sum_(out.to(self.device)).cpu()
        return out

    def _train_forward(
        self, mb: PackedBatch, rows: list[list[int]], temperature: float
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """What the loss callback receives for one forward: per-token log-probs and entropy of
        the live policy (a critic engine returns its values instead, and no entropy), computed
        only where `loss_mask` is set when the batch has one (0 elsewhere: nothing trains there)."""
        score = mb["loss_mask"] != 0 if "loss_mask" in mb else None
        with self._compute_precision():
            if (lean := self._lean_now()) is not None:
                return lean_logprobs(
                    lean,
                    mb,
                    with_entropy=True,
                    temperature=temperature,
                    score=score,
                    share_prefixes=self.share_prefixes,
                )
            return rows_logprobs(self._forward, mb, rows, with_entropy=True, temperature=temperature, score=score)

    # ------------------------------------------------------------------ training
    def train_step(
        self, batch: PackedBatch, loss_fn: LossFn, max_tokens_per_mb: int = 8192, temperature: float = 1.0
    ) -> dict[str, float]:
        """One optimizer step. `temperature` must be the rollout's: the inference engine reports
        log-probs of the temperature-scaled distribution it sampled from (as SGLang does).

        `loss_fn` is called once per forward (a part of a micro-batch made of whole sequences)
        and must return that part's share of the batch loss, so it must be built from the
        whole batch (see the module docstring). Returned stats are summed over those calls
        and, with data parallelism, over ranks; `loss` is the batch loss, `n_microbatches`
        and `n_forwards` count the non-empty micro-batches and forwards of all ranks.
        """
        t0, lr = self._begin_step()
        units, n_units, n_mb = self._units(batch, max_tokens_per_mb)
        totals: dict[str, float] = {}
        loss_sum = 0.0
        for u in range(n_units):
            with dp.grad_sync(self._forward, self.parallel, sync=u == n_units - 1):
                if u >= len(units):
                    self._idle_pass(backward=True)
                    continue
                seqs, rows = units[u]
                mb = batch.select(seqs).to(self.device)
                lp, ent = self._train_forward(mb, rows, temperature)
                loss, stats = loss_fn(lp, ent, mb)
                # reducers average over ranks; scaling makes them sum the ranks' shares. A loss
                # without a graph: the lean path skipped a micro-batch with nothing to score
                # (the HF path, the only one under data parallelism, always keeps the graph).
                if loss.requires_grad:
                    (loss * self.world_size if self.world_size > 1 else loss).backward()
            loss_sum += float(loss.detach())
            add_stats(totals, stats)
        grad_norm = self._take_step(dp.as_local_scalar)
        if self.world_size > 1:
            totals = dp.sum_dicts(
                dp.all_gather_json(
                    {**totals, "loss": loss_sum, "n_microbatches": n_mb, "n_forwards": len(units)}, self.device
                )
            )
            loss_sum, n_mb, n_fwd = totals.pop("loss"), int(totals.pop("n_microbatches")), int(totals.pop("n_forwards"))
        else:
            n_fwd = len(units)
        return self._step_stats(totals, batch, t0, lr, loss_sum, grad_norm, n_mb, n_fwd)

    # ------------------------------------------------------------------ weights and checkpoints
    def state_dict_for_sync(self, copy: bool = True) -> dict[str, torch.Tensor]:
        """What a weight sync moves: the full weights (a CPU copy, or with `copy=False` the live
        tensors, for a caller that copies them out at once); with LoRA the adapters alone
        (`lora.sync: adapter`) or the merged weights. Under FSDP a collective that leaves them
        on rank 0 only (the rank that pushes weights to inference); other ranks get {}."""
        if self.parallel == "fsdp":
            return dp.fsdp_full_model_state(self.model)
        if self.lora_sync is not None:
            state = adapter_tensors(self.model) if self.lora_sync == "adapter" else merged_tensors(self.model)
            return {k: v.detach().to("cpu", copy=True) for k, v in state.items()} if copy else state
        if not copy:
            return {k: v.detach() for k, v in self.model.state_dict().items()}
        return {k: v.detach().to("cpu", copy=True) for k, v in self.model.state_dict().items()}

    def export_hf(self, path: str | Path) -> Path:
        """save_pretrained (safetensors) into `path` atomically: readers never see a half-written dir.

        Under data parallelism rank 0 writes and every rank returns once the directory exists."""
        path = Path(path)
        state = dp.fsdp_full_model_state(self.model) if self.parallel == "fsdp" else None
        if self.rank == 0:
            tmp = path.with_name(path.name + f".tmp{os.getpid()}")
            shutil.rmtree(tmp, ignore_errors=True)
            with naming_the_file(path):  # a full disk names the directory (api/full_disk.py)
                if self.lora_sync is not None:  # the merged model, and the adapters beside it (peft's layout)
                    self.model.get_base_model().save_pretrained(
                        tmp, safe_serialization=True, state_dict=merged_tensors(self.model)
                    )
                    self.model.save_pretrained(tmp / LORA_ADAPTER_DIR)
                else:
                    self.model.save_pretrained(tmp, safe_serialization=True, state_dict=state)
            if path.exists():
                shutil.rmtree(path)
            tmp.rename(path)
        self._barrier()
        return path

    def export_adapter(self, path: str | Path) -> Path:
        """LoRA: the adapters alone, in peft's layout (adapter_config.json + adapter_model.safetensors),
        atomically: what a vLLM or SGLang server loads per version (`lora.sync: adapter`)."""
        if self.lora_sync is None:
            raise ValueError("export_adapter: this model has no LoRA adapters (models.<name>.lora)")
        path = Path(path)
        if self.rank == 0:
            tmp = path.with_name(path.name + f".tmp{os.getpid()}")
            shutil.rmtree(tmp, ignore_errors=True)
            with naming_the_file(path):
                self.model.save_pretrained(tmp)
            if path.exists():
                shutil.rmtree(path)
            tmp.rename(path)
        self._barrier()
        return path

    def save_checkpoint(self, path: str | Path) -> Path:
        """Weights (HF safetensors) and optimizer state; under data parallelism rank 0 writes.

        The optimizer state keeps torch's own form (parameters numbered) whatever the mode, so
        a checkpoint resumes with or without DDP/FSDP and with another world size."""
        path = Path(path)
        if self.rank == 0:
            path.mkdir(parents=True, exist_ok=True)
        self._barrier()
        self.export_hf(path / "model")
        state: dict = {"version": self.version}
        if self.optimizer is not None:
            if self.parallel == "fsdp":
                full = dp.fsdp_full_optim_state(self.model, self.optimizer)
                if self.rank == 0:
                    state["optimizer"] = dp.optim_state_names_to_ids(full, self._param_names())
            else:
                state["optimizer"] = self.optimizer.state_dict()
        if self.rank == 0:
            save_state(state, path / "trainer_state.pt")
        self._barrier()
        return path

    def load_checkpoint(self, path: str | Path) -> None:
        """Every rank reads the checkpoint (it must be on a filesystem they all see)."""
        path = Path(path)
        if self.lora_sync is not None:
            self._load_adapter(path / "model" / LORA_ADAPTER_DIR)
        elif self.parallel == "fsdp":
            weights = self._read_weights(path / "model")
            unknown = set(weights) - set(self.model.state_dict())
            if unknown:
                raise ValueError(f"checkpoint {path} does not match the model: unexpected {sorted(unknown)}")
            dp.fsdp_load_model_state(self.model, weights)
        else:
            weights = self._read_weights(path / "model")
            missing, unexpected = self.model.load_state_dict(weights, strict=False)
            if unexpected or any(not k.endswith("lm_head.weight") for k in missing):
                raise ValueError(
                    f"checkpoint {path} does not match the model: missing {missing}, unexpected {unexpected}"
                )
            self.model.tie_weights()
        state = torch.load(path / "trainer_state.pt", weights_only=True)
        self.version = int(state["version"])
        if self.optimizer is not None and "optimizer" in state:
            if self.parallel == "fsdp":
                named = dp.optim_state_ids_to_names(state["optimizer"], self._param_names())
                dp.fsdp_load_optim_state(self.model, self.optimizer, named)
            else:
                self.optimizer.load_state_dict(state["optimizer"])

    def _load_adapter(self, adapter_dir: Path) -> None:
        """LoRA: the adapters come back; the base stays as it was loaded (frozen, never saved apart)."""
        from peft import set_peft_model_state_dict
        from safetensors.torch import load_file

        result = set_peft_model_state_dict(self.model, load_file(str(adapter_dir / "adapter_model.safetensors")))
        unexpected = getattr(result, "unexpected_keys", None)
        if unexpected:
            raise ValueError(f"{adapter_dir}: adapters that do not fit the model: {unexpected}")

    def _read_weights(self, model_dir: Path) -> dict[str, torch.Tensor]:
        """The full state dict `export_hf` wrote into `model_dir` (keys as in `self.model`)."""
        return read_safetensors_dir(model_dir)

    def _param_names(self) -> list[str]:
        """Parameter names in `model.parameters()` order (the optimizer's numbering)."""
        return [name for name, _ in self.model.named_parameters()]

    def _barrier(self) -> None:
        if self.world_size > 1:
            torch.distributed.barrier()


def _token_index(batch: PackedBatch, idx: list[int]) -> torch.Tensor:
    """Batch positions of the tokens of sequences `idx`, in that order."""
    cu = batch.cu_seqlens.to(torch.int64)
    seqs = torch.tensor(idx, dtype=torch.int64)
    lens = cu[seqs + 1] - cu[seqs]
    n = int(lens.sum())
    ends = torch.cumsum(lens, 0)
    return torch.arange(n) + torch.repeat_interleave(cu[seqs] - (ends - lens), lens, output_size=n)


if TYPE_CHECKING:  # the type checker holds the engine to what a model host drives (tests/test_types.py)

    def _implements(engine: TrainEngine) -> TrainingEngine:
        return engine
