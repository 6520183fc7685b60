"""The off-policy corrections a train node can apply to its behaviour weight, and their bounds.

Torch-free, so that the graph validates `is_correction` / `is_low` / `is_high` without torch;
the math is in nodes/off_policy.py, whose docstring says what each correction does.
"""

from __future__ import annotations

from dataclasses import dataclass

CORRECTIONS: tuple[str, ...] = ("none", "tis", "token_mask", "seq_mask", "icepop")
REJECTING: tuple[str, ...] = ("token_mask", "seq_mask")
# Defaults where a workflow gives no bound: TIS cap 2 (Yao et al.; verl's rollout_is_threshold),
# MIS [0.5, 2] (slime's example), geometric mask [0.999, 1.001] (verl's), IcePop [0.5, 5] (Ring-1T).
DEFAULT_BOUNDS: dict[str, tuple[float | None, float]] = {
    "tis": (None, 2.0),
    "token_mask": (0.5, 2.0),
    "seq_mask": (0.999, 1.001),
    "icepop": (0.5, 5.0),
}


class CorrectionError(ValueError):
    """A correction setting that cannot work; `field` names the train-node field at fault."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


@dataclass(frozen=True)
class ISCorrection:
    """One correction with its bounds resolved (None where the mode has no such bound)."""

    mode: str = "none"
    low: float | None = None
    high: float | None = None

    @classmethod
    def resolve(cls, mode: str, low: float | None, high: float | None) -> ISCorrection:
        """The correction a train node's `is_correction`, `is_low` and `is_high` ask for.

        Raises CorrectionError naming the field for a bound the mode does not use or an empty range."""
        if mode not in CORRECTIONS:
            raise CorrectionError("is_correction", f"must be one of {', '.join(CORRECTIONS)}, got {mode!r}")
        if mode == "none":
            if low is not None or high is not None:
                raise CorrectionError(
                    "is_low" if low is not None else "is_high", "a bound without a correction: set is_correction too"
                )
            return cls()
        default_low, default_high = DEFAULT_BOUNDS[mode]
        if mode == "tis" and low is not None:
            raise CorrectionError("is_low", "truncated IS ('tis') has only an upper bound (is_high)")
        low = default_low if low is None else low
        high = default_high if high is None else high
        if high <= 0:
            raise CorrectionError("is_high", f"must be > 0, got {high}")
        if low is not None and not 0 < low < high:
            raise CorrectionError("is_low", f"must be in (0, is_high = {high}), got {low}")
        if mode == "tis" and high < 1:
            raise CorrectionError("is_high", f"a truncation cap below 1 would shrink every fresh token, got {high}")
        return cls(mode, low, high)

    @property
    def rejects(self) -> bool:
        """Whether the correction removes tokens from the loss before the step (see module docstring)."""
        return self.mode in REJECTING

    def upper(self) -> float:
        """The upper bound (every mode but `none` has one)."""
        if self.high is None:
            raise ValueError(f"is_correction {self.mode!r} has no upper bound")
        return self.high

    def bounds(self) -> tuple[float, float]:
        """(low, high), for the modes with both (all but `none` and `tis`)."""
        if self.low is None or self.high is None:
            raise ValueError(f"is_correction {self.mode!r} has no lower and upper bound")
        return self.low, self.high
