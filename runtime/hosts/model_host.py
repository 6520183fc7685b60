"""Hosts one model in a worker process: the logprob, value and train nodes of that model.

One object per model so that the proximal log-probs (`prox_logprobs`) come from exactly the
weights the train node is about to update, with no transfer in between.

A model is either a policy (log-probs, policy losses; a `TrainEngine` over the causal LM) or
a critic (values, loss `value`; a `ValueEngine`, engines/training/value_model.py: the same backbone
with a value head). `role` says which: the train node's kind sets it from the workflow
(`model_role` in graph/kinds/registry.py) and the executor's Configure call passes it. A call of
the other role (`values` on a policy, `logprob` on a critic, a checkpoint of the other kind)
is an error, not a silent mix: give the critic its own entry under `models:`.

`backend` picks the policy's training engine: "torch" (`TrainEngine`) or "megatron"
(`MegatronTrainEngine`, engines/training/megatron/: one GPU, a policy without LoRA; validation
reports the rest, graph/workflow_rules.py `check_megatron`). `precision` ("fp32", "bf16") goes
to the engine as it is: fp32 means fp32 under FSDP too (the engines' own default there is bf16).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import torch

from areal_graph.data.packed import PackedBatch
from areal_graph.engines import shared_weights
from areal_graph.engines.training.megatron.engine import MegatronTrainEngine
from areal_graph.engines.training.protocol import TrainingEngine, ValueTrainingEngine
from areal_graph.engines.training.step_stats import mean_over_updates
from areal_graph.engines.training.train_engine import TrainEngine
from areal_graph.engines.training.value_model import VALUE_HEAD_FILE, ValueEngine
from areal_graph.graph.kinds.losses import LOSSES, TrainParams
from areal_graph.nodes.off_policy import finish_mismatch_stats
from areal_graph.nodes.train_loss import build_loss_fn, ppo_minibatches, prepare_policy_batch

log = logging.getLogger(__name__)

Role = Literal["policy", "critic"]


class ModelHost:
    def __init__(
        self,
        model_path: str,
        optim: dict[str, Any] | None = None,
        total_steps: int = 1,
        seed: int = 1,
        threads: int | None = None,
        role: Role = "policy",
        device: str = "cpu",
        lora: dict[str, Any] | None = None,
        backend: str = "torch",
        precision: str = "fp32",
    ) -> None:
        if device.startswith("cuda") and not torch.cuda.is_available():
            raise RuntimeError(
                f"model {model_path} is configured with device {device!r}, but this machine has no "
                "CUDA device (or torch is a CPU build): set the model's `device: cpu`"
            )
        if threads:
            torch.set_num_threads(threads)
        torch.manual_seed(seed)
        if role not in ("policy", "critic"):
            raise ValueError(f"role must be policy or critic, got {role!r}")
        self.model_path = model_path
        self.trainable = optim is not None
        self._engine_args = dict(
            **(optim or {}),
            total_steps=max(total_steps, 1),
            trainable=self.trainable,
            device=device,
            **({"lora": lora} if lora else {}),
            precision=precision,
        )
        self.role: Role = role
        # the host drives its engine through engines/training/protocol.py alone
        self.critic: ValueTrainingEngine | None = None
        self.engine: TrainingEngine
        if backend not in ("torch", "megatron"):
            raise ValueError(f"backend must be torch or megatron, got {backend!r}")
        if backend == "megatron":
            if role == "critic" or lora:
                raise ValueError(
                    f"model {model_path}: backend megatron for a {'critic' if role == 'critic' else 'LoRA'} "
                    "model is not built yet"
                )
            self.engine = MegatronTrainEngine(model_path, **self._engine_args, seed=seed)
        elif role == "critic":
            self.engine = self.critic = ValueEngine(model_path, **self._engine_args)
        else:
            self.engine = TrainEngine(model_path, **self._engine_args)

    def _use_as(self, role: Role) -> None:
        if role != self.role:
            raise RuntimeError(
                f"model {self.model_path} is a {self.role} and cannot also serve as a {role}: "
                "give the critic its own entry under `models:`"
            )

    # ------------------------------------------------------------------ nodes
    def logprob(
        self, batch: PackedBatch, out_key: str, max_tokens_per_mb: int, temperature: float = 1.0
    ) -> PackedBatch:
        self._use_as("policy")
        lp = self.engine.compute_logprobs(batch, max_tokens_per_mb=max_tokens_per_mb, temperature=temperature)
        return PackedBatch(batch.cu_seqlens.clone(), {out_key: lp.float()})

    def values(self, batch: PackedBatch, out_key: str, max_tokens_per_mb: int) -> PackedBatch:
        """Per-token values V(tokens < t) at position t (0 at each sequence's first token), fp32."""
        self._use_as("critic")
        assert self.critic is not None  # a critic's engine, by its role
        values = self.critic.compute_values(batch, max_tokens_per_mb=max_tokens_per_mb)
        return PackedBatch(batch.cu_seqlens.clone(), {out_key: values.float()})

    def train(
        self,
        batch: PackedBatch,
        params: dict[str, Any],
        max_tokens_per_mb: int,
        temperature: float = 1.0,
        fused_prox: bool = False,
        policy_version: int | None = None,
    ) -> tuple[PackedBatch, dict[str, float]]:
        """One train node call: `ppo_epochs` x `ppo_minibatches` optimizer steps; returns their stats.

        `fused_prox`: the batch has no `prox_logprobs`; the loss takes them from this
        forward (exact only with one update per call, which the plan guarantees).
        `policy_version`: the version these weights serve as (the controller's), against which
        the batch's `versions` tell fresh tokens from stale ones in the mismatch stats."""
        if not self.trainable:
            raise RuntimeError("this model has no `train:` section in the workflow; it is frozen")
        train_params = TrainParams(**params)
        self._use_as(LOSSES[train_params.loss].role)
        n_mb, epochs = train_params.ppo_minibatches, train_params.ppo_epochs
        if fused_prox and n_mb * epochs != 1:
            raise ValueError(
                "fused proximal log-probs need exactly one optimizer update per step "
                f"(ppo_epochs={epochs}, ppo_minibatches={n_mb})"
            )
        # the lr schedule counts optimizer steps, of which there are n_mb * epochs per batch
        self.engine.total_steps = self._engine_args["total_steps"] * n_mb * epochs
        runs: list[dict[str, float]] = []
        if LOSSES[train_params.loss].role == "policy":
            batch = prepare_policy_batch(train_params, batch)
        for epoch in range(epochs):
            parts = ppo_minibatches(batch.num_seqs, n_mb, seed=self.engine.version * 1009 + epoch)
            for part in parts:
                mb = batch if len(parts) == 1 else batch.select(part)
                stats = self.engine.train_step(
                    mb,
                    build_loss_fn(train_params, mb, fused_prox, policy_version),
                    max_tokens_per_mb=max_tokens_per_mb,
                    temperature=temperature,
                )
                runs.append({k: float(v) for k, v in stats.items() if isinstance(v, (int, float))})
        return PackedBatch(batch.cu_seqlens.clone()), finish_mismatch_stats(_combine_update_stats(runs))

    # ------------------------------------------------------------------ weights and checkpoints
    def publish_weights(self, path: str) -> list[dict]:
        """The weights into the shared-memory file `path` (engines/shared_weights.py); returns its manifest."""
        return shared_weights.publish(path, self.engine.state_dict_for_sync(copy=False))

    def export_weights(self, path: str, with_tokenizer: bool = False) -> str:
        """HF safetensors; with the tokenizer too when the directory is meant for people (final model)."""
        self.engine.export_hf(Path(path))
        if with_tokenizer:
            from transformers import AutoTokenizer

            AutoTokenizer.from_pretrained(self.model_path).save_pretrained(path)
        return path

    def export_adapter(self, path: str) -> str:
        """LoRA: the adapters alone in peft's layout, for servers that load adapters (vLLM, SGLang)."""
        self.engine.export_adapter(Path(path))
        return path

    def save_checkpoint(self, path: str) -> str:
        self.engine.save_checkpoint(Path(path))
        return path

    def load_checkpoint(self, path: str) -> str:
        """Resume; a critic's checkpoint holds a value head, a policy's does not."""
        is_critic = (Path(path) / "model" / VALUE_HEAD_FILE).exists()
        if is_critic != (self.role == "critic"):
            raise ValueError(
                f"{path} is a {'critic' if is_critic else 'policy'}'s checkpoint "
                f"(model/{VALUE_HEAD_FILE} {'present' if is_critic else 'absent'}) but this model is a {self.role}"
            )
        self.engine.load_checkpoint(Path(path))
        return path


def _combine_update_stats(runs: list[dict[str, float]]) -> dict[str, float]:
    """One batch's stats from its optimizer steps: means, but totals for work done."""
    if len(runs) == 1:
        return runs[0]
    out = mean_over_updates(runs)
    for k in ("tokens", "time_s", "n_microbatches", "n_forwards"):
        if k in out:
            out[k] = sum(r.get(k, 0.0) for r in runs)
    if out.get("time_s"):
        out["tokens_per_s"] = out["tokens"] / out["time_s"]
    out["updates"] = float(len(runs))
    return out


if TYPE_CHECKING:  # the type checker holds the class to what the owner calls on it (tests/test_types.py)
    from areal_graph.runtime.hosts.protocols import ModelService

    def _serves(host: ModelHost) -> ModelService:
        return host
