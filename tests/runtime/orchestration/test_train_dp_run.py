"""Multi-rank training from YAML: `models.<name>.dp_size: 2` gives the parameters of one rank.

Three levels, each against an independent reference:

- the command wire format rank 0 broadcasts (a call and its batch) round-trips exactly, and
  the planner's rank shares are disjoint, cover the batch and are token-balanced;
- the plan and the executor: `validate`'s process line names the ranks, the executor starts
  ranks 1..N-1 beside the worker with one rendezvous (recorded, not run);
- the real worker path at the train-node level: a gRPC model worker hosting a
  `DataParallelModelHost` (rank 0) plus its rank-1 process, started by the launcher as a
  run starts them, fed the same batches as an in-process one-rank `ModelHost`: log-probs
  gathered back in batch order, stats and parameters after 3 optimizer steps (one of them
  a 1-sequence batch that leaves rank 1 idle), a checkpoint written by rank 0;
- a whole `areal-graph run` of grpo_sync (eta 0, same seed) with dp_size 2 against the same
  run with dp_size 1: the same trajectories, and final exported weights that agree to float
  tolerance (slow: two runs, ~1-2 minutes).
"""

from __future__ import annotations

import random
import sys
from typing import TYPE_CHECKING

import pytest
import torch

from areal_graph.data.packed import PackedBatch
from areal_graph.engines.training.microbatch_planner import plan_microbatches
from areal_graph.runtime.hosts.dp_model_host import decode_command, encode_command
from support.e2e import kill_during_run, read_metrics, run_cli, write_workflow
from support.paths import REPO

if TYPE_CHECKING:
    from areal_graph.runtime.rpc.worker_client import WorkerClient

OPTIM = {"lr": 1e-3, "grad_clip": 0.5, "weight_decay": 0.01}
TRAIN = {
    "params": {"loss": "decoupled_ppo", "clip_eps": 0.2, "agg": "seq-mean-token-mean"},
    "max_tokens_per_mb": 96,
    "temperature": 1.0,
}


def ppo_batch(n: int, seed: int, vocab: int = 128) -> PackedBatch:
    """Prompt + response sequences with behaviour/proximal log-probs near a random model's
    (about log 1/vocab) and one advantage per sequence."""
    rng = random.Random(seed)
    toks, mask, behav, prox, adv = [], [], [], [], []
    for _ in range(n):
        p, r = rng.randint(2, 8), rng.randint(1, 40)
        toks.append([rng.randint(3, vocab - 1) for _ in range(p + r)])
        mask.append([0] * p + [1] * r)
        b = [-4.85 + rng.uniform(-0.4, 0.4) for _ in range(r)]
        behav.append([0.0] * p + b)
        prox.append([0.0] * p + [x + rng.uniform(-0.2, 0.2) for x in b])
        adv.append([0.0] * p + [rng.gauss(0.0, 1.0)] * r)
    f32 = torch.float32
    return PackedBatch.from_sequences(
        {"input_ids": toks, "loss_mask": mask, "behav_logprobs": behav, "prox_logprobs": prox, "advantages": adv},
        dtypes={"behav_logprobs": f32, "prox_logprobs": f32, "advantages": f32},
    )


# --------------------------------------------------------------------------- scatter / gather units
def test_a_command_round_trips_exactly():
    batch = ppo_batch(5, seed=1)
    method, kwargs, got = decode_command(encode_command("train", {**TRAIN, "fused_prox": False}, batch))
    assert method == "train" and kwargs == {**TRAIN, "fused_prox": False}
    assert torch.equal(got.cu_seqlens, batch.cu_seqlens) and set(got.keys()) == set(batch.keys())
    for key in batch.keys():
        assert got[key].dtype == batch[key].dtype and torch.equal(got[key], batch[key]), key
    assert decode_command(encode_command("save_checkpoint", {"path": "/x"})) == (
        "save_checkpoint",
        {"path": "/x"},
        None,
    )
    with pytest.raises(ValueError, match="truncated"):
        decode_command(encode_command("train", TRAIN, batch)[:-3])


def test_rank_shares_cover_the_batch_once_and_balance_tokens():
    lens = ppo_batch(32, seed=2).seqlens().tolist()
    plan = plan_microbatches(lens, 96, dp_size=2)
    shares = [sorted(i for mb in rank for i in mb) for rank in plan]
    assert sorted(shares[0] + shares[1]) == list(range(32))  # every sequence on exactly one rank
    tokens = [sum(lens[i] for i in share) for share in shares]
    assert abs(tokens[0] - tokens[1]) <= max(lens)  # LPT: within one sequence of even
    assert len(plan[0]) == len(plan[1])  # the ranks step in lock step


def test_the_plan_starts_the_ranks_of_a_dp_model_and_validate_says_so():
    from areal_graph.graph.loader import WorkflowError, load_workflow
    from areal_graph.graph.plan import build_plan

    wf = REPO / "workflows" / "ppo_kl.yaml"
    plan = build_plan(load_workflow(wf, ["models.actor.dp_size=3"]))
    assert plan.ranks("model-actor") == 3 and plan.ranks("model-ref") == 1 and plan.ranks("reward") == 1
    assert plan.hosting["train"].impl.endswith("dp_model_host:DataParallelModelHost")
    assert plan.hosting["ref_logp"].impl.endswith("model_host:ModelHost")
    line = next(x for x in plan.describe() if x.startswith("processes:"))
    assert (
        "on 3 data-parallel ranks (rank 0 serves the calls and relays them to model-actor.rank1 .. model-actor.rank2)"
    ) in line and line.count("data-parallel") == 1
    with pytest.raises(WorkflowError, match=r"moved: .*models.<name>.dp_size"):
        load_workflow(wf, ["runtime.dp_size=2"])
    with pytest.raises(WorkflowError, match=r"models.actor.dp_size.*must be > 0"):
        load_workflow(wf, ["models.actor.dp_size=0"])


def test_the_executor_starts_ranks_beside_the_model_worker(tmp_path):
    """What a run starts for `models.actor.dp_size: 3` (the launcher recorded, not run): ranks
    1 and 2 beside the worker, one rendezvous for all three, the model's threads split."""
    from areal_graph.graph.loader import load_workflow
    from areal_graph.graph.plan import build_plan
    from areal_graph.runtime.observability.run_dir import RunDir
    from areal_graph.runtime.orchestration.process_executor import DP_RANK_MODULE, ProcessExecutor

    class Recorder:
        def __init__(self) -> None:
            self.started: list[tuple[str, str, list[str], dict[str, str], int]] = []

        def start_process(self, name, role, cmd, env=None, threads=None, **_):
            self.started.append((name, role, list(cmd), dict(env or {}), threads))

    from areal_graph.runtime.orchestration.placement import plan_placement

    spec = load_workflow(REPO / "workflows" / "ppo_kl.yaml", ["models.actor.dp_size=3"])
    plan = build_plan(spec)
    executor = ProcessExecutor(plan, RunDir(tmp_path / "run", tensorboard=False))
    executor.placement = plan_placement(spec, plan, small_model=True)  # what start() computes first
    launcher = Recorder()
    base = {"AREAL_RUN_TOKEN": "secret"}
    assert executor._start_other_ranks(launcher, "model-ref", "model", base) == base
    rank0 = executor._start_other_ranks(launcher, "model-actor", "model", base)
    started = launcher.started
    assert [s[0] for s in started] == ["model-actor.rank1", "model-actor.rank2"]
    assert all(s[1] == "model" and s[2][1:3] == ["-m", DP_RANK_MODULE] and s[4] == 1 for s in started)
    envs = [rank0] + [s[3] for s in started]
    assert [e["RANK"] for e in envs] == ["0", "1", "2"] and [e["LOCAL_RANK"] for e in envs] == ["0", "1", "2"]
    assert {(e["MASTER_ADDR"], e["MASTER_PORT"], e["WORLD_SIZE"], e["AREAL_RUN_TOKEN"]) for e in envs} == {
        ("127.0.0.1", rank0["MASTER_PORT"], "3", "secret")
    }
    assert all(s[3]["OMP_NUM_THREADS"] == s[3]["AREAL_TORCH_THREADS"] == "1" for s in started)  # placement's threads
    assert executor._roles == {"model-actor.rank1": "model", "model-actor.rank2": "model"}  # deaths: resumable


# --------------------------------------------------------------------------- the worker path
def _start_two_rank_worker(launcher, token: str) -> WorkerClient:
    """A model worker as a run starts one with dp_size 2: the gRPC worker (rank 0) and its
    rank-1 process, joined through a free loopback port."""
    from areal_graph.api.process import RUN_TOKEN_ENV
    from areal_graph.runtime.launchers.local import free_port
    from areal_graph.runtime.orchestration.process_executor import DP_RANK_MODULE
    from areal_graph.runtime.rpc.worker_client import WorkerClient

    group = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "WORLD_SIZE": "2", RUN_TOKEN_ENV: token}
    launcher.start_process(
        "model-actor.rank1",
        "model",
        [sys.executable, "-m", DP_RANK_MODULE, "--name", "rank1"],
        env={**group, "RANK": "1", "LOCAL_RANK": "1"},
        threads=1,
    )
    address = launcher.start_worker(
        "model-actor", env={**group, "RANK": "0", "LOCAL_RANK": "0"}, threads=1, token_env=RUN_TOKEN_ENV, role="model"
    )
    launcher.wait_healthy(timeout=120)
    return WorkerClient(address, timeout=300, name="model-actor", token=token)


def test_two_rank_model_worker_trains_like_one_rank(tiny_model_dir, tmp_path):
    from areal_graph.runtime.hosts.model_host import ModelHost
    from areal_graph.runtime.launchers.local import LocalLauncher

    args = {
        "model_path": str(tiny_model_dir),
        "optim": OPTIM,
        "total_steps": 3,
        "seed": 3,
        "threads": 2,
        "role": "policy",
    }
    batches = [ppo_batch(16, seed=10), ppo_batch(1, seed=11), ppo_batch(12, seed=12)]
    with LocalLauncher(tmp_path / "logs") as launcher:
        client = _start_two_rank_worker(launcher, token="t0k")
        client.configure("actor", "areal_graph.runtime.hosts.dp_model_host:DataParallelModelHost", args)
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            reference = ModelHost(**{**args, "threads": 1})
            init = {k: v.clone() for k, v in reference.engine.state_dict_for_sync().items()}
            want_lp = reference.logprob(batches[0], "prox_logprobs", max_tokens_per_mb=96)["prox_logprobs"]
            got_lp = client.execute("actor", "logprob", batches[0], out_key="prox_logprobs", max_tokens_per_mb=96)[
                "prox_logprobs"
            ]
            want_stats, got_stats = [], []
            for batch in batches:
                want_stats.append(reference.train(batch, **TRAIN)[1])
                got_stats.append(client.execute_with_stats("actor", "train", batch, **TRAIN)[1])
            client.call("actor", "save_checkpoint", path=str(tmp_path / "ck"))
            after_three = reference.engine.state_dict_for_sync()
            # resume: every rank loads a checkpoint (here one a step further on), then steps on
            reference.train(ppo_batch(8, seed=13), **TRAIN)
            reference.save_checkpoint(str(tmp_path / "ref_ck"))
            client.call("actor", "load_checkpoint", path=str(tmp_path / "ref_ck"))
            reference.train(ppo_batch(12, seed=14), **TRAIN)
            client.execute("actor", "train", ppo_batch(12, seed=14), **TRAIN)
            client.call("actor", "export_weights", path=str(tmp_path / "resumed"))
        finally:
            torch.set_num_threads(threads)
        assert launcher.alive() == {"model-actor": True, "model-actor.rank1": True}
        logs = "".join((tmp_path / "logs" / f"{name}.log").read_text() for name in ("model-actor", "model-actor.rank1"))
    # log-probs of both ranks' shares, gathered back in batch order
    assert got_lp.shape == want_lp.shape and torch.allclose(got_lp, want_lp, atol=2e-5), (got_lp - want_lp).abs().max()
    assert "rank 0/2 joined" in logs and "rank 1/2 joined" in logs and "ddp data parallelism" in logs
    for step, (got, want) in enumerate(zip(got_stats, want_stats)):
        for key in ("loss", "grad_norm", "policy_loss", "entropy"):
            assert abs(got[key] - want[key]) <= 1e-4 * max(abs(want[key]), 1e-2), (step, key, got[key], want[key])
    assert got_stats[0]["n_microbatches"] > want_stats[0]["n_microbatches"]  # both ranks worked
    # rank 0 wrote the checkpoint: the parameters after 3 steps, against the one-rank ones
    from areal_graph.engines.training.train_engine import read_safetensors_dir

    got_w = read_safetensors_dir(tmp_path / "ck" / "model")
    assert set(got_w) <= set(after_three) and len(got_w) > 4
    update = _rel_diff({k: got_w[k] - init[k] for k in got_w}, {k: after_three[k] - init[k] for k in got_w})
    assert _rel_diff(got_w, after_three) < 1e-6 and update < 1e-4, (_rel_diff(got_w, after_three), update)
    assert torch.load(tmp_path / "ck" / "trainer_state.pt", weights_only=True)["version"] == 3
    resumed, want = read_safetensors_dir(tmp_path / "resumed"), reference.engine.state_dict_for_sync()
    assert _rel_diff(resumed, want) < 1e-6, _rel_diff(resumed, want)


def _rel_diff(a: dict, b: dict) -> float:
    """Relative L2 distance of two state dicts (norms, not elements: Adam's first step is about
    lr * sign(g), and float noise in a near-zero gradient flips a sign)."""
    num = sum(float(((a[k] - b[k]).double() ** 2).sum()) for k in a) ** 0.5
    den = sum(float((b[k].double() ** 2).sum()) for k in a) ** 0.5
    return num / den


# --------------------------------------------------------------------------- a whole run
RUN = {
    "runtime.steps": 3,
    "runtime.batch_size": 8,
    "nodes.rollout.group_size": 4,
    "runtime.max_staleness": 0,
    "nodes.rollout.sampling.max_new_tokens": 12,
    "runtime.eval_every": 0,
    "runtime.save_every": 0,
    "runtime.max_tokens_per_microbatch": 128,
    "nodes.reward.fn": "support.e2e_rewards:length_parity",
    "runtime.seed": 5,
    "models.actor.train.lr": 1e-3,
}


def overrides(**changes: object) -> list[str]:
    """RUN with `changes` (dots as double underscores) as CLI overrides."""
    merged = {**RUN, **{k.replace("__", "."): v for k, v in changes.items()}}
    return [f"{k}={v}" for k, v in merged.items()]


@pytest.mark.slow
def test_a_two_rank_run_ends_with_the_weights_of_a_one_rank_run(kit, tmp_path):
    """grpo_sync, eta 0, seed 5, 3 steps, run with dp_size 1 and with dp_size 2: sampling seeds
    follow the prompt stream, so both runs generate the same answers (per-step rewards and
    lengths match), and the final exported weights agree to float rounding (measured: 1.5e-7
    relative, the update 4.8e-6)."""
    from safetensors.torch import load_file

    wf = write_workflow(kit, tmp_path, "grpo_sync.yaml")
    finals, rewards = [], []
    for dp_size in (1, 2):
        run_dir = tmp_path / f"dp{dp_size}"
        proc = run_cli(wf, run_dir, *overrides(models__actor__dp_size=dp_size, runtime__save_every=2))
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        steps = [m for m in read_metrics(run_dir) if "time/step" in m]
        assert [m["version"] for m in steps] == [1, 2, 3]
        rewards.append([(m["reward/mean"], m["response_len/mean"]) for m in steps])
        finals.append(load_file(str(run_dir / "final_model" / "model.safetensors")))
    rank1 = (tmp_path / "dp2" / "logs" / "model-actor.rank1.log").read_text()
    assert "rank 1/2 joined the process group (gloo)" in rank1 and "ddp data parallelism" in rank1
    assert not (tmp_path / "dp1" / "logs" / "model-actor.rank1.log").exists()
    assert (tmp_path / "dp2" / "checkpoints" / "step_00000002" / "COMPLETE").exists()  # written by rank 0
    init = load_file(str(kit / "model" / "model.safetensors"))
    one, two = finals
    assert rewards[0] == rewards[1]  # the same trajectories were generated (sampling seeds, eta 0)
    update = _rel_diff({k: two[k] - init[k] for k in two}, {k: one[k] - init[k] for k in two})
    assert _rel_diff(two, one) < 1e-5 and update < 1e-3, (_rel_diff(two, one), update)


@pytest.mark.slow
def test_a_dead_rank_resumes_the_run_from_its_last_checkpoint(kit, tmp_path):
    """Fault injection: SIGKILL rank 1 (not the worker the controller talks to) after the step-2
    checkpoint. Rank 0's next collective fails at once, the watchdog names the rank, and the
    run goes on from the checkpoint with fresh ranks (runtime.auto_resume) to the last step."""
    import os
    import subprocess

    run_dir = tmp_path / "run"
    cmd = [
        sys.executable,
        "-m",
        "areal_graph.cli.main",
        "run",
        str(write_workflow(kit, tmp_path, "grpo_sync.yaml")),
        "--run-dir",
        str(run_dir),
        *overrides(runtime__steps=5, runtime__save_every=2, models__actor__dp_size=2),
    ]
    env = {
        **os.environ,
        "COLUMNS": "400",
        "PYTHONPATH": os.pathsep.join([str(REPO / "tests"), os.environ.get("PYTHONPATH", "")]),
    }
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    try:
        kill_during_run(proc, run_dir, "model-actor.rank1", after_step=3)
        out, _ = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, out[-4000:]
    assert "model-actor.rank1" in out and "auto-resume 1 of at most 2" in out, out[-4000:]
    assert [m["step"] for m in read_metrics(run_dir) if "time/step" in m] == [1, 2, 3, 4, 5]
