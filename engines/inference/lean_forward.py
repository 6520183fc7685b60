"""A lean forward pass for the Qwen2 / Qwen3 / Llama family, used by the embedded engine.

Why: on a small model every decode step is dominated by per-call overhead, not FLOPs. The
HF forward rebuilds a 4-d attention mask through `masking_utils`, wraps the batched KV
buffers in `Cache` objects, recomputes the rotary table and walks ~20 `nn.Module` calls per
layer, every step. This module runs the same maths with plain tensor ops:
RMSNorm (`F.rms_norm`), rotary embedding from a precomputed cos/sin table, GQA attention
through `F.scaled_dot_product_attention`, SwiGLU MLP and the (tied or untied) lm_head.

It reads the HF model's own parameter tensors (no copy, no fusion), so a weight update
that copies into the model (`load_state_dict`, as `EmbeddedEngine.update_weights_*` does)
is seen by the next step; `rebind()` re-reads the references for updates that replace the
parameter objects. Anything outside the supported family (other architectures, sliding
windows, dynamic rope scaling, non-SiLU MLPs, attention or norm variants) is reported by
`unsupported_reason()`, and the engine then keeps the HF forward.

Numerics follow HF's fp32 path op for op (rotate-half rotary, RMSNorm in fp32, scale
1/sqrt(head_dim)); tests compare logits against `model(...)` to ~1e-5.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from areal_graph.engines.lean_family import family_reason

__all__ = ["LeanForward", "unsupported_reason"]


def unsupported_reason(model: Any) -> str | None:
    """Why the lean forward cannot run `model` (None when it can)."""
    reason = family_reason(model)
    if reason is not None:
        return reason
    attn = model.model.layers[0].self_attn
    for part in ("q_proj", "k_proj", "v_proj", "o_proj"):
        if type(getattr(attn, part, None)) is not torch.nn.Linear:
            return f"self_attn.{part} is not a plain Linear"
    mlp = model.model.layers[0].mlp
    for part in ("gate_proj", "up_proj", "down_proj"):
        if type(getattr(mlp, part, None)) is not torch.nn.Linear:
            return f"mlp.{part} is not a plain Linear"
    if type(getattr(model, "lm_head", None)) is not torch.nn.Linear:
        return "lm_head is not a plain Linear"
    if model.training:
        return "model is in training mode"
    return None


@dataclass
class _Layer:
    """References to one decoder layer's parameter tensors (the model's own storage)."""

    ln1: torch.Tensor
    ln2: torch.Tensor
    q: tuple[torch.Tensor, torch.Tensor | None]
    k: tuple[torch.Tensor, torch.Tensor | None]
    v: tuple[torch.Tensor, torch.Tensor | None]
    o: tuple[torch.Tensor, torch.Tensor | None]
    gate: tuple[torch.Tensor, torch.Tensor | None]
    up: tuple[torch.Tensor, torch.Tensor | None]
    down: tuple[torch.Tensor, torch.Tensor | None]
    q_norm: torch.Tensor | None
    k_norm: torch.Tensor | None


def _lin(m: torch.nn.Linear) -> tuple[torch.Tensor, torch.Tensor | None]:
    return m.weight, m.bias


def _eps(norm: Any, default: float) -> float:
    return float(getattr(norm, "variance_epsilon", getattr(norm, "eps", default)))


class LeanForward:
    """Prefill and decode for a supported HF CausalLM (see module docstring)."""

    def __init__(self, model: Any) -> None:
        reason = unsupported_reason(model)
        if reason is not None:
            raise ValueError(f"lean forward unsupported: {reason}")
        self.model = model
        cfg = model.config
        self.n_heads = int(cfg.num_attention_heads)
        self.n_kv = int(getattr(cfg, "num_key_value_heads", None) or self.n_heads)
        self.group = self.n_heads // self.n_kv
        self.head_dim = int(getattr(cfg, "head_dim", None) or cfg.hidden_size // self.n_heads)
        self.eps = _eps(model.model.norm, float(getattr(cfg, "rms_norm_eps", 1e-6)))
        self._cos = self._sin = torch.empty(0)
        self.rebind()

    def rebind(self) -> None:
        """Re-read the parameter references (after anything that may have replaced parameter objects)."""
        inner = self.model.model
        self.embed = inner.embed_tokens.weight
        self.norm = inner.norm.weight
        self.lm_head = _lin(self.model.lm_head)
        self.layers = []
        for layer in inner.layers:
            a, m = layer.self_attn, layer.mlp
            qn, kn = getattr(a, "q_norm", None), getattr(a, "k_norm", None)
            self.layers.append(
                _Layer(
                    ln1=layer.input_layernorm.weight,
                    ln2=layer.post_attention_layernorm.weight,
                    q=_lin(a.q_proj),
                    k=_lin(a.k_proj),
                    v=_lin(a.v_proj),
                    o=_lin(a.o_proj),
                    gate=_lin(m.gate_proj),
                    up=_lin(m.up_proj),
                    down=_lin(m.down_proj),
                    q_norm=qn.weight if qn is not None else None,
                    k_norm=kn.weight if kn is not None else None,
                )
            )
        if self._cos.device != self.embed.device or self._cos.dtype != self.embed.dtype:
            self._cos = self._sin = torch.empty(0)  # rebuilt on demand; weight loads alone keep it

    # ---------------------------------------------------------------- rotary
    def _rope(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sign-folded sin for `positions` [...]: shapes [..., 1, head_dim] (broadcast over heads).

        The table comes from the model's own rotary module (so scaled rope types match HF
        exactly) and grows on demand. The sin table has its first half negated, so
        `rotate_half(x) * sin == x.roll(head_dim // 2, -1) * sin_signed` (one op, not four).
        """
        need = int(positions.max()) + 1 if positions.numel() else 1
        if self._cos.shape[0] < need or self._cos.device != self.embed.device:
            n = max(need, 2 * self._cos.shape[0], 256)
            pos = torch.arange(n, device=self.embed.device).unsqueeze(0)
            probe = torch.empty(1, dtype=self.embed.dtype, device=self.embed.device)
            cos, sin = self.model.model.rotary_emb(probe, pos)
            half = self.head_dim // 2
            sin = sin[0].clone()
            sin[:, :half] = -sin[:, :half]
            self._cos, self._sin = cos[0].contiguous(), sin
        return self._cos[positions].unsqueeze(-2), self._sin[positions].unsqueeze(-2)

    def _rotate(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        return torch.addcmul(x * cos, x.roll(self.head_dim // 2, -1), sin)

    # ---------------------------------------------------------------- the layers
    def _qkv(self, layer: _Layer, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        """Projections of h [B, L, hidden] -> q [B, L, heads, D], k and v [B, L, kv_heads, D], rotated."""
        b, n = h.shape[0], h.shape[1]
        q = F.linear(h, *layer.q).view(b, n, self.n_heads, self.head_dim)
        k = F.linear(h, *layer.k).view(b, n, self.n_kv, self.head_dim)
        v = F.linear(h, *layer.v).view(b, n, self.n_kv, self.head_dim)
        if layer.q_norm is not None:
            q = F.rms_norm(q, (self.head_dim,), layer.q_norm, self.eps)
            k = F.rms_norm(k, (self.head_dim,), layer.k_norm, self.eps)
        return self._rotate(q, cos, sin), self._rotate(k, cos, sin), v

    def _mlp_block(self, layer: _Layer, x: torch.Tensor, attn: torch.Tensor) -> torch.Tensor:
        """Residual add of the attention output, then the SwiGLU MLP with its residual."""
        x = x + F.linear(attn, *layer.o)
        h = F.rms_norm(x, (x.shape[-1],), layer.ln2, self.eps)
        return x + F.linear(F.silu(F.linear(h, *layer.gate)) * F.linear(h, *layer.up), *layer.down)

    def _logits(self, x_last: torch.Tensor) -> torch.Tensor:
        return F.linear(F.rms_norm(x_last, (x_last.shape[-1],), self.norm, self.eps), *self.lm_head)

    # ---------------------------------------------------------------- entry points
    def prefill(
        self, ids: torch.Tensor, lens: torch.Tensor, hidden: bool = False
    ) -> tuple[torch.Tensor, list[torch.Tensor], list[torch.Tensor]]:
        """Forward left-padded `ids` [n, L] (row j's real tokens are its last lens[j]).

        Returns the last position's logits [n, V] and each layer's keys and values
        [n, kv_heads, L, D] (padding columns hold finite garbage: callers mask or zero them).
        Positions count from each row's first real token, as HF's do with
        `position_ids = attention_mask.cumsum(-1) - 1`. With `hidden`, the first result is
        every position's final hidden state [n, L, hidden] instead (for `logits()` in chunks:
        scoring a whole prompt, where [L, V] logits at once could take gigabytes).
        """
        n, width = ids.shape
        dev = ids.device
        cols = torch.arange(width, device=dev)
        first = (width - lens).unsqueeze(1)  # [n, 1]
        positions = (cols.unsqueeze(0) - first).clamp(min=0)
        real = cols.unsqueeze(0) >= first  # [n, L]
        # causal and real; each query also sees itself, so padded queries never get an empty row (NaN)
        mask = (cols.unsqueeze(1) >= cols.unsqueeze(0)).unsqueeze(0) & real.unsqueeze(1)
        mask = (mask | torch.eye(width, dtype=torch.bool, device=dev)).unsqueeze(1)  # [n, 1, L, L]
        cos, sin = self._rope(positions)
        x = F.embedding(ids, self.embed)
        keys, values = [], []
        for layer in self.layers:
            h = F.rms_norm(x, (x.shape[-1],), layer.ln1, self.eps)
            q, k, v = self._qkv(layer, h, cos, sin)
            k, v = k.transpose(1, 2), v.transpose(1, 2)
            keys.append(k)
            values.append(v)
            a = F.scaled_dot_product_attention(q.transpose(1, 2), k, v, attn_mask=mask, enable_gqa=self.group > 1)
            x = self._mlp_block(layer, x, a.transpose(1, 2).reshape(n, width, -1))
        return (x if hidden else self._logits(x[:, -1])), keys, values

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        """Logits of final hidden states `x` [..., hidden] (the last norm and the lm_head)."""
        return self._logits(x)

    def decode(
        self,
        tokens: torch.Tensor,
        positions: torch.Tensor,
        mask: torch.Tensor,
        kbufs: list[torch.Tensor],
        vbufs: list[torch.Tensor],
        start: int,
        end: int,
        cols: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """One new token per row: tokens and positions [B]; returns logits [B, V].

        Each layer writes the new key/value into column `end` of rows [0, B) of its
        buffer (kbufs[l] is [rows, kv_heads, columns, D]) and attends over columns
        [start, end]; `mask` [B, 1, 1, end - start + 1] (bool) marks the real ones. With
        `cols` [B] (rows that lag after a verifying step: kv_cache.py), row r writes column
        cols[r] <= end instead. The query heads of one KV group are folded into the
        query-length axis, so attention reads each cached key once instead of expanding the
        cache per query head.
        """
        b = tokens.shape[0]
        cos, sin = self._rope(positions.view(b, 1))
        x = F.embedding(tokens.view(b, 1), self.embed)
        rows = torch.arange(b, device=tokens.device) if cols is not None else None
        for layer, kbuf, vbuf in zip(self.layers, kbufs, vbufs):
            h = F.rms_norm(x, (x.shape[-1],), layer.ln1, self.eps)
            q, k, v = self._qkv(layer, h, cos, sin)
            if cols is None:
                kbuf[:b, :, end] = k[:, 0]
                vbuf[:b, :, end] = v[:, 0]
            else:
                kbuf[rows, :, cols] = k[:, 0]
                vbuf[rows, :, cols] = v[:, 0]
            q = q.view(b, self.n_kv, self.group, self.head_dim)
            window = slice(start, end + 1)
            a = F.scaled_dot_product_attention(q, kbuf[:b, :, window], vbuf[:b, :, window], attn_mask=mask)
            x = self._mlp_block(layer, x, a.reshape(b, 1, -1))
        return self._logits(x[:, -1])

    def verify(
        self,
        tokens: torch.Tensor,
        positions: torch.Tensor,
        owner: torch.Tensor,
        slot: torch.Tensor,
        queries: int,
        mask: torch.Tensor,
        kbufs: list[torch.Tensor],
        vbufs: list[torch.Tensor],
        start: int,
        end: int,
        cols: torch.Tensor,
    ) -> torch.Tensor:
        """Several new tokens per row in one forward (speculative decoding's verifying step),
        packed: token t [T] belongs to row owner[t] at its query index slot[t] (0 for the row's
        last token, then its proposal); returns logits [T, V], token t's for the token after it.

        Why packed: on a small model the projections and the MLP are the step's compute, and a
        row that proposes nothing is fed one token, not as many as the longest proposal; only
        attention sees the rows padded to `queries` (its padded queries are computed and never
        read). Row r writes its keys/values into columns cols[r] + slot (cols[r] <= end) and its
        queries attend over the window [start, end + queries) under `mask` [B, 1, queries,
        window] (causal within the new tokens: kv_cache.query_mask). What a row keeps of the
        new columns is the caller's (`BatchedKVCache.advance_rows`); the others are overwritten
        later.
        """
        b, n = cols.shape[0], queries
        cos, sin = self._rope(positions)
        x = F.embedding(tokens, self.embed)  # [T, hidden]
        at = cols[owner] + slot
        flat = owner * n + slot  # each token's place in the padded [B * queries] layout
        window = slice(start, end + n)
        # the query heads of one KV group folded into the query axis (as `decode` does), so the
        # cache is read once per KV head; the mask follows the fold once for every layer
        folded_mask = mask.repeat_interleave(self.group, dim=2)
        uniform = tokens.shape[0] == b * n  # every row fed `queries` tokens: nothing to pad
        padded = None if uniform else x.new_zeros(b * n, self.n_heads, self.head_dim)
        for layer, kbuf, vbuf in zip(self.layers, kbufs, vbufs):
            h = F.rms_norm(x, (x.shape[-1],), layer.ln1, self.eps)
            q, k, v = self._qkv(layer, h.unsqueeze(0), cos.unsqueeze(0), sin.unsqueeze(0))
            kbuf[owner, :, at] = k[0]
            vbuf[owner, :, at] = v[0]
            if padded is not None:
                padded[flat] = q[0]
            qf = (q[0] if padded is None else padded).view(b, n, self.n_kv, self.group, self.head_dim)
            qf = qf.transpose(1, 2).reshape(b, self.n_kv, n * self.group, self.head_dim)
            a = F.scaled_dot_product_attention(qf, kbuf[:b, :, window], vbuf[:b, :, window], attn_mask=folded_mask)
            a = a.view(b, self.n_kv, n, self.group, self.head_dim).transpose(1, 2).reshape(b * n, -1)
            x = self._mlp_block(layer, x, a if padded is None else a[flat])
        return self._logits(x)

    def decode_static(
        self,
        tokens: torch.Tensor,
        positions: torch.Tensor,
        lo: torch.Tensor,
        col: torch.Tensor,
        kbufs: list[torch.Tensor],
        vbufs: list[torch.Tensor],
    ) -> torch.Tensor:
        """`decode` with every shape fixed, for CUDA-graph capture (`cuda_graphs.py`).

        Rows [0, B) of the buffers take part, B = tokens.shape[0]; row r's new key/value goes
        into column col[r] (`col` [B], a device tensor, not Python ints: a captured graph replays
        with new values) and row r attends over columns [lo[r], col[r]] of the whole buffer,
        masked, instead of a window sliced to this step's width. Nothing here reads a value
        back to the host, so the step can be captured. The rotary table must already cover
        every position (`ensure_rope`).
        """
        b = tokens.shape[0]
        cols = torch.arange(kbufs[0].shape[2], device=tokens.device)
        mask = ((cols >= lo.view(b, 1)) & (cols <= col.view(b, 1))).view(b, 1, 1, -1)
        cos, sin = self._cos[positions].view(b, 1, 1, -1), self._sin[positions].view(b, 1, 1, -1)
        x = F.embedding(tokens.view(b, 1), self.embed)
        rows = torch.arange(b, device=tokens.device)
        for layer, kbuf, vbuf in zip(self.layers, kbufs, vbufs):
            h = F.rms_norm(x, (x.shape[-1],), layer.ln1, self.eps)
            q, k, v = self._qkv(layer, h, cos, sin)
            keys, values = kbuf[:b], vbuf[:b]
            keys[rows, :, col] = k[:, 0]
            values[rows, :, col] = v[:, 0]
            q = q.view(b, self.n_kv, self.group, self.head_dim)
            a = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask)
            x = self._mlp_block(layer, x, a.reshape(b, 1, -1))
        return self._logits(x[:, -1])

    def ensure_rope(self, positions: int) -> None:
        """Build the rotary table for positions [0, positions) now (a captured step cannot grow it)."""
        if self._cos.shape[0] < positions or self._cos.device != self.embed.device:
            self._rope(torch.tensor([max(positions - 1, 0)], device=self.embed.device))
