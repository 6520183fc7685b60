"""The engine's forwards - prefill, one decode step, a verifying step - over the lean path or HF's.

`ModelRunner` hides which forward runs: the lean one (`lean_forward.py`) for the
Qwen2 / Qwen3 / Llama family, HF's `model(...)` with the batched cache wrapped as an HF
`Cache` for everything else. Both give the same logits and the same cache contents, so
the scheduler in `engine.py` does not care which one it has. Only the lean path verifies
several tokens per row in one forward (speculative decoding: `can_verify`).
"""

from __future__ import annotations

import logging
from typing import Any

import torch

from areal_graph.engines.inference.cuda_graphs import GraphedDecode
from areal_graph.engines.inference.kv_cache import BatchedKVCache
from areal_graph.engines.inference.lean_forward import LeanForward, unsupported_reason

log = logging.getLogger(__name__)

__all__ = ["ModelRunner"]


class ModelRunner:
    """Prefill and decode for `model` on `device` (see module docstring)."""

    def __init__(
        self,
        model: Any,
        device: torch.device,
        lean: bool = True,
        cuda_graphs: bool = True,
        max_rows: int = 64,
        max_positions: int = 2048,
    ) -> None:
        self.model = model
        self.device = device
        self.lean: LeanForward | None = None
        self.hf_reason: str | None = None if lean else "the lean forward is turned off"  # why HF's forward runs
        if lean:
            self.hf_reason = unsupported_reason(model)
            if self.hf_reason is None:
                self.lean = LeanForward(model)
            else:
                log.info("embedded engine uses the HF forward: %s", self.hf_reason)
        # decode steps from CUDA graphs: on a GPU only, over the lean forward (cuda_graphs.py)
        self.graphs: GraphedDecode | None = None
        if cuda_graphs and self.lean is not None and device.type == "cuda":
            self.graphs = GraphedDecode(self.lean, max_rows, max_positions)
        self._logits_to_keep = True

    def rebind(self) -> None:
        """After a weight load: let the lean path re-read the parameter references."""
        if self.lean is not None:
            self.lean.rebind()

    def prefill(
        self, seqs: list[list[int]], pad_id: int
    ) -> tuple[torch.Tensor, list[torch.Tensor], list[torch.Tensor], list[int]]:
        """Forward `seqs` left-padded into one batch.

        Returns the last position's logits [n, V], each layer's keys and values
        [n, kv_heads, width, D] (row j real in its last lens[j] columns) and lens.
        """
        lens = [len(s) for s in seqs]
        width = max(lens)
        ids = torch.tensor([[pad_id] * (width - len(s)) + s for s in seqs], dtype=torch.long, device=self.device)
        if self.lean is not None:
            logits, keys, values = self.lean.prefill(ids, torch.tensor(lens, device=self.device))
            return logits, keys, values, lens
        mask = (torch.arange(width).unsqueeze(0) >= torch.tensor([width - n for n in lens]).unsqueeze(1)).long()
        mask = mask.to(self.device)
        pos = (mask.cumsum(1) - 1).clamp(min=0)
        out = self._hf_prefill(ids, mask, pos)
        layers = out.past_key_values.layers
        return out.logits[:, -1, :], [layer.keys for layer in layers], [layer.values for layer in layers], lens

    def _hf_prefill(self, ids: torch.Tensor, mask: torch.Tensor, pos: torch.Tensor) -> Any:
        from transformers.cache_utils import DynamicCache

        kw = dict(input_ids=ids, attention_mask=mask, position_ids=pos, past_key_values=DynamicCache(), use_cache=True)
        if self._logits_to_keep:
            try:  # only the last position's logits are needed; not every HF model takes this
                return self.model(**kw, logits_to_keep=1)
            except TypeError:
                self._logits_to_keep = False
                kw["past_key_values"] = DynamicCache()
        return self.model(**kw)

    @torch.inference_mode()
    def prompt_logprobs(
        self, ids: list[int], top_n: int = 0, chunk: int = 1024
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        """Log-probs of ids[1:] given what precedes each, [L - 1] float32 (raw distribution, no
        temperature, as vLLM's prompt log-probs), and with `top_n` the `top_n` most likely ids
        and their log-probs at each of those positions, [L - 1, top_n]. The same forward as a
        prefill, so the numbers agree with what generation would report; logits are taken
        `chunk` positions at a time, so memory stays bounded for long prompts."""
        x = torch.tensor([ids], dtype=torch.long, device=self.device)
        if self.lean is not None:
            hidden = self.lean.prefill(x, torch.tensor([len(ids)], device=self.device), hidden=True)[0][0, :-1]
            logits_of: Any = self.lean.logits
        else:
            hidden = self.model(input_ids=x, use_cache=False).logits[0, :-1]
            logits_of = lambda h: h  # noqa: E731 - the HF forward gives logits already
        targets = x[0, 1:]
        lps, top_ids, top_lps = [], [], []
        for a in range(0, targets.numel(), chunk):
            logp = torch.log_softmax(logits_of(hidden[a : a + chunk]).float(), dim=-1)
            lps.append(logp.gather(1, targets[a : a + chunk].view(-1, 1)).squeeze(1))
            if top_n:
                values, index = torch.topk(logp, min(top_n, logp.shape[-1]), dim=-1)
                top_ids.append(index)
                top_lps.append(values)
        cat = lambda xs: torch.cat(xs).cpu() if xs else None  # noqa: E731
        out = cat(lps)
        return (out if out is not None else torch.zeros(0)), cat(top_ids), cat(top_lps)

    def decode(self, last_tokens: list[int], cache: BatchedKVCache) -> torch.Tensor:
        """One token for each of the cache's rows: write its keys and values, advance; return logits [B, V]."""
        if self.graphs is not None:
            try:
                return self.graphs.decode(last_tokens, cache)
            except RuntimeError:  # a capture the driver refused: the eager step from here on
                log.warning("CUDA graph capture failed; decoding without graphs", exc_info=True)
                self.graphs = None
        tokens = torch.tensor(last_tokens, dtype=torch.long, device=self.device)
        positions = torch.tensor(cache.lens, dtype=torch.long, device=self.device)
        if self.lean is not None:
            start, end = cache.decode_window(1)
            cols = torch.tensor(cache.write_columns(), device=self.device) if cache.ragged else None
            mask = cache.decode_mask(1)
            logits = self.lean.decode(tokens, positions, mask, cache.keys, cache.values, start, end, cols)
        else:
            mask = cache.attention_mask(1).to(self.device)
            hf_cache = cache.hf_cache(1)
            out = self.model(
                input_ids=tokens.view(-1, 1),
                attention_mask=mask,
                position_ids=positions.view(-1, 1),
                past_key_values=hf_cache,
                use_cache=True,
            )
            logits = out.logits[:, -1, :]
        cache.advance(1)
        return logits

    @property
    def can_verify(self) -> bool:
        """Whether `verify` runs here: the lean forward writes several columns per row; HF's
        cache view cannot (the engine then decodes one token at a time)."""
        return self.lean is not None

    def verify(self, rows: list[list[int]], cache: BatchedKVCache) -> torch.Tensor:
        """Feed rows[r] (its last token, then its proposal) to each of the cache's rows in one
        forward; return logits [sum(len(r)), V], packed in row order (row 0's positions, then row
        1's, ...), position j's for the token after rows[r][j]. Only real tokens are computed
        (a row without a proposal is fed one). Writes every fed column; the caller keeps what
        was accepted with `cache.advance_rows`."""
        if self.lean is None:
            raise RuntimeError("verify needs the lean forward (ModelRunner.can_verify)")
        q = max(len(r) for r in rows)
        flat = [t for r in rows for t in r]
        owner = [i for i, r in enumerate(rows) for _ in r]
        slot = [j for r in rows for j in range(len(r))]
        dev = self.device
        owner_t = torch.tensor(owner, dtype=torch.long, device=dev)
        slot_t = torch.tensor(slot, dtype=torch.long, device=dev)
        positions = torch.tensor(cache.lens, dtype=torch.long, device=dev)[owner_t] + slot_t
        start, end = cache.decode_window(q)
        cols = torch.tensor(cache.write_columns(), device=dev)
        tokens = torch.tensor(flat, dtype=torch.long, device=dev)
        return self.lean.verify(
            tokens, positions, owner_t, slot_t, q, cache.query_mask(q), cache.keys, cache.values, start, end, cols
        )
