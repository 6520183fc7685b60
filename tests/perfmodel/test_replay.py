"""perfmodel/replay.py: forwards of given shapes run again alone on a real (tiny) model, and the
ratio to what they took in a run."""

from __future__ import annotations

from areal_graph.perfmodel.replay import replay_ratio


def test_forwards_that_took_ten_times_longer_in_the_run_replay_at_a_small_fraction(tiny_model_dir):
    # [t, dur s, kind, rows, tokens, ctx, width]: decode steps of 8 rows over 40 columns, 2 prefills
    decodes = [[0.0, 0.05, 1, 8, 8, 8 * 30, 40] for _ in range(30)]
    prefills = [[0.0, 0.5, 0, 4, 120, 160, 40] for _ in range(4)]
    decode, prefill = replay_ratio(str(tiny_model_dir), decodes + prefills)
    assert 0 < decode < 0.5 and 0 < prefill < 0.5


def test_too_few_decode_steps_give_no_answer(tiny_model_dir):
    assert replay_ratio(str(tiny_model_dir), [[0.0, 0.01, 1, 2, 2, 20, 10]] * 5) is None
