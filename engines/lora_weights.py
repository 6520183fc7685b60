"""LoRA weights between the trainer and the inference engine.

The trainer holds the model wrapped by peft (frozen base, trainable adapters A and B on the
target modules). What crosses to the inference side each step is either the merged weights
(HF names and layout: every backend loads them) or, with `lora.sync: adapter`, the adapters
alone: `<module>.lora_A.weight`, `<module>.lora_B.weight` for each adapted module (HF module
paths of the plain model) and `lora.scaling` (alpha / r). The engine keeps its base weights of
those modules as they were before the first adapter arrived and sets each to
W0 + scaling * (B @ A): megabytes per step instead of the whole model, and the same weights the
merged sync would give, to float rounding.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

SCALING_KEY = "lora.scaling"
_A, _B = ".lora_A.weight", ".lora_B.weight"


def attach_lora(model: torch.nn.Module, r: int, alpha: int, dropout: float, target_modules: list[str]) -> Any:
    """`model` wrapped by peft with LoRA adapters on `target_modules` (B starts at 0: the
    wrapped model computes exactly what `model` did)."""
    try:
        from peft import LoraConfig, get_peft_model
    except ImportError as err:
        raise ImportError("models.<name>.lora needs peft (pip install peft)") from err
    config = LoraConfig(r=r, lora_alpha=alpha, lora_dropout=dropout, target_modules=list(target_modules), bias="none")
    wrapped = get_peft_model(model, config)
    if not any(".lora_A." in name for name, _ in wrapped.named_parameters()):
        raise ValueError(f"lora.target_modules {list(target_modules)} match no module of the model")
    return wrapped


def _adapted(peft_model: Any) -> list[tuple[str, Any]]:
    """(HF module path, peft LoRA layer) for every adapted module."""
    base = peft_model.get_base_model()
    return [
        (name, module)
        for name, module in base.named_modules()
        if hasattr(module, "lora_A") and "default" in getattr(module, "lora_A", {})
    ]


def scaling_of(peft_model: Any) -> float:
    layers = _adapted(peft_model)
    return float(layers[0][1].scaling["default"]) if layers else 1.0


def adapter_tensors(peft_model: Any) -> dict[str, torch.Tensor]:
    """The adapters (live tensors, no copy) and the scaling, in the layout described above."""
    out = {}
    for name, module in _adapted(peft_model):
        out[name + _A] = module.lora_A["default"].weight.detach()
        out[name + _B] = module.lora_B["default"].weight.detach()
    out[SCALING_KEY] = torch.tensor([scaling_of(peft_model)], dtype=torch.float32)
    return out


def merged_tensors(peft_model: Any) -> dict[str, torch.Tensor]:
    """The plain model's state dict (HF names) with every adapted weight merged: W0 + s B A."""
    base = peft_model.get_base_model()
    merged = {}
    adapted = dict(_adapted(peft_model))
    for key, value in base.state_dict().items():
        if ".lora_A." in key or ".lora_B." in key:
            continue
        if ".base_layer." in key:
            module_name = key.split(".base_layer.")[0]
            key = key.replace(".base_layer.", ".")
            if key.endswith(".weight") and module_name in adapted:
                layer = adapted[module_name]
                value = value + layer.scaling["default"] * (
                    layer.lora_B["default"].weight @ layer.lora_A["default"].weight
                )
        merged[key] = value.detach()
    return merged


def is_adapter(state: Mapping[str, torch.Tensor]) -> bool:
    return SCALING_KEY in state


def apply_adapter(model: torch.nn.Module, base: dict[str, torch.Tensor], state: Mapping[str, torch.Tensor]) -> int:
    """Set each adapted weight of the plain `model` to W0 + scaling * (B @ A), W0 from `base`
    (filled with the model's current weights the first time a module is adapted); returns how
    many weights changed. A module the model lacks is a KeyError naming it."""
    scaling = float(state[SCALING_KEY].reshape(-1)[0])
    params = dict(model.named_parameters())
    changed = 0
    for key in state:
        if not key.endswith(_A):
            continue
        name = key[: -len(_A)]
        weight = params.get(name + ".weight")
        if weight is None:
            raise KeyError(f"adapter for {name!r}: the model has no weight {name + '.weight'!r}")
        if name not in base:
            base[name] = weight.detach().clone()
        a, b = state[key].to(weight.device, torch.float32), state[name + _B].to(weight.device, torch.float32)
        with torch.no_grad():
            weight.copy_((base[name].float() + scaling * (b @ a)).to(weight.dtype))
        changed += 1
    return changed
