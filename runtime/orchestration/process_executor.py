"""The processes of one run: inference servers and gRPC workers, started, configured, stopped.

The controller talks to nodes only through this object, so placement (which process hosts
which node) and transport (gRPC to workers, HTTP to inference servers) stay out of the RL loop.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import random
import socket
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any, Callable

from areal_graph.data.packed import PackedBatch
from areal_graph.graph.spec import InferenceSpec, NodeSpec, WorkflowSpec
from areal_graph.runtime.launchers.local import LocalLauncher
from areal_graph.runtime.orchestration.placement import Placement
from areal_graph.runtime.observability.run_dir import RunDir
from areal_graph.runtime.rpc.worker_client import WorkerClient

log = logging.getLogger(__name__)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RunProcesses:
    def __init__(self, spec: WorkflowSpec, run_dir: RunDir, placement: Placement, tracer: Any) -> None:
        self.spec = spec
        self.run_dir = run_dir
        self.placement = placement
        self.tracer = tracer
        self.launcher: LocalLauncher | None = None
        self.clients: dict[str, WorkerClient] = {}
        self.server_urls: list[str] = []
        self.servers = None  # ServerPool, created in start()
        self.model_paths: dict[str, str] = {}

    # ------------------------------------------------------------------ start / stop
    def start(self, on_death: Callable[[Any], None]) -> None:
        from areal_graph.modelkit.builtin import resolve_model_path
        from areal_graph.engines.inference.client import InferenceClient, ServerPool

        spec, rt = self.spec, self.spec.runtime
        for name, model in spec.models.items():
            self.model_paths[name] = str(resolve_model_path(model.path))
        actor_path = self.model_paths[self.placement.actor_model]

        gen_threads, train_threads = thread_split(rt)
        self.launcher = LocalLauncher(log_dir=self.run_dir.path / "logs", on_death=on_death)
        for i in range(spec.inference.servers):
            port = free_port()
            url = f"http://127.0.0.1:{port}"
            cmd = inference_server_command(spec.inference, actor_path, port, gen_threads, rt.seed + i)
            self.launcher.start_process(f"inference-{i}", role="inference", cmd=cmd,
                                        health_url=f"{url}/health", threads=gen_threads)
            self.server_urls.append(url)
        for worker in self.placement.workers:
            threads = train_threads if worker.startswith("model-") else 1
            address = self.launcher.start_worker(worker, threads=threads)
            self.clients[worker] = WorkerClient(address, timeout=3600, name=worker)
        # SGLang loads CUDA kernels and captures graphs before it answers /health: minutes.
        self.launcher.wait_healthy(timeout=900 if spec.inference.backend == "sglang" else 180)
        self.servers = ServerPool([InferenceClient(u, backend=spec.inference.backend) for u in self.server_urls])
        self._configure(actor_path, train_threads)

    def _configure(self, actor_path: str, train_threads: int) -> None:
        spec, rt = self.spec, self.spec.runtime
        configured_models: set[str] = set()
        for node in spec.nodes.values():
            worker = self.placement.worker_of(node.name)
            if worker == "controller":
                continue
            client = self.clients[worker]
            if node.kind == "rollout":
                p = node.params
                client.configure(node.name, "areal_graph.runtime.hosts.rollout_host:RolloutNode", {
                    "server_urls": self.server_urls, "backend": spec.inference.backend,
                    "workflow": p.workflow, "group_size": p.group_size, "sampling": asdict(p.sampling),
                    "workflow_args": dict(p.workflow_args), "tokenizer_path": actor_path,
                })
            elif node.kind == "reward":
                p = node.params
                client.configure(node.name, "areal_graph.runtime.hosts.reward_host:RewardNode", {
                    "tokenizer_path": actor_path, "fn": p.fn, "timeout_s": p.timeout_s, "num_workers": p.num_workers,
                })
            elif node.model not in configured_models:
                model = spec.models[node.model]
                configured_models.add(node.model)
                optim = None
                if model.train is not None:
                    optim = {k: v for k, v in asdict(model.train).items()}
                client.configure(node.model, "areal_graph.runtime.hosts.model_host:ModelWorker", {
                    "model_path": self.model_paths[node.model], "optim": optim,
                    "total_steps": rt.steps, "seed": rt.seed, "threads": train_threads,
                    "role": "critic" if node.model in self.placement.critics else "policy", "device": model.device,
                })

    def shutdown(self) -> None:
        if self.servers is not None:
            try:
                import asyncio

                asyncio.run(self.servers.close())
            except Exception:  # closing HTTP sessions must not mask the real error
                log.debug("closing inference clients failed", exc_info=True)
        if self.launcher is not None:
            self.launcher.shutdown()

    # ------------------------------------------------------------------ data
    def load_prompts(self) -> tuple[list, list]:
        from transformers import AutoTokenizer

        from areal_graph.data.datasets import load_prompts
        from areal_graph.modelkit.builtin import resolve_dataset_path

        d = self.spec.data
        tok = AutoTokenizer.from_pretrained(self.model_paths[self.placement.actor_model])
        kwargs = dict(prompt_template=d.prompt_template, question_key=d.question_key,
                      answer_key=d.answer_key, max_prompt_tokens=d.max_prompt_tokens)
        train, report = load_prompts(resolve_dataset_path(d.train), tok, **kwargs)
        if not train:
            raise ValueError(f"data.train ({d.train}) has no usable rows: {report}")
        log.info("train prompts: %s", report)
        eval_prompts: list = []
        if d.eval:
            eval_prompts, report = load_prompts(resolve_dataset_path(d.eval), tok, **kwargs)
            log.info("eval prompts: %s", report)
            size = self.spec.runtime.eval_size or d.eval_size
            if size:
                eval_prompts = eval_prompts[:size]
        random.Random(self.spec.runtime.seed).shuffle(train)
        return train, eval_prompts

    # ------------------------------------------------------------------ node calls
    def collect_spans(self) -> list[dict]:
        """Spans the workers recorded since the last call (merged into the run's trace)."""
        spans: list[dict] = []
        for client in self.clients.values():
            spans.extend(client.stats(drain_spans=True).get("spans", []))
        return spans

    def client(self, worker: str) -> WorkerClient:
        return self.clients[worker]

    def train(self, node: NodeSpec, batch: PackedBatch, max_tokens_per_mb: int, temperature: float) -> dict[str, float]:
        client = self.clients[self.placement.worker_of(node.name)]
        impl = self.placement.impl_of(node.name)
        client.execute(impl, "train", batch, params=asdict(node.params), max_tokens_per_mb=max_tokens_per_mb,
                       temperature=temperature)
        return client.call(impl, "train_stats")

    def _actor_client(self) -> tuple[WorkerClient, str]:
        from areal_graph.runtime.orchestration.placement import model_worker

        actor = self.placement.actor_model
        return self.clients[model_worker(actor)], actor

    def export_weights(self, path: Path, with_tokenizer: bool = False) -> None:
        client, impl = self._actor_client()
        client.call(impl, "export_weights", path=str(path), with_tokenizer=with_tokenizer)

    def save_checkpoint(self, path: Path) -> None:
        for worker, model in self.placement.worker_models.items():
            if self.spec.models[model].train is not None:
                self.clients[worker].call(model, "save_checkpoint", path=str(path / model))

    def load_checkpoint(self, path: Path) -> None:
        for worker, model in self.placement.worker_models.items():
            if self.spec.models[model].train is not None:
                self.clients[worker].call(model, "load_checkpoint", path=str(path / model))


def inference_server_command(inference: InferenceSpec, model_path: str, port: int, threads: int,
                             seed: int) -> list[str]:
    """The command line of one inference server on loopback: our embedded engine, or SGLang.

    `inference.args` become extra `--flag value` options (underscores as dashes; `true`
    gives a bare flag) for either, e.g. `{mem_fraction_static: 0.8}` for SGLang.
    """
    if inference.backend == "sglang":
        if importlib.util.find_spec("sglang") is None:
            raise RuntimeError("inference.backend 'sglang' needs the sglang package on a GPU machine: "
                               "pip install 'areal-graph[sglang]' (use backend 'embedded' on a CPU)")
        cmd = [sys.executable, "-m", "sglang.launch_server", "--model-path", model_path,
               "--host", "127.0.0.1", "--port", str(port), "--random-seed", str(seed),
               "--max-running-requests", str(inference.max_running_requests)]
    else:
        cmd = [sys.executable, "-m", "areal_graph.engines.inference.http_server",
               "--model", model_path, "--host", "127.0.0.1", "--port", str(port),
               "--max-running", str(inference.max_running_requests),
               "--threads", str(threads), "--seed", str(seed)]
    for key, value in inference.args.items():
        flag = "--" + str(key).replace("_", "-")
        if value is True:
            cmd.append(flag)
        elif value not in (False, None):
            cmd += [flag, str(value)]
    return cmd


def thread_split(rt: Any) -> tuple[int, int]:
    """Torch threads for generation and for training.

    Synchronous RL alternates generation and training, so each may use every core; the
    asynchronous run overlaps them, so the cores are split to avoid oversubscription.
    """
    cores = os.cpu_count() or 2
    if rt.max_staleness == 0:
        return cores, cores
    half = max(cores // 2, 1)
    return half, max(cores - half, 1)
