"""The inference engine's steps measured alone on a run's model: the shape of their cost.

Why: a run decodes most steps near its own concurrency (a calibration at 64 running, 30-64
rows), and a fit of those alone extrapolates badly below it: its fixed cost absorbed what is per
row, and a step of a few rows came out two to three times too slow. `probe_decode` measures the
engine's decode step alone over a grid of batch sizes (1 to the run's largest, powers of two)
and widths, `probe_verify` its verifying step (speculative decoding) beside the plain one; the
cost model (costs.py) scales each shape by one factor to the run's own steps.

The probes need the run's model on this machine and only mean something when the run ran on
this kind of machine; they return None without torch or the model.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterator, Sequence
from typing import Any

log = logging.getLogger(__name__)


def row_grid(max_rows: int) -> list[int]:
    """The batch sizes a probe times: 1, 2, 4, ... and `max_rows` itself."""
    rows = [1]
    while rows[-1] * 2 <= max(int(max_rows), 1):
        rows.append(rows[-1] * 2)
    if rows[-1] < max_rows:
        rows.append(int(max_rows))
    return rows


def probe_decode(
    model_dir: str, max_rows: int, widths: Sequence[int], threads: int = 1
) -> list[tuple[int, int, float]] | None:
    """(rows, width, seconds) of the engine's decode step alone (forward, sampling and each
    request's bookkeeping, as the step log times it; best of three) for rows = 1, 2, 4, ... up to `max_rows` and each of `widths`; None without torch or
    the model."""
    grid_rows = row_grid(max_rows)
    out: list[tuple[int, int, float]] = []
    with _probe_runner(model_dir, max(grid_rows), threads, reserve=0) as probe:
        if probe is None:
            return None
        runner, cap = probe
        for rows, width, _, step in _warm_decode_grid(runner, cap, widths, grid_rows):
            # best of 7: at a few rows a step is ~1 ms, and one scheduler tick doubles it;
            # width: the cache's before the step, as the step log has it
            out.append((rows, width, min(_timed(step) for _ in range(7))))
    return out


def _warm_decode_grid(
    runner: Any, cap: int, widths: Sequence[int], grid_rows: Sequence[int]
) -> Iterator[tuple[int, int, Any, Any]]:
    """(rows, width, cache, plain decode step) for each width (at least 2, at most `cap`) and
    rows of the grid: a cache filled to the width, its step already run three times (a fresh
    process's first steps run several times slower)."""
    for width in sorted({min(max(int(w), 2), cap) for w in widths}):
        for rows in grid_rows:
            cache = _filled_cache(runner, rows, width)
            step = _decode_step(runner, cache, rows)
            for _ in range(3):
                step()
            yield rows, width, cache, step


@contextlib.contextmanager
def _probe_runner(
    model_dir: str, max_rows: int, threads: int, reserve: int, need_lean: bool = False, device: str = "cpu"
) -> Iterator[tuple[Any, int] | None]:
    """(runner, cap) for a probe: the run's model behind the engine's ModelRunner, at `threads`
    threads (restored after), in inference mode; `cap` the widest cache a probe may fill,
    `reserve` positions kept free for the tokens a step feeds. On the CPU in float32 (the cost
    model's probes); `device="cuda"` loads it in bfloat16 there (benchmarks/bench_gpu.py, CUDA
    graphs off: a verifying step runs eagerly). None without torch, or without the model's lean
    forward when `need_lean` (only the lean forward verifies)."""
    try:
        import torch
        from transformers import AutoModelForCausalLM
        from transformers.utils import logging as hf_logging

        from areal_graph.engines.inference.model_runner import ModelRunner
    except ImportError:  # pragma: no cover - torch is a dependency
        yield None
        return
    hf_logging.disable_progress_bar()
    before = torch.get_num_threads()
    torch.set_num_threads(max(int(threads), 1))
    try:
        dtype = torch.float32 if device == "cpu" else torch.bfloat16
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype).to(device).eval()
        cap = int(getattr(model.config, "max_position_embeddings", 2048)) - 1 - reserve
        runner = ModelRunner(model, torch.device(device), cuda_graphs=False, max_rows=max_rows, max_positions=cap + 1)
        with torch.inference_mode():
            yield None if need_lean and runner.lean is None else (runner, cap)
    finally:
        torch.set_num_threads(before)


def _filled_cache(runner: Any, rows: int, width: int) -> Any:
    """A KV cache of `rows` rows, each prefilled with `width` tokens."""
    from areal_graph.engines.inference.kv_cache import BatchedKVCache

    cache = BatchedKVCache(row_capacity=rows)
    _, keys, values, got = runner.prefill([[3] * width] * rows, 0)
    cache.append(keys, values, got)
    return cache


def _decode_step(runner: Any, cache: Any, rows: int) -> Any:
    """A decode step as the engine runs it (engine.py `_decode`): the forward, then
    `take_tokens` (penalties, sampling, each request's bookkeeping), for `rows` requests that
    never finish; the step log's times hold the same (engine_spans.StepLog)."""
    import concurrent.futures

    import torch

    from areal_graph.engines.inference.requests import Request
    from areal_graph.engines.inference.sampling import SamplingParams
    from areal_graph.engines.inference.token_intake import take_tokens

    params = SamplingParams(temperature=1.0, max_new_tokens=1 << 30)
    reqs = [
        Request(f"probe-{i}", [3], params, concurrent.futures.Future(), torch.Generator().manual_seed(i), frozenset())
        for i in range(rows)
    ]

    def step() -> None:
        take_tokens(reqs, runner.decode([3] * rows, cache), 0, None)

    return step


def _timed(fn: Any, device: str = "cpu") -> float:
    """Wall seconds of fn(); on a GPU, up to its kernels' end (the step reads its sampled tokens
    back to the host anyway; the synchronize makes sure nothing is left queued)."""
    import torch

    sync = torch.cuda.synchronize if device != "cpu" else (lambda: None)
    sync()
    t = time.perf_counter()
    fn()
    sync()
    return time.perf_counter() - t


def probe_verify(
    model_dir: str,
    max_rows: int,
    widths: Sequence[int],
    drafts: Sequence[int] = (1, 2, 4),
    threads: int = 1,
    device: str = "cpu",
    rows: Sequence[int] | None = None,
) -> list[tuple[int, int, int, float, float]] | None:
    """(rows, width, extra fed tokens, seconds of a verifying step, seconds of a plain step at the
    same rows and width) of the engine's steps alone (forward, sampling and bookkeeping, as the
    step log times them; best of five), for rows = 1, 2, 4, ... up to `max_rows`, each of
    `widths`, and every row proposing each of `drafts` tokens.

    Why a probe and not the prefill fit alone: a verifying forward is not a prefill. Its extra
    tokens cost about what prefilled tokens do, but the step has more work whatever it is fed
    (index tensors, the packed layout and its attention mask per layer, sampling every fed
    position, advancing ragged rows): on the tiny kits 0.3-0.4 ms a step alone (more in a run),
    as much as a plain step's tokens at a few rows, which the prefill fit cannot know. None without torch, the model,
    or a model the engine cannot verify with (no lean forward).

    `device="cuda"` and `rows` (instead of the grid up to `max_rows`): the same steps on a GPU
    (benchmarks/bench_gpu.py `speculative`), where a decode step reads every weight for a few
    tokens and a fed token should cost far less of a step than on this CPU."""
    from areal_graph.engines.inference.token_intake import take_verified

    grid_rows = list(rows) if rows else row_grid(max_rows)
    out: list[tuple[int, int, int, float, float]] = []
    with _probe_runner(
        model_dir, max(grid_rows), threads, reserve=8 * (max(drafts) + 1), need_lean=True, device=device
    ) as probe:
        if probe is None:
            return None
        runner, cap = probe
        for n, width, cache, plain in _warm_decode_grid(runner, cap, widths, grid_rows):
            plain_s = min(_timed(plain, device) for _ in range(5))
            for k in drafts:
                step = _verify_step(runner, cache, n, k, take_verified)
                step()  # warm
                out.append((n, width, n * k, min(_timed(step, device) for _ in range(5)), plain_s))
    return out


def _verify_step(runner: Any, cache: Any, rows: int, k: int, take_verified: Any) -> Any:
    """A verifying step as the engine runs it (engine.py `_verify`; its step log's time starts
    before the proposals are looked up): the speculator's proposals for every row (one prompt per
    8 rows, as a group's answers share one; their answers are the tokens sampled so far), every
    row fed its last token and a proposal of `k` tokens (whatever was found: the forward's shape
    is the probe's), the packed forward, `take_verified`, the rows advanced."""
    import concurrent.futures

    import torch

    from areal_graph.engines.inference.requests import Request
    from areal_graph.engines.inference.sampling import SamplingParams
    from areal_graph.engines.inference.speculation.speculator import SpeculativeSettings, Speculator

    params = SamplingParams(temperature=1.0, max_new_tokens=1 << 30)
    reqs = [
        Request(
            f"probe-{i}",
            [3, 5 + i // 8, 7, 3, 5 + i // 8, 7],
            params,
            concurrent.futures.Future(),
            torch.Generator().manual_seed(i),
            frozenset(),
        )
        for i in range(rows)
    ]
    spec = Speculator(SpeculativeSettings(enabled=True, max_draft=max(k, 1)))
    fed = [[3] * (1 + k) for _ in range(rows)]

    def step() -> None:
        spec.proposals(reqs)
        kept, _, _ = take_verified(reqs, fed, runner.verify(fed, cache), 0, None)
        cache.advance_rows(kept)

    return step
