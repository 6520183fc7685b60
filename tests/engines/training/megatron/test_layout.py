"""engines/training/megatron/layout.py: HF <-> Megatron GPTModel weights, exactly, and the fused
q/k/v rows in the order Megatron's attention splits them (checked against HF's own projections,
not against the inverse function). With megatron-core installed, the names and shapes match a
real GPTModel built on the CPU."""

from __future__ import annotations

import pytest
import torch

from areal_graph.engines.training.megatron import layout
from support.tiny_models import build_random_qwen2


def tiny_hf(kind: str, seed: int = 0) -> torch.nn.Module:
    """A random tiny CausalLM of `kind`: qwen2 (tied, q/k/v bias, GQA), qwen3 (untied, q/k norms,
    head_dim * heads != hidden) or llama (untied, no GQA)."""
    if kind == "qwen2":
        return build_random_qwen2(seed=seed)
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(seed)
    if kind == "qwen3":
        cfg = Qwen3Config(
            vocab_size=96,
            hidden_size=64,
            intermediate_size=96,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=32,
            max_position_embeddings=256,
            tie_word_embeddings=False,
            rope_parameters={"rope_type": "default", "rope_theta": 1e6},
        )
        model = Qwen3ForCausalLM(cfg)
    else:
        cfg = LlamaConfig(
            vocab_size=80,
            hidden_size=48,
            intermediate_size=80,
            num_hidden_layers=1,
            num_attention_heads=3,
            num_key_value_heads=3,
            max_position_embeddings=128,
            tie_word_embeddings=False,
        )
        model = LlamaForCausalLM(cfg)
    with torch.no_grad():  # norms start at 1: make them distinguishable
        for name, p in model.named_parameters():
            if "norm" in name:
                p.add_(torch.randn_like(p) * 0.1)
    return model.eval()


@pytest.mark.parametrize("kind", ["qwen2", "qwen3", "llama"])
def test_the_round_trip_is_exact_and_names_every_tensor(kind):
    model = tiny_hf(kind)
    hf = model.state_dict()
    shape = layout.shape_of(model.config)
    mg = layout.hf_to_megatron(hf, shape)
    assert {k: tuple(v.shape) for k, v in mg.items()} == layout.megatron_shapes(shape)
    back = layout.megatron_to_hf(mg, shape)
    assert set(back) == set(hf)
    for k, v in hf.items():
        assert torch.equal(back[k], v), k


@pytest.mark.parametrize("kind", ["qwen2", "qwen3"])
def test_fused_qkv_splits_into_hf_heads_the_way_megatron_splits_it(kind):
    """Megatron (transformer/attention.py get_query_key_value_tensors): view the fused output
    as [tokens, groups, (heads/groups + 2) * head_dim], split each group into its query
    heads, one key head, one value head; queries reshape to [tokens, heads, head_dim]."""
    model = tiny_hf(kind)
    s = layout.shape_of(model.config)
    attn = model.model.layers[1].self_attn
    mg = layout.hf_to_megatron(model.state_dict(), s)
    x = torch.randn(5, s.hidden)
    w = mg["decoder.layers.1.self_attention.linear_qkv.weight"]
    b = mg.get("decoder.layers.1.self_attention.linear_qkv.bias")
    mixed = x @ w.T + (b if b is not None else 0)
    per = s.heads // s.groups
    mixed = mixed.view(5, s.groups, (per + 2) * s.head_dim)
    q, k, v = torch.split(mixed, [per * s.head_dim, s.head_dim, s.head_dim], dim=2)
    q = q.reshape(5, -1, s.head_dim)
    with torch.no_grad():
        assert torch.allclose(q, attn.q_proj(x).view(5, s.heads, s.head_dim), atol=1e-6)
        assert torch.allclose(k, attn.k_proj(x).view(5, s.groups, s.head_dim), atol=1e-6)
        assert torch.allclose(v, attn.v_proj(x).view(5, s.groups, s.head_dim), atol=1e-6)


def test_fc1_is_gate_then_up_as_the_gated_mlp_chunks_it():
    model = tiny_hf("qwen2")
    s = layout.shape_of(model.config)
    mg = layout.hf_to_megatron(model.state_dict(), s)
    x = torch.randn(3, s.hidden)
    gate_out, up_out = torch.chunk(x @ mg["decoder.layers.0.mlp.linear_fc1.weight"].T, 2, dim=-1)  # megatron mlp.py glu
    y = (torch.nn.functional.silu(gate_out) * up_out) @ mg["decoder.layers.0.mlp.linear_fc2.weight"].T
    with torch.no_grad():
        assert torch.allclose(y, model.model.layers[0].mlp(x), atol=1e-6)


def test_transformer_config_follows_the_hf_config():
    q2 = layout.transformer_config_kwargs(tiny_hf("qwen2").config)
    assert (q2["num_layers"], q2["hidden_size"], q2["num_attention_heads"], q2["num_query_groups"]) == (2, 64, 4, 2)
    assert (q2["kv_channels"], q2["ffn_hidden_size"], q2["add_qkv_bias"], q2["qk_layernorm"]) == (16, 128, True, False)
    assert q2["normalization"] == "RMSNorm" and q2["hidden_dropout"] == q2["attention_dropout"] == 0.0
    q3_cfg = tiny_hf("qwen3").config
    q3 = layout.transformer_config_kwargs(q3_cfg)
    assert (q3["kv_channels"], q3["add_qkv_bias"], q3["qk_layernorm"]) == (32, False, True)
    assert q3["layernorm_epsilon"] == q3_cfg.rms_norm_eps
    g = layout.gpt_model_kwargs(q3_cfg)
    assert (g["rotary_base"], g["share_embeddings_and_output_weights"], g["vocab_size"]) == (1e6, False, 96)


@pytest.mark.parametrize(
    "change, field",
    [
        ({"model_type": "gpt2"}, "model_type"),
        ({"hidden_act": "gelu"}, "hidden_act"),
        ({"rope_parameters": {"rope_type": "llama3", "rope_theta": 5e5}}, "rope_type"),
        ({"model_type": "llama", "attention_bias": True}, "attention_bias"),
        ({"use_sliding_window": True}, "use_sliding_window"),
        ({"num_key_value_heads": 3}, "num_key_value_heads"),
    ],
)
def test_what_is_not_built_is_refused_naming_the_field(change, field):
    cfg = {**tiny_hf("qwen2").config.to_dict(), **change}
    with pytest.raises(ValueError, match=field):
        layout.shape_of(cfg)


def test_a_tensor_the_mapping_does_not_cover_is_an_error():
    model = tiny_hf("qwen2")
    state = {**model.state_dict(), "model.layers.0.self_attn.extra.weight": torch.zeros(1)}
    with pytest.raises(ValueError, match="extra"):
        layout.hf_to_megatron(state, layout.shape_of(model.config))
    state = dict(model.state_dict())
    del state["model.norm.weight"]
    with pytest.raises(KeyError, match="model.norm.weight"):
        layout.hf_to_megatron(state, layout.shape_of(model.config))


@pytest.fixture(scope="module")
def megatron_cpu():
    """megatron-core with a one-rank gloo group (its parallel state needs one), torn down after."""
    pytest.importorskip("megatron.core")
    import torch.distributed as dist
    from megatron.core import parallel_state

    from areal_graph.engines.training.megatron.engine import _free_port

    owned = not dist.is_initialized()
    if owned:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{_free_port()}", rank=0, world_size=1)
    fresh = not parallel_state.model_parallel_is_initialized()  # an engine in this process may have made them
    if fresh:
        parallel_state.initialize_model_parallel(1, 1, create_gloo_process_groups=False)
    yield
    if fresh:
        parallel_state.destroy_model_parallel()
    if owned:
        dist.destroy_process_group()


@pytest.mark.parametrize("kind", ["qwen2", "qwen3", "llama"])
def test_names_and_shapes_are_those_of_a_real_gpt_model(megatron_cpu, kind):
    from areal_graph.engines.training.megatron.engine import build_gpt_model

    cfg = tiny_hf(kind).config
    real = build_gpt_model(cfg, cpu_init=True).state_dict()
    assert {k: tuple(v.shape) for k, v in real.items() if not k.endswith("_extra_state")} == layout.megatron_shapes(
        layout.shape_of(cfg)
    )
