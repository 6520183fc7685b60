"""Arrows in the trace from each prompt group's generation to the train step that consumed it.

Why: in asynchronous RL a trajectory is trained some versions after it was generated
(bounded by max_staleness). Drawn as a Chrome flow arrow from the group's rollout span to
the train span of its step, staleness is the arrow's length, and a group that waited long in
the buffer stands out.

How it is recorded: the controller asks `GroupFlows.span_args(node, batch)` for the args of
every node span it opens. The source (rollout) span of group g gets `flow_out: [id]`, the
actor's train span gets `flow_in: [ids of the groups in its batch]`; the Tracer turns those
args into standard flow events (`flow_events`) on the span's own pid and tid:

    {"ph": "s", "id": ID, "cat": "flow", "name": "group", "ts": inside the rollout span, ...}
    {"ph": "f", "bp": "e", "id": ID, "cat": "flow", "name": "group", "ts": inside the train span, ...}

Ids are strings "<run>.g<group>" (".a<k>" for the k-th retry of a group whose earlier attempt
failed), unique within a trace also across resumes (the <run> part differs per controller).
Only groups that reached the sample buffer get an arrow end; a span that raised starts none.
"""

from __future__ import annotations

import os
import time
from typing import Any

FLOW_CAT = "flow"
FLOW_NAME = "group"
FLOW_OUT = "flow_out"  # span arg: flow ids that start at this span
FLOW_IN = "flow_in"  # span arg: flow ids that end at this span


def flow_events(event: dict[str, Any]) -> list[dict[str, Any]]:
    """The flow events a complete ("X") event's args ask for, bound to that event.

    "s" sits 1 us before the span's end (the group is ready then), "f" 1 us after the start
    of the consuming span, both strictly inside their span so every viewer binds them to it.
    """
    args = event.get("args") or {}
    outs, ins = args.get(FLOW_OUT), args.get(FLOW_IN)
    if not (outs or ins) or "error" in args:
        return []
    ts, dur = event["ts"], event.get("dur", 0)
    inset = 1 if dur >= 2 else 0
    base = {"cat": FLOW_CAT, "name": FLOW_NAME, "pid": event["pid"], "tid": event["tid"]}
    out = [dict(base, ph="s", id=fid, ts=ts + dur - inset) for fid in outs or ()]
    out += [dict(base, ph="f", bp="e", id=fid, ts=ts + inset) for fid in ins or ()]
    return out


class GroupFlows:
    """Which flow id each prompt group carries, from its rollout span to its train span.

    Used by the controller: `attempt(gid, k)` before each try of a group, `accepted(gid)` when
    the group enters the sample buffer, `span_args(node, batch)` for each node span.
    """

    def __init__(
        self, source: str, train_nodes: set[str] | frozenset[str], enabled: bool = True, run_tag: str | None = None
    ) -> None:
        self.source = source
        self.train_nodes = frozenset(train_nodes)
        self.enabled = enabled
        self.run_tag = run_tag or f"{os.getpid():x}{int(time.time() * 1000) % 0xFFFFFF:06x}"
        self._attempts: dict[int, int] = {}  # gid -> current attempt, while the group generates
        self._ready: dict[int, str] = {}  # gid -> flow id, from the buffer until its train span

    @classmethod
    def for_plan(cls, plan: Any, enabled: bool = True) -> GroupFlows:
        """The flows of a plan: its source node, and the train node(s) of the served model."""
        trains = {n for n in plan.training if plan.kind(n).trains and plan.node(n).model == plan.actor}
        return cls(plan.source, trains, enabled)

    def flow_id(self, gid: int, attempt: int = 0) -> str:
        return f"{self.run_tag}.g{gid}" + (f".a{attempt}" if attempt else "")

    def attempt(self, gid: int, attempt: int) -> None:
        if self.enabled:
            self._attempts[gid] = attempt

    def accepted(self, gid: int) -> None:
        """The group is in the sample buffer: its train span will end the arrow."""
        if self.enabled:
            self._ready[gid] = self.flow_id(gid, self._attempts.pop(gid, 0))

    def settled(self, gid: int) -> None:
        """The group will not reach the buffer (dropped by a filter or failed)."""
        self._attempts.pop(gid, None)

    def span_args(self, node: str, batch: Any) -> dict[str, Any]:
        """Span args for a call of `node` on `batch`: the flow ids starting or ending there."""
        if not self.enabled or (node != self.source and node not in self.train_nodes):
            return {}
        if "group_id" not in batch:
            return {}
        gids = [g for g in dict.fromkeys(int(g) for g in batch["group_id"].tolist()) if g >= 0]  # eval: < 0
        if node == self.source:
            return {FLOW_OUT: [self.flow_id(g, self._attempts.get(g, 0)) for g in gids]} if gids else {}
        ids = [self._ready.pop(g) for g in gids if g in self._ready]
        if gids:  # groups are trained in submission order: older ones still here were dropped on the way
            newest = max(gids)
            for g in [g for g in self._ready if g <= newest]:
                del self._ready[g]
        return {FLOW_IN: ids} if ids else {}
