"""A `ProcessExecutor` whose processes are its inference servers alone, for tests of weight syncs
and restarts against real server processes: the trainer's side of a sync is `VersionedTrainer`,
in the test's own process, which publishes a distinct, reproducible set of weights per version.

Why not a whole run: a run starts a model worker, a rollout and a reward worker besides the
servers (seconds each on two cores), and the weights a trainer makes are whatever training
made; here every version's weights are known in advance, so a test can tell, from a server's
answers alone, which published version it holds, or that it holds none of them.

The executor is put together as `ProcessExecutor.start` does for its servers (the same
launcher, command line, clients, I/O loop and watchdog), so a server that dies goes through
the executor's own `_on_death`, restart and restore.
"""

from __future__ import annotations

import json
import secrets
import threading
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import torch

from areal_graph.api.process import RUN_TOKEN_ENV
from areal_graph.engines.inference.backends import ServerLaunch
from areal_graph.engines.inference.client import InferenceClient, ServerPool
from areal_graph.graph.kind import RunInfo
from areal_graph.graph.loader import load_workflow
from areal_graph.graph.plan import build_plan
from areal_graph.runtime.launchers.local import LocalLauncher
from areal_graph.runtime.observability.run_dir import RunDir
from areal_graph.runtime.orchestration.placement import inference_server_command
from areal_graph.runtime.orchestration.process_executor import ProcessExecutor, _IOLoop
from support.e2e import write_workflow

PROBE_IDS = [1, 5, 9, 17, 33, 65, 129, 7, 3, 11, 42, 99]  # a prompt every kit tokenizer has ids for
NOISE = 0.05  # each version: the initial weights plus noise of this share of each tensor's std


class VersionedTrainer:
    """The actor's model worker as the executor reaches it (`clients['model-actor'].call`): it
    publishes the weights of `version`, which a test sets before each sync. Version 0 is the
    model directory's weights; version k adds noise seeded by k to every tensor (tied tensors
    stay tied), so any two versions differ in every tensor."""

    def __init__(self, model_dir: Path) -> None:
        from transformers import AutoModelForCausalLM
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()  # save_pretrained's bar on every export
        self.model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
        # a copy (the model is loaded with each version's weights later) in which tied tensors
        # stay one tensor (a clone per name would untie them)
        copies: dict[int, torch.Tensor] = {}
        self.base = {k: copies.setdefault(v.data_ptr(), v.detach().clone()) for k, v in self.model.state_dict().items()}
        self.version = 0
        self._states: dict[int, dict[str, torch.Tensor]] = {}
        self._logprobs: dict[int, torch.Tensor] = {}
        self._lock = threading.Lock()

    def state(self, version: int) -> dict[str, torch.Tensor]:
        with self._lock:
            if version not in self._states:
                g = torch.Generator().manual_seed(1000 + version)
                by_storage: dict[int, torch.Tensor] = {}
                out = {}
                for name, t in self.base.items():
                    key = t.data_ptr()
                    if key not in by_storage:
                        noise = torch.randn(t.shape, generator=g) * (NOISE * float(t.std()) if t.numel() > 1 else NOISE)
                        by_storage[key] = t + noise if version else t.clone()  # new tensors: base stays as loaded
                    out[name] = by_storage[key]
                self._states[version] = out
            return self._states[version]

    def call(self, obj: str, method: str, **args):
        state = self.state(self.version)
        if method == "publish_weights":
            from areal_graph.engines import shared_weights

            return shared_weights.publish(args["path"], state)
        if method == "export_weights":  # as TrainEngine.export_hf: a directory appears whole
            path = Path(args["path"])
            tmp = path.with_name(path.name + ".tmp")
            self.model.load_state_dict(state)
            self.model.save_pretrained(tmp, safe_serialization=True)
            if path.exists():
                import shutil

                shutil.rmtree(path)
            tmp.rename(path)
            return str(path)
        raise AssertionError(f"the fake trainer has no {method!r}")

    def close(self) -> None:
        return None

    def prompt_logprobs(self, version: int) -> torch.Tensor:
        """Log-probs of PROBE_IDS[1:] under version `version`'s weights (float64, in this process)."""
        with self._lock:
            cached = self._logprobs.get(version)
        if cached is not None:
            return cached
        state = self.state(version)
        with self._lock:
            self.model.load_state_dict(state)
            with torch.no_grad():
                logits = self.model(input_ids=torch.tensor([PROBE_IDS])).logits[0].double()
            lp = torch.log_softmax(logits, -1)[:-1].gather(1, torch.tensor(PROBE_IDS[1:]).unsqueeze(1))[:, 0]
            self._logprobs[version] = lp
        return lp


@dataclass
class Probe:
    """What a server said about its weights: the version it reports and the prompt's log-probs."""

    reported: int
    logprobs: torch.Tensor
    matches: list[int] = field(default_factory=list)  # published versions whose weights give these log-probs


def probe_server(url: str, token: str) -> Probe:
    """Score PROBE_IDS on the server (one forward): its version label and the prompt's log-probs."""
    body = {
        "input_ids": PROBE_IDS,
        "sampling_params": {"max_new_tokens": 1, "temperature": 0},
        "return_logprob": True,
        "logprob_start_len": 0,
    }
    req = urllib.request.Request(
        f"{url}/generate",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json", "Authorization": f"Bearer {token}"},
    )
    with urllib.request.urlopen(req, timeout=30) as r:
        meta = json.loads(r.read())["meta_info"]
    lps = [row[0] for row in meta["input_token_logprobs"][1:]]
    return Probe(int(meta["weight_version"]), torch.tensor(lps, dtype=torch.float64))


def identify(probe: Probe, trainer: VersionedTrainer, published: int, tol: float = 1e-3) -> Probe:
    """Which of versions 0..`published` give the probe's log-probs (each within `tol`)."""
    probe.matches = [
        v for v in range(published + 1) if float((trainer.prompt_logprobs(v) - probe.logprobs).abs().max()) < tol
    ]
    return probe


@dataclass
class ServersOnly:
    """The executor, its fake trainer, the failures it reported and its run's secret."""

    executor: ProcessExecutor
    trainer: VersionedTrainer
    failures: list[str]
    token: str

    def close(self) -> None:
        self.executor.shutdown()


def start_servers_only(kit: Path, tmp: Path, *overrides: str, servers: int = 1) -> ServersOnly:
    """Start `servers` embedded inference servers of the kit's model under a `ProcessExecutor`
    (what its `start` does for them), with `VersionedTrainer` as the actor's host."""
    spec = load_workflow(write_workflow(kit, tmp), [f"inference.servers={servers}", "runtime.trace=false", *overrides])
    plan = build_plan(spec)
    executor = ProcessExecutor(plan, RunDir(tmp / "run", tensorboard=False))
    trainer = VersionedTrainer(kit / "model")
    executor.clients[f"model-{plan.actor}"] = trainer  # type: ignore[assignment]
    failures: list[str] = []
    executor._on_failure = lambda message, resumable=False: failures.append(message)
    token = executor._token = secrets.token_urlsafe(16)
    launcher = executor.launcher = LocalLauncher(tmp / "run" / "logs", on_death=executor._on_death)
    backend = executor.backend
    model = spec.models[plan.actor].path
    for i in range(servers):
        name = f"inference-{i}"
        host, port = launcher.server_endpoint(name)
        cmd = inference_server_command(backend, ServerLaunch(spec.inference, model, port, 1, i, name, token, host))
        url = f"http://{host}:{port}"
        env = {RUN_TOKEN_ENV: token, **backend.environment(token)}
        launcher.start_process(name, "inference", cmd, env=env, threads=1, health_url=f"{url}/health")
        executor.server_urls.append(url)
        executor._roles[name] = "inference"
    launcher.wait_healthy(timeout=120)
    executor.servers = ServerPool([InferenceClient(u, backend=backend, api_key=token) for u in executor.server_urls])
    executor._io = _IOLoop()
    executor._info = RunInfo(model_paths={plan.actor: model}, server_urls=tuple(executor.server_urls))
    executor._ready = {name: threading.Event() for name in executor._roles}
    for event in executor._ready.values():
        event.set()
    return ServersOnly(executor, trainer, failures, token)
