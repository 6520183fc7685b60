"""perfmodel/replay.py: forwards of given shapes run again alone on a real (tiny) model, and the
ratio to what they took in a run."""

from __future__ import annotations

import pytest

from areal_graph.perfmodel.replay import probe_decode, probe_verify, replay_ratio


@pytest.mark.parametrize("out_column", [False, True])
def test_forwards_that_took_ten_times_longer_in_the_run_replay_at_a_small_fraction(tiny_model_dir, out_column):
    # [t, dur s, kind, rows, tokens, ctx, width(, out)]: decode steps of 8 rows over 40 columns,
    # 4 prefills; engines since speculative decoding log the eighth column and verifying steps
    # (kind 2), which are not replayed
    decodes = [[0.0, 0.05, 1, 8, 8, 8 * 30, 40] for _ in range(30)]
    prefills = [[0.0, 0.5, 0, 4, 120, 160, 40] for _ in range(4)]
    steps = decodes + prefills
    if out_column:
        steps = [[*s, s[3]] for s in steps] + [[0.0, 0.05, 2, 8, 24, 8 * 30, 40, 14]]
    decode, prefill = replay_ratio(str(tiny_model_dir), steps)
    assert 0 < decode < 0.5 and 0 < prefill < 0.5


def test_too_few_decode_steps_give_no_answer(tiny_model_dir):
    assert replay_ratio(str(tiny_model_dir), [[0.0, 0.01, 1, 2, 2, 20, 10]] * 5) is None


def test_the_decode_probe_measures_every_batch_size_and_width(tiny_model_dir):
    """probe_decode: the engine's decode step alone at 1, 2, 4, ... rows up to the run's largest
    (which need not be a power of two) and at each width asked for."""
    got = probe_decode(str(tiny_model_dir), 6, [10, 30])
    assert sorted({r for r, _, _ in got}) == [1, 2, 4, 6]
    assert sorted({w for _, w, _ in got}) == [10, 30]
    assert len(got) == 8 and all(t > 0 for *_, t in got)


def test_the_verify_probe_measures_each_shape_beside_its_plain_step(tiny_model_dir):
    """probe_verify: the engine's verifying step alone (proposals looked up, the packed forward,
    every fed position sampled, the rows advanced) at 1, 2, 4, ... rows, each width and each
    proposal length, with the plain step of the same rows and width; feeding more costs more."""
    got = probe_verify(str(tiny_model_dir), 4, [10, 30], drafts=(1, 4))
    assert got is not None
    assert [(r, w, e) for r, w, e, _, _ in got] == [(r, w, r * k) for w in (10, 30) for r in (1, 2, 4) for k in (1, 4)]
    assert all(v > 0 and p > 0 for *_, v, p in got)
    by = {(r, w, e): v for r, w, e, v, _ in got}
    assert sum(by[(r, w, 4 * r)] for r in (1, 2, 4) for w in (10, 30)) > sum(
        by[(r, w, r)] for r in (1, 2, 4) for w in (10, 30)
    )
