"""The calibration run's own forwards, replayed alone: how much its environment slowed them.

Why: an asynchronous run's forwards run beside the trainer and the Python processes around
the engine, and on this project's 2-core machines they took 1.2-1.4x what the same shapes
take alone (replayed here), while a synchronous run's generation ran as fast as alone
(0.9-1.0x; the engine has the machine to itself while the trainer waits). The CPU model
(cpu.py) explains part of that; the rest we could not pin on one cause (it is not CPU time:
the other processes use ~0.3 cores). So the cost model keeps the measured ratio, and the
simulator applies it where the regime differs: a synchronous run's forwards are priced alone.

`probe_decode` measures the engine's decode step alone over a grid of batch sizes (1 to the
run's largest, powers of two) and widths: the shape of the decode cost where the run itself
seldom went (a run at 64 requests running decodes few steps of 1-8 rows, and a fit of its own
steps alone put a 3 ms fixed cost on a step that takes ~1 ms at one row).

The replay needs the run's model on this machine and is only meaningful when the run ran on
this kind of machine; `replay_ratio` returns None (and the model keeps 1.0) otherwise.
"""

from __future__ import annotations

import contextlib
import logging
import random
import time
from collections.abc import Iterator, Sequence
from typing import Any

log = logging.getLogger(__name__)

SAMPLES = 120  # decode steps replayed (prefill chunks: a quarter of that)


def replay_ratio(
    model_dir: str, steps: Sequence[Sequence[float]], threads: int = 1, seed: int = 0
) -> tuple[float, float] | None:
    """(isolated / measured) for decode steps and for prefill chunks: each sampled forward's
    shape (rows, tokens, padded tokens, width; engine_spans.StepLog) run again alone on the
    run's model with the engine's forward (and, for a decode step, its sampling and bookkeeping),
    best of three, summed against what it took in the run."""
    try:
        import torch
        from transformers import AutoModelForCausalLM

        from areal_graph.engines.inference.kv_cache import BatchedKVCache
        from areal_graph.engines.inference.model_runner import ModelRunner
    except ImportError:  # pragma: no cover - torch is a dependency
        return None
    rng = random.Random(seed)
    decodes = [s for s in steps if int(s[2]) == 1]
    prefills = [s for s in steps if int(s[2]) == 0]
    decodes = rng.sample(decodes, min(SAMPLES, len(decodes)))
    prefills = rng.sample(prefills, min(SAMPLES // 4, len(prefills)))
    if len(decodes) < 20:
        return None
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # "Loading weights" bars would land in whatever prints around this
    before = torch.get_num_threads()
    torch.set_num_threads(max(int(threads), 1))
    try:
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
        width_cap = int(getattr(model.config, "max_position_embeddings", 2048))
        runner = ModelRunner(model, torch.device("cpu"), cuda_graphs=False, max_rows=256, max_positions=width_cap + 1)
        measured_d = replayed_d = measured_p = replayed_p = 0.0
        with torch.inference_mode():
            for _, dur, _, n_rows, _, ctx, n_width, *_ in decodes:
                rows, width = int(n_rows), min(int(n_width), width_cap - 1)
                rest = max(1, int((ctx - width) // max(rows - 1, 1))) if rows > 1 else width
                lens = [width] + [min(rest, width)] * (rows - 1)
                cache = BatchedKVCache(row_capacity=max(rows, 1))
                _, keys, values, got = runner.prefill([[3] * n for n in lens], 0)
                cache.append(keys, values, got)
                step = _decode_step(runner, cache, rows)
                step()  # warm
                replayed_d += min(_timed(step) for _ in range(3))
                measured_d += dur
            for _, dur, _, p_rows, tokens, _, p_width, *_ in prefills:
                prows, pwidth = int(p_rows), min(int(p_width), width_cap)
                rest = max(1, int((tokens - pwidth) // max(prows - 1, 1))) if prows > 1 else pwidth
                seqs = [[3] * pwidth] + [[3] * min(rest, pwidth)] * (prows - 1)
                replayed_p += min(_timed(lambda seqs=seqs: runner.prefill(seqs, 0)) for _ in range(2))
                measured_p += dur
    finally:
        torch.set_num_threads(before)
    decode = replayed_d / measured_d if measured_d > 0 else 1.0
    prefill = replayed_p / measured_p if measured_p > 0 else decode
    return decode, prefill


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
    model_dir: str, max_rows: int, threads: int, reserve: int, need_lean: bool = False
) -> Iterator[tuple[Any, int] | None]:
    """(runner, cap) for a probe: the run's model on the CPU behind the engine's ModelRunner, at
    `threads` threads (restored after), in inference mode; `cap` the widest cache a probe may fill,
    `reserve` positions kept free for the tokens a step feeds. None without torch, or without the
    model's lean forward when `need_lean` (only the lean forward verifies)."""
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
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
        cap = int(getattr(model.config, "max_position_embeddings", 2048)) - 1 - reserve
        runner = ModelRunner(model, torch.device("cpu"), cuda_graphs=False, max_rows=max_rows, max_positions=cap + 1)
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


def _timed(fn: Any) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def probe_verify(
    model_dir: str, max_rows: int, widths: Sequence[int], drafts: Sequence[int] = (1, 2, 4), threads: int = 1
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
    or a model the engine cannot verify with (no lean forward)."""
    from areal_graph.engines.inference.token_intake import take_verified

    grid_rows = row_grid(max_rows)
    out: list[tuple[int, int, int, float, float]] = []
    with _probe_runner(model_dir, max(grid_rows), threads, reserve=8 * (max(drafts) + 1), need_lean=True) as probe:
        if probe is None:
            return None
        runner, cap = probe
        for rows, width, cache, plain in _warm_decode_grid(runner, cap, widths, grid_rows):
            plain_s = min(_timed(plain) for _ in range(5))
            for k in drafts:
                step = _verify_step(runner, cache, rows, k, take_verified)
                step()  # warm
                out.append((rows, width, rows * k, min(_timed(step) for _ in range(5)), plain_s))
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
