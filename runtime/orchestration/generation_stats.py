"""What generation-side nodes report between two training steps, as one line of the step's metrics.

Many prompt groups pass the generation side per step, each calling every node once, and each
call returns its own stats (`node/key`). Counts and seconds (`judge/failures`,
`rm_score/forwards`) add up over the calls; a per-call mean (`rm_score/mean`: a key that is
`mean` or ends in `_mean` or `/mean`) is averaged over them instead, so a sigmoid score's mean
stays in [0, 1] however many groups the step saw.
"""

from __future__ import annotations


def is_mean(key: str) -> bool:
    leaf = key.rsplit("/", 1)[-1]
    return leaf == "mean" or leaf.endswith("_mean")


class GenerationStats:
    """Accumulates node stats since the last `take()`."""

    def __init__(self) -> None:
        self._sums: dict[str, float] = {}
        self._calls: dict[str, int] = {}

    def add(self, stats: dict[str, float]) -> None:
        for key, value in stats.items():
            self._sums[key] = self._sums.get(key, 0.0) + float(value)
            self._calls[key] = self._calls.get(key, 0) + 1

    def take(self) -> dict[str, float]:
        """The stats since the last take (sums, and means of the means), and start over."""
        out = {k: v / self._calls[k] if is_mean(k) else v for k, v in self._sums.items()}
        self._sums, self._calls = {}, {}
        return out
