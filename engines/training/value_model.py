"""The critic: a causal LM's backbone with a scalar value head, trained by the packed engine.

`ValueModel` is the backbone of the actor's architecture (loaded from the same HF directory
with `AutoModelForCausalLM`, whose LM head is dropped) plus `value_head`, a Linear(hidden, 1).
`ValueEngine` is the training engine (engines/training/train_engine.py) around it: the same planner,
the same padding-free rows (`row_layout`: position_ids restart per sequence,
use_cache=False), the same optimizer, data parallelism and checkpoint code. Only what one
forward yields differs: a value per token instead of a log-prob.

Alignment (what `nodes/advantages.py` `gae` expects): a generated token t is the action taken
in state s_t = tokens[:t], and GAE computes delta_t = r_t + gamma * V(s_next) - V(s_t) with
V(s_t) stored at position t. So **position t holds V(s_t) = V(tokens < t)**, read off the
hidden state at position t - 1, the same shift as a per-token log-prob (position t holds
log p(token t | tokens < t)); position 0 of every sequence has no state before it and holds
0. The value of the final state (after the last token) is never computed: GAE treats it as
terminal (0).

The head starts at zero (weight and bias): the first values are exactly 0, so the first GAE
advantages are the Monte-Carlo returns rather than returns minus a random baseline, and every
data-parallel replica starts identical without depending on the seed.

A checkpoint's `model/` directory holds the backbone as `save_pretrained` writes it (config
and safetensors; `AutoModel` loads it) plus `value_head.safetensors`; `ValueModel.from_pretrained`
loads either that or a causal LM directory (fresh zero head), so a trained critic can also
warm-start another run.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from transformers.modeling_outputs import TokenClassifierOutput

from areal_graph.data.packed import PackedBatch
from areal_graph.engines.training.packed_scoring import row_layout
from areal_graph.engines.training.train_engine import TrainEngine, read_safetensors_dir

log = logging.getLogger(__name__)

VALUE_HEAD_FILE = "value_head.safetensors"
_BACKBONE = "model."  # state-dict prefix of the backbone, as in HF CausalLMs
_HEAD = "value_head."


class ValueModel(torch.nn.Module):
    """Backbone + Linear(hidden, 1): per-position values of a token sequence.

    The backbone sits at `.model`, where HF CausalLMs keep theirs, so the backbone's
    state-dict keys match the causal LM's and FSDP's per-layer sharding (`model.model.layers`,
    engines/training/data_parallel.py) applies unchanged. `forward` returns the values as the `logits`
    ([batch, width, 1]) of a `TokenClassifierOutput`, HF's form for a one-label per-token
    regression, so code that runs a forward and touches `.logits` works on both kinds.
    """

    def __init__(self, backbone: torch.nn.Module) -> None:
        super().__init__()
        self.model = backbone
        self.config = backbone.config
        param = next(backbone.parameters())
        self.value_head = torch.nn.Linear(backbone.config.hidden_size, 1, dtype=param.dtype, device=param.device)
        torch.nn.init.zeros_(self.value_head.weight)
        torch.nn.init.zeros_(self.value_head.bias)

    @classmethod
    def from_pretrained(cls, path: str | Path, dtype: torch.dtype = torch.float32) -> ValueModel:
        """A critic directory (backbone + `value_head.safetensors`), or a causal LM directory
        whose LM head is dropped and replaced by a zero value head."""
        path = Path(path)
        if (path / VALUE_HEAD_FILE).exists():
            from safetensors.torch import load_file
            from transformers import AutoModel

            model = cls(AutoModel.from_pretrained(str(path), dtype=dtype))
            model.value_head.load_state_dict(load_file(str(path / VALUE_HEAD_FILE)))
            return model
        from transformers import AutoModelForCausalLM

        lm = AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype)
        return cls(lm.base_model)

    def forward(
        self, input_ids: torch.Tensor, position_ids: torch.Tensor | None = None, use_cache: bool = False, **kwargs: Any
    ) -> TokenClassifierOutput:
        hidden = self.model(
            input_ids=input_ids, position_ids=position_ids, use_cache=use_cache, **kwargs
        ).last_hidden_state
        return TokenClassifierOutput(logits=self.value_head(hidden))

    def tie_weights(self) -> None:
        """Nothing to tie (the engine re-ties a CausalLM's LM head after loading weights)."""

    def save_pretrained(
        self, path: str | Path, safe_serialization: bool = True, state_dict: dict[str, torch.Tensor] | None = None
    ) -> None:
        """Backbone via its own `save_pretrained`, head as `value_head.safetensors`.

        `state_dict` (full keys, e.g. gathered from FSDP shards) replaces the live weights."""
        from safetensors.torch import save_file

        path = Path(path)
        state = self.state_dict() if state_dict is None else state_dict
        backbone = {k[len(_BACKBONE) :]: v for k, v in state.items() if k.startswith(_BACKBONE)}
        head = {k[len(_HEAD) :]: v.detach().to("cpu").contiguous() for k, v in state.items() if k.startswith(_HEAD)}
        self.model.save_pretrained(path, safe_serialization=safe_serialization, state_dict=backbone)
        save_file(head, str(path / VALUE_HEAD_FILE))

    @staticmethod
    def read_weights(path: str | Path) -> dict[str, torch.Tensor]:
        """The full state dict (`model.*`, `value_head.*`) that `save_pretrained` wrote."""
        from safetensors.torch import load_file

        path = Path(path)
        state = {_BACKBONE + k: v for k, v in read_safetensors_dir(path).items()}
        state.update({_HEAD + k: v for k, v in load_file(str(path / VALUE_HEAD_FILE)).items()})
        return state


def rows_values(model: torch.nn.Module, batch: PackedBatch, rows: list[list[int]]) -> torch.Tensor:
    """Per-token values V(tokens < t) at position t from ONE forward over `rows` (sequence
    indices per row), fp32; position 0 of every sequence, and sequences not in `rows`, hold 0.
    The same packed layout and shift as `rows_logprobs`."""
    device = next(model.parameters()).device
    out = torch.zeros(batch.num_tokens, device=device, dtype=torch.float32)
    layout = row_layout(batch, rows, device)
    if layout is None:
        return out
    values = model(input_ids=layout.input_ids, position_ids=layout.position_ids, use_cache=False).logits
    return out.index_put((layout.dst,), values[layout.pred_row, layout.pred_col, 0].float())


class ValueEngine(TrainEngine):
    """The training engine with a `ValueModel`: `compute_values` instead of log-probs, and the
    loss callback of `train_step` receives the live values (entropy: None).

    `model` is a directory (see `ValueModel.from_pretrained`) or a ValueModel; every other
    argument is TrainEngine's.
    """

    def __init__(self, model: str | Path | ValueModel, *, dtype: torch.dtype = torch.float32, **kwargs: Any) -> None:
        if isinstance(model, (str, Path)):
            model = ValueModel.from_pretrained(model, dtype=dtype)
        if not isinstance(model, ValueModel):
            raise TypeError(f"ValueEngine needs a ValueModel or a model directory, got {type(model).__name__}")
        super().__init__(model, dtype=dtype, **kwargs)

    @torch.no_grad()
    def compute_values(self, batch: PackedBatch, max_tokens_per_mb: int = 8192) -> torch.Tensor:
        """Per-token values of the batch (see the module docstring for the alignment)."""
        return self._per_token(batch, max_tokens_per_mb, lambda mb, rows: rows_values(self.model, mb, rows))

    def compute_logprobs(
        self, batch: PackedBatch, max_tokens_per_mb: int = 8192, temperature: float = 1.0
    ) -> torch.Tensor:
        raise TypeError("a critic has no log-probs: it is a value model (use compute_values)")

    def _train_forward(self, mb: PackedBatch, rows: list[list[int]], temperature: float) -> tuple[torch.Tensor, None]:
        return rows_values(self._forward, mb, rows), None

    def _read_weights(self, model_dir: Path) -> dict[str, torch.Tensor]:
        return ValueModel.read_weights(model_dir)


if TYPE_CHECKING:  # the type checker holds the critic to what a model host drives (tests/test_types.py)
    from areal_graph.engines.training.protocol import ValueTrainingEngine

    def _implements(engine: ValueEngine) -> ValueTrainingEngine:
        return engine
