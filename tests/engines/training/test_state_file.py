"""A trainer state saved on a full disk fails as ENOSPC with the path (torch.save's own error names neither)."""

from __future__ import annotations

import errno

import pytest
import torch

from areal_graph.engines.training import state_file
from areal_graph.engines.training.state_file import save_state
from support.small_disk import small_tmpfs


def test_a_save_that_fills_a_real_small_filesystem_is_enospc_naming_the_file(tmp_path):
    with small_tmpfs(tmp_path / "disk", "1m") as disk:
        with pytest.raises(OSError) as info:
            save_state({"optimizer": torch.zeros(1 << 20)}, disk / "trainer_state.pt")
        assert info.value.errno == errno.ENOSPC and info.value.filename == str(disk / "trainer_state.pt")
        save_state({"version": 3}, tmp_path / "small.pt")  # room enough: an ordinary save
        assert torch.load(tmp_path / "small.pt") == {"version": 3}


def test_another_failure_with_room_left_stays_what_it_was(tmp_path, monkeypatch):
    def broken(obj, path):
        raise RuntimeError("pickling failed")

    monkeypatch.setattr(state_file.torch, "save", broken)
    with pytest.raises(RuntimeError, match="pickling failed"):
        save_state({"x": 1}, tmp_path / "s.pt")
