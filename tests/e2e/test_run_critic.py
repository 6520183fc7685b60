"""End to end: `areal-graph run workflows/ppo_gae_critic.yaml` (PPO with a learned critic and
GAE), with real subprocesses, on the tiny random kit of tests/e2e/test_run.py; then resumed
from its checkpoint for one more step. Each run costs ~20 s of process start-up on 2 cores
(the steps themselves take well under a second), so the two-step run is shared.
"""

from __future__ import annotations

import math
import shutil

import pytest
import torch

from support.e2e import read_metrics, run_cli, write_workflow

SMALL = [
    "runtime.batch_size=8",
    "nodes.rollout.group_size=4",
    "nodes.rollout.sampling.max_new_tokens=12",
    "runtime.eval_every=0",
    "runtime.max_tokens_per_microbatch=256",
    "runtime.max_staleness=1",
    "nodes.reward.fn=support.e2e_rewards:length_parity",
]


@pytest.fixture(scope="module")
def critic_run(kit, tmp_path_factory):  # noqa: F811
    """(workflow, run dir) of a finished two-step run, checkpointed after step 2."""
    tmp = tmp_path_factory.mktemp("critic_run")
    wf = write_workflow(kit, tmp, "ppo_gae_critic.yaml")
    run_dir = tmp / "run"
    proc = run_cli(wf, run_dir, *SMALL, "runtime.steps=2", "runtime.save_every=2")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return wf, run_dir


def test_ppo_gae_critic_trains_the_critic(kit, critic_run):  # noqa: F811
    from safetensors.torch import load_file

    _, run_dir = critic_run
    steps = [m for m in read_metrics(run_dir) if "time/step" in m]
    assert [m["version"] for m in steps] == [1, 2]
    for m in steps:
        assert math.isfinite(m["train_critic/value_loss"]) and m["train_critic/value_loss"] >= 0.0
        assert "time/value" in m and math.isfinite(m["train_actor/policy_loss"])
    assert any(m["train_critic/value_loss"] > 0 for m in steps)  # rewards vary: there was something to fit

    # the critic checkpoint: backbone (save_pretrained) + value head, both moved off their start
    critic_dir = run_dir / "checkpoints" / "step_00000002" / "critic" / "model"
    head = load_file(str(critic_dir / "value_head.safetensors"))
    assert head["weight"].abs().sum() > 0  # the head starts at zero
    backbone = load_file(str(critic_dir / "model.safetensors"))
    init = load_file(str(kit / "model" / "model.safetensors"))
    assert set(backbone) == {k[len("model.") :] for k in init if k.startswith("model.")}
    assert any(not torch.equal(backbone[k], init["model." + k]) for k in backbone)


@pytest.mark.slow  # ~25-45 s of a whole run: `make test-slow`
def test_ppo_gae_critic_resumes_both_models(critic_run, tmp_path):
    wf, first = critic_run
    run_dir = tmp_path / "run"
    shutil.copytree(first, run_dir)
    proc = run_cli(wf, run_dir, *SMALL, "runtime.steps=3", "runtime.save_every=1", "--resume", str(run_dir))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    steps = [m for m in read_metrics(run_dir) if "time/step" in m]
    assert [m["version"] for m in steps] == [1, 2, 3]
    assert math.isfinite(steps[-1]["train_critic/value_loss"])
    # both models came back at version 2 (a critic that restarted fresh would be at 1)
    for model in ("actor", "critic"):
        state = torch.load(run_dir / "checkpoints" / "step_00000003" / model / "trainer_state.pt", weights_only=True)
        assert state["version"] == 3, (model, state["version"])
