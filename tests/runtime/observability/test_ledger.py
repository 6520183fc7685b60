"""The sample ledger's accounting across resumes (runtime/observability/ledger.py)."""

from __future__ import annotations

from areal_graph.runtime.observability.ledger import SampleLedger, read_ledger, reconcile


def _write(tmp_path, rows):
    led = SampleLedger(tmp_path / "ledger.jsonl")
    for event, pos, step, prompt in rows:
        led.record(event, pos, pos, prompt, step, step)
    led.close()
    return read_ledger(tmp_path / "ledger.jsonl")


def test_work_after_the_checkpoint_is_superseded_by_the_resume(tmp_path):
    rows = [
        ("generated", 0, 0, "p0"),
        ("generated", 1, 0, "p1"),
        ("trained", 0, 1, "p0"),
        ("trained", 1, 1, "p1"),
        ("generated", 2, 1, "p2"),  # in flight at the checkpoint: requeued
        ("checkpoint", -1, 1, "step_00000001"),
        ("dropped", 3, 1, "p3"),  # after the checkpoint: redone after the resume
        ("trained", 2, 2, "p2"),
        ("generated", 4, 2, "p4"),
        ("resumed", -1, 1, "step_00000001"),
        ("requeued", 2, 1, "p2"),
        ("trained", 2, 2, "p2"),
        ("trained", 3, 2, "p3"),
    ]
    acc = reconcile(_write(tmp_path, rows))
    assert dict(acc.trained) == {0: 1, 1: 1, 2: 1, 3: 1}
    assert acc.trained_twice == [] and acc.unaccounted() == [] and acc.dropped == frozenset()
    assert acc.resumes == 1 and acc.trained_steps == (1, 1, 2, 2)


def test_a_gap_and_a_double_training_are_reported(tmp_path):
    rows = [
        ("trained", 0, 1, "p0"),
        ("trained", 2, 1, "p2"),
        ("trained", 2, 2, "p2"),
        ("failed", 3, 2, "p3"),
        ("trained", 4, 3, "p4"),
    ]
    acc = reconcile(_write(tmp_path, rows))
    assert acc.trained_twice == [2]
    assert acc.unaccounted() == [1]  # position 3 failed (accounted for), 1 vanished


def test_two_resumes_from_the_same_checkpoint(tmp_path):
    rows = [
        ("trained", 0, 1, "p0"),
        ("checkpoint", -1, 1, "c1"),
        ("trained", 1, 2, "p1"),
        ("resumed", -1, 1, "c1"),
        ("trained", 1, 2, "p1"),
        ("trained", 2, 3, "p2"),
        ("resumed", -1, 1, "c1"),
        ("trained", 1, 2, "p1"),
        ("trained", 2, 3, "p2"),
        ("trained", 3, 4, "p3"),
    ]
    acc = reconcile(_write(tmp_path, rows))
    assert dict(acc.trained) == {0: 1, 1: 1, 2: 1, 3: 1} and acc.resumes == 2
