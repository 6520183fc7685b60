"""runtime/orchestration/learning_signal.py: the "nothing to learn" check, on plain numbers.
Feed it step rewards; it fires once, when the last N steps had nothing to learn, and never
before the window is full or while some group still has a spread."""

from __future__ import annotations

import pytest

from areal_graph.runtime.orchestration.learning_signal import (
    Clues,
    LearningSignalWatch,
    NoSignal,
    explain,
    step_rewards,
)

GROUPS = [0, 0, 0, 0, 1, 1, 1, 1]  # two prompt groups of four answers


def feed(watch: LearningSignalWatch, steps: list[list[float]], groups=GROUPS) -> list[NoSignal | None]:
    return [watch.observe(rewards, groups)[1] for rewards in steps]


def test_all_zero_fires_once_when_the_window_is_full():
    watch = LearningSignalWatch(steps=3, flat_groups=0.95)
    found = feed(watch, [[0.0] * 8] * 6)
    assert found[:2] == [None, None]  # not before N steps
    assert found[2] == NoSignal(steps=3, trajectories=24, groups=6, flat_groups=6, reward=0.0)
    assert found[3:] == [None, None, None]  # said once
    assert watch.finding == found[2]


def test_all_one_fires_too_with_the_reward_it_pays():
    watch = LearningSignalWatch(steps=2, flat_groups=1.0)
    assert feed(watch, [[1.0] * 8] * 2)[1].reward == 1.0


def test_one_step_with_a_spread_inside_the_window_keeps_it_quiet():
    watch = LearningSignalWatch(steps=3, flat_groups=0.95)
    spread = [0.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0]
    assert feed(watch, [[0.0] * 8, spread, [0.0] * 8, [0.0] * 8]) == [None, None, None, None]
    # the spread leaves the window: now it fires
    found = NoSignal(steps=3, trajectories=24, groups=6, flat_groups=6, reward=0.0, learned_before=True)
    assert feed(watch, [[0.0] * 8]) == [found]
    assert not found.solved  # all 0 after a signal: lost, not solved


def test_flat_groups_of_different_rewards_fire_under_a_group_baseline_only():
    """Group 0 all 1, group 1 all 0: rewards differ across groups, but GRPO's advantages are all 0."""
    flat = [1.0] * 4 + [0.0] * 4
    grpo = LearningSignalWatch(steps=2, flat_groups=0.95, group_baseline=True)
    expected = NoSignal(steps=2, trajectories=16, groups=4, flat_groups=4, reward=None, learned_before=True)
    assert feed(grpo, [flat, flat])[1] == expected
    gae = LearningSignalWatch(steps=2, flat_groups=0.95, group_baseline=False)
    assert feed(gae, [flat, flat]) == [None, None]


def test_the_flat_share_threshold():
    """3 of 4 groups flat over the window: 75%. It fires at a threshold of 0.75, not at 0.8."""
    one_spread = [1.0] * 4 + [0.0, 1.0, 0.0, 0.0]
    flat = [1.0] * 4 + [0.0] * 4
    assert feed(LearningSignalWatch(2, 0.8), [one_spread, flat]) == [None, None]
    found = feed(LearningSignalWatch(2, 0.75), [one_spread, flat])[1]
    assert (found.flat_groups, found.groups, found.flat_share) == (3, 4, 0.75)


def test_metrics_every_step_and_zero_steps_never_checks():
    watch = LearningSignalWatch(steps=2, flat_groups=0.95)
    metrics, _ = watch.observe([1.0] * 4 + [0.0, 1.0, 0.0, 0.0], GROUPS)
    assert metrics == {"signal/flat_groups_frac": 0.5, "signal/nothing_to_learn": 0.0}
    watch.observe([0.0] * 8, GROUPS)
    metrics, _ = watch.observe([0.0] * 8, GROUPS)
    assert metrics["signal/nothing_to_learn"] == 1.0
    off = LearningSignalWatch(steps=0, flat_groups=0.95)
    assert [off.observe([0.0] * 8, GROUPS) for _ in range(5)] == [({"signal/flat_groups_frac": 1.0}, None)] * 5


def test_groups_of_one_have_no_spread_to_count():
    step = step_rewards([0.0, 1.0, 0.0], [0, 1, 2])
    assert (step.trajectories, step.groups, step.flat_groups, step.low, step.high) == (3, 0, 0, 0.0, 1.0)
    assert step_rewards([0.5, 0.5], None).groups == 0
    assert step_rewards([0.5, 0.5 + 1e-9, 0.2, 0.3], [7, 7, 8, 8]).flat_groups == 1  # float noise is no spread


@pytest.mark.parametrize("steps, flat", [(-1, 0.9), (3, 0.0), (3, 1.5)])
def test_bad_settings_are_refused(steps, flat):
    with pytest.raises(ValueError):
        LearningSignalWatch(steps, flat)


def clues(**kw) -> Clues:
    base = dict(
        reward_fns=("reasoning_gym",),
        prompt_template=None,
        max_new_tokens=64,
        cut_off=0.0,
        invalid_moves=None,
        eval_command="areal-graph eval M --workflow R/config.yaml",
        metrics_path="R/metrics.jsonl",
    )
    return Clues(**{**base, **kw})


def test_the_message_has_the_numbers_the_causes_measured_and_where_to_look():
    found = NoSignal(steps=10, trajectories=320, groups=40, flat_groups=40, reward=0.0)
    text = explain(found, clues(), "warn")
    assert text.startswith("nothing to learn: every one of the 320 trajectories of the last 10 steps got reward 0.000")
    assert "fn reasoning_gym reads only <answer>...</answer> or \\boxed{...}" in text
    assert "data.prompt_template is not set" in text
    assert "context too short" not in text and "invalid moves" not in text  # nothing measured says so
    assert "areal-graph eval M --workflow R/config.yaml" in text and "R/metrics.jsonl" in text
    assert text.endswith("(runtime.no_signal.action: stop ends such a run here).")
    measured = explain(found, clues(cut_off=0.62, invalid_moves=0.97, prompt_template="{question} <answer>"), "stop")
    assert "context too short: 62% of the last step's answers stopped at max_new_tokens (64)" in measured
    assert "invalid moves: 97% of the last step's episodes ended on an invalid move" in measured
    assert "does data.prompt_template ('{question} <answer>') ask for that form?" in measured
    assert "action: stop ends" not in measured


def test_flat_groups_are_worded_as_such():
    found = NoSignal(steps=10, trajectories=320, groups=40, flat_groups=39, reward=None)
    text = explain(found, clues(reward_fns=("math_verify",)), "warn")
    assert "39 of the 40 prompt groups of the last 10 steps (98%) gave all their answers one reward" in text
    assert "all its answers or by none: the data is too easy or too hard" in text
    assert "fn math_verify reads the last \\boxed{...}" in text


def test_a_game_s_causes_are_its_moves_not_a_prompt_template():
    found = NoSignal(steps=10, trajectories=320, groups=40, flat_groups=40, reward=0.0)
    text = explain(found, clues(reward_fns=("agent",), invalid_moves=1.0), "warn")
    assert "fn agent reads the environment's own reward, which a move or answer the environment cannot read" in text
    assert "invalid moves: 100% of the last step's episodes ended on an invalid move" in text
    assert "prompt template" not in text


def test_a_policy_that_learned_the_task_is_told_as_solved_not_as_a_fault():
    """All answers paid 1 after steps that had a spread: the policy solved the data (the shipped
    kit reaches 100%): the message says so, without the causes of a reward that reads nothing.
    Paid 1 from the first step on, it is still a suspect reward."""
    watch = LearningSignalWatch(steps=2, flat_groups=0.95)
    spread = [0.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0]
    found = feed(watch, [spread, [1.0] * 8, [1.0] * 8])[2]
    assert found is not None and found.solved and found.reward == 1.0
    text = explain(found, clues(), "warn")
    assert "the policy solves this data" in text and "answer format" not in text
    never = feed(LearningSignalWatch(steps=2, flat_groups=0.95), [[1.0] * 8] * 2)[1]
    assert never is not None and not never.solved
    assert "answer format" in explain(never, clues(), "warn")
