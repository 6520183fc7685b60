"""A batched, right-aligned KV cache for continuous batching over HF CausalLMs.

Why not one `DynamicCache` per request: a decode step must run every running request in
one forward, and HF caches are batch tensors. Why not HF's `DynamicCache` for the batch:
it grows by `torch.cat` every step, copying the whole cache per token.

Layout. Each layer owns preallocated buffers [rows, kv_heads, columns, head_dim]. The
running batch is rows [0, B). Every row is *right-aligned* at a shared write column
`end`: row r's real tokens fill columns [end - lens[r], end), so a decode step writes one
column (`end`) for all rows in place. Attention reads the window [end - width, end) with
width = max(lens); the columns of a row before its first token are masked out by
`attention_mask()` (they may hold stale but always finite values: see `append`).

A decode step reaches the buffers one of two ways: the HF forward through `hf_cache()` (an
HF `Cache` view whose `update` writes column `end`) and `attention_mask()`, or the lean
forward (`lean_forward.py`), which writes column `end` itself inside `decode_window()` and
masks with `decode_mask()`. Either way the caller then calls `advance()`.

Ragged rows (speculative decoding). A verifying step writes several columns per row and
keeps a different number of them in each row (the accepted tokens), so rows may end before
`end`: row r's real tokens fill [end - lags[r] - lens[r], end - lags[r]), and its next
token goes to column end - lags[r]. Every lag is 0 unless speculation ran, and then the
decode and mask paths are the plain ones above. Columns right of a row's end hold finite
garbage (rejected proposals) that its masks keep out and its next writes overwrite; a
repack right-aligns every row again (lags back to 0).

Why this shape: in a long-tailed request mix requests join and leave at almost every
step. Copying the whole cache on each join or leave (the simple way to keep rows
compact) cost a fifth of all engine time. Here
- a leave moves at most as many rows as left (live rows from the tail fill the holes),
- a join writes only the new rows (into free rows, at the right columns),
- the attention window shrinks for free when the longest row leaves (width = max(lens)),
- the window moves (`_repack`) only when the buffers run out of room: every
  ~`_HEADROOM` decode steps, or when a request longer than the left room joins; it moves
  in place unless the buffers must grow.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch
from transformers.cache_utils import Cache, DynamicLayer

_HEADROOM = 128  # free columns right of `end` after a repack (decode steps until the next one)
_LEFT_SLACK = 64  # extra columns left of the window after a repack, so slightly longer joins fit


class _BufferLayer(DynamicLayer):
    """One layer's view of the shared buffers (rows [0, B)), speaking HF's cache-layer protocol."""

    def __init__(self, keys: torch.Tensor, values: torch.Tensor, start: int, end: int) -> None:
        super().__init__()
        self.kbuf, self.vbuf, self.start, self.end = keys, values, start, end
        self.dtype, self.device = keys.dtype, keys.device
        self.is_initialized = True
        self.keys, self.values = keys[:, :, start:end], values[:, :, start:end]

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        end = self.end + key_states.shape[-2]
        if end > self.kbuf.shape[2]:
            raise RuntimeError(f"KV buffer overflow: need {end} columns, have {self.kbuf.shape[2]}")
        self.kbuf[:, :, self.end : end] = key_states
        self.vbuf[:, :, self.end : end] = value_states
        self.end = end
        self.keys, self.values = self.kbuf[:, :, self.start : end], self.vbuf[:, :, self.start : end]
        return self.keys, self.values

    def get_seq_length(self) -> int:
        return self.end - self.start


class BatchedKVCache:
    """Per-layer KV buffers of the running batch plus each row's real length (see module docstring)."""

    def __init__(self, row_capacity: int = 0) -> None:
        self.row_capacity = row_capacity  # rows allocated up front (the engine's max_running)
        self.repacks = 0  # full copies so far (tests and stats)
        self.keys: list[torch.Tensor] = []  # per layer, allocated by the first append and kept
        self.values: list[torch.Tensor] = []
        self.clear()

    def clear(self) -> None:
        """Drop every row (e.g. after a weight swap: the cached keys came from old weights).

        The buffers stay allocated for the next rows: nothing is reallocated per weight swap,
        and CUDA graphs captured over them (cuda_graphs.py) stay valid. Their stale values
        are finite and outside every new row's columns, so masks keep them out."""
        self.lens: list[int] = []
        self.lags: list[int] = []  # end - the row's own end: 0 unless a verifying step kept fewer columns
        self.end = 0

    @property
    def batch_size(self) -> int:
        return len(self.lens)

    @property
    def width(self) -> int:
        """Columns attention reads per row: from the earliest first column of any row to `end`
        (the longest row's length while no row lags)."""
        if not self.lens:
            return 0
        if not self.ragged:
            return max(self.lens)
        return max(n + lag for n, lag in zip(self.lens, self.lags))

    @property
    def ragged(self) -> bool:
        """Whether some row ends before `end` (after a verifying step kept fewer of its columns)."""
        return any(self.lags)

    def write_columns(self) -> list[int]:
        """The column each row's next token goes to (`end` for every row that does not lag)."""
        return [self.end - lag for lag in self.lags]

    # ---------------------------------------------------------------- a decode step
    def hf_cache(self, new_tokens: int = 1) -> Cache:
        """An HF `Cache` over rows [0, B) writing at column `end`; repacks first if `new_tokens` would not fit."""
        if not self.keys:
            raise RuntimeError("the KV cache holds no rows")
        if self.ragged:  # HF's cache writes one column for all rows: only the lean path verifies
            raise RuntimeError("an HF cache view needs rows that end together; realign() first")
        if self.end + new_tokens > self.keys[0].shape[2]:
            self._repack(self.keys[0].shape[0], self.width, new_tokens)
        b, w = self.batch_size, self.width
        return Cache(
            layers=[_BufferLayer(k[:b], v[:b], self.end - w, self.end) for k, v in zip(self.keys, self.values)]
        )

    def decode_window(self, new_tokens: int = 1) -> tuple[int, int]:
        """(start, end) for a forward writing `new_tokens` columns at `end` and reading [start, end + new_tokens).

        Repacks first if the new columns would not fit; the lean forward writes into
        `keys[l][:B, :, end:end + new_tokens]` itself, then the caller `advance()`s.
        """
        if not self.keys:
            raise RuntimeError("the KV cache holds no rows")
        if self.end + new_tokens > self.keys[0].shape[2]:
            self._repack(self.keys[0].shape[0], self.width, new_tokens)
        return self.end - self.width, self.end

    def decode_mask(self, new_tokens: int = 1) -> torch.Tensor:
        """[B, 1, 1, width + new_tokens] bool: the attention mask of a decode step over `decode_window()`."""
        if self.ragged:
            return self.query_mask(1)
        w = self.width
        device = self.keys[0].device if self.keys else None
        start = torch.tensor([w - n for n in self.lens], device=device).view(-1, 1, 1, 1)
        return torch.arange(w + new_tokens, device=device) >= start

    def query_mask(self, queries: int) -> torch.Tensor:
        """[B, 1, queries, width + queries] bool: the mask of a step that feeds `queries` new tokens
        per row over `decode_window(queries)`. Row r's query j sits at its write column + j and
        sees the row's real tokens and its own new ones up to itself (causal); never the columns
        another row wrote, nor the garbage right of its end."""
        w = self.width
        device = self.keys[0].device if self.keys else None
        cols = torch.arange(w + queries, device=device).view(1, 1, 1, -1)
        first = torch.tensor([w - lag - n for n, lag in zip(self.lens, self.lags)], device=device).view(-1, 1, 1, 1)
        own = torch.tensor([w - lag for lag in self.lags], device=device).view(-1, 1, 1, 1)
        last = own + torch.arange(queries, device=device).view(1, 1, -1, 1)
        return (cols >= first) & (cols <= last)

    def attention_mask(self, new_tokens: int = 1) -> torch.Tensor:
        """[B, width + new_tokens] int64: 1 on real tokens (and the new ones), 0 on padding."""
        w = self.width
        start = torch.tensor([w - n for n in self.lens]).unsqueeze(1)
        return (torch.arange(w + new_tokens).unsqueeze(0) >= start).long()

    def advance(self, new_tokens: int = 1) -> None:
        """Record that a forward appended `new_tokens` columns to every row (at its write column)."""
        self.end += new_tokens
        self.lens = [n + new_tokens for n in self.lens]

    def advance_rows(self, kept: Sequence[int]) -> None:
        """Record that a verifying step kept kept[r] >= 1 of the columns it wrote to row r (the
        first ones, from its write column on); the rest are garbage right of the row's end."""
        if len(kept) != len(self.lens) or any(k < 1 for k in kept):
            raise ValueError(f"advance_rows: need one count >= 1 per row ({len(self.lens)}), got {list(kept)}")
        ends = [self.end - lag + k for lag, k in zip(self.lags, kept)]
        self.end = max(ends)
        self.lags = [self.end - e for e in ends]
        self.lens = [n + k for n, k in zip(self.lens, kept)]

    # ---------------------------------------------------------------- leaves and joins
    def remove(self, rows: Iterable[int]) -> list[int]:
        """Drop `rows`; return `order`, where new row i is old row order[i] (callers permute alike).

        Live rows from the tail move into the holes, so the copy is proportional to the
        number of rows that left, not to the batch.
        """
        dead = set(rows)
        b = self.batch_size
        if not dead:
            return list(range(b))
        if not dead <= set(range(b)):
            raise IndexError(f"rows {sorted(dead - set(range(b)))} are not in a batch of {b}")
        b2 = b - len(dead)
        holes = [i for i in range(b2) if i in dead]
        movers = [i for i in range(b2, b) if i not in dead]
        order = list(range(b2))
        for h, m in zip(holes, movers):
            order[h] = m
        if holes:
            w = max(self.lens[m] + self.lags[m] for m in movers)  # only the movers' real columns matter
            dev = self.keys[0].device
            h_idx, m_idx = torch.tensor(holes, device=dev), torch.tensor(movers, device=dev)
            for bufs in (self.keys, self.values):
                for buf in bufs:
                    buf[h_idx, :, self.end - w : self.end] = buf[m_idx, :, self.end - w : self.end]
        self.lens = [self.lens[i] for i in order]
        self.lags = [self.lags[i] for i in order]
        return order

    def append(
        self, new_keys: Sequence[torch.Tensor], new_values: Sequence[torch.Tensor], new_lens: Sequence[int]
    ) -> None:
        """Add rows from a left-padded prefill cache after the current ones.

        new_keys[l] is [n, kv_heads, w, head_dim], row j's real tokens in its last
        new_lens[j] columns. The padding columns are zeroed on the way in: a padded
        query's activations may be garbage (even NaN), and 0 * NaN in the attention
        product would leak into this row later. That keeps every buffer value finite.
        """
        n = len(new_lens)
        if n == 0:
            return
        if len(new_keys) != len(new_values) or any(k.shape[0] != n for k in new_keys):
            raise ValueError(f"{len(new_lens)} new lengths for caches of shape {tuple(new_keys[0].shape)}")
        take = max(new_lens)
        b = self.batch_size
        if not self.keys:
            ref = new_keys[0]
            rows = max(self.row_capacity, n)
            cols = take + _LEFT_SLACK + _HEADROOM
            shape = (rows, ref.shape[1], cols, ref.shape[3])
            self.keys = [ref.new_zeros(shape) for _ in new_keys]
            self.values = [ref.new_zeros(shape) for _ in new_keys]
            self.end = take + _LEFT_SLACK
        elif b + n > self.keys[0].shape[0] or take > self.end:
            self._repack(max(self.keys[0].shape[0], b + n), max(self.width, take), 1)
        w_new = new_keys[0].shape[2]
        start = torch.tensor([take - m for m in new_lens]).unsqueeze(1)
        real = (torch.arange(take).unsqueeze(0) >= start).view(n, 1, take, 1).to(new_keys[0].device)
        for bufs, news in ((self.keys, new_keys), (self.values, new_values)):
            for buf, new in zip(bufs, news):
                buf[b : b + n, :, self.end - take : self.end] = torch.where(real, new[:, :, w_new - take :], 0.0)
        self.lens = self.lens + list(new_lens)
        self.lags = self.lags + [0] * n

    def realign(self) -> None:
        """Right-align every row at `end` again (lags back to 0), in place when the buffers allow:
        after verifying steps, so that the HF path or a long run of plain decode steps reads no
        lagging columns."""
        if self.ragged:
            self._repack(self.keys[0].shape[0], max(self.lens), 1)

    def _repack(self, rows: int, left: int, right: int) -> None:
        """Move the window so that `left` (+ slack) columns precede `end` and `right` columns follow it.

        In place when the buffers are big enough (only the window is copied); otherwise into
        fresh, zeroed buffers with 50% spare columns, so growth is amortised. Fresh buffers
        are the only allocation: zeroing them once and only ever writing finite keys keeps
        every stale value finite. Lagging rows come out right-aligned (lags 0): each row's
        real columns are gathered to end at the new `end`.
        """
        b = self.batch_size
        ragged = self.ragged
        w = max(self.lens) if b else 0  # columns each row keeps (its real ones, right-aligned)
        new_end = max(left, w) + _LEFT_SLACK
        need = new_end + max(right, _HEADROOM)
        old_rows, old_cols = self.keys[0].shape[0], self.keys[0].shape[2]
        in_place = rows <= old_rows and need <= old_cols
        if not in_place:
            rows, cols = max(rows, old_rows), need + need // 2
        index = None
        if ragged and b and w:  # row r's last w columns before its own end (clamped: finite garbage left of it)
            ends = torch.tensor([self.end - lag for lag in self.lags], device=self.keys[0].device)
            index = (ends.view(b, 1) - w + torch.arange(w, device=ends.device).view(1, w)).clamp(min=0)
        for bufs in (self.keys, self.values):
            for i, old in enumerate(bufs):
                if index is not None:
                    h, d = old.shape[1], old.shape[3]
                    window = old[:b].gather(2, index.view(b, 1, w, 1).expand(b, h, w, d))  # a copy
                else:
                    window = old[:b, :, self.end - w : self.end]
                if in_place:
                    if (new_end != self.end or index is not None) and b and w:
                        old[:b, :, new_end - w : new_end] = window if index is not None else window.clone()
                    continue
                new = old.new_zeros(rows, old.shape[1], cols, old.shape[3])
                if b and w:
                    new[:b, :, new_end - w : new_end] = window
                bufs[i] = new
        self.end = new_end
        self.lags = [0] * b
        self.repacks += 1
