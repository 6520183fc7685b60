"""A batched, left-padded KV cache for continuous batching over HF CausalLMs.

Why not one `DynamicCache` per request: a decode step must run every running request in
one forward, and HF caches are batch tensors. Why not HF's `DynamicCache` for the batch:
it grows by `torch.cat` every step, copying the whole cache per token. Here each layer
owns a preallocated buffer [B, kv_heads, capacity, head_dim]; a decode step writes one
column in place. Rows are *right-aligned*: row r's real tokens fill columns
[width - lens[r], width), the columns before are zero padding masked out by
`attention_mask()`. Requests join (after a batched prefill) and leave through
`rebuild`, the only operation that copies the cache.
"""

from __future__ import annotations

from typing import Sequence

import torch
from transformers.cache_utils import Cache, DynamicLayer

_HEADROOM = 128  # free columns allocated past the current width on every rebuild


class _BufferLayer(DynamicLayer):
    """One layer's view of the shared buffer, speaking HF's cache-layer protocol."""

    def __init__(self, keys: torch.Tensor, values: torch.Tensor, width: int) -> None:
        super().__init__()
        self.kbuf, self.vbuf, self.width = keys, values, width
        self.dtype, self.device = keys.dtype, keys.device
        self.is_initialized = True
        self.keys, self.values = keys[:, :, :width], values[:, :, :width]

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        end = self.width + key_states.shape[-2]
        if end > self.kbuf.shape[2]:
            raise RuntimeError(f"KV buffer overflow: need {end} columns, have {self.kbuf.shape[2]}")
        self.kbuf[:, :, self.width:end] = key_states
        self.vbuf[:, :, self.width:end] = value_states
        self.width = end
        self.keys, self.values = self.kbuf[:, :, :end], self.vbuf[:, :, :end]
        return self.keys, self.values

    def get_seq_length(self) -> int:
        return self.width


class BatchedKVCache:
    """Per-layer KV buffers of the running batch plus each row's real length."""

    def __init__(self) -> None:
        self.keys: list[torch.Tensor] = []
        self.values: list[torch.Tensor] = []
        self.lens: list[int] = []
        self.width = 0

    @property
    def batch_size(self) -> int:
        return len(self.lens)

    def clear(self) -> None:
        self.keys, self.values, self.lens, self.width = [], [], [], 0

    # ---------------------------------------------------------------- a decode step
    def hf_cache(self, new_tokens: int = 1) -> Cache:
        """An HF `Cache` writing into the buffers; grows them first if `new_tokens` would not fit."""
        if self.keys and self.width + new_tokens > self.keys[0].shape[2]:
            self._grow(self.width + new_tokens + max(_HEADROOM, self.width))
        return Cache(layers=[_BufferLayer(k, v, self.width) for k, v in zip(self.keys, self.values)])

    def attention_mask(self, new_tokens: int = 1) -> torch.Tensor:
        """[B, width + new_tokens] int64: 1 on real tokens (and the new ones), 0 on padding."""
        total = self.width + new_tokens
        start = torch.tensor([self.width - n for n in self.lens]).unsqueeze(1)
        return (torch.arange(total).unsqueeze(0) >= start).long()

    def advance(self, new_tokens: int = 1) -> None:
        """Record that a forward through `hf_cache()` appended `new_tokens` columns to every row."""
        self.width += new_tokens
        self.lens = [n + new_tokens for n in self.lens]

    # ---------------------------------------------------------------- joins and leaves
    def rebuild(
        self,
        keep: Sequence[int],
        new_keys: Sequence[torch.Tensor] | None = None,
        new_values: Sequence[torch.Tensor] | None = None,
        new_lens: Sequence[int] = (),
    ) -> None:
        """Keep rows `keep` (in that order) and append rows from a left-padded prefill cache.

        new_keys[l] is [b, kv_heads, w, head_dim], row j's real tokens in its last
        new_lens[j] columns. The result is trimmed to the longest row, so columns that
        only ever held padding do not cost attention compute.
        """
        keep = list(keep)
        n_new = len(new_lens)
        lens = [self.lens[i] for i in keep] + list(new_lens)
        if not lens:
            self.clear()
            return
        width = max(lens)
        ref = self.keys[0] if self.keys else new_keys[0]
        n_layers = len(self.keys) if self.keys else len(new_keys)
        b, h, d = len(lens), ref.shape[1], ref.shape[3]
        cap = width + _HEADROOM
        idx = torch.tensor(keep, dtype=torch.long)
        new_mask = None
        if n_new:
            w_new = new_keys[0].shape[2]
            start = torch.tensor([w_new - n for n in new_lens]).unsqueeze(1)
            new_mask = (torch.arange(w_new).unsqueeze(0) >= start).view(n_new, 1, w_new, 1)
        keys, values = [], []
        for layer in range(n_layers):
            out_k = ref.new_zeros(b, h, cap, d)
            out_v = ref.new_zeros(b, h, cap, d)
            if keep:
                # kept rows are right-aligned: their real tokens all lie in the last `take` columns
                take = min(width, self.width)
                out_k[: len(keep), :, width - take:width] = self.keys[layer][idx, :, self.width - take:self.width]
                out_v[: len(keep), :, width - take:width] = self.values[layer][idx, :, self.width - take:self.width]
            if n_new:
                # Zero the padding columns: a padded query's activations may be garbage (even NaN),
                # and 0 * NaN in the attention product would leak into real rows later.
                k = torch.where(new_mask, new_keys[layer], 0.0)
                v = torch.where(new_mask, new_values[layer], 0.0)
                take = min(width, w_new)
                out_k[len(keep):, :, width - take:width] = k[:, :, w_new - take:]
                out_v[len(keep):, :, width - take:width] = v[:, :, w_new - take:]
            keys.append(out_k)
            values.append(out_v)
        self.keys, self.values, self.lens, self.width = keys, values, lens, width

    def _grow(self, capacity: int) -> None:
        for i in range(len(self.keys)):
            for bufs in (self.keys, self.values):
                old = bufs[i]
                new = old.new_zeros(old.shape[0], old.shape[1], capacity, old.shape[3])
                new[:, :, : self.width] = old[:, :, : self.width]
                bufs[i] = new
