"""RunDir.prune_checkpoints (runtime.keep_checkpoints) on real directories: what is kept, what a
crash leaves and the next prune sweeps, the READING marker of a resume, and, over random
sequences of saves, crashes, reads and prunes, the invariants that make deleting safe."""

from __future__ import annotations

import functools
import logging
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from areal_graph.runtime.observability import run_dir as run_dir_module
from areal_graph.runtime.observability.run_dir import (
    COMPLETE_MARKER,
    DELETING_PREFIX,
    READING_MARKER,
    RunDir,
    end_state_file,
)


@functools.cache
def dead_pid() -> int:
    """The pid of a process that has exited (a READING marker a killed resume left behind)."""
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def save(rd: RunDir, step: int, complete: bool = True) -> Path:
    d = rd.checkpoint_dir(step)
    (d / "actor").mkdir(exist_ok=True)
    (d / "actor" / "weights.bin").write_bytes(b"\0" * 64)
    if complete:
        rd.mark_checkpoint_complete(d)
    return d


def steps(rd: RunDir, complete_only: bool = True) -> list[int]:
    return [s for s, _ in rd.checkpoints(complete_only=complete_only)]


def test_the_newest_n_and_the_milestones_are_kept(tmp_path):
    rd = RunDir(tmp_path, tensorboard=False)
    for s in range(2, 21, 2):
        save(rd, s)
    removed = rd.prune_checkpoints(2, keep_every=6)
    assert steps(rd) == [6, 12, 18, 20]
    assert [p.name for p in removed] == [f"step_{s:08d}" for s in (2, 4, 8, 10, 14, 16)]
    assert sorted(p.name for p in rd.checkpoints_root.iterdir()) == [f"step_{s:08d}" for s in (6, 12, 18, 20)]
    assert rd.prune_checkpoints(2, keep_every=6) == []  # nothing more to do


def test_the_newest_complete_checkpoint_survives_and_a_newer_incomplete_one_is_left(tmp_path):
    """An incomplete directory newer than the newest complete one may be a save in progress;
    older incomplete ones are crashed saves that latest_checkpoint would never take."""
    rd = RunDir(tmp_path, tensorboard=False)
    save(rd, 1, complete=False)
    save(rd, 2)
    save(rd, 3, complete=False)
    save(rd, 4)
    save(rd, 5, complete=False)
    assert [p.name for p in rd.prune_checkpoints(1)] == ["step_00000001", "step_00000002", "step_00000003"]
    assert steps(rd, complete_only=False) == [4, 5] and rd.latest_checkpoint() == rd.checkpoints_root / "step_00000004"


def test_without_a_complete_checkpoint_nothing_is_deleted(tmp_path):
    rd = RunDir(tmp_path, tensorboard=False)
    save(rd, 1, complete=False)
    assert rd.prune_checkpoints(1) == [] and steps(rd, complete_only=False) == [1]
    assert RunDir(tmp_path / "empty", tensorboard=False).prune_checkpoints(3) == []


def test_protected_checkpoints_are_kept(tmp_path):
    rd = RunDir(tmp_path, tensorboard=False)
    dirs = [save(rd, s) for s in (1, 2, 3)]
    assert rd.prune_checkpoints(1, protect=[dirs[0]]) == [dirs[1]]
    assert steps(rd) == [1, 3]


def test_a_checkpoint_a_live_process_reads_is_kept_and_a_dead_ones_marker_is_ignored(tmp_path):
    rd = RunDir(tmp_path, tensorboard=False)
    one, two, _ = (save(rd, s) for s in (1, 2, 3))
    (two / f"{READING_MARKER}.{dead_pid()}").write_text(f"{dead_pid()}\n")
    with rd.reading_checkpoint(one) as marked:
        assert marked == one and (one / f"{READING_MARKER}.{os.getpid()}").read_text() == f"{os.getpid()}\n"
        assert rd.prune_checkpoints(1) == [two]
    assert not list(one.glob(f"{READING_MARKER}*"))  # the marker goes with the load
    assert rd.prune_checkpoints(1) == [one]


def test_the_reading_marker_is_removed_when_the_load_fails(tmp_path):
    rd = RunDir(tmp_path, tensorboard=False)
    ckpt = save(rd, 1)
    with pytest.raises(RuntimeError), rd.reading_checkpoint(ckpt):
        raise RuntimeError("load failed")
    assert sorted(p.name for p in ckpt.iterdir()) == [COMPLETE_MARKER, "actor"]


def test_a_removal_is_a_rename_first_and_a_crash_mid_removal_is_swept_next_time(tmp_path, monkeypatch, caplog):
    """Killed between the rename and the end of the delete: what is left is no checkpoint to
    anyone (not step_N), and the next prune removes it and says so."""
    rd = RunDir(tmp_path, tensorboard=False)
    for s in (1, 2, 3):
        save(rd, s)
    real_rmtree = run_dir_module.shutil.rmtree
    monkeypatch.setattr(run_dir_module.shutil, "rmtree", lambda *a, **k: None)  # "killed" before deleting
    assert [p.name for p in rd.prune_checkpoints(2)] == ["step_00000001"]
    leftover = rd.checkpoints_root / f"{DELETING_PREFIX}step_00000001.{os.getpid()}"
    assert (leftover / "actor" / "weights.bin").exists() and steps(rd) == [2, 3]
    assert rd.latest_checkpoint() == rd.checkpoints_root / "step_00000003"
    monkeypatch.setattr(run_dir_module.shutil, "rmtree", real_rmtree)
    save(rd, 4)
    with caplog.at_level(logging.INFO, logger=run_dir_module.__name__):
        assert [p.name for p in rd.prune_checkpoints(2)] == ["step_00000002"]
    assert sorted(p.name for p in rd.checkpoints_root.iterdir()) == ["step_00000003", "step_00000004"]
    said = [r.getMessage() for r in caplog.records]
    assert said == [
        "checkpoints pruned (keep_checkpoints 2): removed step_00000002, and 1 leftover(s) of an "
        "interrupted removal; newest kept step_00000004"
    ]


def test_a_directory_that_cannot_be_renamed_is_logged_and_kept(tmp_path, monkeypatch, caplog):
    rd = RunDir(tmp_path, tensorboard=False)
    save(rd, 1)
    save(rd, 2)

    def refuse(src, dst):
        raise PermissionError(13, "Permission denied", str(src))

    monkeypatch.setattr(run_dir_module.os, "rename", refuse)
    with caplog.at_level(logging.WARNING, logger=run_dir_module.__name__):
        assert rd.prune_checkpoints(1) == []
    assert steps(rd) == [1, 2] and "could not remove checkpoint" in caplog.text


def test_keep_last_must_keep_one(tmp_path):
    with pytest.raises(ValueError, match="keep_last must be >= 1"):
        RunDir(tmp_path, tensorboard=False).prune_checkpoints(0)


def test_the_end_state_file_of_an_older_run_is_its_unfinished_json(tmp_path):
    rd = RunDir(tmp_path, tensorboard=False)
    assert end_state_file(tmp_path) == rd.end_state_path == tmp_path / "end_state.json"
    rd.write_json("unfinished.json", {})
    assert end_state_file(tmp_path) == tmp_path / "unfinished.json"
    rd.write_json("end_state.json", {})
    assert end_state_file(tmp_path) == tmp_path / "end_state.json"


# ---------------------------------------------------------------------- random sequences
_op = st.one_of(
    st.tuples(st.just("save"), st.integers(1, 3), st.booleans()),  # steps later; complete, or crashed mid-save
    st.tuples(
        st.just("prune"),
        st.integers(1, 4),
        st.one_of(st.none(), st.integers(1, 6)),
        st.lists(st.integers(0, 30), max_size=2),
    ),  # keep_last, keep_every, which directories to protect
    st.tuples(st.just("read"), st.integers(0, 30), st.booleans()),  # which directory; by a live pid or a dead one
    st.tuples(st.just("crash_mid_removal"), st.integers(0, 30)),
)


@settings(max_examples=150, deadline=None)
@given(st.lists(_op, min_size=1, max_size=25))
def test_random_saves_crashes_reads_and_prunes_keep_the_invariants(ops):
    """After every prune: the newest complete checkpoint is there and latest_checkpoint is
    unchanged; a complete checkpoint is there exactly when the rules keep it (newest N,
    milestone, protected, read by a live process); an incomplete one older than the newest
    complete one is gone unless protected or read; nothing named .deleting-* is left; what the
    prune returns is exactly what disappeared."""
    with tempfile.TemporaryDirectory() as tmp:
        rd = RunDir(tmp, tensorboard=False)
        step = 0
        for op in ops:
            if op[0] == "save":
                step += op[1]
                save(rd, step, complete=op[2])
            elif op[0] == "read":
                dirs = rd.checkpoints(complete_only=False)
                if dirs:
                    pid = os.getpid() if op[2] else dead_pid()
                    (dirs[op[1] % len(dirs)][1] / f"{READING_MARKER}.{pid}").write_text(str(pid))
            elif op[0] == "crash_mid_removal":
                rd.checkpoints_root.mkdir(exist_ok=True)
                (rd.checkpoints_root / f"{DELETING_PREFIX}step_{op[1]:08d}.7" / "actor").mkdir(
                    parents=True, exist_ok=True
                )
            else:
                _, keep_last, keep_every, protect_steps = op
                _check_prune(rd, keep_last, keep_every, protect_steps)


def _check_prune(rd: RunDir, keep_last: int, keep_every: int | None, protect_steps: list[int]) -> None:
    complete = steps(rd)
    every = steps(rd, complete_only=False)
    incomplete = sorted(set(every) - set(complete))
    live = {s for s in every if (rd.checkpoints_root / f"step_{s:08d}" / f"{READING_MARKER}.{os.getpid()}").exists()}
    latest = rd.latest_checkpoint()
    protect_steps = [every[i % len(every)] for i in protect_steps] if every else []
    protect = [rd.checkpoints_root / f"step_{s:08d}" for s in protect_steps]
    removed = rd.prune_checkpoints(keep_last, keep_every, protect)

    after = set(steps(rd, complete_only=False))
    assert {int(p.name.split("_")[1]) for p in removed} == set(every) - after
    if rd.checkpoints_root.is_dir():
        assert not [p for p in rd.checkpoints_root.iterdir() if p.name.startswith(DELETING_PREFIX)]
    assert rd.latest_checkpoint() == latest
    if not complete:
        assert after == set(every)
        return
    newest = complete[-1]
    spared = set(protect_steps) | live
    wanted = set(complete[-keep_last:]) | {newest} | {s for s in complete if keep_every and s % keep_every == 0}
    assert {s for s in complete if s in after} == {s for s in complete if s in wanted or s in spared}
    assert {s for s in incomplete if s in after} == {s for s in incomplete if s > newest or s in spared}
