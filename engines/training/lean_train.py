"""A lean training forward for the Qwen2 / Qwen3 / Llama family: no padding in the linear layers.

Why: the HF forward over packed rows pays for every padded position in every linear layer,
and without a variable-length attention kernel on CPU it computes attention over whole rows
(width^2 per row, a block-diagonal mask, most of it thrown away). This forward keeps the
micro-batch as one flat stream of token positions for everything but attention:
embeddings, RMSNorm, rotary, the projections, the MLP and the LM head see each position
exactly once. Only attention needs sequences side by side: keys and values of each sequence
are gathered into right-padded blocks (sequences of similar length share a block) and run
through `F.scaled_dot_product_attention`, causal without any mask where a sequence queries
all its positions: a real token never sees the padding after it, and padded queries'
outputs are dropped.

Savings on top of "no padding", all exact (see `StreamLayout`):
- common prefixes (GRPO: the prompt, repeated for each of its answers, and answers that
  begin alike) are one stretch of the stream, computed once; attention queries each
  position once, from the sequence that owns it (a bottom-right causal mask for a sequence
  that owns only its tail);
- the last layer's o_proj, MLP, the final norm and the LM head run only at the positions
  whose next token is scored (`keep`): every other position's last-layer output feeds
  nothing (keys and values of the last layer are still computed everywhere).

It reads the HF model's own parameters on every call (no copy kept), so optimizer steps and
`load_state_dict` are seen at once, and gradients land in the model's `.grad` as usual.
Numerics follow HF's fp32 path op for op (RMSNorm in fp32, rotate-half rotary, scale
1/sqrt(head_dim), the embedding module with its padding_idx); tests/engines/training/test_lean_train.py
compares log-probs and gradients with the HF forward and a float64 loop. Anything outside
the family (sliding windows, other activations, rope types whose frequencies depend on the
length, non-Linear projections, training mode, i.e. dropout) is reported by
`unsupported_reason` and the engine keeps the HF forward.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from areal_graph.engines.lean_family import family_reason

__all__ = ["AttnBlock", "LeanTrainForward", "StreamLayout", "stream_layout", "unsupported_reason"]

_LINEARS = {"self_attn": ("q_proj", "k_proj", "v_proj", "o_proj"), "mlp": ("gate_proj", "up_proj", "down_proj")}

# A new attention block starts when a sequence is shorter than this share of the block's
# width: attention over a padded block costs width^2 per sequence, so a sequence 3/4 as long
# as the widest wastes ~44% of its attention, while every extra block is one more (small)
# SDPA call per layer, forward and backward.
BUCKET_RATIO = 0.75


def unsupported_reason(model: Any) -> str | None:
    """Why the lean training forward cannot run `model` (None when it can)."""
    reason = family_reason(model)
    if reason is not None:
        return reason
    if type(getattr(model.model, "embed_tokens", None)) is not torch.nn.Embedding:
        return "embed_tokens is not a plain Embedding"
    for layer in model.model.layers:
        for block, parts in _LINEARS.items():
            for part in parts:
                if type(getattr(getattr(layer, block), part, None)) is not torch.nn.Linear:
                    return f"{block}.{part} is not a plain Linear"
        a, m = layer.self_attn, layer.mlp
        # q, k, v (and gate, up) run as one matmul: they must agree on having a bias
        if len({a.q_proj.bias is None, a.k_proj.bias is None, a.v_proj.bias is None}) > 1:
            return "q/k/v projections disagree on bias"
        if len({m.gate_proj.bias is None, m.up_proj.bias is None}) > 1:
            return "gate/up projections disagree on bias"
    if type(getattr(model, "lm_head", None)) is not torch.nn.Linear:
        return "lm_head is not a plain Linear"
    if model.training:
        return "model is in training mode (dropout)"
    return None


@dataclass
class AttnBlock:
    """`n` sequences side by side for one attention call: their keys right-padded to
    `key_width`, the queries they own right-padded to `query_width`. `mask` [n, 1, queries,
    keys] (None: plain causal, every sequence owns all its queries) lets query i of sequence s
    see keys 0 .. first_s + i, where first_s is the position of its first owned query."""

    n: int
    key_width: int
    query_width: int
    mask: torch.Tensor | None


@dataclass
class StreamLayout:
    """A micro-batch as the lean forward runs it: a flat stream of distinct token positions,
    and where they go for attention.

    With `share_prefixes`, sequences that start with the same tokens (the answers of one
    prompt in GRPO, answers that begin alike, a common chat template) hold that common prefix
    once in the stream: a causal model gives every position of a shared prefix the same
    hidden states in each of those sequences, so computing it once is exact, and autograd
    sums the gradients the copies would have received.

    Attention: every sequence's keys and values are gathered into right-padded blocks
    (`key_gather`: stream position per key slot; padding reads position 0, which no real
    query sees), but each stream position is queried once, by the sequence that owns it (the
    first, in lexicographic order, to contain it): a sequence's owned positions are the tail
    after its shared prefix (`query_gather`, and `scatter` maps each stream position back to
    its query slot). Sequences owning nothing (exact duplicates) take no part.
    """

    input_ids: torch.Tensor  # [D] token of each stream position
    positions: torch.Tensor  # [D] its position inside its sequence(s)
    token_index: torch.Tensor  # [N] stream position of every packed token of the micro-batch
    key_gather: torch.Tensor  # [key slots] stream position in each key slot
    query_gather: torch.Tensor  # [query slots] stream position in each query slot
    scatter: torch.Tensor  # [D] the query slot of each stream position
    blocks: list[AttnBlock]


def _stream_index(seqs: list[list[int]], share_prefixes: bool) -> tuple[list[list[int]], list[int], int]:
    """Stream position of every token of every sequence, how many leading tokens each shares
    with a sequence before it, and the stream length. Sharing: in lexicographic order, a
    sequence's first LCP(previous, it) tokens reuse the previous one's positions (sequences
    sharing a prefix are contiguous in that order); its other tokens get new positions."""
    index: list[list[int]] = [[] for _ in seqs]
    shared_of = [0] * len(seqs)
    next_pos, prev = 0, None
    order = sorted(range(len(seqs)), key=lambda i: seqs[i]) if share_prefixes else range(len(seqs))
    for i in order:
        seq, shared = seqs[i], 0
        if share_prefixes and prev is not None:
            other = seqs[prev]
            limit = min(len(seq), len(other))
            while shared < limit and seq[shared] == other[shared]:
                shared += 1
        n_new = len(seq) - shared
        own = list(range(next_pos, next_pos + n_new))
        index[i] = index[prev][:shared] + own if shared and prev is not None else own
        shared_of[i] = shared
        next_pos += n_new
        prev = i
    return index, shared_of, next_pos


def _group_spans(spans: list[tuple[int, int, int]], ratio: float) -> list[list[tuple[int, int, int]]]:
    """Spans (sequence, first owned, length) in blocks: longest first, a new block when a
    sequence is shorter than `ratio` x the block's widest."""
    groups: list[list[tuple[int, int, int]]] = []
    for span in sorted(spans, key=lambda sp: (-sp[2], sp[0])):
        if not groups or span[2] < ratio * groups[-1][0][2]:
            groups.append([])
        groups[-1].append(span)
    return groups


def _attention_plan(
    index: list[list[int]], shared_of: list[int], n_stream: int, ratio: float, device: torch.device
) -> tuple[list[int], list[int], torch.Tensor, list[AttnBlock]]:
    """Key and query gathers, the scatter and the blocks of `StreamLayout`. Sequences owning all
    their positions run in plain causal blocks; those owning a tail, in masked ones."""
    spans = [(i, shared_of[i], len(ix)) for i, ix in enumerate(index) if len(ix) > shared_of[i]]
    key_gather: list[int] = []
    query_gather: list[int] = []
    scatter = [0] * n_stream
    blocks: list[AttnBlock] = []
    for causal in (True, False):
        for group in _group_spans([sp for sp in spans if (sp[1] == 0) == causal], ratio):
            kw = max(length for _, _, length in group)
            qw = max(length - first for _, first, length in group)
            for i, first, length in group:
                ix = index[i]
                for t, pos in enumerate(ix[first:]):
                    scatter[pos] = len(query_gather) + t
                key_gather += ix + [0] * (kw - length)
                query_gather += ix[first:] + [0] * (qw - length + first)
            mask = None
            if not causal:
                firsts = torch.tensor([first for _, first, _ in group])
                mask = torch.arange(kw).view(1, 1, kw) <= firsts.view(-1, 1, 1) + torch.arange(qw).view(1, qw, 1)
                mask = mask.unsqueeze(1).to(device)
            blocks.append(AttnBlock(len(group), kw, qw, mask))
    return key_gather, query_gather, torch.tensor(scatter, dtype=torch.int64), blocks


def stream_layout(
    input_ids: torch.Tensor,
    cu_seqlens: list[int],
    device: torch.device,
    share_prefixes: bool = True,
    ratio: float = BUCKET_RATIO,
) -> StreamLayout:
    """The `StreamLayout` of the packed sequences `input_ids` (offsets `cu_seqlens`)."""
    flat = input_ids.tolist()
    seqs = [flat[cu_seqlens[i] : cu_seqlens[i + 1]] for i in range(len(cu_seqlens) - 1)]
    index, shared_of, n_stream = _stream_index(seqs, share_prefixes)
    key_gather, query_gather, scatter, blocks = _attention_plan(index, shared_of, n_stream, ratio, device)
    token_index = torch.tensor([p for ix in index for p in ix], dtype=torch.int64)
    positions = torch.tensor([t for ix in index for t in range(len(ix))], dtype=torch.int64)
    stream_ids = torch.zeros(n_stream, dtype=torch.int64).index_put_(
        (token_index,), torch.tensor(flat, dtype=torch.int64)
    )
    stream_pos = torch.zeros(n_stream, dtype=torch.int64).index_put_((token_index,), positions)
    as_index = lambda xs: torch.tensor(xs, dtype=torch.int64, device=device)  # noqa: E731
    return StreamLayout(
        stream_ids.to(device),
        stream_pos.to(device),
        token_index.to(device),
        as_index(key_gather),
        as_index(query_gather),
        scatter.to(device),
        blocks,
    )


def _lin(m: torch.nn.Linear) -> tuple[torch.Tensor, torch.Tensor | None]:
    return m.weight, m.bias


def _cat_bias(*biases: torch.Tensor | None) -> torch.Tensor | None:
    return None if biases[0] is None else torch.cat(biases)


def _eps(norm: Any, default: float = 1e-6) -> float:
    return float(getattr(norm, "variance_epsilon", getattr(norm, "eps", default)))


class LeanTrainForward:
    """Hidden states and logits of a supported HF CausalLM over a flat packed stream (see the
    module docstring); differentiable, into the model's own parameters."""

    def __init__(self, model: Any) -> None:
        reason = unsupported_reason(model)
        if reason is not None:
            raise ValueError(f"lean training forward unsupported: {reason}")
        self.model = model
        cfg = model.config
        self.n_heads = int(cfg.num_attention_heads)
        self.n_kv = int(getattr(cfg, "num_key_value_heads", None) or self.n_heads)
        self.head_dim = int(getattr(cfg, "head_dim", None) or cfg.hidden_size // self.n_heads)
        self.eps = _eps(model.model.norm, float(getattr(cfg, "rms_norm_eps", 1e-6)))
        half = self.head_dim // 2
        self._sign = torch.cat([-torch.ones(half), torch.ones(self.head_dim - half)])

    @property
    def device(self) -> torch.device:
        return self.model.model.embed_tokens.weight.device

    # ---------------------------------------------------------------- pieces
    def _rope(self, positions: torch.Tensor, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sign-folded sin [N, 1, head_dim] from the model's own rotary module, so that
        ``rotate_half(x) * sin == x.roll(head_dim // 2, -1) * sin_signed`` (exact: a sign flip)."""
        cos, sin = self.model.model.rotary_emb(like, positions.unsqueeze(0))
        sign = self._sign.to(device=sin.device, dtype=sin.dtype)
        return cos[0].unsqueeze(1), (sin[0] * sign).unsqueeze(1)

    def _norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float | None = None) -> torch.Tensor:
        """HF's RMSNorm: in fp32, then the weight times the input-dtype result."""
        y = F.rms_norm(x.float(), (x.shape[-1],), None, self.eps if eps is None else eps)
        return weight * y.to(x.dtype)

    def _attention(
        self, layer: Any, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, layout: StreamLayout
    ) -> torch.Tensor:
        """Causal self-attention of each sequence, h [D, hidden] -> [D, heads * head_dim]."""
        a = layer.self_attn
        nh, nkv, d = self.n_heads, self.n_kv, self.head_dim
        qkv = F.linear(
            h,
            torch.cat([a.q_proj.weight, a.k_proj.weight, a.v_proj.weight]),
            _cat_bias(a.q_proj.bias, a.k_proj.bias, a.v_proj.bias),
        ).view(-1, nh + 2 * nkv, d)
        qk, v = qkv[:, : nh + nkv], qkv[:, nh + nkv :]
        q_norm, k_norm = getattr(a, "q_norm", None), getattr(a, "k_norm", None)
        if q_norm is not None and k_norm is not None:  # Qwen3: RMSNorm of every head before the rotary embedding
            qk = torch.cat(
                [
                    self._norm(qk[:, :nh], q_norm.weight, _eps(q_norm, self.eps)),
                    self._norm(qk[:, nh:], k_norm.weight, _eps(k_norm, self.eps)),
                ],
                1,
            )
        qk = torch.addcmul(qk * cos, qk.roll(d // 2, -1), sin)
        q, k = qk.split([nh, nkv], 1)
        keys = torch.cat([k, v], 1)[layout.key_gather]
        queries = q[layout.query_gather]
        # split, not slicing: the backward of a split is one cat, while every slice's backward
        # would zero-fill a gradient the size of the whole buffer
        blocks = layout.blocks
        if len(blocks) > 1:
            keys = keys.split([b.n * b.key_width for b in blocks])
            queries = queries.split([b.n * b.query_width for b in blocks])
        else:
            keys, queries = (keys,), (queries,)
        outs = []
        for kb, qb, b in zip(keys, queries, blocks):
            kk, vv = kb.view(b.n, b.key_width, 2 * nkv, d).transpose(1, 2).split([nkv, nkv], dim=1)
            qq = qb.view(b.n, b.query_width, nh, d).transpose(1, 2)
            o = F.scaled_dot_product_attention(
                qq, kk, vv, attn_mask=b.mask, is_causal=b.mask is None, scale=d**-0.5, enable_gqa=nkv != nh
            )
            outs.append(o.transpose(1, 2).reshape(b.n * b.query_width, nh * d))
        out = outs[0] if len(outs) == 1 else torch.cat(outs)
        return out[layout.scatter]

    def _mlp(self, layer: Any, x: torch.Tensor) -> torch.Tensor:
        m = layer.mlp
        h = self._norm(x, layer.post_attention_layernorm.weight)
        gate_up = F.linear(
            h, torch.cat([m.gate_proj.weight, m.up_proj.weight]), _cat_bias(m.gate_proj.bias, m.up_proj.bias)
        )
        gate, up = gate_up.chunk(2, dim=-1)
        return x + F.linear(F.silu(gate) * up, *_lin(m.down_proj))

    # ---------------------------------------------------------------- entry points
    def hidden(self, layout: StreamLayout, keep: torch.Tensor | None = None) -> torch.Tensor:
        """Final (normed) hidden states of the stream of `layout` at stream positions `keep`
        (None: all), [len(keep), hidden]."""
        inner = self.model.model
        x = inner.embed_tokens(layout.input_ids)  # the module: its padding_idx row gets no gradient, as in HF
        cos, sin = self._rope(layout.positions, x)
        layers = inner.layers
        for i, layer in enumerate(layers):
            h = self._norm(x, layer.input_layernorm.weight)
            attn = self._attention(layer, h, cos, sin, layout)
            if i == len(layers) - 1 and keep is not None:  # only these positions feed the head
                attn, x = attn[keep], x[keep]
            x = x + F.linear(attn, *_lin(layer.self_attn.o_proj))
            x = self._mlp(layer, x)
        return self._norm(x, inner.norm.weight)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """The LM head (tied or not) on final hidden states."""
        return F.linear(hidden, *_lin(self.model.lm_head))
