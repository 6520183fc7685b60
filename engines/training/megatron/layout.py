"""HF Qwen2 / Qwen3 / Llama weights <-> a Megatron-Core GPTModel built with the local spec.

Why a module of pure functions (torch only, no megatron import): the mapping is where a
silent mistake costs most (a model that loads and trains, but on scrambled heads), so it is
tested on CPU against an independent computation (tests/engines/training/megatron/
test_layout.py) on every run, and the inference side gets HF names back whatever trained.

Megatron's layout, read from megatron-core 0.16 (models/gpt/gpt_layer_specs.py
`get_gpt_layer_local_spec`, transformer/attention.py `SelfAttention`, transformer/mlp.py):

- `self_attention.linear_qkv` is q, k and v fused and **interleaved per query group**:
  `get_query_key_value_tensors` views its output as [groups, (heads/groups + 2) * head_dim]
  and splits each group into its query heads, then one key head, then one value head. HF's
  grouped-query attention gives key/value head g to query heads g*r .. g*r+r-1 (r =
  heads/groups), and Megatron's query reshape keeps that order, so group g's rows are
  [q heads of g, k head g, v head g]. The bias (Qwen2's `add_qkv_bias`) is fused the same way.
- `mlp.linear_fc1` is cat(gate, up): the gated MLP chunks fc1's output in two and applies the
  activation to the first half.
- the local spec keeps its norms apart (`input_layernorm`, `pre_mlp_layernorm`,
  `self_attention.q_layernorm` / `k_layernorm` for Qwen3's per-head norms); the TE spec
  would fuse them into the linears as `layer_norm_weight`, which this backend does not use.
- `output_layer.weight` exists only when the embeddings are not tied.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

SUPPORTED = ("qwen2", "qwen3", "llama")


@dataclass(frozen=True)
class Shape:
    """What the mapping needs to know of a model (read from its HF config by `shape_of`)."""

    num_layers: int
    hidden: int
    heads: int
    groups: int  # key/value heads (Megatron: num_query_groups)
    head_dim: int
    ffn: int
    vocab: int
    tied: bool
    qkv_bias: bool
    qk_norm: bool


def _get(cfg: Any, name: str, default: Any = None) -> Any:
    return cfg.get(name, default) if isinstance(cfg, dict) else getattr(cfg, name, default)


def rope_theta_of(cfg: Any) -> float:
    """The RoPE base; only plain RoPE is built (scaled variants would change the frequencies)."""
    params = _get(cfg, "rope_parameters") or {}
    scaling = _get(cfg, "rope_scaling") or {}
    rope_type = params.get("rope_type") or scaling.get("rope_type") or scaling.get("type") or "default"
    if rope_type != "default":
        raise ValueError(
            f"backend megatron: rope_parameters.rope_type {rope_type!r} is not built yet (plain RoPE only)"
        )
    theta = params.get("rope_theta", _get(cfg, "rope_theta"))
    if theta is None:
        raise ValueError("backend megatron: the HF config has no rope_parameters.rope_theta (or rope_theta)")
    return float(theta)


def shape_of(cfg: Any) -> Shape:
    """The shape of a supported HF config (a transformers config object or its dict); a
    ValueError naming the field for anything the mapping or the local spec cannot express."""
    kind = _get(cfg, "model_type")
    if kind not in SUPPORTED:
        raise ValueError(f"backend megatron: model_type {kind!r} is not built yet (supported: {', '.join(SUPPORTED)})")
    if _get(cfg, "hidden_act", "silu") != "silu":
        raise ValueError(f"backend megatron: hidden_act {_get(cfg, 'hidden_act')!r} is not built yet (silu only)")
    if _get(cfg, "use_sliding_window", False):
        raise ValueError("backend megatron: use_sliding_window is not built yet")
    if _get(cfg, "mlp_bias", False):
        raise ValueError("backend megatron: mlp_bias is not built yet")
    if kind != "qwen2" and _get(cfg, "attention_bias", False):  # this flag also puts a bias on o_proj
        raise ValueError(f"backend megatron: attention_bias for {kind} is not built yet")
    if float(_get(cfg, "partial_rotary_factor", 1.0) or 1.0) != 1.0:
        raise ValueError("backend megatron: partial_rotary_factor != 1 is not built yet")
    rope_theta_of(cfg)
    heads = int(_get(cfg, "num_attention_heads"))
    hidden = int(_get(cfg, "hidden_size"))
    groups = int(_get(cfg, "num_key_value_heads") or heads)
    if heads % groups:
        raise ValueError(
            f"backend megatron: num_attention_heads ({heads}) must be a multiple of num_key_value_heads ({groups})"
        )
    return Shape(
        num_layers=int(_get(cfg, "num_hidden_layers")),
        hidden=hidden,
        heads=heads,
        groups=groups,
        head_dim=int(_get(cfg, "head_dim") or hidden // heads),
        ffn=int(_get(cfg, "intermediate_size")),
        vocab=int(_get(cfg, "vocab_size")),
        tied=bool(_get(cfg, "tie_word_embeddings", False)),
        qkv_bias=kind == "qwen2",  # Qwen2 always has q/k/v biases (and none on o_proj)
        qk_norm=kind == "qwen3",
    )


def transformer_config_kwargs(cfg: Any) -> dict[str, Any]:
    """Keyword arguments of megatron's TransformerConfig for this HF config: the local
    (no Transformer Engine, no apex) implementation, no dropout (log-probs of the same
    weights must be reproducible), and every fusion off (they need kernels we do not ship)."""
    s = shape_of(cfg)
    return dict(
        num_layers=s.num_layers,
        hidden_size=s.hidden,
        num_attention_heads=s.heads,
        num_query_groups=s.groups,
        kv_channels=s.head_dim,
        ffn_hidden_size=s.ffn,
        normalization="RMSNorm",
        layernorm_epsilon=float(_get(cfg, "rms_norm_eps", 1e-6)),
        add_bias_linear=False,
        add_qkv_bias=s.qkv_bias,
        gated_linear_unit=True,
        activation_func=torch.nn.functional.silu,
        qk_layernorm=s.qk_norm,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        transformer_impl="local",
        bias_activation_fusion=False,
        masked_softmax_fusion=False,
        bias_dropout_fusion=False,
        apply_rope_fusion=False,
        persist_layer_norm=False,
        gradient_accumulation_fusion=False,
    )


def gpt_model_kwargs(cfg: Any) -> dict[str, Any]:
    """GPTModel's own arguments (besides config and layer spec) for this HF config."""
    s = shape_of(cfg)
    return dict(
        vocab_size=s.vocab,
        max_sequence_length=int(_get(cfg, "max_position_embeddings", 4096)),
        share_embeddings_and_output_weights=s.tied,
        position_embedding_type="rope",
        rotary_percent=1.0,
        rotary_base=rope_theta_of(cfg),
    )


def _layer_names(i: int) -> list[tuple[str, str]]:
    """(HF, Megatron) names of one layer's tensors that map one to one."""
    hf, mg = f"model.layers.{i}.", f"decoder.layers.{i}."
    return [
        (hf + "input_layernorm.weight", mg + "input_layernorm.weight"),
        (hf + "post_attention_layernorm.weight", mg + "pre_mlp_layernorm.weight"),
        (hf + "self_attn.o_proj.weight", mg + "self_attention.linear_proj.weight"),
        (hf + "self_attn.q_norm.weight", mg + "self_attention.q_layernorm.weight"),
        (hf + "self_attn.k_norm.weight", mg + "self_attention.k_layernorm.weight"),
        (hf + "mlp.down_proj.weight", mg + "mlp.linear_fc2.weight"),
    ]


def fuse_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, s: Shape) -> torch.Tensor:
    """HF q/k/v projections (weights [out, in] or biases [out]) -> Megatron's per-group rows."""
    rest = q.shape[1:]
    per = s.heads // s.groups
    parts = (
        q.reshape(s.groups, per, s.head_dim, *rest),
        k.reshape(s.groups, 1, s.head_dim, *rest),
        v.reshape(s.groups, 1, s.head_dim, *rest),
    )
    return torch.cat(parts, dim=1).reshape((s.heads + 2 * s.groups) * s.head_dim, *rest)


def split_qkv(qkv: torch.Tensor, s: Shape) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The inverse of `fuse_qkv` (contiguous tensors in HF's layout)."""
    rest = qkv.shape[1:]
    per = s.heads // s.groups
    q, k, v = qkv.reshape(s.groups, per + 2, s.head_dim, *rest).split([per, 1, 1], dim=1)
    return (
        q.reshape(s.heads * s.head_dim, *rest).contiguous(),
        k.reshape(s.groups * s.head_dim, *rest).contiguous(),
        v.reshape(s.groups * s.head_dim, *rest).contiguous(),
    )


def hf_to_megatron(state: dict[str, torch.Tensor], s: Shape) -> dict[str, torch.Tensor]:
    """A HF state dict (as `save_pretrained` wrote it: a tied lm_head may be absent) -> the
    GPTModel's parameter names and layout. Raises KeyError for a missing tensor and
    ValueError for a tensor nothing maps (an architecture detail this backend would drop)."""
    left = dict(state)
    out: dict[str, torch.Tensor] = {}

    def take(name: str) -> torch.Tensor:
        if name not in left:
            raise KeyError(f"backend megatron: the HF weights lack {name}")
        return left.pop(name)

    out["embedding.word_embeddings.weight"] = take("model.embed_tokens.weight")
    for i in range(s.num_layers):
        for hf, mg in _layer_names(i):
            if "_norm." in hf and not s.qk_norm:
                continue
            out[mg] = take(hf)
        a = f"model.layers.{i}.self_attn."
        out[f"decoder.layers.{i}.self_attention.linear_qkv.weight"] = fuse_qkv(
            take(a + "q_proj.weight"), take(a + "k_proj.weight"), take(a + "v_proj.weight"), s
        )
        if s.qkv_bias:
            out[f"decoder.layers.{i}.self_attention.linear_qkv.bias"] = fuse_qkv(
                take(a + "q_proj.bias"), take(a + "k_proj.bias"), take(a + "v_proj.bias"), s
            )
        m = f"model.layers.{i}.mlp."
        out[f"decoder.layers.{i}.mlp.linear_fc1.weight"] = torch.cat(
            [take(m + "gate_proj.weight"), take(m + "up_proj.weight")], dim=0
        )
    out["decoder.final_layernorm.weight"] = take("model.norm.weight")
    if s.tied:
        left.pop("lm_head.weight", None)
    else:
        out["output_layer.weight"] = take("lm_head.weight")
    if left:
        raise ValueError(f"backend megatron: HF tensors the mapping does not cover: {sorted(left)[:8]}")
    return out


def megatron_to_hf(state: dict[str, torch.Tensor], s: Shape) -> dict[str, torch.Tensor]:
    """GPTModel parameters -> HF names and layout, with every key HF's `state_dict()` has
    (a tied `lm_head.weight` is the embedding tensor itself). `_extra_state` entries (the
    local spec's empty placeholders) are skipped."""
    out: dict[str, torch.Tensor] = {"model.embed_tokens.weight": state["embedding.word_embeddings.weight"]}
    for i in range(s.num_layers):
        for hf, mg in _layer_names(i):
            if "_norm." in hf and not s.qk_norm:
                continue
            out[hf] = state[mg]
        a, mg = f"model.layers.{i}.self_attn.", f"decoder.layers.{i}."
        out[a + "q_proj.weight"], out[a + "k_proj.weight"], out[a + "v_proj.weight"] = split_qkv(
            state[mg + "self_attention.linear_qkv.weight"], s
        )
        if s.qkv_bias:
            out[a + "q_proj.bias"], out[a + "k_proj.bias"], out[a + "v_proj.bias"] = split_qkv(
                state[mg + "self_attention.linear_qkv.bias"], s
            )
        gate, up = state[mg + "mlp.linear_fc1.weight"].chunk(2, dim=0)
        out[f"model.layers.{i}.mlp.gate_proj.weight"] = gate.contiguous()
        out[f"model.layers.{i}.mlp.up_proj.weight"] = up.contiguous()
    out["model.norm.weight"] = state["decoder.final_layernorm.weight"]
    out["lm_head.weight"] = out["model.embed_tokens.weight"] if s.tied else state["output_layer.weight"]
    return out


def megatron_shapes(s: Shape) -> dict[str, tuple[int, ...]]:
    """Every GPTModel parameter name and shape this mapping produces (what the CPU test
    compares with a real GPTModel's `state_dict()`)."""
    shapes: dict[str, tuple[int, ...]] = {
        "embedding.word_embeddings.weight": (s.vocab, s.hidden),
        "decoder.final_layernorm.weight": (s.hidden,),
    }
    qkv = (s.heads + 2 * s.groups) * s.head_dim
    for i in range(s.num_layers):
        p = f"decoder.layers.{i}."
        shapes.update(
            {
                p + "input_layernorm.weight": (s.hidden,),
                p + "pre_mlp_layernorm.weight": (s.hidden,),
                p + "self_attention.linear_qkv.weight": (qkv, s.hidden),
                p + "self_attention.linear_proj.weight": (s.hidden, s.heads * s.head_dim),
                p + "mlp.linear_fc1.weight": (2 * s.ffn, s.hidden),
                p + "mlp.linear_fc2.weight": (s.hidden, s.ffn),
            }
        )
        if s.qkv_bias:
            shapes[p + "self_attention.linear_qkv.bias"] = (qkv,)
        if s.qk_norm:
            shapes[p + "self_attention.q_layernorm.weight"] = (s.head_dim,)
            shapes[p + "self_attention.k_layernorm.weight"] = (s.head_dim,)
    if not s.tied:
        shapes["output_layer.weight"] = (s.vocab, s.hidden)
    return shapes
