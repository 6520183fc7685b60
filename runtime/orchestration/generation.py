"""The controller's generation side: prompt groups submitted under the staleness gate, generated,
retried, counted, and settled.

`GenerationSide.loop` keeps submitting prompt groups while the gate has capacity; each group
runs the source node (the rollout), then the plan's generation phase as a DAG (rewards, filters,
shaping). A group that survives goes into the sample buffer (`on_accept`); a group a filter drops
gives its slot back (`on_reject`) and is counted; a group that fails is retried
`GROUP_ATTEMPTS` times, then counted as failed (never lost silently), and
`FAILED_GROUPS_IN_A_ROW` failures in a row stop the run.

What it owns: the gate (`StalenessGate`), the groups submitted and not yet settled in submission
order (`untrained`, which the trainer's `Controller._next_batch` reads, and the `settled` event
it waits on), the tasks of the groups in flight, the generation-side node stats and drop counts
since the last step, and each group's life in the ledger (generated, dropped, failed, trained).
It also measures what it generated (`batch_stats`: reward, staleness, response length of a
step's batch) and answers the eval prompts (`eval_answers`, `eval_metrics`) by the same calls.
What it is given by the controller: the run's `RunState` (it advances the prompt stream and
counts groups), the buffer, the node call (`Controller._call`: one lock per exclusive host, the
trace span), and how to stop the run (`on_failure`, the disk-full wording).
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from areal_graph.api.env_metrics import env_metric_means
from areal_graph.data.packed import PackedBatch
from areal_graph.graph.plan import ExecutionPlan
from areal_graph.runtime.observability.disk_full import is_disk_full
from areal_graph.runtime.observability.flows import GroupFlows
from areal_graph.runtime.observability.ledger import SampleLedger
from areal_graph.runtime.observability.source_metrics import means_by_source
from areal_graph.runtime.orchestration.generation_stats import GenerationStats
from areal_graph.runtime.orchestration.phase_runner import NodeContractError, NodeResult, run_phase
from areal_graph.runtime.orchestration.sample_buffer import SampleBuffer
from areal_graph.runtime.orchestration.staleness import StalenessGate, version_range
from areal_graph.runtime.rpc.worker_client import WorkerError

log = logging.getLogger("areal_graph.runtime.orchestration.controller")  # the run's console names the controller

GROUP_ATTEMPTS = 3  # a failing prompt group is tried this often, then counted as failed
# this many prompt groups failing in a row (none generated or dropped between them) stop the
# run: a node that always fails (a user function's bug) would otherwise fail every prompt forever
FAILED_GROUPS_IN_A_ROW = 8

NodeCall = Callable[[str, PackedBatch, dict[str, Any] | None], Coroutine[Any, Any, NodeResult]]


def tool_call_stats(batch: PackedBatch, prefix: str) -> dict[str, float]:
    """`<prefix>/tool_call_rate` (share of trajectories with a tool call) and
    `<prefix>/tool_calls_mean`, when the rollout counts tool calls (the `tool_calls` key)."""
    if "tool_calls" not in batch:
        return {}
    calls = batch["tool_calls"].float()
    return {
        f"{prefix}/tool_call_rate": float((calls > 0).float().mean()),
        f"{prefix}/tool_calls_mean": float(calls.mean()),
    }


class NodeFailed(RuntimeError):
    """A generation-side node call failed: the message names the node (and its kind), which the
    raw exception (a user function's ValueError, a worker's remote traceback) may not."""

    def __init__(self, node: str, kind: str, cause: BaseException) -> None:
        if isinstance(cause, WorkerError):  # one line, not a remote traceback per retry and group
            what = f"{cause.summary} (traceback in logs/{cause.worker}.log)"
        else:
            what = f"{type(cause).__name__}: {cause}"
        super().__init__(f"node {node!r} ({kind}): {what}")
        self.node = node


@dataclass
class RunState:
    """What the controller knows about progress; saved with every checkpoint for resume. The
    generation side advances the prompt stream and counts groups; the training loop the rest."""

    step: int = 0
    version: int = 0
    next_prompt: int = 0  # position in the shuffled prompt stream
    next_group_id: int = 0
    groups_submitted: int = 0
    groups_finished: int = 0
    groups_failed: int = 0
    groups_retried: int = 0
    groups_dropped: int = 0
    trajectories_trained: int = 0
    history: list[dict] = field(default_factory=list)
    # positions in the prompt stream of groups submitted but not trained when the checkpoint
    # was taken (in flight or buffered): a resume generates them again first, so none is skipped
    requeue: list[int] = field(default_factory=list)


class GenerationSide:
    """The generation loop and everything a prompt group goes through (see module docstring).

    `state` is the controller's `RunState`: the controller sets it again when a resume loads one."""

    def __init__(
        self,
        plan: ExecutionPlan,
        prompts: list[Any],
        eval_prompts: list[Any],
        state: RunState,
        buffer: SampleBuffer,
        ledger: SampleLedger,
        flows: GroupFlows,
        call: NodeCall,
        on_failure: Callable[[str], None],
        stopping: Callable[[], bool],
        disk_full_message: Callable[[BaseException], str],
    ) -> None:
        self.plan = plan
        self.rt = plan.spec.runtime
        self.prompts = prompts
        self.eval_prompts = eval_prompts
        self.state = state
        self.buffer = buffer
        self.ledger = ledger
        self.flows = flows
        self._call = call
        self._on_failure = on_failure
        self._stopping = stopping  # the run is failing already: a failed group is not retried
        self._disk_full_message = disk_full_message
        self.group_size = int(getattr(plan.node(plan.source).params, "group_size", 1))
        self.gate = StalenessGate(self.rt.batch_size, self.rt.max_staleness, self.rt.max_concurrent_rollouts)
        self.settled = asyncio.Event()  # a prompt group finished: generated, dropped or failed
        self.inflight: dict[int, asyncio.Task] = {}
        self.stats = GenerationStats()  # generation-side node stats since the last step
        self.dropped_by: dict[str, int] = {}
        self.untrained: dict[int, int] = {}  # gid -> prompt-stream position, until trained, dropped or failed
        self._failed_in_a_row = 0  # prompt groups failed since one was last generated or dropped
        self._said: Counter = Counter()  # how often each failure text was shown (shown twice, then counted)

    # ------------------------------------------------------------------ the loop
    async def loop(self) -> None:
        """Submit prompt groups while the gate has room, until the run's last step."""
        G = self.group_size
        while self.state.step < self.rt.steps:
            await self.gate.wait_for_capacity(G)
            if self.state.step >= self.rt.steps:
                return
            self.gate.on_submit(G)
            gid = self.state.next_group_id
            self.state.next_group_id += 1
            if self.state.requeue:  # prompts a resumed checkpoint had not trained yet come first
                pos = self.state.requeue.pop(0)
            else:
                pos = self.state.next_prompt
                self.state.next_prompt += 1
            self.untrained[gid] = pos
            self.state.groups_submitted += 1
            prompt = self.prompts[pos % len(self.prompts)]
            self.inflight[gid] = asyncio.create_task(self._run_group(gid, prompt), name=f"group-{gid}")

    async def _run_group(self, gid: int, prompt: Any) -> None:
        G = self.group_size
        try:
            for attempt in range(GROUP_ATTEMPTS):
                self.flows.attempt(gid, attempt)
                try:
                    outcome = await self._generate_group(gid, prompt)
                    break
                except (asyncio.CancelledError, NodeContractError):
                    raise
                except Exception as exc:  # a failed group is retried, then reported: never lost silently
                    if attempt + 1 == GROUP_ATTEMPTS or self._stopping():
                        self._group_failed(gid, prompt, exc)
                        return
                    self.state.groups_retried += 1
                    self._say_once(
                        logging.WARNING,
                        exc,
                        "prompt group %d failed (%s); retrying (attempt %d)",
                        gid,
                        exc,
                        attempt + 2,
                    )
            self._failed_in_a_row = 0
            for name, n in outcome.groups_dropped.items():
                self.dropped_by[name] = self.dropped_by.get(name, 0) + n
            self.stats.add(outcome.stats)
            if outcome.batch is None:
                self.gate.on_reject(G)
                self.state.groups_dropped += 1
                self._settle(gid, prompt, "dropped")
            else:
                self.gate.on_accept(G)
                self.state.groups_finished += 1
                self.buffer.put(outcome.batch)
                self.flows.accepted(gid)
                self._record(gid, prompt, "generated")
            self.settled.set()
        except NodeContractError as err:
            self.gate.on_reject(G)
            self._on_failure(f"{err}")
        except OSError as err:  # the ledger's write: a full disk stops the run, said as such
            if not is_disk_full(err):
                raise
            self._on_failure(self._disk_full_message(err))
        finally:
            if self.inflight.get(gid) is asyncio.current_task():
                del self.inflight[gid]

    def _group_failed(self, gid: int, prompt: Any, exc: Exception) -> None:
        """Count the group as failed (never lost silently); stop the run when groups keep failing."""
        self.gate.on_reject(self.group_size)
        self.state.groups_failed += 1
        self._settle(gid, prompt, "failed")
        self.settled.set()
        self._say_once(
            logging.ERROR,
            exc,
            "prompt group %d (prompt %s) failed %d times, dropped and counted: %s",
            gid,
            prompt.id,
            GROUP_ATTEMPTS,
            exc,
        )
        self._failed_in_a_row += 1
        if self._failed_in_a_row == FAILED_GROUPS_IN_A_ROW:
            self._on_failure(
                f"{FAILED_GROUPS_IN_A_ROW} prompt groups in a row failed, each tried {GROUP_ATTEMPTS} "
                f"times; the last: {exc}"
            )

    def _say_once(self, level: int, exc: Exception, fmt: str, *args: Any) -> None:
        """A group's failure (`exc`) on the console the first two times this message meets this
        error, then once more to say the rest are only counted (rollout/groups_failed,
        end_state.json) and logged at debug level: with 64 groups in flight, a node that always
        fails would otherwise print a line per group and attempt before the run stops."""
        key = (fmt, str(exc))
        self._said[key] += 1
        n = self._said[key]
        if n <= 2:
            log.log(level, fmt, *args)
        elif n == 3:
            log.log(level, fmt + " (the same failure again: further ones are counted, not shown)", *args)
        else:
            log.debug(fmt, *args)

    # ------------------------------------------------------------------ a group's life in the ledger
    def _record(self, gid: int, prompt: Any, event: str) -> None:
        self.ledger.record(
            event, gid, self.untrained.get(gid, -1), getattr(prompt, "id", prompt), self.state.step, self.state.version
        )

    def source_of(self, gid: int) -> str:
        """The data source of a group's prompt ("" when the dataset names none); eval groups
        have ids -len(eval_prompts)..-1."""
        if gid < 0:
            prompt = self.eval_prompts[gid + len(self.eval_prompts)] if -gid <= len(self.eval_prompts) else None
        else:
            pos = self.untrained.get(gid, -1)
            prompt = self.prompts[pos % len(self.prompts)] if pos >= 0 else None
        return str(getattr(prompt, "source", "") or "")

    def _settle(self, gid: int, prompt: Any, event: str) -> None:
        """A group's last event: it will never be trained (or just was)."""
        self._record(gid, prompt, event)
        self.untrained.pop(gid, None)
        self.flows.settled(gid)

    def settle_trained(self, batch: PackedBatch | None, taken: PackedBatch) -> None:
        """Every group taken for this step is settled: trained, or dropped by a training-side filter."""
        trained = set(batch["group_id"].tolist()) if batch is not None and "group_id" in batch else set()
        for gid in dict.fromkeys(taken["group_id"].tolist()):
            pos = self.untrained.get(gid, -1)
            self._settle(
                gid,
                self.prompts[pos % len(self.prompts)] if pos >= 0 else gid,
                "trained" if gid in trained else "dropped",
            )

    # ------------------------------------------------------------------ calling the nodes
    def _group_seed(self, gid: int) -> dict[str, Any] | None:
        """Sampling seed of a group: from the run's seed and the group's place in the prompt
        stream, unless the workflow fixes one. A group's answers then depend on the weights
        alone, not on which process drew them or when: a retried or resumed group is
        generated exactly as it would have been (the rollout gives answer j seed + 1000 j)."""
        sampling = getattr(self.plan.node(self.plan.source).params, "sampling", None)
        if sampling is None or getattr(sampling, "seed", 0) is not None:
            return None
        pos = self.untrained.get(gid, gid)
        return {"sampling": {"seed": (self.rt.seed % (1 << 20)) * (1 << 40) + pos * (1 << 16)}}

    async def _generate_group(self, gid: int, prompt: Any):
        batch = (
            await self.generation_call(
                self.plan.source, self.prompt_batch([prompt], [gid]), extra=self._group_seed(gid)
            )
        ).batch
        return await run_phase(self.plan, self.plan.generation, batch, self.generation_call)

    async def generation_call(self, name: str, batch: PackedBatch, extra: dict[str, Any] | None = None) -> NodeResult:
        """One generation-side node call (also the evaluation's); a failure names the node (`NodeFailed`)."""
        try:
            return await self._call(name, batch, extra)
        except (asyncio.CancelledError, NodeContractError):
            raise
        except Exception as exc:
            fn = getattr(self.plan.node(name).params, "fn", None)  # a function or reward node's code
            raise NodeFailed(name, self.plan.kind(name).name + (f" {fn}" if isinstance(fn, str) else ""), exc) from exc

    def prompt_batch(self, prompts: Sequence[Any], group_ids: list[int]) -> PackedBatch:
        return PackedBatch.from_sequences(
            {"input_ids": [p.input_ids for p in prompts]},
            seqs={"group_id": group_ids},
            meta={
                "answer": [p.answer for p in prompts],
                "prompt_id": [p.id for p in prompts],
                # what a rollout class may read besides the tokens (PromptLike): the prompt as text,
                # and the question as the row gives it (an environment restates it)
                "text": [str(getattr(p, "text", "")) for p in prompts],
                "question": [str(getattr(p, "question", "")) for p in prompts],
            },
        )

    # ------------------------------------------------------------------ what was generated, measured
    def batch_stats(self, batch: PackedBatch) -> dict[str, float]:
        """Reward, staleness and version spread of the trajectories about to be trained (the step's metrics)."""
        out: dict[str, float] = {}
        if "versions" in batch and "loss_mask" in batch:
            vmin, vmax = version_range(batch["versions"], batch["loss_mask"], batch.cu_seqlens)
            generated = vmin >= 0  # a sequence without generated tokens has no staleness
            staleness = (self.state.version - vmin[generated]).float()
            resp_len = torch.zeros(batch.num_seqs).index_add_(0, batch.seq_ids(), batch["loss_mask"].float())
            if generated.any():
                out.update(
                    {
                        "staleness/mean": float(staleness.mean()),
                        "staleness/max": float(staleness.max()),
                        "versions_per_traj/mean": float((vmax - vmin + 1)[generated].float().mean()),
                    }
                )
            out["response_len/mean"] = float(resp_len.mean())
            out["response_len/p90"] = float(torch.quantile(resp_len, 0.9))
            out["response_len/max"] = float(resp_len.max())
        if "rewards" in batch:
            out["reward/mean"] = float(batch["rewards"].float().mean())
            if "group_id" in batch:
                out.update(
                    means_by_source(
                        "reward",
                        "mean",
                        batch["rewards"].float().tolist(),
                        [self.source_of(g) for g in batch["group_id"].tolist()],
                    )
                )
        if "seq_no_eos" in batch:
            out["no_eos/frac"] = float(batch["seq_no_eos"].float().mean())
        out.update(tool_call_stats(batch, "rollout"))
        out.update(env_metric_means(batch.meta.get("info") or ()))
        return out

    async def eval_answers(self) -> PackedBatch | None:
        """Greedy answers to the eval prompts (group ids -len(eval_prompts)..-1), scored by the plan's
        scoring nodes; None when a filter dropped them all. A failing node stops the run here with
        its name (no retries: this is not training data)."""
        source = self.plan.node(self.plan.source)
        greedy = {"temperature": 0.0, "max_new_tokens": source.params.sampling.max_new_tokens}
        gids = list(range(-len(self.eval_prompts), 0))
        batch = (
            await self.generation_call(
                self.plan.source,
                self.prompt_batch(self.eval_prompts, gids),
                extra={"group_size": 1, "sampling": greedy},
            )
        ).batch
        outcome = await run_phase(self.plan, self.plan.eval_nodes, batch, self.generation_call)
        return outcome.batch

    def eval_metrics(self, answers: PackedBatch) -> tuple[dict[str, float], float]:
        """The metrics of scored eval answers, and the accuracy.

        `eval/accuracy` is the share of answers the first `reward` node (else the first scoring
        node) scores above 0.5;
        `eval/<key>` is the mean of every scoring node's key."""
        scorers = self.plan.scorers()
        out = {f"eval/{k}": float(answers[k].float().mean()) for n in scorers for k in self.plan.node(n).writes}
        # accuracy is a verifier's verdict: a rule reward's when there is one (not a reward model's score)
        judge = next((n for n in scorers if self.plan.kind(n).name == "reward"), scorers[0])
        first = self.plan.node(judge).writes[0]
        acc = float((answers[first].float() > 0.5).float().mean())
        out["eval/accuracy"] = acc
        if "group_id" in answers:
            out.update(
                means_by_source(
                    "eval",
                    "accuracy",
                    (answers[first].float() > 0.5).float().tolist(),
                    [self.source_of(g) for g in answers["group_id"].tolist()],
                )
            )
        out.update(tool_call_stats(answers, "eval"))
        out.update(env_metric_means(answers.meta.get("info") or (), prefix="eval/env"))
        return out, acc
