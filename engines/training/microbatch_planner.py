"""Dynamic batching: split a packed batch across data-parallel ranks and into micro-batches.

Why: sequences in an RL batch differ wildly in length. Fixed "n sequences per micro-batch"
either overflows memory on long ones or wastes compute on padding. The planner instead packs
sequences, unpadded, into micro-batches that each hold at most `max_tokens_per_mb` tokens,
uses as few micro-batches as it can (lower bound ``ceil(tokens / budget)`` per rank) and
balances token counts, so that every rank and every micro-batch does about the same work.

The plan is ``plan[rank][microbatch] -> list of sequence indices`` (indices into `seqlens`,
ascending inside a micro-batch). Guarantees:

- every sequence appears exactly once;
- every micro-batch holds at most `max_tokens_per_mb` tokens, except a sequence that alone
  is longer than the budget: it gets a micro-batch of its own (``oversize="own"``, the
  default, with a warning in the log; the training engine must cope with one long forward)
  or raises ``ValueError`` (``oversize="error"``);
- every rank has the same number of micro-batches (data-parallel ranks must step in lock
  step). A micro-batch is empty only when a rank holds fewer sequences than that common
  count (e.g. fewer groups than ranks): the engine should then run a zero-token step;
- with ``group_ids``, all sequences of one group land on the same rank;
- with ``equal_seq_counts``, every rank gets the same number of sequences (needs
  ``len(seqlens) % dp_size == 0``, and a feasible split of the groups, else ``ValueError``);
- the plan is a deterministic function of its inputs (ties are broken by index).

Algorithm: rank split by longest-processing-time-first (largest unit to the least-loaded
rank, a heap); then, per rank, with k = the lower bound it places the sequences, longest
first, each into the least-loaded of k micro-batches (LPT: balanced, O(n log k)). When that
overflows (total tokens just below k * budget), it tries k .. k + 3 again with LPT that
ignores the budget followed by pairwise exchanges between the fullest and the emptiest
micro-batches until all fit. If that stalls too (few, long sequences per micro-batch),
best-fit-decreasing gives the count and a balancing pass evens the loads.

Measured on random lognormal batches: with a median length of budget/16 the count was at
most lower bound + 1 in 3000 of 3000 cases (usually equal to it); with only 4-5 sequences
per micro-batch and > 99.5% fill it exceeded lower bound + 1 in ~0.3% of cases. 100k
sequences plan in about 0.3-0.9 s of CPU (benchmarks/bench_planner.py).
"""

from __future__ import annotations

import bisect
import heapq
import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

log = logging.getLogger(__name__)

MicrobatchPlan = list[list[list[int]]]  # plan[rank][micro-batch] -> sequence indices

# The tight-fit repair (see `_lpt_repair`) runs on rank shares up to this many sequences
# (100k took ~0.9 s CPU in the worst case measured); beyond it best-fit-decreasing alone is used.
REPAIR_MAX_SEQS = 200_000


@dataclass(frozen=True)
class MicrobatchPlanStats:
    """Summary of a plan, for logs and benchmarks."""

    num_microbatches: int  # per rank (the same on every rank)
    lower_bound: int  # max over ranks of ceil(rank tokens / budget) (at least 1)
    tokens_per_rank: tuple[int, ...]
    max_mb_tokens: int
    min_mb_tokens: int
    mb_fill: float  # total tokens / (micro-batches * budget)
    rank_imbalance: float  # max rank tokens / mean rank tokens (1.0 = perfect)


def plan_microbatches(
    seqlens: Sequence[int],
    max_tokens_per_mb: int,
    dp_size: int = 1,
    group_ids: Sequence[int] | None = None,
    equal_seq_counts: bool = False,
    oversize: str = "own",
) -> MicrobatchPlan:
    """Plan ranks and micro-batches for sequences of the given lengths (see module docstring)."""
    lens_np = _check_inputs(seqlens, max_tokens_per_mb, dp_size, group_ids, oversize)
    rank_members = split_across_ranks(lens_np, dp_size, group_ids, equal_seq_counts)
    lens = lens_np.tolist()  # plain ints: the packing loops index them ~10x faster than numpy
    budget = int(max_tokens_per_mb)
    per_rank = [_pack_rank(lens, idx, budget, k=None) for idx in rank_members]
    k = max(max(len(p) for p in per_rank), 1)
    plan: MicrobatchPlan = []
    for idx, packed in zip(rank_members, per_rank):
        if len(packed) < k:
            packed = _pack_rank(lens, idx, budget, k=k, fallback=packed)
        plan.append(_canonical(packed, k))
    return plan


def plan_stats(plan: MicrobatchPlan, seqlens: Sequence[int], max_tokens_per_mb: int) -> MicrobatchPlanStats:
    lens = np.asarray(seqlens, dtype=np.int64)
    mb_tokens = [int(lens[mb].sum()) if mb else 0 for rank in plan for mb in rank]
    rank_tokens = tuple(int(sum(int(lens[mb].sum()) for mb in rank if mb)) for rank in plan)
    k = len(plan[0]) if plan else 0
    lb = max([max(1, math.ceil(t / max_tokens_per_mb)) for t in rank_tokens] or [1])
    total = sum(rank_tokens)
    mean_rank = total / max(len(plan), 1)
    return MicrobatchPlanStats(
        num_microbatches=k,
        lower_bound=lb,
        tokens_per_rank=rank_tokens,
        max_mb_tokens=max(mb_tokens or [0]),
        min_mb_tokens=min(mb_tokens or [0]),
        mb_fill=total / max(len(mb_tokens) * max_tokens_per_mb, 1),
        rank_imbalance=(max(rank_tokens) / mean_rank) if mean_rank > 0 else 1.0,
    )


# --------------------------------------------------------------------------- rank split
def split_across_ranks(
    seqlens: Sequence[int] | np.ndarray,
    dp_size: int,
    group_ids: Sequence[int] | None = None,
    equal_seq_counts: bool = False,
) -> list[list[int]]:
    """Sequence indices of each rank, balanced by tokens, groups kept whole.

    Units (groups, or single sequences) go largest first to the least-loaded rank; with
    `equal_seq_counts`, to the least-loaded rank that still has room for the unit.
    """
    lens = np.asarray(seqlens, dtype=np.int64)
    n = int(lens.shape[0])
    if dp_size == 1:
        return [list(range(n))]
    if group_ids is None and not equal_seq_counts:
        return _lpt_ranks(lens, dp_size)
    units = _units(n, group_ids)
    unit_tokens: list[int]
    if group_ids is None:
        unit_tokens = lens.tolist()
    else:
        unit_of: np.ndarray = np.empty(n, dtype=np.int64)
        for u, members_u in enumerate(units):
            unit_of[members_u] = u
        unit_tokens = np.bincount(unit_of, weights=lens, minlength=len(units)).astype(np.int64).tolist()
    order = _descending(unit_tokens)
    members: list[list[int]] = [[] for _ in range(dp_size)]
    if not equal_seq_counts:
        heap = [(0, r) for r in range(dp_size)]
        for u in order:
            load, r = heap[0]
            members[r].extend(units[u])
            heapq.heapreplace(heap, (load + unit_tokens[u], r))
        return members
    if n % dp_size:
        raise ValueError(f"equal_seq_counts: {n} sequences cannot be split evenly over dp_size={dp_size} ranks")
    room = [n // dp_size] * dp_size
    loads = [0] * dp_size
    for u in order:
        size = len(units[u])
        best = -1
        for r in range(dp_size):
            if room[r] >= size and (best < 0 or loads[r] < loads[best]):
                best = r
        if best < 0:
            raise ValueError(
                f"equal_seq_counts: groups of sizes {sorted({len(x) for x in units})} cannot be split into "
                f"{dp_size} ranks of {n // dp_size} sequences each"
            )
        members[best].extend(units[u])
        room[best] -= size
        loads[best] += unit_tokens[u]
    return members


def _lpt_ranks(lens: np.ndarray, dp_size: int) -> list[list[int]]:
    """Single sequences, largest first, each to the least-loaded rank (no per-unit lists)."""
    order = _descending(lens)
    values = lens.tolist()
    members: list[list[int]] = [[] for _ in range(dp_size)]
    appends = [m.append for m in members]
    heap = [(0, r) for r in range(dp_size)]
    replace = heapq.heapreplace
    for i in order:
        load, r = heap[0]
        appends[r](i)
        replace(heap, (load + values[i], r))
    return members


def _units(n: int, group_ids: Sequence[int] | None) -> list[list[int]]:
    if group_ids is None:
        return [[i] for i in range(n)]
    groups: dict[int, list[int]] = {}
    for i, g in enumerate(group_ids):
        groups.setdefault(int(g), []).append(i)
    return list(groups.values())  # first-appearance order: deterministic


# --------------------------------------------------------------------------- per-rank packing
def _pack_rank(
    lens: list[int], idx: list[int], budget: int, k: int | None, fallback: list[list[int]] | None = None
) -> list[list[int]]:
    """Pack sequences `idx` into micro-batches: as few as possible (k=None) or exactly k."""
    if not idx:
        return [[] for _ in range(k or 0)]
    sub = [lens[i] for i in idx]
    order = [idx[j] for j in _descending(sub)]
    own = [[i] for i in order if lens[i] > budget]  # documented: an oversize sequence is alone
    fit = [i for i in order if lens[i] <= budget]
    if k is not None:
        want = k - len(own)
        if want >= len(fit):
            return own + [[i] for i in fit] + [[] for _ in range(want - len(fit))]
        bins = _lpt(lens, fit, want, budget)
        if bins is None:  # rare: split the heaviest bins of the smaller feasible packing
            assert fallback is not None
            bins = _split_to(lens, [b for b in fallback if not (len(b) == 1 and lens[b[0]] > budget)], want)
        return own + bins
    if not fit:
        return own
    fit_lens = np.fromiter((lens[i] for i in fit), dtype=np.int64, count=len(fit))
    half = int((2 * fit_lens > budget).sum())  # pairwise incompatible: one micro-batch each
    lb = max(-(-int(fit_lens.sum()) // budget), half, 1)
    bins = _lpt(lens, fit, lb, budget)
    if bins is not None:
        return own + bins
    bfd = _best_fit_decreasing(lens, fit, budget)
    for kk in range(lb, min(len(bfd), lb + 4)):  # tight fit: LPT overfills a few, swaps repair
        bins = _lpt_repair(lens, fit, kk, budget)
        if bins is not None:
            return own + bins
    if len(bfd) > lb:
        bins = _lpt(lens, fit, len(bfd), budget)
        if bins is not None:
            return own + bins
    return own + _balance(lens, bfd, budget)


def _lpt_repair(lens: list[int], order: list[int], k: int, budget: int, candidates: int = 32) -> list[list[int]] | None:
    """k balanced bins even when the fill is tight: LPT ignoring the budget, then pairwise
    exchange: the fullest bin swaps one sequence with a shorter one of one of the emptiest
    bins (or just gives it one), chosen to bring the pair closest to equal, until every bin
    fits. None if it stalls.

    Why: when total tokens sit just below k * budget, plain LPT or best-fit leave unusable
    gaps and need k + 2 or more micro-batches; exchanges between the extreme bins even out
    the loads to within a few tokens because sequence lengths vary nearly continuously.
    Cost O(iterations * (k + bin size * log)), so it is tried only on ranks of moderate size.
    """
    if k <= 0 or len(order) > REPAIR_MAX_SEQS:
        return None
    heap = [(0, b) for b in range(k)]
    bins: list[list[int]] = [[] for _ in range(k)]
    for i in order:
        load, b = heap[0]
        bins[b].append(i)
        heapq.heapreplace(heap, (load + lens[i], b))
    loads = [0] * k
    for load, b in heap:
        loads[b] = load
    ranked = sorted((load, b) for b, load in enumerate(loads))  # kept sorted: O(1) fullest/emptiest
    for _ in range(3 * k + 100):
        hi = ranked[-1][1]
        if loads[hi] <= budget:
            return bins
        swap, lo = None, -1
        for _, lo in ranked[:candidates]:
            swap = _best_exchange(lens, bins[hi], bins[lo], loads[hi] - loads[lo])
            if swap is not None:
                break
        if swap is None:
            return None
        i, j = swap
        bins[hi].remove(i)
        bins[lo].append(i)
        d = lens[i]
        if j is not None:
            bins[lo].remove(j)
            bins[hi].append(j)
            d -= lens[j]
        for b, new in ((hi, loads[hi] - d), (lo, loads[lo] + d)):
            del ranked[bisect.bisect_left(ranked, (loads[b], b))]
            loads[b] = new
            bisect.insort(ranked, (new, b))
    return None


def _best_exchange(lens: list[int], a: list[int], b: list[int], gap: int) -> tuple[int, int | None] | None:
    """(i from a, j from b or None for a plain move) with 0 < len i - len j < gap, closest to
    gap / 2: both bins end strictly below the fuller one's old load."""
    if gap <= 1:
        return None
    target = gap / 2
    b_items = sorted(b, key=lambda x: (lens[x], x))
    b_lens = [0] + [lens[x] for x in b_items]
    best = None
    for i in a:
        pos = bisect.bisect_left(b_lens, lens[i] - target)
        for q in (pos - 1, pos):
            if 0 <= q < len(b_lens):
                d = lens[i] - b_lens[q]
                if 0 < d < gap and (best is None or (abs(d - target), i, q) < best):
                    best = (abs(d - target), i, q)
    if best is None:
        return None
    _, i, q = best
    return i, (b_items[q - 1] if q > 0 else None)


def _lpt(lens: list[int], order: list[int], k: int, budget: int) -> list[list[int]] | None:
    """Longest first into the least-loaded of k bins; None if some sequence does not fit.

    If the least-loaded bin has no room, no bin has: the failure is exact for this order.
    """
    if k <= 0:
        return None
    heap = [(0, b) for b in range(k)]
    bins: list[list[int]] = [[] for _ in range(k)]
    replace = heapq.heapreplace
    for i in order:
        load, b = heap[0]
        new = load + lens[i]
        if new > budget:
            return None
        bins[b].append(i)
        replace(heap, (new, b))
    return bins


def _best_fit_decreasing(lens: list[int], order: list[int], budget: int) -> list[list[int]]:
    """Each sequence (longest first) into the fullest bin it fits; remaining room kept sorted."""
    rooms: list[tuple[int, int]] = []  # (remaining room, bin id), sorted
    bins: list[list[int]] = []
    for i in order:
        n = lens[i]
        pos = bisect.bisect_left(rooms, (n, -1))
        if pos == len(rooms):
            bins.append([i])
            bisect.insort(rooms, (budget - n, len(bins) - 1))
        else:
            room, b = rooms.pop(pos)
            bins[b].append(i)
            bisect.insort(rooms, (room - n, b))
    return bins


def _balance(lens: list[int], bins: list[list[int]], budget: int, passes: int = 3) -> list[list[int]]:
    """Even out loads: pair the heaviest bin with the lightest, the 2nd with the 2nd, ...,
    and move the one sequence that best halves each pair's gap (never over budget)."""
    bins = [list(b) for b in bins]
    loads = [sum(lens[i] for i in b) for b in bins]
    smallest = min((lens[i] for b in bins for i in b), default=0)
    for _ in range(passes):
        moved = False
        by_load = sorted(range(len(bins)), key=lambda q: (loads[q], q))
        for lo, hi in zip(by_load[: len(bins) // 2], reversed(by_load[len(bins) // 2 :])):
            gap = loads[hi] - loads[lo]
            if gap <= smallest:  # gaps only shrink further down the pairing: nothing can move
                break
            best, best_err = -1, gap
            for pos, i in enumerate(bins[hi]):
                n = lens[i]
                err = abs(gap - 2 * n)
                if n < gap and loads[lo] + n <= budget and err < best_err:
                    best, best_err = pos, err
            if best >= 0:
                i = bins[hi].pop(best)
                bins[lo].append(i)
                loads[hi] -= lens[i]
                loads[lo] += lens[i]
                moved = True
        if not moved:
            break
    return bins


def _split_to(lens: list[int], bins: list[list[int]], k: int) -> list[list[int]]:
    """Reach exactly k bins by halving the heaviest multi-sequence bin (each half fits)."""
    bins = [list(b) for b in bins]
    while len(bins) < k:
        splittable = [q for q in range(len(bins)) if len(bins[q]) > 1]
        if not splittable:
            bins.append([])
            continue
        q = max(splittable, key=lambda q: (sum(lens[i] for i in bins[q]), -q))
        items = sorted(bins.pop(q), key=lambda i: (-lens[i], i))
        a, b, la, lb = [], [], 0, 0
        for i in items:
            if la <= lb:
                a.append(i)
                la += lens[i]
            else:
                b.append(i)
                lb += lens[i]
        bins += [a, b]
    return bins


def _canonical(bins: list[list[int]], k: int) -> list[list[int]]:
    """Sorted indices inside each micro-batch, micro-batches ordered by first index, empties last."""
    out = [sorted(b) for b in bins if b]
    out.sort(key=lambda b: b[0])
    return out + [[] for _ in range(k - len(out))]


def _descending(values: Sequence[int] | np.ndarray) -> list[int]:
    """Indices by value, largest first, ties by index (deterministic)."""
    return np.argsort(-np.asarray(values, dtype=np.int64), kind="stable").tolist()


def _check_inputs(
    seqlens: Sequence[int], budget: int, dp_size: int, group_ids: Sequence[int] | None, oversize: str
) -> np.ndarray:
    lens = np.asarray(seqlens, dtype=np.int64).reshape(-1)
    if isinstance(budget, bool) or not isinstance(budget, (int, np.integer)) or budget <= 0:
        raise ValueError(f"max_tokens_per_mb must be a positive integer, got {budget!r}")
    if isinstance(dp_size, bool) or not isinstance(dp_size, (int, np.integer)) or dp_size <= 0:
        raise ValueError(f"dp_size must be a positive integer, got {dp_size!r}")
    if lens.size and int(lens.min()) < 0:
        raise ValueError(f"seqlens must be non-negative; sequence {int(lens.argmin())} has length {int(lens.min())}")
    if group_ids is not None and len(group_ids) != lens.size:
        raise ValueError(f"group_ids has {len(group_ids)} entries but there are {lens.size} sequences")
    if oversize not in ("own", "error"):
        raise ValueError(f"oversize must be 'own' or 'error', got {oversize!r}")
    too_long = np.flatnonzero(lens > budget)
    if too_long.size:
        msg = (
            f"{too_long.size} sequence(s) longer than max_tokens_per_mb={budget} "
            f"(longest: index {int(too_long[lens[too_long].argmax()])}, {int(lens.max())} tokens)"
        )
        if oversize == "error":
            raise ValueError(msg)
        log.warning("%s: each gets a micro-batch of its own", msg)
    return lens
