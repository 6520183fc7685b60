"""The controller: runs an execution plan through an executor, synchronously or not.

One code path serves every staleness bound. Two loops share a `StalenessGate`:

- the *generation side* (generation.py: `GenerationSide`) keeps submitting prompt groups while
  the gate has capacity; each group runs the source node (the rollout), then the plan's
  generation phase as a DAG (rewards, filters, shaping). A group that survives goes into the
  sample buffer (`on_accept`); a group a filter drops gives its slot back (`on_reject`) and is counted;
- the *training side* takes B trajectories from the buffer, runs the plan's training phase as
  a DAG (independent nodes concurrently: reference and proximal log-probs, critic values,
  then advantages, then the train nodes), makes the new weights the servers' policy, and only
  then bumps the version, which opens capacity for more generation.

With max_staleness = 0 the gate admits exactly B trajectories per version, so generation of
step v+1 cannot start before step v has trained: synchronous RL, by the same code.

This module holds the two loops' meeting (`Controller._main`), the training step and its
bookkeeping: eval, checkpoints, resume, the autopilot, metrics, the end state and the wording
of a run's failure. The controller owns no processes: it is given a `NodeExecutor`
(executor.py), so its retry, failure and staleness logic is tested in one process
(tests/runtime/orchestration/test_controller.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import re
import time
from collections import Counter
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict
from pathlib import Path
from typing import Any

from areal_graph.api.full_disk import naming_the_file
from areal_graph.data.packed import PackedBatch
from areal_graph.graph.kinds.common import actor_model
from areal_graph.graph.plan import ExecutionPlan
from areal_graph.runtime.launchers.interrupt import interrupted
from areal_graph.runtime.observability.disk_full import checkpoint_need, disk_full_message, is_disk_full
from areal_graph.runtime.observability.flows import GroupFlows
from areal_graph.runtime.observability.ledger import SampleLedger
from areal_graph.runtime.observability.run_dir import (
    CONFIG_FILENAME,
    END_STATE_FILENAME,
    LEGACY_END_STATE_FILENAME,
    METRICS_FILENAME,
    RunDir,
    end_state_file,
)
from areal_graph.runtime.observability.span_pull import BackgroundSpanPull
from areal_graph.runtime.observability.tracing import Tracer
from areal_graph.runtime.orchestration import staleness_rule
from areal_graph.runtime.orchestration.autopilot import ConcurrencyAutopilot
from areal_graph.runtime.orchestration.executor import NodeExecutor
from areal_graph.runtime.orchestration.generation import GenerationSide, RunState
from areal_graph.runtime.orchestration.generation import NodeFailed as NodeFailed  # re-exported: imported from here
from areal_graph.runtime.orchestration.generation import tool_call_stats as tool_call_stats  # re-exported too
from areal_graph.runtime.orchestration.learning_signal import Clues, LearningSignalWatch, explain
from areal_graph.runtime.orchestration.phase_runner import NodeContractError, NodeResult, run_phase
from areal_graph.runtime.orchestration.sample_buffer import SampleBuffer

log = logging.getLogger(__name__)

_PATH_IN_ERROR = re.compile(r"No space left on device: '([^']+)'")  # an OSError's text, also a remote one
SPAN_PULL_S = 5.0  # how often the trace pulls spans from workers and servers (not every step: RPCs)
# Test hook: seconds the controller waits between the models' checkpoint files and the checkpoint's
# COMPLETE marker, so a test can kill the run in the middle of a save (tests/runtime/orchestration/
# test_fault_injection.py). Unset in real runs.
SAVE_DELAY_ENV = "AREAL_TEST_SAVE_DELAY_S"


class RunFailed(RuntimeError):
    """The run stopped because a process died or a node failed past its retries.

    `resumable`: what failed was a process that holds state (a model worker): the run can go
    on from its last complete checkpoint in fresh processes (`runtime.auto_resume`)."""

    def __init__(self, message: str, resumable: bool = False) -> None:
        super().__init__(message)
        self.resumable = resumable
        self.resumes = 0  # auto-resumes used before this failure (run_with_auto_resume sets it)


class Controller:
    def __init__(
        self,
        plan: ExecutionPlan,
        executor: NodeExecutor,
        prompts: Sequence[Any],
        eval_prompts: Sequence[Any],
        run_dir: RunDir,
        tracer: Tracer,
        display: Any | None = None,
    ) -> None:
        self.plan = plan
        self.executor = executor
        self.prompts = list(prompts)
        self.eval_prompts = list(eval_prompts)
        self.run_dir = run_dir
        self.tracer = tracer
        self.display = display
        self.rt = plan.spec.runtime
        if not self.prompts:
            raise ValueError("the controller needs at least one training prompt")
        self.state = RunState()
        self.buffer = SampleBuffer()
        self.ledger = SampleLedger(run_dir.path / "ledger.jsonl" if run_dir is not None else None)
        self.flows = GroupFlows.for_plan(plan, enabled=tracer.enabled)  # trace arrows: generation -> train step
        self.generation = GenerationSide(  # the staleness gate, the groups in flight and untrained, their failures
            plan,
            self.prompts,
            self.eval_prompts,
            self.state,
            self.buffer,
            self.ledger,
            self.flows,
            call=self._call,
            on_failure=self.on_failure,
            stopping=lambda: self._fatal is not None,
            disk_full_message=self._disk_full_message,
        )
        self.group_size = self.generation.group_size
        inference = plan.spec.inference
        self.autopilot = (
            ConcurrencyAutopilot(
                self.rt.batch_size,
                self.group_size,
                self.rt.max_staleness,
                self.rt.max_concurrent_rollouts,
                inference.max_running_requests * inference.servers,
            )
            if self.rt.autopilot
            else None
        )
        no_signal = self.rt.no_signal
        self.signal = LearningSignalWatch(  # runtime.no_signal: a run with nothing to learn says so
            no_signal.steps,
            no_signal.flat_groups,
            group_baseline=any(
                getattr(n.params, "estimator", None) in ("grpo", "rloo") for n in plan.spec.nodes.values()
            ),
        )
        self._fatal: BaseException | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None  # created inside the event loop
        self._locks: dict[tuple[str, str], asyncio.Lock] = {}
        self._earlier_restarts: Counter = Counter()  # restarts in the parts of the run before a resume
        self._resumed_from: Path | None = None  # kept by runtime.keep_checkpoints until a newer one is complete
        self._stop_reason: str | None = None  # why the run stopped early, for end_state.json
        self._saving: Path | None = None  # the checkpoint being written, while it is
        self.span_pull = BackgroundSpanPull(tracer, executor.collect_spans, SPAN_PULL_S)  # never awaited inline

    # ------------------------------------------------------------------ lifecycle
    def run(self, resume_from: Path | None = None) -> RunState:
        """Run to `runtime.steps` (the executor must have been started with `self.on_failure`)."""
        for line in self.plan.describe():
            log.info("plan: %s", line)
        try:
            if resume_from is not None:
                asyncio.run(self._restore(resume_from))
            asyncio.run(self._main())
        finally:
            self.ledger.close()
        return self.state

    def on_failure(self, message: str, resumable: bool = False) -> None:
        """Called from any thread (the launcher's watchdog): stop the run with `message`."""
        if self._fatal is None:
            self._fatal = RunFailed(message, resumable)
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)

    async def _main(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._loop.set_default_executor(ThreadPoolExecutor(max_workers=64, thread_name_prefix="ctl"))
        self._stop = asyncio.Event()
        if self._fatal is not None:
            raise self._fatal
        tasks = {
            asyncio.create_task(self.generation.loop(), name="generation"),
            asyncio.create_task(self._training_loop(), name="training"),
            asyncio.create_task(self._stop.wait(), name="stop"),
        }
        train = next(t for t in tasks if t.get_name() == "training")
        stop = next(t for t in tasks if t.get_name() == "stop")
        try:
            pending = set(tasks)
            while train in pending and stop in pending:  # generation finishing early ends nothing
                done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                for task in done:
                    if task is not stop and (failure := task.exception()) is not None:
                        raise failure
            if self._fatal is not None:
                raise self._fatal
        except Exception as err:
            if interrupted():  # Ctrl-C is stopping the processes: the failed call is its doing, not a death
                self._stop_reason = "interrupted (Ctrl-C)"
                raise KeyboardInterrupt from err
            try:
                if is_disk_full(err):  # said as such, with the path and the room needed; not auto-resumed
                    raise RunFailed(self._disk_full_message(err)) from err
                await self._name_the_dead(err)
            except Exception as named:
                self._stop_reason = f"{type(named).__name__}: {named}"
                raise
        finally:
            inflight = self.generation.inflight
            in_flight = len(inflight)  # counted before cancelling: cancelled groups remove themselves
            for task in (*tasks, *inflight.values()):
                task.cancel()
            await asyncio.gather(*tasks, *inflight.values(), return_exceptions=True)
            self._write_end_state(in_flight)

    def _disk_full_message(self, err: BaseException) -> str:
        """Which write hit the full disk (a checkpoint's, else the file the error names) and the room needed."""
        m = _PATH_IN_ERROR.search(str(err))
        path = getattr(err, "filename", None) or (m.group(1) if m else None)
        if self._saving is not None:
            return disk_full_message(
                f"checkpoint {self._saving.name}",
                path or self._saving,
                self.run_dir.path,
                need_bytes=checkpoint_need(self.run_dir.path),
            )
        if path is None:  # a write that names no file: say the folder, and what the error said
            return disk_full_message(
                f"a file of the run (the error names none: {type(err).__name__}: {err})",
                self.run_dir.path,
                self.run_dir.path,
            )
        return disk_full_message("a file of the run", path, self.run_dir.path)

    async def _name_the_dead(self, err: Exception) -> None:
        """A dead process usually shows up first as a failed call to it: give the executor a
        moment to say which process died and why, and raise that instead."""
        if self._fatal is None and not isinstance(err, NodeContractError):
            for _ in range(30):
                await asyncio.sleep(0.1)
                if self._fatal is not None:
                    break
        if self._fatal is not None and err is not self._fatal:
            raise self._fatal from err
        raise err

    def _write_end_state(self, in_flight: int) -> None:
        """end_state.json, at every stop: whether the run finished (and if not, why), its counters
        and restarts, and, so that nothing is silently dropped, what was generated but never
        trained. A resumed run reads its restarts back (`earlier_restarts`)."""
        stats = self.buffer.stats()
        finished = self._stop_reason is None and self.state.step >= self.rt.steps
        reason = (
            f"completed runtime.steps ({self.rt.steps})"
            if finished
            else self._stop_reason or "stopped before runtime.steps (interrupted or cancelled)"
        )
        summary = {
            "finished": finished,
            "stop_reason": reason,
            "groups_in_flight_at_stop": in_flight,
            "trajectories_buffered_at_stop": stats.buffered_trajectories,
            **{k: v for k, v in asdict(self.state).items() if k != "history"},
            "groups_dropped_by_node": dict(self.generation.dropped_by),
            "process_restarts": dict(self._earlier_restarts + Counter(getattr(self.executor, "restarts", {}))),
            "groups_untrained_at_stop": len(self.generation.untrained),
            "buffer": stats,
        }
        try:
            self.run_dir.write_json(END_STATE_FILENAME, summary)
        except OSError as err:  # a full disk: the run's own error is what the user must see
            log.warning("end_state.json not written: %s", err)
            return
        # a part of this run from before the rename wrote unfinished.json: this file supersedes it
        (self.run_dir.path / LEGACY_END_STATE_FILENAME).unlink(missing_ok=True)
        if in_flight or stats.buffered_trajectories:
            log.info(
                "at stop: %d prompt groups in flight, %d trajectories buffered (not trained)",
                in_flight,
                stats.buffered_trajectories,
            )

    # ------------------------------------------------------------------ calling nodes
    async def _call(self, name: str, batch: PackedBatch, extra: dict[str, Any] | None = None) -> NodeResult:
        """One node call, traced; calls to an exclusive host object (a model) take turns."""
        h = self.plan.hosting[name]
        lock = self._locks.setdefault((h.process, h.obj), asyncio.Lock()) if h.exclusive else None
        async with lock if lock is not None else contextlib.nullcontext():
            fused = [n for n, by in self.plan.fused.items() if by == name]
            with self.tracer.span(
                name,
                cat="node",
                node=name,
                worker=h.process,
                step=self.state.step,
                version=self.state.version,
                **({"fused": fused} if fused else {}),
                **self.flows.span_args(name, batch),
            ):
                return await self.executor.run(
                    name, batch, step=self.state.step, version=self.state.version, extra=extra
                )

    # ------------------------------------------------------------------ training side
    async def _training_loop(self) -> None:
        if self.rt.eval_every and self.rt.eval_at_start and self.state.step == 0:
            self.run_dir.log_metrics(0, await self._evaluate())
        while self.state.step < self.rt.steps:
            await self._train_step()
        await self.span_pull.wait()  # the rest is collected once the run is over (run.py)
        with self.tracer.span("export_final_model", cat="controller"):
            await self.executor.export_model(self.run_dir.final_model_dir)
        assert self._stop is not None  # run() creates it before this task starts
        self._stop.set()

    async def _train_step(self) -> None:
        """One training step, top to bottom (the generation loop fills the buffer meanwhile).

        1. wait for the batch: the B oldest untrained trajectories (`_next_batch` says why oldest);
        2. run the training phase's DAG on it (proximal log-probs, advantages, the train node...:
           `phase_runner.run_phase`, each node sent by the executor to its worker);
        3. publish the new weights to the inference servers (the executor's `WeightSync`);
        4. advance: version and step, the ledger, the staleness gate that admits new rollouts;
        5. record: the step's span, eval and checkpoint when due, the autopilot, the metrics line.
        """
        step, t_wait = self.state.step, time.perf_counter()
        buffered = self.buffer.stats().buffered_trajectories
        with self.tracer.span("wait_batch", cat="controller", step=step):
            batch = await self._next_batch(self.rt.batch_size)  # 1
        t_start = time.perf_counter()
        stats: dict[str, float] = {"time/wait_batch": t_start - t_wait, **self.generation.batch_stats(batch)}
        stop_for = self._watch_signal(batch, stats)

        outcome = await run_phase(self.plan, self.plan.training, batch, self._timed_call(stats))  # 2
        stats.update(outcome.stats)
        trained = outcome.batch.num_seqs if outcome.batch is not None else 0

        t_sync = time.perf_counter()
        stats.update(await self._sync_weights(self.state.version + 1))  # 3
        stats["time/weight_sync"] = time.perf_counter() - t_sync

        self._advance(batch, outcome.batch, trained)  # 4
        t_end = time.perf_counter()
        stats["time/step"] = t_end - t_start
        self.tracer.record("step", t_wait, t_end, cat="step", step=step)  # 5: waiting for the batch included

        if self.rt.eval_every and (self.state.step % self.rt.eval_every == 0 or self.state.step == self.rt.steps):
            stats.update(await self._evaluate())
        if self.rt.save_every and self.state.step % self.rt.save_every == 0:
            await self._checkpoint()
        if self.autopilot is not None:
            self._steer(stats, trained, buffered)
        self._log_step(stats, dropped_in_training=sum(outcome.groups_dropped.values()))
        self.span_pull.maybe_start()
        if stop_for is not None:  # runtime.no_signal.action: stop, once this step's metrics are logged
            self.on_failure(stop_for)

    def _watch_signal(self, batch: PackedBatch, stats: dict[str, float]) -> str | None:
        """runtime.no_signal: feed this step's rewards to the watch (its metrics go into `stats`);
        the first time the last steps had nothing to learn, say so on the console with the likely
        causes, or (action: stop) return that message: the run stops with it after this step."""
        if "rewards" not in batch:
            return None
        groups = batch["group_id"].tolist() if "group_id" in batch else None
        metrics, found = self.signal.observe(batch["rewards"].float().tolist(), groups)
        stats.update(metrics)
        if found is None:
            return None
        action = self.rt.no_signal.action
        message = explain(found, self._clues(stats), action)
        if action == "stop":
            return f"runtime.no_signal.action is stop: {message}"
        # a policy that learned the task is news, not a fault (the shipped kit reaches 100%)
        (log.info if found.solved else log.warning)("step %d: %s", self.state.step + 1, message)
        return None

    def _clues(self, stats: dict[str, float]) -> Clues:
        """What the workflow and this step's measurements say about why there is nothing to learn."""
        spec = self.plan.spec
        source = self.plan.node(self.plan.source).params
        sampling = getattr(source, "sampling", None)
        actor = actor_model(spec)
        model = spec.models[actor].path if actor in spec.models else "MODEL"
        run = self.run_dir.path if self.run_dir is not None else Path("RUN")
        return Clues(
            reward_fns=tuple(
                fn for n in self.plan.scorers() if isinstance(fn := getattr(self.plan.node(n).params, "fn", None), str)
            ),
            prompt_template=spec.data.prompt_template,
            max_new_tokens=getattr(sampling, "max_new_tokens", None),
            cut_off=stats.get("no_eos/frac"),
            invalid_moves=stats.get("env/invalid_move"),
            eval_command=(
                f"areal-graph eval {model} --workflow {run / CONFIG_FILENAME} --limit 16 --show 8 "
                "(the starting policy: with nothing to learn it has hardly moved)"
            ),
            metrics_path=str(run / METRICS_FILENAME),
        )

    def _advance(self, taken: PackedBatch, trained_batch: PackedBatch | None, trained: int) -> None:
        """After the weights are published: the new version, the step, the ledger and the gate."""
        self.state.version += 1
        self.state.step += 1
        self.state.trajectories_trained += trained
        if "group_id" in taken:  # ledger: the groups of step N are "trained" at step N
            self.generation.settle_trained(trained_batch, taken)
        self.generation.gate.set_version(self.state.version)  # admits the rollouts the new version allows

    def _steer(self, stats: dict[str, float], trained: int, buffered: int) -> None:
        """runtime.autopilot: feed this step to the concurrency autopilot; apply what it decides."""
        assert self.autopilot is not None
        limit = self.autopilot.observe(
            self.state.step, stats.get("time/wait_batch", 0.0), stats.get("time/step", 0.0), trained, buffered
        )
        if limit is not None:
            decision = self.autopilot.decisions[-1]
            self.generation.gate.set_max_concurrent(limit)
            now = time.perf_counter()
            self.tracer.record(
                "autopilot",
                now,
                now,
                cat="controller",
                step=self.state.step,
                max_concurrent_before=decision.before,
                max_concurrent=limit,
                why=decision.why,
            )
            log.info(
                "autopilot at step %d: max concurrent rollouts %d -> %d (%s)",
                self.state.step,
                decision.before,
                limit,
                decision.why,
            )
        stats["autopilot/max_concurrent"] = float(self.autopilot.limit)

    async def _next_batch(self, batch_size: int) -> PackedBatch:
        """The next B trajectories: the oldest-submitted untrained groups, waiting for them.

        Which groups are due is `staleness_rule.due_groups` (the simulator's rule too), which
        says why submission order, not the first groups to finish: taking whichever finish first
        lets a slow old group be overtaken until it is trained more than eta versions late.
        The trainer waits only for a group that is due; groups dropped by a filter or failed
        leave the queue and the next ones move up (group ids grow in submission order)."""
        wanted = batch_size // self.group_size
        generation = self.generation
        while True:
            generation.settled.clear()
            due = staleness_rule.due_groups(sorted(generation.untrained), wanted)
            if due is not None:
                batch = self.buffer.take_groups(due)
                if batch is not None:
                    return batch
            await generation.settled.wait()

    def _timed_call(self, stats: dict[str, float]):
        async def call(name: str, batch: PackedBatch) -> NodeResult:
            t = time.perf_counter()
            extra = {"policy_version": self.state.version} if self.plan.kind(name).versioned_call else None
            try:
                return await self._call(name, batch, extra)
            finally:
                stats[f"time/{name}"] = time.perf_counter() - t

        return call

    async def _sync_weights(self, version: int) -> dict[str, float]:
        with self.tracer.span("weight_sync", cat="weights", version=version):
            return await self.executor.sync_weights(version)

    # ------------------------------------------------------------------ eval, checkpoints, logging
    async def _evaluate(self) -> dict[str, float]:
        """Greedy answers to the eval prompts, scored by the plan's scoring nodes, and their metrics
        (`GenerationSide.eval_metrics` says which); the accuracy goes into the run's history."""
        if not self.eval_prompts or not self.plan.scorers():
            return {}
        with self.tracer.span("eval", cat="eval", version=self.state.version):
            answers = await self.generation.eval_answers()
        if answers is None:
            return {}
        out, acc = self.generation.eval_metrics(answers)
        self.state.history.append({"step": self.state.step, "version": self.state.version, "eval/accuracy": acc})
        log.info("eval at step %d: greedy accuracy %.3f on %d prompts", self.state.step, acc, answers.num_seqs)
        if self.display is not None:
            self.display.on_eval(self.state.step, acc)
        return out

    async def _checkpoint(self) -> None:
        path = self.run_dir.checkpoint_dir(self.state.step)
        self._saving = path  # named if the disk fills during the save
        with self.tracer.span("checkpoint", cat="controller", step=self.state.step):
            await self.executor.save_checkpoint(path)
            if delay := float(os.environ.get(SAVE_DELAY_ENV) or 0):  # test hook: a slow save to kill
                await asyncio.sleep(delay)
            state = asdict(self.state)
            # not yet trained: still to resubmit, in flight, or buffered (generated by weights
            # that will not exist after a resume: regenerated rather than trained stale)
            state["requeue"] = sorted({*self.state.requeue, *self.generation.untrained.values()})
            # same moment as the state above: ledger events before this line are in the checkpoint
            self.ledger.record("checkpoint", -1, -1, path.name, self.state.step, self.state.version)
            with naming_the_file(path / "controller_state.json"):
                (path / "controller_state.json").write_text(json.dumps(state))
            self.run_dir.mark_checkpoint_complete(path)
            self._saving = None
            if self._resumed_from is not None and self._resumed_from.name < path.name:
                self._resumed_from = None  # a newer checkpoint is complete: the resumed one may go
            await self._prune_checkpoints(path)

    async def _prune_checkpoints(self, written: Path | None = None) -> None:
        """runtime.keep_checkpoints: delete the checkpoints it does not keep (in a thread: removing
        gigabytes takes a while, and generation goes on meanwhile). Kept whatever the numbers say:
        the checkpoint just `written`, and the one this run resumed from until a newer one is
        complete (a run resumed from an older checkpoint than the newest must not lose either)."""
        if self.rt.keep_checkpoints is None:
            return
        protect = [p for p in (written, self._resumed_from) if p is not None]
        try:
            await asyncio.to_thread(
                self.run_dir.prune_checkpoints, self.rt.keep_checkpoints, self.rt.keep_checkpoints_every, protect
            )
        except OSError as err:  # a checkpoint left on disk must not stop training
            log.warning("pruning old checkpoints failed: %s", err)

    async def _restore(self, ckpt: Path) -> None:
        """Continue as if never stopped: the models' weights and optimizers, the servers on the
        checkpoint's policy (they started on the workflow's model), the prompt stream and the
        untrained groups' prompts, the counters, and metrics with no step logged twice."""
        with self.run_dir.reading_checkpoint(ckpt):  # no prune deletes it under the load
            data = json.loads((ckpt / "controller_state.json").read_text())
            self.state = RunState(**data)
            self.generation.state = self.state  # one RunState, which the generation side advances too
            self._earlier_restarts = earlier_restarts(self.run_dir)
            await self.executor.load_checkpoint(ckpt)
        self._resumed_from = ckpt
        await self._prune_checkpoints()  # what a crash left: a half-written save, a half-done removal
        if self.state.version > 0:
            await self.executor.sync_weights(self.state.version)
        # Trajectories trained before the checkpoint count as accepted, so the bound stays exact.
        self.generation.gate.restore(self.state.version, self.state.trajectories_trained)
        dropped = self.run_dir.truncate_metrics(self.state.step)
        self.ledger.record("resumed", -1, -1, ckpt.name, self.state.step, self.state.version)
        for pos in self.state.requeue:
            self.ledger.record(
                "requeued",
                -1,
                pos,
                getattr(self.prompts[pos % len(self.prompts)], "id", pos),
                self.state.step,
                self.state.version,
            )
        log.info(
            "resumed from %s: step %d, version %d, %d untrained prompt groups requeued%s",
            ckpt,
            self.state.step,
            self.state.version,
            len(self.state.requeue),
            f", {dropped} metrics lines after step {self.state.step} removed" if dropped else "",
        )

    def _log_step(self, stats: dict[str, float], dropped_in_training: int) -> None:
        stats = {k: float(v) for k, v in stats.items()}
        stats.update(
            self.generation.stats.take()
        )  # e.g. reward/failures summed, rm_score/mean averaged, since the last step
        stats.update(
            {
                "step": self.state.step,
                "version": self.state.version,
                "buffer/size": float(self.buffer.size()),
                "rollout/groups_in_flight": float(len(self.generation.inflight)),
                "rollout/groups_failed": float(self.state.groups_failed),
                "groups/dropped": float(self.state.groups_dropped),
                "groups/dropped_in_training": float(dropped_in_training),
                **{f"{name}/groups_dropped_total": float(n) for name, n in self.generation.dropped_by.items()},
            }
        )
        self.run_dir.log_metrics(self.state.step, stats)
        self._say_failures(stats)
        problem = getattr(self.tracer, "problem", None)
        if problem is not None:  # runtime.trace_max_mb cannot hold a step, or the disk is full: said at once
            self.on_failure(problem)
        if self.display is not None:
            self.display.on_step(self.state.step, stats)

    def _say_failures(self, stats: dict[str, float]) -> None:
        """A node's failed calls (a judge's requests, a verifier's timeouts) on the run's console,
        not only in its own process's log: they were scored `on_failure`, and a judge that is down
        would otherwise train the whole run on that score unseen."""
        for key, n in stats.items():
            node, _, leaf = key.rpartition("/")
            if leaf == "failures" and n > 0 and node in self.plan.hosting:
                log.warning(
                    "step %d: node %r: %d request(s) failed and got the failure reward (why: %s)",
                    self.state.step,
                    node,
                    n,
                    self.run_dir.logs_dir / f"{self.plan.hosting[node].process}.log",
                )


def earlier_restarts(run_dir: RunDir) -> Counter:
    """The process restarts the run's earlier parts recorded (end_state.json, or unfinished.json
    from before its rename), so a resumed run reports its restarts over the whole run, not since
    the last resume."""
    try:
        data = json.loads(end_state_file(run_dir.path).read_text())
        return Counter({str(k): int(v) for k, v in (data.get("process_restarts") or {}).items()})
    except (OSError, ValueError, TypeError, AttributeError):
        return Counter()
