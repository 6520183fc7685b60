"""Which models the lean forwards may run: `family_reason` on tiny configs of several families.

One rule decides it for both the inference and the training lean forward, so a model it
admits wrongly is computed wrongly in both places, silently. Checked here: each admitted
family and rope type gives None *and* its lean logits equal HF's (the rule's promise that
a precomputed rotary table is exact), each excluded configuration is named in the reason,
and both forwards refuse for the same reason. Configs are built locally at tiny sizes with
transformers' config classes; nothing is downloaded.
"""

from __future__ import annotations

import pytest
import torch
from transformers import (
    LlamaConfig,
    LlamaForCausalLM,
    MistralConfig,
    MistralForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
)

from areal_graph.engines.inference.lean_forward import LeanForward
from areal_graph.engines.inference.lean_forward import unsupported_reason as inference_reason
from areal_graph.engines.lean_family import STATIC_ROPE, SUPPORTED, family_reason
from areal_graph.engines.training.lean_train import unsupported_reason as training_reason

COMMON = dict(
    vocab_size=48,
    hidden_size=32,
    intermediate_size=48,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=64,
)
FAMILY = sorted(SUPPORTED)


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def build(model_cls, config_cls, **overrides):
    torch.manual_seed(0)
    model = model_cls(config_cls(**{**COMMON, **overrides})).eval()
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():  # weights far from init's std 0.02, so a wrong rotary table shows in the logits
        for name, p in model.named_parameters():
            if "norm" not in name:
                p.copy_(0.2 * torch.randn(p.shape, generator=g))
    return model


def llama_rope(rope_scaling: dict):
    return build(LlamaForCausalLM, LlamaConfig, rope_scaling=rope_scaling)


IN_FAMILY = {
    "qwen2": lambda: build(Qwen2ForCausalLM, Qwen2Config),
    "qwen3": lambda: build(Qwen3ForCausalLM, Qwen3Config, head_dim=12),
    "llama": lambda: build(LlamaForCausalLM, LlamaConfig, tie_word_embeddings=False),
    "llama-rope-linear": lambda: llama_rope({"rope_type": "linear", "factor": 2.0}),
    "llama-rope-yarn": lambda: llama_rope({"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16}),
    "llama-rope-llama3": lambda: llama_rope(
        {
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 16,
        }
    ),
    "qwen2-sliding-window-off": lambda: build(
        Qwen2ForCausalLM, Qwen2Config, use_sliding_window=False, sliding_window=4
    ),
}


def test_the_family_and_its_static_rope_types():
    assert SUPPORTED == {"Qwen2ForCausalLM", "Qwen3ForCausalLM", "LlamaForCausalLM"}
    assert STATIC_ROPE == {"default", "linear", "llama3", "yarn"}


@pytest.mark.parametrize("name", list(IN_FAMILY))
def test_admitted_models_run_exactly_on_the_lean_forward(name):
    model = IN_FAMILY[name]()
    assert family_reason(model) is None
    assert inference_reason(model) is None and training_reason(model) is None
    g = torch.Generator().manual_seed(2)
    ids = torch.randint(0, COMMON["vocab_size"], (2, 40), generator=g)  # past a scaled rope's original length
    with torch.no_grad():
        ref = model(input_ids=ids).logits[:, -1]
        logits, _, _ = LeanForward(model).prefill(ids, torch.tensor([40, 40]))
    assert (logits - ref).abs().max() < 1e-4


def test_another_architecture_is_named_with_the_family():
    mistral = build(MistralForCausalLM, MistralConfig)
    assert family_reason(mistral) == f"architecture MistralForCausalLM is not in the lean family {FAMILY}"
    # the architecture is what is reported even when its configuration would be excluded too
    assert family_reason(build(MistralForCausalLM, MistralConfig, hidden_act="gelu")).startswith(
        "architecture MistralForCausalLM"
    )


@pytest.mark.parametrize(
    "make, reason",
    [
        (
            lambda: build(
                Qwen2ForCausalLM, Qwen2Config, use_sliding_window=True, sliding_window=8, max_window_layers=1
            ),
            "sliding-window layers",
        ),
        (
            lambda: build(
                Qwen3ForCausalLM, Qwen3Config, layer_types=["full_attention", "sliding_attention"], sliding_window=8
            ),
            "sliding-window layers",
        ),
        (lambda: build(Qwen2ForCausalLM, Qwen2Config, hidden_act="gelu"), "MLP activation 'gelu'"),
        (lambda: build(LlamaForCausalLM, LlamaConfig, hidden_act="relu"), "MLP activation 'relu'"),
        (lambda: build(LlamaForCausalLM, LlamaConfig, pretraining_tp=2), "pretraining_tp > 1"),
        (
            lambda: llama_rope({"rope_type": "dynamic", "factor": 2.0}),
            "rope type 'dynamic' (its frequencies change with the sequence length)",
        ),
        (
            lambda: llama_rope(
                {
                    "rope_type": "longrope",
                    "short_factor": [1.0] * 4,
                    "long_factor": [2.0] * 4,
                    "original_max_position_embeddings": 16,
                }
            ),
            "rope type 'longrope'",
        ),
    ],
    ids=["qwen2-sliding-layers", "qwen3-layer-types", "gelu", "relu", "pretraining-tp", "dynamic-rope", "longrope"],
)
def test_excluded_configurations_are_named(make, reason):
    model = make()
    got = family_reason(model)
    assert got is not None and got.startswith(reason), got
    assert inference_reason(model) == got and training_reason(model) == got


def test_sliding_window_flag_alone_excludes_a_model():
    """A config asking for sliding windows but listing no sliding layer is refused all the same."""
    model = build(Qwen2ForCausalLM, Qwen2Config)
    model.config.use_sliding_window = True
    model.config.layer_types = None
    assert family_reason(model) == "sliding-window attention"


def test_configs_without_the_optional_fields_default_to_admitted():
    model = build(LlamaForCausalLM, LlamaConfig)
    for field in ("layer_types", "use_sliding_window", "pretraining_tp"):
        if hasattr(model.config, field):
            delattr(model.config, field)
    assert family_reason(model) is None
    model.config.pretraining_tp = None
    assert family_reason(model) is None
