"""A discrete-event simulation of a run: the controller as it is, driven by a cost model.

What it reproduces, each as the code does it (file: what):
- runtime/orchestration/staleness.py: the gate admits a prompt group of G while
  accepted + running + G <= (eta + v + 1) B and running + G <= max_concurrent_rollouts; the
  simulation calls the gate's own functions for it (runtime/orchestration/staleness_rule.py:
  `staleness_bound`, `admissible`), so the two cannot drift apart;
- runtime/orchestration/controller.py: the generation loop submits groups as soon as the gate
  allows; a group is its rollout call (dispatch, G requests, collect), then the generation-side
  nodes (reward); the trainer takes the B/G oldest-submitted groups (`_next_batch`, by the same
  `staleness_rule.due_groups`), runs the training side, syncs the weights to every server, bumps
  the version;
- engines/inference/engine.py: per server, continuous batching: each step admits queued
  requests up to `max_running_requests`, prefills the pending ones in chunks of at most the
  prefill budget of padded tokens (the G answers of a fresh prompt share one prefill), then
  decodes one token for every running request; a weight update waits for the step boundary,
  swaps, and (interruptible generation) sends every request in flight back to be prefilled
  again from prompt + tokens so far;
- the CPU: every step and call takes its cost-model time times the slowdown of who else
  computes on its cores at that moment (perfmodel/cpu.py), with the background CPU of the
  controller, rollout and reward workers scaled to the simulated request rate; the engine's
  forwards also lose what of that background lands on their cores (`cpu.preemption`), which
  is why a run with fewer requests per second (lower concurrency, a synchronous run) decodes
  each step faster than the calibration did.

What it leaves out: network latency beyond the measured per-call overheads, the trace's own
cost, memory limits (a KV cache that would not fit), evaluation answers' own lengths (an eval
uses the training lengths, greedy). `SimResult.notes` says where a run extrapolates.
"""

from __future__ import annotations

import dataclasses
import heapq
import itertools
import math
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from areal_graph.perfmodel.cost_model import CostModel, SidePlacement
from areal_graph.perfmodel.cpu import Demand, preemption, slowdown
from areal_graph.perfmodel.speculation import (
    NO_ACCEPTANCE,
    PROBE,
    BucketAcceptance,
    CannotPriceSpeculation,
    Verdict,
    best_draft,
    bucket_of,
    fed_token_ms,
    sample_accepted,
    verify_fixed_ms,
    verify_token_ms,
)
from areal_graph.runtime.orchestration import staleness_rule
from areal_graph.runtime.orchestration.autopilot import ConcurrencyAutopilot

ADMIT_WAIT_S = 0.002  # engine.py admit_wait_s: an idle engine lets a burst of submissions arrive
PREFILL_BUDGET = 2048  # engine.py prefill_token_budget
EXPLORE = 64  # speculation/policy.py _EXPLORE: steps of one kind in a bucket before the other runs once


@dataclass
class SimConfig:
    """The settings of one simulated run (`config_from_spec` reads them off a workflow)."""

    steps: int = 100
    batch_size: int = 32
    group_size: int = 8
    max_staleness: int = 4
    max_concurrent: int = 64
    max_running: int = 64
    servers: int = 1
    max_new_tokens: int = 0  # 0: as calibrated
    prefill_budget: int = PREFILL_BUDGET
    max_tokens_per_microbatch: int = 4096
    decode_chunk: int = 1  # decode steps one event may cover (cluster-scale runs; 1 = exact)
    machine_cores: list[int] = field(default_factory=lambda: [0, 1])
    inference: SidePlacement = field(default_factory=SidePlacement)
    training: SidePlacement = field(default_factory=SidePlacement)
    other: SidePlacement = field(default_factory=SidePlacement)
    # "recompute" (AReaL), "keep" (the KV cache survives a weight update) or "wait" (the update waits
    # for the requests in flight to finish, admitting none meanwhile)
    kv_on_update: str = "recompute"
    batch_order: str = "submission"  # "submission" (the controller today) or "completion"
    eval_every: int = 0
    eval_size: int = 0
    autopilot: bool = False  # runtime.autopilot: the controller's concurrency rule, run on the simulated steps
    cpu_contention: bool = True  # False: the engines and the trainer do not share CPU cores (GPU clusters)
    # inference.speculative: verify proposals where the policy would (priced from the calibration's shadow
    # acceptance, perfmodel/speculation.py); max_draft and max_rows as the engine's settings
    speculative: bool = False
    max_draft: int = 4
    speculative_max_rows: int | None = None
    seed: int = 1
    label: str = ""


@dataclass
class SimResult:
    steps_window_s: float
    step_s_median: float
    staleness_mean: float
    staleness_max: int
    busy: dict[str, float]  # process -> busy share of the steps window
    step_bound: dict[str, int]  # what each step waited for: generation or training
    tokens_per_s: float
    requests: int
    reprefill_tokens: int
    notes: list[str] = field(default_factory=list)
    step_ends: list[float] = field(default_factory=list)  # each step's end, seconds from the window's start
    # speculative runs: verifying and plain decode steps, tokens per row and verifying forward
    speculation: dict[str, float] = field(default_factory=dict)

    def steady_step_s(self) -> float:
        """The time between step ends over the second half of the run: the pipeline has filled by then
        (the first asynchronous steps wait for it), where the median step would not see it."""
        ends = self.step_ends
        half = len(ends) // 2
        if len(ends) - half < 2:
            return self.step_s_median
        return (ends[-1] - ends[half - 1 if half else 0]) / (len(ends) - half if half else len(ends) - 1)

    def as_dict(self) -> dict[str, Any]:
        return {
            "steps_window_s": self.steps_window_s,
            "step_s_median": self.step_s_median,
            "staleness_mean": self.staleness_mean,
            "staleness_max": self.staleness_max,
            "busy": self.busy,
            "step_bound": self.step_bound,
            "tokens_per_s": self.tokens_per_s,
            "requests": self.requests,
            "reprefill_tokens": self.reprefill_tokens,
            "notes": self.notes,
            "speculation": self.speculation,
        }


# ============================================================================ the pieces
@dataclass
class _Request:
    group: _Group
    prompt: int
    target: int
    made: int = 0
    server: int = -1

    @property
    def context(self) -> int:
        return self.prompt + self.made


@dataclass
class _Group:
    gid: int
    version: int
    prompt: int
    lengths: list[int]
    left: int = 0
    accepted_at: float = math.inf
    eval: bool = False


class _Server:
    """One inference server's engine (see module docstring)."""

    def __init__(self, sim: Simulation, index: int) -> None:
        self.sim, self.index = sim, index
        self.queue: list[_Request] = []
        self.pending: list[_Request] = []
        self.running: list[_Request] = []
        self.stepping = False
        self.update: tuple[int, Callable[[], None]] | None = None  # (version, done) waiting for a boundary
        self.swapping = False
        self.busy_s = 0.0
        self.outstanding = 0
        self.just_finished = False  # the last step finished requests (admitting right after costs more)
        # speculation: per batch-size bucket [verifying steps, plain steps, steps since the other kind ran]
        self.policy: dict[int, list[int]] = {}

    def submit(self, req: _Request) -> None:
        req.server = self.index
        self.outstanding += 1
        self.queue.append(req)
        if not self.stepping and not self.swapping:
            self.stepping = True
            self.sim.at(ADMIT_WAIT_S if not (self.running or self.pending) else 0.0, self._step)

    def request_update(self, version: int, done: Callable[[], None]) -> None:
        self.update = (version, done)
        if not self.stepping and not self.swapping:
            self._swap()

    def _swap_due(self) -> bool:
        """An update swaps at the next step boundary, except under kv_on_update=wait while requests run."""
        return self.update is not None and not (self.sim.cfg.kv_on_update == "wait" and (self.running or self.pending))

    def _step(self) -> None:
        if self._swap_due():
            self.stepping = False
            self._swap()
            return
        room = self.sim.cfg.max_running - len(self.running) - len(self.pending)
        admitted = 0
        while room > 0 and self.queue and self.update is None:
            self.pending.append(self.queue.pop(0))
            room -= 1
            admitted += 1
        after_finish, self.just_finished = self.just_finished and admitted > 0, False
        if not (self.pending or self.running):
            self.stepping = False
            return
        costs = self.sim.costs
        ms = 0.0
        if self.pending:  # a prefill gives each request its first token; those done at once never decode
            ms += self._prefill_cost(self.pending)
            ms += costs.engine_admit_after_finish_ms if after_finish else 0.0
            # the engine's own work per request (admitting it, joining the KV cache, leaving it)
            ms += costs.engine_request_overhead_ms * sum(1 for r in self.pending if r.made == 0)
            for r in self.pending:
                r.made += 1
            self.running.extend(self.pending)
            self.pending = []
        decoding = [r for r in self.running if r.made < r.target]
        # the engine's own work between two forwards: the loop, and each row's bookkeeping
        between = costs.engine_step_overhead_ms + costs.engine_row_overhead_ms * len(decoding)
        if decoding and self.sim.cfg.speculative:
            ms += self._speculative_step(decoding) + between
        elif decoding:
            # decode_chunk > 1 (cluster-scale runs): k steps in one event while nobody finishes; each step at
            # the chunk's mean width. 1 (the default) is the engine step for step.
            k = max(1, min(self.sim.cfg.decode_chunk, min(r.target - r.made for r in decoding)))
            ms += k * (self._plain_ms(decoding, (k - 1) / 2) + between)
            for r in decoding:
                r.made += k
            self.sim.tokens += len(decoding) * k
        dur = ms / 1e3 * self.sim.engine_slowdown(self.index)
        self.busy_s += self.sim.clip_to_window(dur)
        self.sim.engine_active[self.index] = True
        self.sim.at(dur, self._step_done)

    def _plain_ms(self, decoding: list[_Request], ahead: float = 0.0) -> float:
        """One plain decode step over `decoding`, its rows `ahead` tokens further on (a chunk's mean)."""
        costs = self.sim.costs
        b = len(decoding)
        width = max(r.context for r in decoding) + ahead
        context = sum(r.context for r in decoding) + b * ahead
        # the embedded engine attends over the padded window (rows x width); a paged-attention
        # engine (cluster.py) reads each row's own context (the sum): each cost model says which
        return costs.decode_ms.predict(rows=b, rows_x_width_k=b * width / 1e3, context_k=context / 1e3)

    def _speculative_step(self, decoding: list[_Request]) -> float:
        """One decode step of an engine that speculates (engine.py `_decode`, speculation/policy.py):
        its policy's choice in this batch-size bucket (a bucket never verified tries it, then the
        plain kind is measured, then the better of the two at its steady state, `best_draft`, with
        the other kind once every `EXPLORE` steps); a verifying step feeds each row with a
        proposal (drawn at the bucket's proposal rate) the verdict's length, cut to the row's room,
        advances it by 1 + its accepted tokens (drawn position by position) and costs the plain
        step plus its extra fed tokens (`Simulation.verify_extra_ms`). Returns its ms."""
        sim = self.sim
        b = len(decoding)
        width = max(r.context for r in decoding)
        plain = self._plain_ms(decoding)
        verdict, acc = sim.verdict(b, width, plain)
        state = self.policy.setdefault(bucket_of(b), [0, 0, 0])
        if sim.cfg.speculative_max_rows is not None and b > sim.cfg.speculative_max_rows:
            verify = False
        elif state[0] == 0:
            verify = True  # never measured here: the policy tries it
        elif state[1] == 0:
            verify = False  # the baseline next
        elif state[2] >= EXPLORE:
            state[2] = 0
            verify = not verdict.verifies
        else:
            state[2] += 1
            verify = verdict.verifies
        extra, made = 0, 0
        if verify:
            draft, share = (verdict.draft, verdict.share) if verdict.draft else (1, acc.rate / PROBE)
            for r in decoding:
                k = min(draft, r.target - r.made - 1)
                if k > 0 and sim.spec_rng.random() < share:
                    extra += k
                    step = 1 + sample_accepted(sim.spec_rng, acc.positions, k)
                else:
                    step = 1
                r.made += step
                made += step
        if not extra:  # nobody proposed (or the policy said plain): a plain step, measured as one
            if not verify:
                for r in decoding:
                    r.made += 1
                made = b
            state[1] += 1
            sim.spec_counts["plain_steps"] += 1
            sim.tokens += made
            return plain
        state[0] += 1
        sim.spec_counts["verifying_steps"] += 1
        sim.spec_counts["verified_rows"] += b
        sim.spec_counts["verified_tokens"] += made
        sim.spec_counts["fed_extra"] += extra
        sim.tokens += made
        return plain + sim.verify_extra_ms(b, extra, width)

    def _prefill_cost(self, reqs: list[_Request]) -> float:
        """engine.py _prefill: identical token sequences (a fresh group's answers) share one row;
        rows sorted by length go into chunks of at most the budget of padded tokens."""
        rows: dict[Any, int] = {}
        keep = self.sim.costs.reprefill_keep
        for r in reqs:
            if r.made and keep < 1.0 and self.sim.share_rng.random() > keep:
                continue  # identical to a group mate's answer so far: shares its row
            key = ("g", r.group.gid) if r.made == 0 else ("r", id(r))
            rows[key] = r.context
            if r.made:
                self.sim.reprefill_tokens += r.context
        lens = sorted(rows.values())
        budget = self.sim.cfg.prefill_budget
        ms, chunk = 0.0, []  # type: float, list[int]
        for n in lens:
            if chunk and n * (len(chunk) + 1) > budget:
                ms += self._chunk_ms(chunk)
                chunk = []
            chunk.append(n)
        if chunk:
            ms += self._chunk_ms(chunk)
        return ms

    def _chunk_ms(self, lens: list[int]) -> float:
        """One prefill forward, and the engine's work after it (sampling first tokens, joining the cache)."""
        width = max(lens)
        padded = width * len(lens)
        costs = self.sim.costs
        forward = costs.prefill_ms.predict(
            tokens_k=sum(lens) / 1e3, padded_k=padded / 1e3, padded_x_width_m=padded * width / 1e6
        )
        return forward + costs.engine_prefill_overhead_ms

    def _step_done(self) -> None:
        self.sim.engine_active[self.index] = False
        done = [r for r in self.running if r.made >= r.target]
        self.just_finished = bool(done)
        if done:
            self.running = [r for r in self.running if r.made < r.target]
            for r in done:
                self.outstanding -= 1
                self.sim.request_done(r)
        if self._swap_due():
            self.stepping = False
            self._swap()
            return
        self._step()

    def _swap(self) -> None:
        version, done = self.update  # type: ignore[misc]
        self.update = None
        self.swapping = True

        def finished() -> None:
            self.swapping = False
            if self.sim.cfg.kv_on_update == "recompute":
                self.pending = self.running + self.pending
                self.running = []
            done()
            if (self.queue or self.pending or self.running) and not self.stepping:
                self.stepping = True
                self._step()

        self.busy_s += self.sim.clip_to_window(self.sim.costs.swap_s)
        self.sim.at(self.sim.costs.swap_s, finished)


class Simulation:
    """One simulated run (see module docstring); `run()` returns its `SimResult`."""

    def __init__(
        self, cfg: SimConfig, costs: CostModel, background_scale: float = 1.0, plan_nodes: dict[str, Any] | None = None
    ) -> None:
        self.cfg, self.costs = cfg, costs
        self.rng = random.Random(cfg.seed)
        self.share_rng = random.Random(cfg.seed + 7919)  # apart: lengths drawn stay the same whatever is shared
        self.now = 0.0
        self._events: list[tuple[float, int, Callable[[], None]]] = []
        self._seq = itertools.count()
        self.servers = [_Server(self, i) for i in range(cfg.servers)]
        self.engine_active = [False] * cfg.servers
        self.training_busy = False
        self.version = 0
        self.step = 0
        self.accepted = 0
        self.running = 0
        self.gid = 0
        self.untrained: list[_Group] = []  # submitted, not yet trained, in submission order
        self.buffer: list[_Group] = []
        self.tokens = 0
        self.reprefill_tokens = 0
        self.requests = 0
        self.staleness: list[int] = []
        self.step_spans: list[tuple[float, float, str]] = []
        self.window: tuple[float, float] = (0.0, math.inf)
        self.trainer_busy_s = 0.0
        self.reward_busy_s = 0.0
        self.background = costs.background_demands(
            background_scale, {"inference": cfg.inference, "training": cfg.training, "other": cfg.other}
        )
        # the background's bursts on the engine's cores: fixed for the run (its placement and rate)
        self.engine_preemption = preemption(self._engine_demand(), self.background, cfg.machine_cores)
        self.plan_nodes = plan_nodes or {}
        self.notes: list[str] = []
        self._trainer_waiting: Callable[[], None] | None = None  # a batch is due: called on every accept
        self._eval_waiting: Callable[[], None] | None = None  # an evaluation's answers: called when all are in
        self._eval_left = 0
        self._done = False
        self.autopilot = None
        if cfg.autopilot:
            self.autopilot = ConcurrencyAutopilot(
                cfg.batch_size, cfg.group_size, cfg.max_staleness, cfg.max_concurrent, cfg.max_running * cfg.servers
            )
        self._buffered_at_start = 0
        self._batch_at = 0.0
        self.spec_rng = random.Random(cfg.seed + 104729)  # apart: lengths drawn stay the same with speculation
        self.spec_counts: dict[str, int] = {
            "verifying_steps": 0,
            "plain_steps": 0,
            "verified_rows": 0,
            "verified_tokens": 0,
            "fed_extra": 0,
        }
        self._acceptance: dict[int, BucketAcceptance] = {}
        if cfg.speculative and costs.speculation is None:
            raise CannotPriceSpeculation(NO_ACCEPTANCE)

    # ------------------------------------------------------------------ clock
    def at(self, delay: float, fn: Callable[[], None]) -> None:
        heapq.heappush(self._events, (self.now + max(delay, 0.0), next(self._seq), fn))

    def clip_to_window(self, dur: float) -> float:
        """How much of [now, now + dur] lies inside the steps window (busy shares count only that)."""
        lo, hi = self.window
        return max(0.0, min(self.now + dur, hi) - max(self.now, lo))

    # ------------------------------------------------------------------ CPU
    def engine_slowdown(self, index: int) -> float:
        """Cores asked for vs cores there (cpu.py), times the interference of a computing trainer."""
        if not self.cfg.cpu_contention:
            return 1.0 + self.costs.interference * self.training_busy
        engine = self._engine_demand()
        others = [engine for i, a in enumerate(self.engine_active) if a and i != index]
        if self.training_busy:
            others.append(self._trainer_demand())
        cpu = slowdown(engine, others + self.background, self.cfg.machine_cores) * self.engine_preemption
        return cpu * (1.0 + self.costs.interference * self.training_busy)

    def training_slowdown(self) -> float:
        busy = sum(self.engine_active) or (1 if any(s.running or s.pending for s in self.servers) else 0)
        if not self.cfg.cpu_contention:
            return 1.0 + self.costs.interference * min(busy, 1)
        others = [self._engine_demand()] * busy
        cpu = slowdown(self._trainer_demand(), others + self.background, self.cfg.machine_cores)
        return cpu * (1.0 + self.costs.interference * min(busy, 1))

    def _engine_demand(self) -> Demand:
        """The engine's threads, at most as many as it was calibrated with: the model does not know
        how its time scales with threads, so more are taken to give and to cost nothing."""
        side = self.cfg.inference
        return Demand(min(side.threads, self.costs.inference.threads), _cores(side))

    def _trainer_demand(self) -> Demand:
        side = self.cfg.training
        return Demand(min(side.threads, self.costs.training.threads), _cores(side))

    # ------------------------------------------------------------------ speculation
    def acceptance(self, rows: int) -> BucketAcceptance:
        """The calibration's acceptance at `rows` rows (its bucket, pooled where thin)."""
        b = bucket_of(rows)
        got = self._acceptance.get(b)
        if got is None:
            if self.costs.speculation is None:
                raise CannotPriceSpeculation(NO_ACCEPTANCE)
            got = self._acceptance[b] = self.costs.speculation.at(b)
        return got

    def fed_token_ms(self, width: float) -> float:
        """One more fed token of a verifying step at window `width`: the verifying-step fit's (probed
        alone and scaled to the run, or fitted on a run that speculated), else the prefill fit's
        marginal token (speculation.py `fed_token_ms`)."""
        fit = self.costs.verify_ms
        ms = verify_token_ms(fit, width) if fit is not None else fed_token_ms(self.costs.prefill_ms, width)
        return ms

    def verify_extra_ms(self, rows: int, extra: int, width: float) -> float:
        """A verifying step's ms beyond the plain decode step of its `rows` rows, feeding `extra`
        proposed tokens at window `width` (with a verifying-step fit, its cost whatever is fed too)."""
        fit = self.costs.verify_ms
        fixed = verify_fixed_ms(fit, rows) if fit is not None else 0.0
        return fixed + extra * self.fed_token_ms(width)

    def verdict(self, rows: int, width: float, plain_ms: float) -> tuple[Verdict, BucketAcceptance]:
        """The policy's steady-state choice at `rows` rows (speculation.py `best_draft`), with the
        acceptance it was made on."""
        acc = self.acceptance(rows)
        token = self.fed_token_ms(width)
        fixed = self.verify_extra_ms(rows, 0, width)  # a direct fit's per-row cost of verifying
        draft = min(self.cfg.max_draft, len(acc.positions)) if acc.positions else self.cfg.max_draft
        return best_draft(rows, acc, plain_ms, token, max(draft, 1), fixed), acc

    # ------------------------------------------------------------------ generation side
    def capacity(self) -> int:
        """What the controller's gate would admit now (`StalenessGate.capacity`, by the same rule)."""
        cfg = self.cfg
        bound = staleness_rule.staleness_bound(cfg.max_staleness, self.version, cfg.batch_size)
        return staleness_rule.admissible(cfg.max_concurrent, self.running, self.accepted, bound)

    def try_submit(self) -> None:
        G = self.cfg.group_size
        while not self._done and self.step < self.cfg.steps and self.capacity() >= G:
            self.running += G
            prompt, lengths = self.costs.lengths.sample(self.rng, self.version, G, self.cfg.max_new_tokens or None)
            group = _Group(self.gid, self.version, prompt, lengths, left=G)
            self.gid += 1
            self.untrained.append(group)
            self.at(self.costs.dispatch_s, _call(self._dispatch, group))

    def _dispatch(self, group: _Group) -> None:
        for n in group.lengths:
            server = min(self.servers, key=lambda s: (s.outstanding, s.index))
            server.submit(_Request(group, group.prompt, max(int(n), 1)))

    def request_done(self, req: _Request) -> None:
        self.requests += 1
        group = req.group
        group.left -= 1
        if group.left:
            return
        if group.eval:
            self._eval_left -= 1
            if self._eval_left == 0 and self._eval_waiting is not None:
                fn, self._eval_waiting = self._eval_waiting, None
                self.at(self.costs.collect_s + sum(self.costs.generation_nodes_s.values()), fn)
            return
        latency = self.costs.collect_s + sum(self.costs.generation_nodes_s.values())
        self.reward_busy_s += self.clip_to_window(sum(self.costs.generation_nodes_s.values()))
        self.at(latency, lambda: self._accept(group))

    def _accept(self, group: _Group) -> None:
        G = self.cfg.group_size
        self.running -= G
        self.accepted += G
        group.accepted_at = self.now
        self.buffer.append(group)
        self.try_submit()
        if self._trainer_waiting is not None:
            fn, self._trainer_waiting = self._trainer_waiting, None
            fn()

    # ------------------------------------------------------------------ training side
    def _next_batch(self) -> list[_Group] | None:
        wanted = self.cfg.batch_size // self.cfg.group_size
        if self.cfg.batch_order == "completion":
            fresh = [g for g in self.buffer if self.version - g.version <= self.cfg.max_staleness]
            for g in [g for g in self.buffer if g not in fresh]:  # too stale: dropped, its slots back
                self.buffer.remove(g)
                self.untrained.remove(g)
                self.accepted -= self.cfg.group_size
            if len(fresh) < wanted:
                if len(self.buffer) != len(fresh):
                    self.try_submit()
                return None
            take = sorted(fresh, key=lambda g: g.accepted_at)[:wanted]
        else:
            due = staleness_rule.due_groups(self.untrained, wanted)  # the controller's choice
            if due is None or any(g.accepted_at == math.inf for g in due):
                return None
            take = due
        for g in take:
            self.buffer.remove(g)
            self.untrained.remove(g)
        return take

    def _train_loop(self) -> None:
        if self.step >= self.cfg.steps:
            self._done = True
            return
        if self.cfg.eval_every and self.step == 0 and not self.step_spans:
            self._evaluate(self._begin_step)
            return
        self._begin_step()

    def _begin_step(self) -> None:
        start = self.now
        self._buffered_at_start = sum(len(g.lengths) for g in self.buffer)
        if self.step == 0:
            self.window = (start, math.inf)
        waited = {"flag": False}

        def attempt() -> None:
            batch = self._next_batch()
            if batch is None:
                waited["flag"] = True
                self._trainer_waiting = attempt
                return
            self._train(batch, start, waited["flag"])

        attempt()

    def _train(self, batch: list[_Group], start: float, waited: bool) -> None:
        self._batch_at = self.now
        for g in batch:
            self.staleness.append(self.version - g.version)
        tokens = sum(g.prompt * len(g.lengths) + sum(g.lengths) for g in batch)
        seqs = sum(len(g.lengths) for g in batch)
        compute, wall = self._training_side(tokens, seqs)
        self.training_busy = True
        self.trainer_busy_s += self.clip_to_window(compute)

        def trained() -> None:
            self.training_busy = False
            self.at(self.costs.sync_s, lambda: self._sync(start, waited))

        self.at(wall, trained)

    def _training_side(self, tokens: int, seqs: int) -> tuple[float, float]:
        """(compute seconds on model workers, wall seconds) of the training-side nodes: model
        calls at their fitted cost times the slowdown, plus call overheads and controller nodes.
        Calls on one model worker take turns; the rest of the DAG is summed (a safe bound: the
        shipped workflows' training sides are chains)."""
        s = self.training_slowdown()
        compute = 0.0
        wall = 0.0
        for name, fit in self.costs.model_calls.items():
            microbatches = max(math.ceil(tokens / self.cfg.max_tokens_per_microbatch), 1)
            t = fit.predict(tokens_k=tokens / 1e3, seqs=seqs, microbatches=microbatches) * s
            compute += t
            wall += t + self.costs.call_overhead_s.get(name, 0.0)
        wall += sum(self.costs.controller_nodes_s.values())
        return compute, wall

    def _sync(self, start: float, waited: bool) -> None:
        left = {"n": len(self.servers)}
        version = self.version + 1

        def one_done() -> None:
            left["n"] -= 1
            if left["n"] == 0:
                self._stepped(start, waited, version)

        for server in self.servers:
            server.request_update(version, one_done)

    def _stepped(self, start: float, waited: bool, version: int) -> None:
        """The servers have the new weights: the version moves on (the gate opens B more slots),
        the step span ends after the controller's own overhead, the next starts after the gap
        between steps (metrics, logging) or an evaluation."""
        self.version = version
        self.step += 1
        end = self.now + self.costs.step_overhead_s
        self.step_spans.append((start, end, "generation" if waited else "training"))
        if self.autopilot is not None:
            limit = self.autopilot.observe(
                self.step, self._batch_at - start, end - self._batch_at, self.cfg.batch_size, self._buffered_at_start
            )
            if limit is not None:
                self.cfg = dataclasses.replace(self.cfg, max_concurrent=limit)
                self.notes.append(f"autopilot at step {self.step}: max concurrent rollouts {limit}")
        self.try_submit()
        if self.step >= self.cfg.steps:
            self.window = (self.window[0], end)
            self._done = True
            return
        gap = self.costs.step_overhead_s + self.costs.step_gap_s
        if self.cfg.eval_every and self.step % self.cfg.eval_every == 0:
            self.at(gap, lambda: self._evaluate(self._train_loop))
        else:
            self.at(gap, self._train_loop)

    def _evaluate(self, then: Callable[[], None]) -> None:
        """Greedy answers to eval_size prompts on the servers (training lengths stand in)."""
        n = self.cfg.eval_size
        if n <= 0:
            then()
            return
        self._eval_left = n
        self._eval_waiting = then
        for i in range(n):
            prompt, lengths = self.costs.lengths.sample(self.rng, self.version, 1, self.cfg.max_new_tokens or None)
            group = _Group(-1 - i, self.version, prompt, lengths, left=1, eval=True)
            self.at(self.costs.dispatch_s, _call(self._dispatch, group))

    # ------------------------------------------------------------------ the run
    def run(self, max_events: int = 20_000_000) -> SimResult:
        self.try_submit()
        self._train_loop()
        n = 0
        while self._events and not self._done:
            t, _, fn = heapq.heappop(self._events)
            self.now = t
            fn()
            n += 1
            if n > max_events:
                raise RuntimeError(f"the simulation did not finish within {max_events} events")
        if not self._done:
            raise RuntimeError(
                f"the simulation stalled at step {self.step} of {self.cfg.steps} (no event left): "
                "the settings can never fill a batch"
            )
        return self._result()

    def _result(self) -> SimResult:
        lo, hi = self.window
        span = max(hi - lo, 1e-9)
        durs = [b - a for a, b, _ in self.step_spans]
        busy = {f"inference-{s.index}": min(s.busy_s / span, 1.0) for s in self.servers}
        busy["trainer"] = min(self.trainer_busy_s / span, 1.0)
        busy["reward"] = min(self.reward_busy_s / span, 1.0)
        bound = {
            "generation": sum(1 for *_, w in self.step_spans if w == "generation"),
            "training": sum(1 for *_, w in self.step_spans if w == "training"),
        }
        return SimResult(
            span,
            float(np.median(durs)) if durs else 0.0,
            float(np.mean(self.staleness)) if self.staleness else 0.0,
            max(self.staleness, default=0),
            busy,
            bound,
            self.tokens / span,
            self.requests,
            self.reprefill_tokens,
            list(self.notes),
            [b - lo for _, b, _ in self.step_spans],
            self._speculation_result(),
        )

    def _speculation_result(self) -> dict[str, float]:
        if not self.cfg.speculative:
            return {}
        c = self.spec_counts
        steps = c["verifying_steps"] + c["plain_steps"]
        return {
            "verifying_steps": float(c["verifying_steps"]),
            "plain_steps": float(c["plain_steps"]),
            "verifying_share": c["verifying_steps"] / steps if steps else 0.0,
            "tokens_per_row_forward": c["verified_tokens"] / c["verified_rows"] if c["verified_rows"] else 0.0,
            "fed_extra": float(c["fed_extra"]),
        }


def _call(fn: Callable[[_Group], None], group: _Group) -> Callable[[], None]:
    """`fn(group)` later (a closure per group: a lambda in a loop would bind the last one)."""
    return lambda: fn(group)


def _cores(side: SidePlacement) -> frozenset[int] | None:
    return frozenset(side.cores) if side.cores else None


def _demand(side: SidePlacement) -> Demand:
    return Demand(side.threads, _cores(side))


def simulate(cfg: SimConfig, costs: CostModel, passes: int = 2) -> SimResult:
    """Simulate `cfg`; background CPU (controller, rollout, reward) scales with the simulated
    request rate, found by running it `passes` times (the first at the calibration's rate)."""
    scale = 1.0
    result: SimResult | None = None
    calibrated_rate = float(costs.measured.get("requests_per_s") or 0.0)
    for _ in range(max(passes, 1)):
        result = Simulation(cfg, costs, background_scale=scale).run()
        if calibrated_rate <= 0:
            break
        scale = (result.requests / result.steps_window_s) / calibrated_rate
    assert result is not None
    result.notes.extend(extrapolation_notes(cfg, costs))
    return result


def extrapolation_notes(cfg: SimConfig, costs: CostModel) -> list[str]:
    """Where `cfg` leaves what the cost model was fitted on (the prediction extrapolates)."""
    cal = costs.calibrated
    notes = []
    if costs.lengths.extrapolates(cfg.steps + cfg.max_staleness):
        lo, hi = costs.lengths.versions()
        notes.append(
            f"output lengths were measured for policy versions {lo}-{hi}; later versions reuse the last "
            "ones (the length drift after that is not known)"
        )
    out = costs.decode_ms.outside(rows=min(cfg.max_running, cfg.max_concurrent))
    if out:
        notes.append("decode steps of up to " + ", ".join(out) + " rows: the step-time fit extrapolates")
    budget = cal.get("max_tokens_per_microbatch")
    if budget and cfg.max_tokens_per_microbatch != budget:
        notes.append(
            f"max_tokens_per_microbatch {cfg.max_tokens_per_microbatch} (calibrated at {budget}): a step's "
            "training time follows the fitted cost per micro-batch; memory is not modelled"
        )
    if cfg.group_size != cal.get("group_size"):
        notes.append(
            f"group size {cfg.group_size} (calibrated at {cal.get('group_size')}): answers are drawn "
            "one by one, so how alike a group's answers are is not kept"
        )
    if cfg.inference.threads != costs.inference.threads or cfg.training.threads != costs.training.threads:
        notes.append(
            f"threads {cfg.inference.threads} (inference) and {cfg.training.threads} (training), calibrated "
            f"at {costs.inference.threads} and {costs.training.threads}: compute times are taken as they "
            "were (the model does not know how they scale with threads)"
        )
    spec = costs.speculation
    if cfg.speculative and spec is not None and cfg.max_draft > spec.max_draft:
        notes.append(
            f"max_draft {cfg.max_draft}: acceptance was counted for proposals of up to {spec.max_draft} tokens; "
            "later positions are priced as never accepted"
        )
    if cal.get("max_new_tokens") and cfg.max_new_tokens and cfg.max_new_tokens > cal["max_new_tokens"]:
        notes.append(
            f"max_new_tokens {cfg.max_new_tokens} is above the calibration's {cal['max_new_tokens']}: "
            "answers cut there are not known to be longer"
        )
    return notes
