"""Which prompt group, episode and turn a generation request belongs to: `request_tags`.

Why: a request span in the trace (the server's) carried only its request id, so a multi-turn
episode's turns could not be told apart or tied to their group. The rollout worker runs each
prompt group's rollout inside `episode_group(gid)`; within it, every asyncio task that generates
(rollouts run one task per answer, as `asyncio.gather` makes them) is numbered in the order it
first generates, and each new request id the task sends is its next turn (a request resubmitted
after an interruption keeps its id, and its turn). The client sends the tags with the request;
our embedded server records them on the request's spans (`group`, `episode`, `turn`). No change
to a rollout class is needed, and outside a group (eval, a served model) there are no tags.
"""

from __future__ import annotations

import asyncio
import contextvars
import weakref
from typing import Any

TAG_KEYS = ("group", "episode", "turn")


class _Group:
    __slots__ = ("gid", "next_episode", "tasks")

    def __init__(self, gid: int) -> None:
        self.gid = gid
        self.next_episode = 0
        # per generating task: [episode, turn, last request id]
        self.tasks: weakref.WeakKeyDictionary[Any, list[Any]] = weakref.WeakKeyDictionary()


_GROUP: contextvars.ContextVar[_Group | None] = contextvars.ContextVar("areal_graph_episode_group", default=None)


def enter_group(gid: int) -> None:
    """Tag the requests of the current task (and the tasks it starts) with prompt group `gid`.
    Call at the start of the coroutine that runs one group's rollout: a task's context is its own."""
    _GROUP.set(_Group(int(gid)))


def request_tags(rid: str) -> dict[str, int] | None:
    """{"group", "episode", "turn"} for a request `rid` sent now from this task; None outside a group."""
    group = _GROUP.get()
    task = asyncio.current_task() if group is not None else None
    if group is None or task is None:
        return None
    rec = group.tasks.get(task)
    if rec is None:
        rec = group.tasks[task] = [group.next_episode, -1, None]
        group.next_episode += 1
    if rec[2] != rid:
        rec[1] += 1
        rec[2] = rid
    return {"group": group.gid, "episode": rec[0], "turn": rec[1]}


def parse_tags(raw: Any) -> dict[str, int] | None:
    """Tags from a request body (the server's side): ints under TAG_KEYS only (a group may be
    negative: the evaluation's groups are), anything else dropped: they label a trace, they
    never fail a request."""
    if not isinstance(raw, dict):
        return None
    out = {
        k: int(v)
        for k, v in raw.items()
        if k in TAG_KEYS
        and isinstance(v, int)
        and not isinstance(v, bool)
        and (0 if k != "group" else -(1 << 62)) <= v < 1 << 62
    }
    return out or None
