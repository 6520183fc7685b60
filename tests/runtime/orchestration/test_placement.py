"""runtime/orchestration/placement.py: the workflow's `resources` as one placement per process,
what the launcher does with it (a real child process pinned to its cores), and the machine check
(a core this machine lacks)."""

from __future__ import annotations

import os
import sys
import time

import pytest

from areal_graph.cli.preflight import placement_problems
from areal_graph.graph.loader import load_workflow
from areal_graph.graph.plan import build_plan
from areal_graph.runtime.launchers.local import LocalLauncher
from areal_graph.runtime.orchestration.placement import plan_placement, thread_split, usable_cores
from support.paths import WORKFLOWS

PPO = WORKFLOWS / "ppo_async.yaml"


def _placement(overrides, small=True):
    spec = load_workflow(PPO, overrides)
    return plan_placement(spec, build_plan(spec), small_model=small)


def test_nothing_pinned_by_default_and_threads_as_before():
    places = _placement([])
    assert set(places) == {"inference-0", "model-actor", "rollout", "reward", "controller"}
    assert all(p.cores is None and p.gpus is None for p in places.values())
    assert places["inference-0"].threads == 1  # a small model decodes faster on one thread
    assert places["model-actor"].threads == thread_split(4)[1]
    assert "AREAL_CPU_CORES" not in places["model-actor"].env()
    assert _placement(["runtime.max_staleness=0"], small=False)["model-actor"].threads == thread_split(0)[1]


def test_pinned_sides_get_their_cores_and_threads_to_match_and_the_rest_every_core():
    places = _placement(["resources.inference.cores=[0]", "resources.training.cores=[1]"], small=False)
    assert places["inference-0"].cores == (0,) and places["inference-0"].threads == 1
    assert places["model-actor"].cores == (1,) and places["model-actor"].threads == 1
    # unpinned sides are pinned to everything: a child inherits the mask of whoever forks it
    assert places["reward"].cores == usable_cores() and places["controller"].cores == usable_cores()
    env = places["model-actor"].env()
    assert env["AREAL_CPU_CORES"] == "1" and env["OMP_NUM_THREADS"] == env["AREAL_TORCH_THREADS"] == "1"


def test_servers_and_ranks_split_their_sides_cores():
    places = _placement(
        [
            "inference.servers=2",
            "resources.inference.cores=[0, 1, 2, 3]",
            "resources.training.cores=[4, 5]",
            "models.actor.dp_size=2",
        ],
        small=False,
    )
    assert places["inference-0"].cores == (0, 1) and places["inference-1"].cores == (2, 3)
    assert places["inference-0"].threads == 2
    assert places["model-actor"].cores == (4,) and places["model-actor.rank1"].cores == (5,)


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity") or len(usable_cores()) < 2, reason="needs 2 cores")
def test_the_launcher_pins_a_process_from_birth(tmp_path):
    """A real child process started with a placement's environment runs on exactly its cores,
    and so does a thread it starts."""
    core = usable_cores()[-1]
    out = tmp_path / "mask.txt"
    code = (
        "import os, threading; r = []; t = threading.Thread(target=lambda: r.append(os.sched_getaffinity(0))); "
        f"t.start(); t.join(); open({str(out)!r}, 'w').write(repr((sorted(os.sched_getaffinity(0)), sorted(r[0]))))"
    )
    with LocalLauncher(log_dir=tmp_path) as launcher:
        launcher.start_process(
            "pinned", role="inference", cmd=[sys.executable, "-c", code], env={"AREAL_CPU_CORES": str(core)}
        )
        deadline = time.monotonic() + 30
        while not out.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
    assert out.read_text() == repr(([core], [core]))


def test_a_core_or_gpu_this_machine_lacks_is_named():
    spec = load_workflow(PPO, ["resources.inference.cores=[0]", "resources.training.cores=[4096]"])
    problems = placement_problems(spec)
    assert len(problems) == 1 and problems[0].startswith("resources.training.cores: core(s) 4096 not on this machine")
    spec = load_workflow(PPO, ["resources.training.gpus=[64]", "models.actor.device=cuda"])
    assert any(p.startswith("resources.training.gpus: GPU(s) 64 not on this machine") for p in placement_problems(spec))
