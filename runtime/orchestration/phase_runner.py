"""Run one phase of the plan on one batch: every node as soon as its inputs are ready.

The generation side runs this once per prompt group (after its rollout), the training side
once per step. A node starts when the nodes it depends on (`plan.deps`) have finished;
nodes that do not depend on each other run at the same time (on different processes they
truly overlap). Every node receives exactly its declared reads (plus the implicit
sequence ids); a declared read missing from the batch is an error naming node and key,
never a silent drop. What a node returns is checked against its declaration: exactly its
`writes`, for the sequences it was given, or a subset of whole prompt groups when its kind
may drop groups (a filter).

Why by sample id: a filter may drop groups while a sibling node still works on the larger
batch; the sibling's output is then cut down to the sequences that are left.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import torch

from areal_graph.data.packed import PackedBatch
from areal_graph.graph.kinds.common import IMPLICIT_ROLLOUT_KEYS
from areal_graph.graph.plan import ExecutionPlan

ID_KEYS = ("group_id", "sample_id")


class NodeContractError(RuntimeError):
    """A node was given or returned something its declaration does not allow."""


@dataclass
class NodeResult:
    batch: PackedBatch
    stats: dict[str, float] = field(default_factory=dict)


@dataclass
class PhaseOutcome:
    batch: PackedBatch | None  # None: every sequence was dropped
    stats: dict[str, float]
    groups_dropped: dict[str, int]  # node -> prompt groups it dropped


CallNode = Callable[[str, PackedBatch], Awaitable[NodeResult]]


def node_inputs(plan: ExecutionPlan, name: str, batch: PackedBatch) -> PackedBatch:
    """The keys `name` declares it reads (and the implicit ids), or an error naming what is missing."""
    reads = plan.reads(name)
    missing = [k for k in reads if k not in batch]
    if missing:
        raise NodeContractError(
            f"node {name!r} reads {missing}, which the batch does not hold (it has {sorted(batch.keys())}): "
            "the node that writes it did not run or did not write it"
        )
    implicit = [k for k in IMPLICIT_ROLLOUT_KEYS + plan.kind(name).optional_reads if k in batch and k not in reads]
    return batch.select_keys(list(reads) + implicit)


def _ids(batch: PackedBatch) -> list[int]:
    return batch.seqs["sample_id"].tolist()


def check_output(plan: ExecutionPlan, name: str, given: PackedBatch, out: PackedBatch) -> None:
    """Exactly the declared writes; the same sequences, or a subset of whole groups (filters)."""
    node = plan.node(name)
    keys = out.keys() - set(ID_KEYS)
    if keys != set(node.writes):
        extra, missing = sorted(keys - set(node.writes)), sorted(set(node.writes) - keys)
        raise NodeContractError(
            f"node {name!r} must return exactly its declared writes {list(node.writes)}"
            + (f"; it did not write {missing}" if missing else "")
            + (f"; it wrote undeclared {extra}" if extra else "")
        )
    if out.num_seqs == given.num_seqs and torch.equal(out.cu_seqlens, given.cu_seqlens):
        return
    if not plan.kind(name).may_drop:
        raise NodeContractError(
            f"node {name!r} returned {out.num_seqs} sequences for the {given.num_seqs} it was "
            f"given; a node of kind {plan.node(name).kind} keeps every sequence"
        )
    if "sample_id" not in out.seqs or "group_id" not in given.seqs:
        raise NodeContractError(
            f"node {name!r} dropped sequences but its output has no sample_id: return "
            "batch.select(kept_indices) with the writes added, so the kept ones are known"
        )
    given_ids = _ids(given)
    kept = set(_ids(out))
    if not kept <= set(given_ids) or len(kept) != out.num_seqs:
        raise NodeContractError(f"node {name!r} returned sequences it was not given (or one twice)")
    groups: dict[int, list[bool]] = {}
    for sid, gid in zip(given_ids, given.seqs["group_id"].tolist()):
        groups.setdefault(gid, []).append(sid in kept)
    partial = [g for g, flags in groups.items() if any(flags) and not all(flags)]
    if partial:
        raise NodeContractError(
            f"node {name!r} dropped part of prompt group(s) {partial[:5]}: a node may drop "
            "whole groups only (group-normalised advantages need every answer of a prompt)"
        )


def restrict(batch: PackedBatch, keep_ids: list[int]) -> PackedBatch:
    """`batch` cut down to the sequences with these sample ids (in `batch`'s order)."""
    keep = set(keep_ids)
    idx = [i for i, s in enumerate(_ids(batch)) if s in keep]
    return batch if len(idx) == batch.num_seqs else batch.select(idx)


def _merge(state: PackedBatch, out: PackedBatch) -> PackedBatch:
    """The state with `out`'s writes added, both cut to the sequences present in both."""
    if out.num_seqs != state.num_seqs or not torch.equal(out.cu_seqlens, state.cu_seqlens):
        common = [s for s in _ids(state) if s in set(_ids(out))]
        state, out = restrict(state, common), restrict(out, common)
    writes = out.select_keys(out.keys() - set(ID_KEYS))
    return state.update(writes)


def _groups(batch: PackedBatch) -> set[int]:
    return set(batch.seqs["group_id"].tolist()) if "group_id" in batch.seqs else set()


async def run_phase(plan: ExecutionPlan, names: tuple[str, ...], batch: PackedBatch, call: CallNode) -> PhaseOutcome:
    """Run `names` (one phase, topologically ordered) on `batch` as a DAG; see module docstring."""
    state = batch
    stats: dict[str, float] = {}
    dropped: dict[str, int] = {}
    done = {n: asyncio.Event() for n in names}

    async def one(name: str) -> None:
        nonlocal state
        for dep in plan.deps[name]:
            await done[dep].wait()
        if state.num_seqs == 0:  # everything was dropped upstream: nothing left to compute
            done[name].set()
            return
        given = node_inputs(plan, name, state)
        result = await call(name, given)
        check_output(plan, name, given, result.batch)
        out = result.batch
        if "sample_id" not in out.seqs:  # only its writes, for the sequences it was given (checked above):
            out = out.update(given.select_keys([k for k in ID_KEYS if k in given]))  # a filter may cut them
        before = _groups(state)
        state = _merge(state, out)
        if len(before) > len(_groups(state)):
            dropped[name] = len(before) - len(_groups(state))
        stats.update({f"{name}/{k}": v for k, v in result.stats.items()})
        done[name].set()

    tasks = [asyncio.create_task(one(n), name=f"node-{n}") for n in names]
    try:
        await asyncio.gather(*tasks)
    except BaseException:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise
    return PhaseOutcome(state if state.num_seqs else None, stats, dropped)
