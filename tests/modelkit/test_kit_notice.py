"""Kits announce themselves (issue 48 item 5; modelkit/kit_notice.py, modelkit/kit_cache.py): a
build from the recipe is announced before it starts, with the expected time and the cache path;
waiting for another process's build is said; a cached kit or a shipped install says nothing
extra. And docs/datasets.md's kits table names, for every builtin kit, the shipped workflows that
use it, whether its warm start ships, and otherwise how long it builds."""

from __future__ import annotations

import fcntl
import json
import logging
import re
import threading
import time
from pathlib import Path

import pytest

from areal_graph.modelkit import kit_cache, kit_notice
from areal_graph.modelkit.kit_cache import ensure_kit, kit_dir
from areal_graph.modelkit.recipes import BUILTIN_DATASETS, BUILTIN_KITS, KitConfig
from areal_graph.modelkit.shipped import shipped_info
from support.paths import REPO

MINI = KitConfig(name="mini-notice", n_train=50, n_test=8)


def fake_build(events: list[str]):
    """A build_kit that records when it starts and writes just a kit.json."""

    def build(cfg: KitConfig, out: Path, progress) -> dict:
        events.append("build")
        info = {"name": cfg.name, "source": "recipe"}
        out.mkdir(parents=True, exist_ok=True)
        (out / "kit.json").write_text(json.dumps(info))
        return info

    return build


@pytest.fixture
def events(monkeypatch) -> list[str]:
    got: list[str] = []
    monkeypatch.setattr(kit_cache, "build_kit", fake_build(got))
    monkeypatch.setitem(kit_notice.BUILD_SECONDS, MINI.name, (731.0, 2))
    return got


def test_a_build_from_the_recipe_is_announced_first_with_time_and_path(tmp_path, events):
    ensure_kit(MINI, root=tmp_path, progress=events.append)
    notices = [i for i, e in enumerate(events) if e.startswith("building kit mini-notice")]
    assert notices and notices[0] < events.index("build"), events
    notice = events[notices[0]]
    assert str(kit_dir(MINI, tmp_path)) in notice and "about 12 min on 2 cores" in notice, notice
    assert "no shipped warm start for this kit" in notice and "later runs reuse it" in notice
    # cached: nothing is said, nothing built
    events.clear()
    ensure_kit(MINI, root=tmp_path, progress=events.append)
    assert events == []


def test_without_a_progress_callback_the_notice_is_a_warning(tmp_path, events, caplog):
    with caplog.at_level(logging.WARNING, logger="areal_graph.modelkit.kit_cache"):
        ensure_kit(MINI, root=tmp_path)
    warned = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert any(m.startswith("building kit mini-notice") and str(tmp_path) in m for m in warned), warned


def test_a_shipped_install_is_not_announced_as_a_build(tmp_path, events):
    tiny = BUILTIN_KITS["tiny-arith"]
    said: list[str] = []
    kit = ensure_kit(tiny, root=tmp_path, progress=said.append)
    assert kit.info["source"] == "shipped" and "build" not in events
    assert not any("building kit" in m for m in said), said
    # --from-recipe says why it builds anyway, with the shipped kit.json's time
    ensure_kit(tiny, root=tmp_path, progress=said.append, rebuild=True, from_recipe=True)
    notice = next(m for m in said if m.startswith("building kit tiny-arith"))
    assert "as asked" in notice and "about 2 min on 2 cores" in notice, notice


def test_waiting_for_another_process_is_said(tmp_path, events):
    path = kit_dir(MINI, tmp_path)
    said: list[str] = []
    with open(path.with_name(path.name + ".lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # "another process" is building
        waiter = threading.Thread(target=lambda: ensure_kit(MINI, root=tmp_path, progress=said.append))
        waiter.start()
        deadline = time.monotonic() + 20
        while not said and time.monotonic() < deadline:
            time.sleep(0.02)
        fake_build([])(MINI, path, None)  # what the other process leaves
        fcntl.flock(lock, fcntl.LOCK_UN)
    waiter.join(20)
    assert said and said[0].startswith("waiting for another process that is making kit mini-notice"), said
    assert str(path) in said[0] and "about 12 min on 2 cores" in said[0]
    assert events == [] and len(said) == 1  # it reused that build


@pytest.mark.parametrize("name", sorted(BUILTIN_KITS))
def test_every_builtin_kit_has_a_measured_build_time(name):
    assert kit_notice.expected_build(BUILTIN_KITS[name]) is not None, (
        f"kit {name}: record its build time (kit.json timings.total_s) in modelkit/kit_notice.py BUILD_SECONDS"
    )


def workflows_naming(name: str) -> list[str]:
    """The shipped workflows whose model or data is kit `name` (or one of its datasets)."""
    names = [name] + [d for d, (kit, _) in BUILTIN_DATASETS.items() if kit == name]
    pattern = re.compile(r"builtin:(" + "|".join(map(re.escape, names)) + r")(?![\w/-])")
    return sorted(f"workflows/{p.name}" for p in (REPO / "workflows").glob("*.yaml") if pattern.search(p.read_text()))


@pytest.mark.parametrize("name", sorted(BUILTIN_KITS))
def test_the_docs_kits_table_says_what_ships_and_what_builds(name):
    rows = [
        ln for ln in (REPO / "docs" / "datasets.md").read_text().splitlines() if ln.startswith(f"| `builtin:{name}`")
    ]
    assert len(rows) == 1, f"docs/datasets.md: no kits-table row for builtin:{name}"
    row = rows[0]
    for workflow in workflows_naming(name):
        assert f"`{Path(workflow).name}`" in row, f"docs/datasets.md: the builtin:{name} row does not name {workflow}"
    cfg = BUILTIN_KITS[name]
    info = shipped_info(name)
    ships = info is not None and info.get("fingerprint") == cfg.fingerprint()
    seconds, threads = kit_notice.expected_build(cfg)
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[2].startswith("yes" if ships else "no"), row
    assert kit_notice.duration(seconds).removeprefix("about ") in cells[3], row


def test_eval_on_an_unbuilt_kit_prints_the_notice_before_the_build(tmp_path, monkeypatch, capsys):
    """`areal-graph eval builtin:tiny-guess` started a 12-minute build without a word."""
    from areal_graph.cli import cmd_eval
    from areal_graph.modelkit import builtin
    from support.cli import parser_of

    monkeypatch.setenv("COLUMNS", "400")
    monkeypatch.setenv("AREAL_GRAPH_CACHE", str(tmp_path))
    monkeypatch.setitem(builtin.BUILTIN_KITS, "tiny-guess", MINI)
    monkeypatch.setitem(kit_notice.BUILD_SECONDS, MINI.name, (731.0, 2))
    shown_before_build: list[str] = []

    def build(cfg, out, progress):
        shown_before_build.append(capsys.readouterr().err)  # what the console showed when the build began
        return fake_build([])(cfg, out, progress)

    monkeypatch.setattr(kit_cache, "build_kit", build)
    data = tmp_path / "d.jsonl"
    data.write_text(json.dumps({"question": "1+1", "answer": "2"}) + "\n")
    cmd_eval.run(parser_of(cmd_eval, "eval")("builtin:tiny-guess", "--data", str(data)))
    assert len(shown_before_build) == 1
    shown = shown_before_build[0].replace("\n", "")
    assert (
        "building kit mini-notice from its recipe (no shipped warm start for this kit): about 12 min on 2 cores"
        in shown
    )
    assert f"into {kit_dir(MINI, tmp_path)} (once; later runs reuse it)" in shown, shown
