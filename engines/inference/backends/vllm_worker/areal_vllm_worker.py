"""A vLLM worker extension (`--worker-extension-cls areal_vllm_worker.ArealWorkerExtension`).

It runs in vLLM's interpreter, which need not have areal-graph installed: this directory is put
on the server's PYTHONPATH and this file imports nothing of ours. Keep it standalone.

Why it exists: vLLM 0.32's in-place `reload_weights` rebuilds the input embedding's parameter,
and a model with tied word embeddings (Qwen2 0.5B-3B, our tiny kits) keeps decoding with the
*old* output head: the tie is lost (and on CPU the head's GEMM keeps a packed copy of the old
weight). `reload_weights_tied` reloads, then ties the head to the new embedding again. Found by
tests/engines/inference/backends/test_vllm_backend.py: the log-probs after an update matched
"new body, old head" to 2e-6 and the new model only to 3e-2.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import torch

log = logging.getLogger(__name__)


class ArealWorkerExtension:
    """Mixed into vLLM's worker class; `self` is the worker (it has `reload_weights` and `model_runner`)."""

    if TYPE_CHECKING:  # what vLLM's worker brings, for the type checker
        model_runner: Any

        def reload_weights(self, weights_path: str | None = None, weights_iterator: Any = None) -> None: ...

    def reload_weights_tied(self, weights_path: str) -> bool:
        """Load the safetensors in `weights_path` in place; restore a tied output head. True if it was tied."""
        self.reload_weights(weights_path=weights_path)
        return retie_output_head(self.model_runner.get_model())

    def load_weights_from_shared_memory(self, path: str, manifest: list) -> bool:
        """Load the weights a trainer on this machine published into the file at `path`
        (areal-graph's engines/shared_weights.py layout: `manifest` gives each tensor's name,
        dtype, shape and byte offset), in place, then restore a tied output head."""
        self.reload_weights(weights_iterator=iter(read_shared_weights(path, manifest)))
        return retie_output_head(self.model_runner.get_model())


def read_shared_weights(path: str, manifest: list) -> list:
    """(name, tensor) views of the shared file, one per manifest entry (no copies)."""
    end = max((int(e["offset"]) + int(e["nbytes"]) for e in manifest), default=1)
    buf = torch.from_file(path, shared=True, size=end, dtype=torch.uint8)
    out = []
    for e in manifest:
        dtype = getattr(torch, str(e["dtype"]), None)
        if not isinstance(dtype, torch.dtype):
            raise ValueError(f"manifest entry {e['name']!r}: unknown dtype {e['dtype']!r}")
        raw = buf[int(e["offset"]) : int(e["offset"]) + int(e["nbytes"])]
        out.append((str(e["name"]), raw.view(dtype).view(tuple(e["shape"]))))
    return out


def retie_output_head(model: torch.nn.Module) -> bool:
    """Point the output head at the (reloaded) input embedding again and redo its post-load
    processing: on CPU that packs the weight for the GEMM kernel, so the head keeps computing
    with the old weights until it is redone."""
    config = getattr(model, "config", None)
    get_text_config = getattr(config, "get_text_config", None)
    text_config = get_text_config() if callable(get_text_config) else config
    if not getattr(text_config, "tie_word_embeddings", False):
        return False
    head = getattr(model, "lm_head", None)
    embed = getattr(getattr(model, "model", None), "embed_tokens", None)
    head_weight, embed_weight = getattr(head, "weight", None), getattr(embed, "weight", None)
    if (
        head is None
        or not isinstance(head_weight, torch.nn.Parameter)
        or not isinstance(embed_weight, torch.nn.Parameter)
        or head_weight.shape != embed_weight.shape
    ):
        log.warning("tied word embeddings, but no lm_head / model.embed_tokens pair of one shape to re-tie")
        return False
    head.weight = embed_weight
    method = getattr(head, "quant_method", None)
    if method is not None and hasattr(method, "process_weights_after_loading"):
        method.process_weights_after_loading(head)
    return True
