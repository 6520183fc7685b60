"""The controller: runs a validated workflow over worker processes, synchronously or not.

One code path serves every staleness bound. Two loops share a `StalenessGate`:

- the *generation side* keeps submitting prompt groups to the rollout worker while the gate
  has capacity; each finished group goes through the reward node and into the sample buffer;
- the *training side* takes B trajectories from the buffer, runs the remaining nodes in
  topological order (reference / proximal log-probs, advantages, train), pushes the new
  weights to every inference server, and only then bumps the version, which opens capacity
  for more generation.

With max_staleness = 0 the gate admits exactly B trajectories per version, so generation of
step v+1 cannot start before step v has trained: synchronous RL, by the same code.
"""

from __future__ import annotations

import asyncio
import json
import logging
import shutil
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from areal_graph.data.packed import PackedBatch
from areal_graph.graph.dag import execution_order
from areal_graph.graph.spec import NodeSpec, WorkflowSpec
from areal_graph.nodes.advantage import compute_advantages
from areal_graph.nodes.train import required_keys
from areal_graph.runtime.orchestration.placement import Placement, plan_placement
from areal_graph.runtime.orchestration.process_executor import RunProcesses
from areal_graph.runtime.observability.run_dir import RunDir
from areal_graph.runtime.orchestration.sample_buffer import SampleBuffer
from areal_graph.runtime.orchestration.staleness import StalenessGate
from areal_graph.runtime.observability.tracing import Tracer

log = logging.getLogger(__name__)

GENERATION_KINDS = ("rollout", "reward")


class RunFailed(RuntimeError):
    """The run stopped because a process died or a node failed past its retries."""


@dataclass
class RunState:
    """What the controller knows about progress; saved with every checkpoint for resume."""

    step: int = 0
    version: int = 0
    next_prompt: int = 0  # position in the shuffled prompt stream
    next_group_id: int = 0
    groups_submitted: int = 0
    groups_finished: int = 0
    groups_failed: int = 0
    groups_retried: int = 0
    trajectories_trained: int = 0
    reward_failures: int = 0
    history: list[dict] = field(default_factory=list)


class RLController:
    def __init__(self, spec: WorkflowSpec, run_dir: RunDir, display: "Any | None" = None) -> None:
        self.spec = spec
        self.run_dir = run_dir
        self.display = display
        self.rt = spec.runtime
        self.order = execution_order(spec)
        self.nodes = spec.nodes
        self.rollout_node = next(n for n in spec.nodes.values() if n.kind == "rollout")
        self.reward_nodes = [self.nodes[n] for n in self.order if self.nodes[n].kind == "reward"]
        self.train_side = [self.nodes[n] for n in self.order if self.nodes[n].kind not in GENERATION_KINDS]
        self.group_size = self.rollout_node.params.group_size
        # log-probs are of the temperature-scaled sampling distribution (what the engine reports)
        self.temperature = self.rollout_node.params.sampling.temperature or 1.0
        if self.rt.batch_size % self.group_size:
            raise ValueError(
                f"runtime.batch_size ({self.rt.batch_size}) must be a multiple of "
                f"nodes.{self.rollout_node.name}.group_size ({self.group_size})"
            )
        self.state = RunState()
        self.tracer = Tracer(run_dir.trace_path)
        self.gate = StalenessGate(self.rt.batch_size, self.rt.max_staleness, self.rt.max_concurrent_rollouts)
        self.buffer = SampleBuffer()
        self.placement: Placement = plan_placement(spec)
        self.procs = RunProcesses(spec, run_dir, self.placement, self.tracer)
        self._fatal: BaseException | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None  # created inside the event loop
        self._inflight: dict[int, asyncio.Task] = {}

    # ------------------------------------------------------------------ lifecycle
    def run(self, resume_from: Path | None = None) -> RunState:
        try:
            with self.tracer.span("startup", cat="controller"):
                self.procs.start(on_death=self._on_process_death)
                self.prompts, self.eval_prompts = self.procs.load_prompts()
                if resume_from is not None:
                    self._restore(resume_from)
            asyncio.run(self._main())
        finally:
            self.procs.shutdown()
            self.tracer.flush()
        return self.state

    def _on_process_death(self, died: Any) -> None:
        """Called from the launcher's watchdog thread: stop the run, naming what died."""
        nodes = self.placement.nodes_on(died.name)
        self._fatal = RunFailed(
            f"process {died.name!r} (role {died.role}, hosting nodes {nodes or 'none'}) died: "
            f"exit code {died.returncode}"
            + (f", signal {died.signal}" if getattr(died, "signal", None) else "")
            + (f"\n--- last lines of its log ---\n{died.log_tail}" if died.log_tail else "")
        )
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)

    async def _main(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._loop.set_default_executor(ThreadPoolExecutor(max_workers=64, thread_name_prefix="ctl"))
        self._stop = asyncio.Event()
        if self._fatal is not None:
            raise self._fatal
        gen = asyncio.create_task(self._generation_loop(), name="generation")
        train = asyncio.create_task(self._training_loop(), name="training")
        stop = asyncio.create_task(self._stop.wait(), name="stop")
        try:
            pending = {gen, train, stop}
            while train in pending and stop in pending:  # generation finishing early ends nothing
                done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                for task in done:
                    if task is not stop and task.exception() is not None:
                        raise task.exception()
            if self._fatal is not None:
                raise self._fatal
        except Exception as err:
            # A dead process usually shows up first as a failed call to it; give the launcher's
            # watchdog a moment so the user is told which process died and why.
            if self._fatal is None:
                for _ in range(30):
                    await asyncio.sleep(0.1)
                    if self._fatal is not None:
                        break
            if self._fatal is not None and err is not self._fatal:
                raise self._fatal from err
            raise
        finally:
            for task in (gen, train, stop, *self._inflight.values()):
                task.cancel()
            await asyncio.gather(gen, train, stop, *self._inflight.values(), return_exceptions=True)
            self._account_unfinished()

    def _account_unfinished(self) -> None:
        """Nothing is silently dropped: record what was generated but never trained."""
        running = len(self._inflight)
        stats = self.buffer.stats()
        buffered = stats.buffered_trajectories
        summary = {
            "groups_in_flight_at_stop": running,
            "trajectories_buffered_at_stop": buffered,
            "groups_submitted": self.state.groups_submitted,
            "groups_finished": self.state.groups_finished,
            "groups_failed": self.state.groups_failed,
            "groups_retried": self.state.groups_retried,
            "trajectories_trained": self.state.trajectories_trained,
            "buffer": stats,
        }
        self.run_dir.write_json("unfinished.json", summary)
        if running or buffered:
            log.info("at stop: %d prompt groups in flight, %d trajectories buffered (not trained)", running, buffered)

    # ------------------------------------------------------------------ generation side
    async def _generation_loop(self) -> None:
        G = self.group_size
        while self.state.step < self.rt.steps:
            await self.gate.wait_for_capacity(G)
            if self.state.step >= self.rt.steps:
                return
            self.gate.on_submit(G)
            gid = self.state.next_group_id
            self.state.next_group_id += 1
            prompt = self.prompts[self.state.next_prompt % len(self.prompts)]
            self.state.next_prompt += 1
            self.state.groups_submitted += 1
            self._inflight[gid] = asyncio.create_task(self._run_group(gid, prompt), name=f"group-{gid}")

    async def _run_group(self, gid: int, prompt: Any, attempt: int = 0) -> None:
        try:
            batch = await self._rollout([prompt], [gid], self.group_size, sampling=None, tag="rollout")
            for node in self.reward_nodes:
                out = await self._execute(node, batch)
                batch.update(out)
            self.gate.on_accept(self.group_size)
            self.state.groups_finished += 1
            self.buffer.put(batch)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a failed group is retried, then reported: never lost silently
            self.gate.on_reject(self.group_size)
            if attempt < 2 and self._fatal is None:
                self.state.groups_retried += 1
                log.warning("prompt group %d failed (%s); retrying (attempt %d)", gid, exc, attempt + 2)
                self.gate.on_submit(self.group_size)
                self._inflight[gid] = asyncio.create_task(self._run_group(gid, prompt, attempt + 1))
                return
            self.state.groups_failed += 1
            log.error("prompt group %d (prompt %s) failed 3 times, dropped and counted: %s", gid, prompt.id, exc)
        finally:
            if self._inflight.get(gid) is asyncio.current_task():
                del self._inflight[gid]

    async def _rollout(self, prompts: list, group_ids: list[int], group_size: int, sampling: dict | None, tag: str) -> PackedBatch:
        prompt_batch = PackedBatch.from_sequences(
            {"input_ids": [p.input_ids for p in prompts]},
            seqs={"group_id": group_ids},
            meta={"answer": [p.answer for p in prompts], "prompt_id": [p.id for p in prompts]},
        )
        node = self.rollout_node
        worker = self.placement.worker_of(node.name)
        with self.tracer.span(tag, cat="rollout", node=node.name, worker=worker, version=self.state.version):
            return await asyncio.to_thread(
                self.procs.client(worker).execute, node.name, "run", prompt_batch,
                group_size=group_size, sampling=sampling,
            )

    # ------------------------------------------------------------------ training side
    async def _training_loop(self) -> None:
        B = self.rt.batch_size
        if self.rt.eval_every and self.state.step == 0:
            self.run_dir.log_metrics(0, await self._evaluate())
        while self.state.step < self.rt.steps:
            t_wait = time.perf_counter()
            with self.tracer.span("wait_batch", cat="controller", step=self.state.step):
                batch = await self.buffer.get_async(B, group_size=self.group_size)
            t0 = time.perf_counter()
            stats: dict[str, float] = {"time/wait_batch": t0 - t_wait}
            stats.update(self._batch_stats(batch))
            for node in self.train_side:
                t_node = time.perf_counter()
                out, node_stats = await self._execute_train_side(node, batch)
                if out is not None:
                    batch.update(out)
                stats.update({f"{node.name}/{k}": v for k, v in node_stats.items()})
                stats[f"time/{node.name}"] = time.perf_counter() - t_node
            t_sync = time.perf_counter()
            await self._sync_weights(self.state.version + 1)
            stats["time/weight_sync"] = time.perf_counter() - t_sync
            self.state.version += 1
            self.state.step += 1
            self.state.trajectories_trained += batch.num_seqs
            self.gate.set_version(self.state.version)
            stats["time/step"] = time.perf_counter() - t0
            if self.rt.eval_every and (self.state.step % self.rt.eval_every == 0 or self.state.step == self.rt.steps):
                stats.update(await self._evaluate())
            if self.rt.save_every and self.state.step % self.rt.save_every == 0:
                await self._checkpoint()
            self._log_step(stats)
            self.tracer.merge(await asyncio.to_thread(self.procs.collect_spans))
        with self.tracer.span("export_final_model", cat="controller"):
            await asyncio.to_thread(self.procs.export_weights, self.run_dir.final_model_dir, True)
        self._stop.set()

    def _batch_stats(self, batch: PackedBatch) -> dict[str, float]:
        """Reward, staleness and version spread of the trajectories about to be trained."""
        mask = batch["loss_mask"].bool()
        seq = batch.seq_ids()[mask]
        vers = batch["versions"][mask].to(torch.int64)
        n = batch.num_seqs
        vmin = torch.full((n,), 1 << 30, dtype=torch.int64).scatter_reduce(0, seq, vers, "amin")
        vmax = torch.full((n,), -1, dtype=torch.int64).scatter_reduce(0, seq, vers, "amax")
        staleness = (self.state.version - vmin).float()
        resp_len = torch.zeros(n).index_add_(0, seq, torch.ones(seq.numel()))
        return {
            "reward/mean": float(batch["rewards"].float().mean()),
            "staleness/mean": float(staleness.mean()),
            "staleness/max": float(staleness.max()),
            "versions_per_traj/mean": float((vmax - vmin + 1).float().mean()),
            "response_len/mean": float(resp_len.mean()),
            "no_eos/frac": float(batch["seq_no_eos"].float().mean()) if "seq_no_eos" in batch else 0.0,
        }

    async def _execute_train_side(self, node: NodeSpec, batch: PackedBatch) -> tuple[PackedBatch | None, dict]:
        if node.kind == "advantage":
            with self.tracer.span(node.name, cat="node", node=node.name, worker="controller", step=self.state.step):
                out = await asyncio.to_thread(compute_advantages, node.params, batch)
            return out, {"mean": float(out["advantages"][batch["loss_mask"].bool()].mean())}
        if node.kind == "train":
            worker = self.placement.worker_of(node.name)
            sub = batch.select_keys(required_keys(node.params))
            with self.tracer.span(node.name, cat="node", node=node.name, worker=worker, step=self.state.step):
                stats = await asyncio.to_thread(self.procs.train, node, sub, self.rt.max_tokens_per_microbatch,
                                                self.temperature)
            return None, stats
        out = await self._execute(node, batch)  # logprob / value
        return out, {}

    async def _execute(self, node: NodeSpec, batch: PackedBatch) -> PackedBatch:
        worker = self.placement.worker_of(node.name)
        method = {"reward": "score", "logprob": "logprob", "value": "values"}[node.kind]
        args: dict[str, Any] = {}
        if node.kind in ("logprob", "value"):
            args = {"out_key": node.writes[0], "max_tokens_per_mb": self.rt.max_tokens_per_microbatch}
            if node.kind == "logprob":
                args["temperature"] = self.temperature
        sub = batch.select_keys([k for k in node.reads if k in batch] + (["answer"] if node.kind == "reward" else []))
        with self.tracer.span(node.name, cat="node", node=node.name, worker=worker, step=self.state.step):
            out = await asyncio.to_thread(
                self.procs.client(worker).execute, self.placement.impl_of(node.name), method, sub, **args
            )
        if node.kind == "reward" and "reward_failed" in out:
            self.state.reward_failures += int(out["reward_failed"].sum())
            out.seqs.pop("reward_failed")
        return out

    async def _sync_weights(self, version: int) -> None:
        """Export the actor to disk and have every inference server load it.

        Disk (a directory under the run dir) rather than in-memory tensors: SGLang and the
        embedded server both load from a path, one export serves every server, and for the
        model sizes that run over loopback the write costs milliseconds.
        """
        path = self.run_dir.weights_dir(version)
        with self.tracer.span("weight_sync", cat="weights", version=version):
            await asyncio.to_thread(self.procs.export_weights, path)
            await self.procs.servers.update_weights_from_disk(str(path), version)
        old = self.run_dir.weights_dir(version - 2)
        if old.exists():
            shutil.rmtree(old, ignore_errors=True)

    # ------------------------------------------------------------------ eval, checkpoints, logging
    async def _evaluate(self) -> dict[str, float]:
        if not self.eval_prompts:
            return {}
        with self.tracer.span("eval", cat="eval", version=self.state.version):
            greedy = {"temperature": 0.0, "max_new_tokens": self.rollout_node.params.sampling.max_new_tokens}
            gids = list(range(-len(self.eval_prompts), 0))
            batch = await self._rollout(self.eval_prompts, gids, 1, sampling=greedy, tag="eval_rollout")
            for node in self.reward_nodes:
                batch.update(await self._execute(node, batch))
        acc = float((batch["rewards"].float() > 0.5).float().mean())
        self.state.history.append({"step": self.state.step, "version": self.state.version, "eval/accuracy": acc})
        log.info("eval at step %d: greedy accuracy %.3f on %d prompts", self.state.step, acc, batch.num_seqs)
        if self.display is not None:
            self.display.on_eval(self.state.step, acc)
        return {"eval/accuracy": acc}

    async def _checkpoint(self) -> None:
        path = self.run_dir.checkpoint_dir(self.state.step)
        with self.tracer.span("checkpoint", cat="controller", step=self.state.step):
            await asyncio.to_thread(self.procs.save_checkpoint, path)
            (path / "controller_state.json").write_text(json.dumps(asdict(self.state)))
            self.run_dir.mark_checkpoint_complete(path)

    def _restore(self, ckpt: Path) -> None:
        data = json.loads((ckpt / "controller_state.json").read_text())
        self.state = RunState(**data)
        self.procs.load_checkpoint(ckpt)
        # Trajectories trained before the checkpoint count as accepted, so the bound stays exact.
        self.gate.restore(self.state.version, self.state.trajectories_trained)

    def _log_step(self, stats: dict[str, float]) -> None:
        stats = {k: float(v) for k, v in stats.items()}
        stats.update({
            "step": self.state.step, "version": self.state.version,
            "buffer/size": float(self.buffer.size()), "rollout/groups_in_flight": float(len(self._inflight)),
            "rollout/groups_failed": float(self.state.groups_failed),
            "reward/failures": float(self.state.reward_failures),
        })
        self.run_dir.log_metrics(self.state.step, stats)
        if self.display is not None:
            self.display.on_step(self.state.step, stats)
