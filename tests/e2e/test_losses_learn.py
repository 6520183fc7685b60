"""The shipped loss variants and a correction learn on the shipped tiny-arith warm start (`make test-slow`).

The bar is the one tests/e2e/test_kit_learns.py sets for the main workflow: 40 steps add 25
points of greedy accuracy (the warm start's hasty habit is gone within ~25 steps when RL works).
"""

from __future__ import annotations

import pytest

from areal_graph.modelkit.builtin import BUILTIN_KITS, ensure_kit
from support.e2e import read_metrics, run_cli
from support.paths import WORKFLOWS

STEPS = 40


@pytest.fixture(scope="module")
def kit(tmp_path_factory):
    """The shipped warm start, installed into a cache of its own (seconds; the user's cache is left alone)."""
    return ensure_kit(BUILTIN_KITS["tiny-arith"], root=tmp_path_factory.mktemp("cache"))


@pytest.mark.slow
@pytest.mark.parametrize(
    "workflow,extra",
    [
        ("gspo.yaml", ()),
        ("cispo.yaml", ()),
        ("ppo_async.yaml", ("nodes.train.is_correction=icepop",)),
        ("ppo_async.yaml", ("nodes.train.is_correction=token_mask",)),
    ],
    ids=["gspo", "cispo", "icepop", "token_mask"],
)
def test_loss_variant_learns_in_40_steps(kit, tmp_path, workflow, extra):
    run_dir = tmp_path / "run"
    proc = run_cli(
        WORKFLOWS / workflow,
        run_dir,
        f"models.actor.path={kit.model_dir}",
        f"data.train={kit.data_path('train')}",
        f"data.eval={kit.data_path('test')}",
        "data.eval_size=200",
        f"runtime.steps={STEPS}",
        f"runtime.eval_every={STEPS}",
        "runtime.save_every=0",
        *extra,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    metrics = read_metrics(run_dir)
    accs = [m["eval/accuracy"] for m in metrics if "eval/accuracy" in m]
    assert len(accs) == 2 and accs[1] - accs[0] >= 0.25, f"greedy accuracy {accs} after {STEPS} steps"
    if extra and "token_mask" in extra[0]:
        assert any("train/is_rejected" in m for m in metrics)
