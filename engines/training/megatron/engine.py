"""`MegatronTrainEngine`: a Megatron-Core GPTModel as the training backend (`backend: megatron`).

Why: Megatron-Core is where tensor and pipeline parallelism for large models live; this is the
first step, one GPU (tensor/pipeline parallel 1, no data parallelism), built so that the rest
of the engine cannot tell it from `TrainEngine` (engines/training/protocol.py): the same
packed batches in, the same per-token log-probs out (0 at each sequence's first token,
temperature dividing the logits, engines/training/packed_scoring.py `score_logits`), the
same loss callback per forward, the same optimizer step around it (lr schedule, AdamW, grad
clip, stats: engines/training/optimizer_steps.py `OptimizerSteps`), and weights that leave in
HF names and layout (engines/training/megatron/layout.py).

Choices, each the simplest one that megatron-core 0.16's source shows to work without
Transformer Engine or apex:
- the local layer spec (`get_gpt_layer_local_spec`, torch RMSNorm) and every fusion off;
- one right-padded row per sequence, causal mask (`AttnMaskType.causal` builds it when the
  mask is None; padding sits after the real tokens, which causal attention never lets them
  see), RoPE positions 0..L-1 per row, so no packed (THD) format is needed;
- fp32 parameters and torch's AdamW on them (no distributed optimizer); `precision: bf16`
  runs the forward and backward under `torch.autocast("cuda", bfloat16)`, so master weights,
  gradients and optimizer state stay fp32 and the log-softmax is taken in fp32;
- dropout 0 and the model in eval mode: log-probs of the same weights are reproducible.

Megatron is imported inside the engine only: this module imports on a machine without it.
"""

from __future__ import annotations

import logging
import os
import shutil
import socket
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from areal_graph.data.packed import PackedBatch, token_seq_ids
from areal_graph.engines.training.megatron import layout
from areal_graph.engines.training.microbatch_planner import plan_microbatches
from areal_graph.engines.training.optimizer_steps import OptimizerSteps
from areal_graph.engines.training.packed_scoring import score_logits
from areal_graph.engines.training.protocol import LossFn, TrainingEngine
from areal_graph.engines.training.state_file import save_state
from areal_graph.engines.training.step_stats import add_stats
from areal_graph.engines.training.train_engine import read_safetensors_dir

log = logging.getLogger(__name__)

# copied from the source model directory by `export_hf`, so that the export is a whole model
SIDE_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "vocab.json",
    "merges.txt",
    "tokenizer.model",
    "added_tokens.json",
    "chat_template.jinja",
    "generation_config.json",
)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def init_single_rank(seed: int) -> None:
    """Megatron's process groups on this one GPU: a one-rank torch.distributed group if none
    exists (NCCL on a free local port), model parallel sizes 1, and the CUDA RNG tracker its
    attention dropout forks from (seeded even though dropout is 0: the fork asserts it)."""
    import torch.distributed as dist
    from megatron.core import parallel_state, tensor_parallel

    if not dist.is_initialized():
        dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{_free_port()}", rank=0, world_size=1)
    elif dist.get_world_size() != 1:
        raise ValueError(
            f"backend megatron runs on one rank; this process group has {dist.get_world_size()} "
            "(data parallelism with backend megatron is not built yet)"
        )
    if not parallel_state.model_parallel_is_initialized():
        parallel_state.initialize_model_parallel(
            tensor_model_parallel_size=1, pipeline_model_parallel_size=1, create_gloo_process_groups=False
        )
    tensor_parallel.model_parallel_cuda_manual_seed(seed)


def build_gpt_model(hf_config: Any, device: torch.device | None = None, cpu_init: bool = False) -> torch.nn.Module:
    """A GPTModel (local spec, fp32) shaped like `hf_config`, its weights uninitialised
    (they are loaded next); `cpu_init` builds it on the CPU (what the CPU test compares)."""
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer.transformer_config import TransformerConfig

    config = TransformerConfig(
        **layout.transformer_config_kwargs(hf_config),
        params_dtype=torch.float32,
        use_cpu_initialization=cpu_init,
        perform_initialization=cpu_init,
    )
    shape = layout.shape_of(hf_config)
    spec = get_gpt_layer_local_spec(qk_layernorm=shape.qk_norm, normalization="RMSNorm")
    model = GPTModel(config, spec, **layout.gpt_model_kwargs(hf_config))
    return model if device is None else model.to(device)  # torch's RMSNorm is built on the CPU


class MegatronTrainEngine(OptimizerSteps):
    """A HF Qwen2/Qwen3/Llama checkpoint trained as a Megatron-Core GPTModel on one GPU.

    Takes the arguments `TrainEngine` takes from a model host (runtime/hosts/model_host.py),
    plus `precision` ("fp32" or "bf16" autocast) and `seed`; tensor/pipeline parallel sizes
    other than 1 are refused (not built yet)."""

    parallel = "none"

    def __init__(
        self,
        model: str | Path,
        *,
        lr: float = 2e-5,
        weight_decay: float = 0.0,
        grad_clip: float = 1.0,
        betas: tuple[float, float] = (0.9, 0.999),
        warmup_steps: int = 0,
        lr_schedule: str = "constant",
        total_steps: int = 1,
        device: str = "cuda",
        trainable: bool = True,
        precision: str = "fp32",
        tensor_parallel: int = 1,
        pipeline_parallel: int = 1,
        seed: int = 1,
    ) -> None:
        if tensor_parallel != 1 or pipeline_parallel != 1:
            raise ValueError(
                f"backend megatron with tensor_parallel={tensor_parallel}, "
                f"pipeline_parallel={pipeline_parallel} is not built yet (1 and 1 only)"
            )
        if precision not in ("fp32", "bf16"):
            raise ValueError(f"precision must be fp32 or bf16, got {precision!r}")
        dev = torch.device(device)
        if dev.type != "cuda" or not torch.cuda.is_available():
            raise RuntimeError(
                f"backend megatron needs a CUDA device: got device {device!r}"
                + ("" if torch.cuda.is_available() else " and torch sees no CUDA device")
            )
        self.device = torch.device("cuda", dev.index if dev.index is not None else torch.cuda.current_device())
        torch.cuda.set_device(self.device)
        from transformers import AutoConfig

        self.model_path = Path(model)
        self.hf_config = AutoConfig.from_pretrained(str(model))
        self.shape = layout.shape_of(self.hf_config)  # refuses an unsupported model before any GPU work
        init_single_rank(seed)
        self.model = build_gpt_model(self.hf_config, self.device)
        self._load_hf_state(read_safetensors_dir(model), str(model))
        self.model.eval()  # dropout is 0 anyway; eval keeps Megatron off any training-only path
        self.bf16 = precision == "bf16"
        super().__init__(
            lr=lr, grad_clip=grad_clip, warmup_steps=warmup_steps, lr_schedule=lr_schedule, total_steps=total_steps
        )
        if trainable:
            self.optimizer = torch.optim.AdamW(
                list(self.model.parameters()), lr=lr, betas=(betas[0], betas[1]), weight_decay=weight_decay, fused=True
            )
        else:
            self.model.requires_grad_(False)
        log.info("backend megatron: %s on %s (%s, %d layers)", model, self.device, precision, self.shape.num_layers)

    def _load_hf_state(self, hf_state: dict[str, torch.Tensor], where: str) -> None:
        state = layout.hf_to_megatron(hf_state, self.shape)
        missing, unexpected = self.model.load_state_dict(state, strict=False)
        missing = [k for k in missing if not k.endswith("_extra_state")]  # the local spec's empty placeholders
        if missing or unexpected:
            raise ValueError(
                f"{where}: the mapped weights do not fit the GPTModel: missing {missing}, unexpected {unexpected}"
            )

    # ------------------------------------------------------------------ forwards
    def _scores(
        self, mb: PackedBatch, with_entropy: bool, temperature: float, score: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Per-token log-probs (and entropy) of one micro-batch from one forward over right-padded
        rows, laid out as `rows_logprobs` lays them: position t holds log p(token t | tokens < t),
        0 at first tokens and wherever `score` (bool per token, None: all) is False. Only scored
        positions reach the log-softmax (in fp32)."""
        n = mb.num_tokens
        out_lp = torch.zeros(n, device=self.device, dtype=torch.float32)
        out_ent = torch.zeros(n, device=self.device, dtype=torch.float32) if with_entropy else None
        cu = mb.cu_seqlens.to("cpu", torch.int64)
        lens = cu[1:] - cu[:-1]
        seq = token_seq_ids(cu, n)
        pos = torch.arange(n) - torch.repeat_interleave(cu[:-1], lens, output_size=n)
        want = pos > 0
        if score is not None:
            want &= score.to("cpu", torch.bool)
        dst = want.nonzero().squeeze(1)
        if dst.numel() == 0:  # nothing to score: no forward (the loss then has no graph)
            return out_lp, out_ent
        width = int(lens.max())
        ids = mb["input_ids"].to("cpu", torch.long)
        rows = torch.zeros(len(lens), width, dtype=torch.long)
        rows[seq, pos] = ids
        rows = rows.to(self.device)
        positions = torch.arange(width, device=self.device).unsqueeze(0).expand_as(rows)
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=self.bf16):
            logits = self.model(input_ids=rows, position_ids=positions, attention_mask=None)  # [rows, width, V]
        at = (seq[dst].to(self.device), (pos[dst] - 1).to(self.device))
        lp, ent = score_logits(logits[at], ids[dst].to(self.device), with_entropy, temperature)
        d = dst.to(self.device)
        out_lp = out_lp.index_put((d,), lp)
        if out_ent is not None and ent is not None:
            out_ent = out_ent.index_put((d,), ent)
        return out_lp, out_ent

    def _microbatches(self, batch: PackedBatch, max_tokens_per_mb: int) -> list[list[int]]:
        """The planner's micro-batches (one rank); each runs as one forward."""
        plan = plan_microbatches(batch.seqlens().tolist(), max_tokens_per_mb, dp_size=1)
        return [sorted(idx) for idx in plan[0] if idx]

    @torch.no_grad()
    def compute_logprobs(
        self, batch: PackedBatch, max_tokens_per_mb: int = 8192, temperature: float = 1.0
    ) -> torch.Tensor:
        """Per-token log-probs of the batch (CPU, fp32, batch order)."""
        out = torch.zeros(batch.num_tokens, dtype=torch.float32)
        for seqs in self._microbatches(batch, max_tokens_per_mb):
            lp, _ = self._scores(batch.select(seqs), False, temperature, None)
            out[_token_index(batch, seqs)] = lp.cpu()
        return out

    def train_step(
        self, batch: PackedBatch, loss_fn: LossFn, max_tokens_per_mb: int = 8192, temperature: float = 1.0
    ) -> dict[str, float]:
        """One optimizer step, as `TrainEngine.train_step`: `loss_fn` once per forward (one per
        micro-batch), its shares summed, clip, AdamW, `version` + 1; the same stats keys."""
        t0, lr = self._begin_step()
        mbs = self._microbatches(batch, max_tokens_per_mb)
        totals: dict[str, float] = {}
        loss_sum = 0.0
        n_fwd = 0
        for seqs in mbs:
            mb = batch.select(seqs).to(self.device)
            score = mb["loss_mask"] != 0 if "loss_mask" in mb else None
            lp, ent = self._scores(mb, True, temperature, score)
            n_fwd += int(lp.requires_grad)
            loss, stats = loss_fn(lp, ent, mb)
            if loss.requires_grad:
                loss.backward()
            loss_sum += float(loss.detach())
            add_stats(totals, stats)
        grad_norm = self._take_step()
        return self._step_stats(totals, batch, t0, lr, loss_sum, grad_norm, len(mbs), n_fwd)

    def hf_grads(self) -> dict[str, torch.Tensor]:
        """The last step's gradients (after clipping) in HF names and layout, on the CPU: what
        tests compare with the torch backend's."""
        grads = {
            k: (p.grad if p.grad is not None else torch.zeros_like(p)).detach().cpu()
            for k, p in self.model.named_parameters()
        }
        return layout.megatron_to_hf(grads, self.shape)

    # ------------------------------------------------------------------ weights and checkpoints
    def state_dict_for_sync(self, copy: bool = True) -> dict[str, torch.Tensor]:
        """The full weights in HF names and layout, CPU tensors either way (q/k/v and gate/up
        are cut out of fused tensors, so there are no live HF-shaped tensors to hand out); a
        tied `lm_head.weight` is the embedding tensor itself (shared_weights stores it once)."""
        state = {
            k: v.detach().to("cpu", copy=True)
            for k, v in self.model.state_dict().items()
            if isinstance(v, torch.Tensor) and not k.endswith("_extra_state")
        }
        return layout.megatron_to_hf(state, self.shape)

    def export_adapter(self, path: str | Path) -> Path:
        raise NotImplementedError("LoRA with backend megatron is not built yet (the rules refuse it)")

    def export_hf(self, path: str | Path) -> Path:
        """config.json, model.safetensors and the source's tokenizer files into `path`,
        atomically (a reader never sees a half-written directory); fp32 weights."""
        from safetensors.torch import save_file

        path = Path(path)
        tmp = path.with_name(path.name + f".tmp{os.getpid()}")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        state = self.state_dict_for_sync()
        if self.shape.tied:
            state.pop("lm_head.weight")  # from_pretrained ties it back, as save_pretrained leaves it out
        save_file(
            {k: v.contiguous() for k, v in state.items()}, str(tmp / "model.safetensors"), metadata={"format": "pt"}
        )
        config = type(self.hf_config).from_dict(self.hf_config.to_dict())
        config.dtype = torch.float32
        config.save_pretrained(tmp)
        for name in SIDE_FILES:
            if (self.model_path / name).is_file() and not (tmp / name).exists():
                shutil.copy2(self.model_path / name, tmp / name)
        if path.exists():
            shutil.rmtree(path)
        tmp.rename(path)
        return path

    def save_checkpoint(self, path: str | Path) -> Path:
        """HF weights (model/) and trainer_state.pt: version and the AdamW state, whose tensors
        keep Megatron's order and fused layout (so only this backend resumes it)."""
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        self.export_hf(path / "model")
        state: dict[str, Any] = {"version": self.version, "backend": "megatron"}
        if self.optimizer is not None:
            state["optimizer"] = self.optimizer.state_dict()
        save_state(state, path / "trainer_state.pt")
        return path

    def load_checkpoint(self, path: str | Path) -> None:
        path = Path(path)
        state = torch.load(path / "trainer_state.pt", weights_only=True)
        if self.optimizer is not None and "optimizer" in state and state.get("backend") != "megatron":
            raise ValueError(
                f"{path} was written by the torch backend: its optimizer state is in HF parameter "
                "order, and resuming it with backend megatron is not built yet"
            )
        self._load_hf_state(read_safetensors_dir(path / "model"), str(path / "model"))
        self.version = int(state["version"])
        if self.optimizer is not None and "optimizer" in state:
            self.optimizer.load_state_dict(state["optimizer"])


def _token_index(batch: PackedBatch, idx: list[int]) -> torch.Tensor:
    """Batch positions of the tokens of sequences `idx`, in that order."""
    cu = batch.cu_seqlens.to(torch.int64)
    if not idx:
        return torch.zeros(0, dtype=torch.int64)
    return torch.cat([torch.arange(int(cu[i]), int(cu[i + 1])) for i in idx])


if TYPE_CHECKING:  # the type checker holds the engine to what a model host drives (tests/test_types.py)

    def _implements(engine: MegatronTrainEngine) -> TrainingEngine:
        return engine
