"""Whether a run has anything to learn: the check behind `runtime.no_signal`.

Why: a policy-gradient step moves the policy only where rewards differ. When every trajectory of
the last N steps got the same reward (all 0: the reward never reads an answer; all 1: it pays
everything), or almost every prompt group gave all its answers one reward (a group baseline, GRPO's
or RLOO's, then makes every advantage 0), the run trains on nothing and still looks healthy: steps
go by, losses are finite. Seen with reasoning-gym's spell_backward on the arithmetic kit (no answer
in a form the scorer reads) and TextArena's TowerOfHanoi on the game kit (every game lost to an
invalid move): reward 0.000 on every step, to the end, without a word.

`LearningSignalWatch` is the detector, on plain numbers (one call per training step with the
step's rewards and group ids): its per-step metrics, and a `NoSignal` finding the first time the
window has nothing to learn, once per run. `explain` words the finding for the console: the
numbers, the likely causes with what the run measured about each, where to look. The controller
feeds it (`Controller._train_step`), logs the metrics and warns or stops (`runtime.no_signal.action`).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

# Rewards this close count as one: a group baseline subtracts the mean, and float noise from a
# weighted sum of equal rewards must not pass for a signal.
SAME = 1e-6


@dataclass(frozen=True)
class StepRewards:
    """One training step's rewards, as the check needs them."""

    trajectories: int
    groups: int  # prompt groups of more than one answer (a group of one has no spread to learn from)
    flat_groups: int  # of those, groups whose answers all got one reward
    low: float
    high: float


def step_rewards(rewards: Sequence[float], group_ids: Sequence[int] | None) -> StepRewards:
    """Count a step's trajectories and its flat prompt groups (None: no groups, e.g. no group ids)."""
    by_group: dict[int, list[float]] = {}
    for reward, gid in zip(rewards, group_ids if group_ids is not None else range(len(rewards)), strict=True):
        by_group.setdefault(int(gid), []).append(float(reward))
    spread = [max(g) - min(g) for g in by_group.values() if len(g) > 1]
    return StepRewards(
        trajectories=len(rewards),
        groups=len(spread),
        flat_groups=sum(s <= SAME for s in spread),
        low=min(rewards, default=0.0),
        high=max(rewards, default=0.0),
    )


@dataclass(frozen=True)
class NoSignal:
    """What the last `steps` steps held when they had nothing to learn."""

    steps: int
    trajectories: int
    groups: int
    flat_groups: int
    reward: float | None  # the one reward every trajectory got; None when the groups were flat, not all alike
    learned_before: bool = False  # an earlier step of the run had rewards that differed

    @property
    def solved(self) -> bool:
        """Every answer paid the same positive reward after the run had a signal: the policy learned
        the task (the shipped arithmetic kit reaches 100%), not a reward that cannot read an answer."""
        return self.learned_before and self.reward is not None and self.reward > 0

    @property
    def flat_share(self) -> float:
        return self.flat_groups / self.groups if self.groups else 1.0


class LearningSignalWatch:
    """Feed it each step's rewards (`observe`); it says, once, when the last `steps` steps had
    nothing to learn.

    `steps`: the window (0: never check); `flat_groups`: the share of flat prompt groups over the
    window at or above which there is (almost) nothing to learn; `group_baseline`: whether the
    advantage estimator baselines per group (GRPO, RLOO), so that a flat group teaches nothing even
    when groups differ from one another (GAE's critic and plain REINFORCE learn from those)."""

    def __init__(self, steps: int, flat_groups: float, group_baseline: bool = True) -> None:
        if steps < 0 or not 0 < flat_groups <= 1:
            raise ValueError(f"steps must be >= 0 and flat_groups in (0, 1], got {steps}, {flat_groups}")
        self.steps = steps
        self.flat_groups = flat_groups
        self.group_baseline = group_baseline
        self.window: deque[StepRewards] = deque(maxlen=max(steps, 1))
        self.finding: NoSignal | None = None  # the first finding (said once)
        self.had_signal = False  # some step so far had rewards that differed

    def observe(
        self, rewards: Sequence[float], group_ids: Sequence[int] | None
    ) -> tuple[dict[str, float], NoSignal | None]:
        """This step's metrics (`signal/flat_groups_frac`: the share of this step's prompt groups
        whose answers all got one reward; `signal/nothing_to_learn`: 1 while the last `steps` steps
        have nothing to learn), and the finding the first time they have (None at every other step)."""
        step = step_rewards(rewards, group_ids)
        metrics: dict[str, float] = {}
        if step.groups:
            metrics["signal/flat_groups_frac"] = step.flat_groups / step.groups
        if not self.steps or not step.trajectories:
            return metrics, None
        learned_before = self.had_signal
        self.had_signal |= step.high - step.low > SAME
        self.window.append(step)
        found = self._nothing_to_learn(learned_before)
        metrics["signal/nothing_to_learn"] = float(found is not None)
        if found is None or self.finding is not None:
            return metrics, None
        self.finding = found
        return metrics, found

    def _nothing_to_learn(self, learned_before: bool) -> NoSignal | None:
        if len(self.window) < self.steps:
            return None
        low = min(s.low for s in self.window)
        high = max(s.high for s in self.window)
        groups = sum(s.groups for s in self.window)
        flat = sum(s.flat_groups for s in self.window)
        same = high - low <= SAME
        if not same and not (self.group_baseline and groups and flat / groups >= self.flat_groups):
            return None
        return NoSignal(
            steps=len(self.window),
            trajectories=sum(s.trajectories for s in self.window),
            groups=groups,
            flat_groups=flat,
            reward=low if same else None,
            learned_before=learned_before,
        )


@dataclass(frozen=True)
class Clues:
    """What the run knows about the likely causes, for `explain` (from the workflow and the last step)."""

    reward_fns: tuple[str, ...]  # the reward nodes' fns
    prompt_template: str | None
    max_new_tokens: int | None
    cut_off: float | None  # share of the last step's answers that hit max_new_tokens (no_eos/frac)
    invalid_moves: float | None  # share of the last step's episodes ended by an invalid move (env/invalid_move)
    eval_command: str  # how to see the answers and their rewards
    metrics_path: str


# What each builtin reward reads in an answer: an answer it cannot read scores 0.
READS = {
    "math_verify": "the last \\boxed{...}, else the text after '####' or 'the answer is'",
    "reasoning_gym": "only <answer>...</answer> or \\boxed{...}, which the tasks' questions do not ask for",
    "agent": "the environment's own reward, which a move or answer the environment cannot read never earns",
    "code": "the last ```python block (else the last fenced block), run against the row's tests",
    "code_fraction": "the last ```python block (else the last fenced block), run against the row's tests",
}


def explain(found: NoSignal, clues: Clues, action: str) -> str:
    """The console's message: the numbers, the likely causes (with what the run measured), where to look."""
    if found.reward is not None:
        what = (
            f"every one of the {found.trajectories} trajectories of the last {found.steps} steps got reward "
            f"{found.reward:.3f}"
        )
    else:
        what = (
            f"{found.flat_groups} of the {found.groups} prompt groups of the last {found.steps} steps "
            f"({found.flat_share:.0%}) gave all their answers one reward"
        )
    lines = [f"nothing to learn: {what}, so the advantages are 0 and training does not move the policy."]
    if found.solved:  # earlier steps had a signal: the policy got every answer right
        lines.append(
            f"Every answer is paid {found.reward:g}: the policy solves this data (harder data would "
            "teach it more), or the reward has started to pay anything."
        )
        lines.append(f"Per step: reward/mean in {clues.metrics_path}.")
        if action == "warn":
            lines.append("The run goes on (runtime.no_signal.action: stop ends such a run here).")
        return "\n".join(lines)
    causes = []
    if found.reward is not None and found.reward > 0:
        causes.append(f"every answer is paid {found.reward:g}: the reward pays anything, or the task is solved")
    if found.reward is None:
        causes.append(
            "each prompt is answered right by all its answers or by none: the data is too easy or too hard "
            "for the policy at this temperature"
        )
    for fn in clues.reward_fns:
        causes.append(f"answer format: fn {fn} reads {READS.get(fn, 'what your function reads')}")
    if any(fn != "agent" for fn in clues.reward_fns):  # an environment's own messages say what it reads
        if clues.prompt_template is None:
            causes.append("prompt template: data.prompt_template is not set, so the prompt does not ask for that form")
        else:
            causes.append(f"prompt template: does data.prompt_template ({clues.prompt_template!r}) ask for that form?")
    if clues.cut_off:
        causes.append(
            f"context too short: {clues.cut_off:.0%} of the last step's answers stopped at max_new_tokens "
            f"({clues.max_new_tokens}) before their end"
        )
    if clues.invalid_moves:
        causes.append(
            f"invalid moves: {clues.invalid_moves:.0%} of the last step's episodes ended on an invalid move "
            "(env/invalid_move)"
        )
    lines.append("Likely causes: " + "; ".join(causes) + ".")
    lines.append(
        f"Look at the answers and their rewards: {clues.eval_command}; per step: signal/flat_groups_frac and "
        f"reward/mean in {clues.metrics_path}."
    )
    if action == "warn":
        lines.append("The run goes on (runtime.no_signal.action: stop ends such a run here).")
    return "\n".join(lines)
