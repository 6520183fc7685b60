"""Loading a model's tokenizer, stop ids and checkpoints for the embedded engine.

Split out of `engine.py` so the scheduler module holds only the scheduler.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

log = logging.getLogger(__name__)

__all__ = ["eos_ids", "load_state_dict_checked", "read_checkpoint", "try_load_tokenizer"]

_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "tokenizer.model")


def try_load_tokenizer(path: str | Path) -> Any:
    """The tokenizer saved next to the model, or None.

    A directory without tokenizer files gives None: transformers would otherwise build an
    empty tokenizer from the config's model type (vocab of 1), and stop strings would then
    be matched against meaningless text.
    """
    if Path(path).is_dir() and not any((Path(path) / f).exists() for f in _TOKENIZER_FILES):
        log.info("no tokenizer files in %s; stop strings are unavailable", path)
        return None
    try:
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(str(path))
    except Exception as err:  # noqa: BLE001 - a model dir without tokenizer files is legitimate
        log.info("no tokenizer at %s (%s); stop strings are unavailable", path, type(err).__name__)
        return None


def eos_ids(model: Any, tokenizer: Any) -> list[int]:
    """The ids that end a generation by default: generation_config, else config, else tokenizer."""
    for src in (getattr(model, "generation_config", None), model.config):
        eos = getattr(src, "eos_token_id", None) if src is not None else None
        if eos is not None:
            return [int(e) for e in (eos if isinstance(eos, (list, tuple)) else [eos])]
    if tokenizer is not None and getattr(tokenizer, "eos_token_id", None) is not None:
        return [int(tokenizer.eos_token_id)]
    return []


def read_checkpoint(path: Path, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """State dict from a safetensors file or a save_pretrained directory (sharded or not)."""
    from safetensors.torch import load_file

    if path.is_file():
        files = [path]
    elif path.is_dir():
        files = sorted(path.glob("*.safetensors"))
    else:
        raise FileNotFoundError(f"no checkpoint at {path}")
    if not files:
        from transformers import AutoModelForCausalLM  # e.g. a pytorch_model.bin checkpoint

        return AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype).state_dict()
    sd: dict[str, torch.Tensor] = {}
    for f in files:
        sd.update(load_file(str(f)))
    return sd


def load_state_dict_checked(model: torch.nn.Module, state_dict: Mapping[str, torch.Tensor]) -> None:
    """Copy `state_dict` into `model`; tied parameters may be absent (saved once), anything else is an error."""
    result = model.load_state_dict(dict(state_dict), strict=False)
    if result.unexpected_keys:
        raise ValueError(f"weights have keys the model does not: {sorted(result.unexpected_keys)[:5]}")
    if result.missing_keys:
        params = dict(model.named_parameters(remove_duplicate=False))
        loaded_ptrs = {params[k].data_ptr() for k in state_dict if k in params}
        missing = [k for k in result.missing_keys if k not in params or params[k].data_ptr() not in loaded_ptrs]
        if missing:
            raise ValueError(f"weights lack keys the model needs: {sorted(missing)[:5]}")
