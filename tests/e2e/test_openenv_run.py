"""The shipped OpenEnv workflow trained for a few steps as a user runs it, against the shipped
environment served by OpenEnv's own app in a thread of this test (`rollout_args.url`): every
episode the run plays is a session the server counts, and the rewards the run trains on are the
ones the environment gave."""

from __future__ import annotations

import threading
import time

import pytest

from support.ci import optional
from support.e2e import read_metrics, run_cli
from support.paths import WORKFLOWS

SHIPPED_ENV = "env: areal_graph.workflows.openenv_envs.arith:ArithEnvironment"


@pytest.fixture()
def counted_server():
    """The arithmetic environment served here; yields (url, episodes: seed -> list of step rewards)."""
    optional("openenv", "pip install 'openenv-core==0.2.1' (in the dev extra)")
    import uvicorn
    from openenv.core.env_server import create_fastapi_app

    from areal_graph.workflows.openenv_envs.arith import ArithAction, ArithEnvironment, ArithObservation
    from areal_graph.workflows.rollout.openenv_server import free_port

    episodes: list[dict] = []
    lock = threading.Lock()

    class Counted(ArithEnvironment):
        def reset(self, seed=None, episode_id=None, **kwargs):
            obs = super().reset(seed=seed, episode_id=episode_id, **kwargs)
            self.record = {"seed": seed, "episode": episode_id, "rewards": [], "replies": []}
            with lock:
                episodes.append(self.record)
            return obs

        def step(self, action, timeout_s=None, **kwargs):
            obs = super().step(action, timeout_s=timeout_s, **kwargs)
            self.record["rewards"].append(obs.reward)
            self.record["replies"].append(action.message)
            return obs

    app = create_fastapi_app(Counted, ArithAction, ArithObservation, max_concurrent_envs=512)
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.05)
    assert server.started
    yield f"http://127.0.0.1:{port}", episodes
    server.should_exit = True
    thread.join(10)


def test_the_openenv_workflow_trains_on_the_environments_rewards(counted_server, tmp_path):
    url, episodes = counted_server
    text = (WORKFLOWS / "openenv_arith.yaml").read_text()
    assert SHIPPED_ENV in text
    wf = tmp_path / "openenv.yaml"
    wf.write_text(text.replace(SHIPPED_ENV, f"url: {url}"))
    run_dir = tmp_path / "run"
    proc = run_cli(
        wf,
        run_dir,
        "runtime.steps=3",
        "runtime.batch_size=16",
        "runtime.eval_every=3",
        "data.eval_size=8",
        "runtime.max_staleness=1",
        timeout=400,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    metrics = read_metrics(run_dir)
    steps = [m for m in metrics if "reward/mean" in m]
    assert len(steps) == 3
    # the run's episodes are the server's: 3 steps of 16 trained (more were played ahead), 8 + 8 evaluated
    assert len(episodes) >= 3 * 16 + 2 * 8 and all(e["rewards"] for e in episodes)
    assert all(1 <= len(e["rewards"]) <= 2 and len(e["replies"]) == len(e["rewards"]) for e in episodes)
    # the environment's rewards: 1 right first time, 0.5 on the retry, 0; the run's are sums of them
    totals = [sum(e["rewards"]) for e in episodes]
    assert set(totals) <= {0.0, 0.5, 1.0}
    for m in steps:
        assert (m["reward/mean"] * 16 * 2) == pytest.approx(round(m["reward/mean"] * 16 * 2))
        assert 1.0 <= m["env/turns"] <= 2.0 and m["env/finished"] == 1.0
        assert m["env/reward_steps"] == pytest.approx(m["env/turns"])  # one reward per step the env took
    # a group plays one episode: its 8 answers reset with one seed
    seeds: dict[str, set] = {}
    for e in episodes:
        seeds.setdefault(str(e["episode"]).rsplit("/", 1)[0], set()).add(e["seed"])
    assert all(len(s) == 1 for s in seeds.values())
    evals = [m for m in metrics if "eval/accuracy" in m]
    assert [m["step"] for m in evals] == [0, 3]
