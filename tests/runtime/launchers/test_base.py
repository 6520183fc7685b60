"""What every launcher shares (runtime/launchers/base.py): how a death is named and reported.

Both launchers report deaths through `report_death`, so a callback that fails must not stop the
watchdog, and the death must still be queued and logged once."""

from __future__ import annotations

import logging
import queue

from areal_graph.runtime.launchers.base import ProcessDied, report_death, signal_name


def test_signal_name_only_for_a_process_killed_by_a_signal():
    assert (signal_name(-9), signal_name(-15)) == ("SIGKILL", "SIGTERM")
    assert signal_name(0) is None and signal_name(1) is None and signal_name(-999) is None


def test_a_death_is_logged_queued_and_called_back_even_when_the_callback_fails(caplog):
    died = ProcessDied("rollout", "rollout", -9, "SIGKILL", "tail")
    deaths: queue.Queue[ProcessDied] = queue.Queue()
    seen: list[ProcessDied] = []

    def on_death(d: ProcessDied) -> None:
        seen.append(d)
        raise RuntimeError("callback broke")

    log = logging.getLogger("test-launcher")
    with caplog.at_level(logging.ERROR, logger="test-launcher"):
        report_death(died, deaths, on_death, log)
    assert deaths.get_nowait() is died and seen == [died] and deaths.empty()
    messages = [r.getMessage() for r in caplog.records]
    assert messages == ["rollout 'rollout' died: exit code -9 (SIGKILL)", "on_death callback failed for rollout"]
