"""The bounded-staleness rule as pure functions: what the gate admits and which groups a step trains.

One rule, two users: `staleness.py:StalenessGate` (the run) and `perfmodel/simulator.py`
(the prediction). Both call these functions *through this module* (`staleness_rule.admissible(...)`,
not a name imported into theirs), so a change here changes both, and a test that swaps a
function here sees both follow (tests/perfmodel/test_simulator.py). Why a module of its own and
not staleness.py: staleness.py needs torch (`version_range`), and perfmodel/ imports no torch.

The rule (AReaL; docs/design.md): with B trajectories per training step, current policy version
v and max staleness eta, at most ``(eta + v + 1) * B`` trajectories may be accepted or running
in total since the start of the run; the trainer takes groups in submission order.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeVar

T = TypeVar("T")


def staleness_bound(max_staleness: int, version: int, batch_size: int) -> int:
    """``(eta + v + 1) * B``: how many trajectories may have been accepted or be running, in total
    since the start of the run, while the policy is at `version`.

    Named for what it bounds (the run's admitted total), not for its use: the gate checks every
    submission against it, and its value at version 0 is the most that can ever run at once."""
    return (max_staleness + version + 1) * batch_size


def admissible(max_concurrent: int, running: int, accepted: int, bound: int) -> int:
    """How many new trajectories may be submitted now (never negative):
    ``min(max_concurrent - running, bound - (accepted + running))``.

    Named for the answer (a count that may be admitted), as `StalenessGate.capacity` returns it:
    the concurrency limit and the staleness `bound` (`staleness_bound`) each cap it; a trajectory
    that finished and was dropped is neither running nor accepted, so it frees its slot."""
    return max(min(max_concurrent - running, bound - (accepted + running)), 0)


def due_groups(untrained: Sequence[T], wanted: int) -> list[T] | None:
    """The groups the next training step takes: the `wanted` (B / G) first of `untrained`, which
    the caller gives in submission order; None while fewer than that are untrained.

    Why submission order, not the first groups to finish: the gate admits a group at version v
    only while at most (v + eta + 1) B trajectories are admitted, so the k-th group trained in
    submission order is trained by step v + eta at the latest: the bound holds exactly, whatever
    order groups finish in. The caller then waits until every due group is generated (a group
    dropped by a filter or failed leaves `untrained`, and the next one moves up)."""
    due = list(untrained[:wanted])
    return due if len(due) == wanted else None
