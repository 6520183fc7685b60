"""The embedded generation engine: continuous batching and interruptible generation in torch.

It lets the whole RL system run on a laptop or CI with a tiny HF CausalLM. One background
scheduler thread owns the model and the batched KV cache; at every step it
1. admits queued requests (up to `max_running`) and prefills them in left-padded chunks of
   at most `prefill_token_budget` tokens, which yields each one's first token and its KV
   rows, written into free rows of the running cache (see `kv_cache.py`);
2. decodes every running request by one token in a single forward over the batched cache;
3. retires finished requests at once (their futures resolve, their cache rows are freed).
Requests waiting for prefill whose tokens are identical (the G answers of one RL prompt)
are prefilled once and share copies of the KV rows and last logits (`prefix_sharing`); each
then samples on its own. The forwards run through `model_runner.py`: a lean Qwen2/Qwen3/
Llama forward (`lean_forward.py`) when the model allows it, HF's forward otherwise.
Sampling is vectorised (`sampling.py`): each request pre-draws its uniforms from its own
seeded generator, so its tokens never depend on the batch it shares.
A pause, abort or weight swap waits for the current step only; a step that is prefilling
stops between chunks for it, so even a re-prefill of every request costs it one chunk.

Interruptible generation (AReaL): `update_weights_*` swaps the weights at a step boundary,
bumps the policy version and drops the whole KV cache; the next step re-prefills every
in-flight request from prompt + tokens so far with the new weights, so tokens after the
swap carry the new version and nothing is lost or repeated. Each token's log-prob is taken
under the weights that produced it (see `sampling.py` for which distribution).

Locking: `_step_lock` guards the model, the running set and the cache (held for a whole
step); `_cv` guards the queue and flags. Order is always `_step_lock` then `_cv`.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import contextlib
import logging
import random
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from areal_graph.engines.inference.constrained import ConstraintCompiler, ConstraintError
from areal_graph.engines.inference.engine_errors import InvalidRequestError, QueueFullError
from areal_graph.engines.inference.engine_spans import (
    STEP_DECODE,
    STEP_PREFILL,
    STEP_VERIFY,
    BusyIntervals,
    EngineSpans,
    StepLog,
    StepRow,
)
from areal_graph.engines.inference.kv_cache import BatchedKVCache
from areal_graph.engines.inference.model_io import eos_ids, load_state_dict_checked, read_checkpoint, try_load_tokenizer
from areal_graph.engines.inference.model_runner import ModelRunner
from areal_graph.engines.inference.requests import Request as _Request
from areal_graph.engines.inference.requests import validate_request
from areal_graph.engines.inference.sampling import GenerationResult, SamplingParams, generator_seed
from areal_graph.engines.inference.speculation.shadow import ShadowSpeculation
from areal_graph.engines.inference.speculation.speculator import SpeculativeSettings, Speculator
from areal_graph.engines.inference.token_intake import take_tokens, take_verified
from areal_graph.engines.lora_weights import apply_adapter, is_adapter
from areal_graph.engines.weights_digest import Samples, digest, sample_tensors

log = logging.getLogger(__name__)

__all__ = [
    "EmbeddedEngine",
    "GenerationResult",
    "InvalidRequestError",
    "QueueFullError",
    "SamplingParams",
]


class EmbeddedEngine:
    """Continuous-batching, interruptible generation over a HF CausalLM (see module docstring)."""

    def __init__(
        self,
        model_path: str | Path | None = None,
        *,
        model: Any = None,
        tokenizer: Any = None,
        device: str | torch.device = "cpu",
        dtype: torch.dtype = torch.float32,
        max_running: int = 64,
        max_queue: int = 1024,
        max_context: int | None = None,
        version: int = 0,
        seed: int | None = None,
        prefill_token_budget: int = 2048,
        lean_forward: bool = True,
        prefix_sharing: bool = True,
        admit_wait_s: float = 0.002,
        cuda_graphs: bool = True,
        kv_on_update: str = "recompute",
        speculative: SpeculativeSettings | None = None,
    ) -> None:
        """Load or take the model; nothing runs until `start()`.

        lean_forward: use the lean Qwen2/Qwen3/Llama forward when the model allows it
        (`lean_forward.py`; other models always use the HF forward). prefix_sharing:
        requests waiting for prefill with identical tokens (the G answers of one prompt)
        are prefilled once. admit_wait_s: when idle, how long the scheduler lets a burst of
        submissions finish arriving before its first prefill (so the burst shares one).
        cuda_graphs: on a GPU, replay the lean forward's decode steps from CUDA graphs
        (`cuda_graphs.py`: there a step's kernel launches cost more than its kernels).
        kv_on_update: "recompute" (a weight update sends every request in flight back to be
        prefilled from its tokens so far with the new weights: AReaL's interruptible generation)
        "keep" (the cache built by the old weights stays and decoding goes on with the new
        ones: no re-prefill, as PipelineRL's in-flight updates; each token's log-prob is still
        the one it was sampled with, and its version the weights that sampled it), or "wait"
        (the update admits nothing new and waits until the requests in flight finish on the old
        weights: generation without interruption, the AReaL paper's ablation baseline).
        speculative: speculative decoding without a draft model (`speculation/`): each running
        request proposes tokens found after a match of its context's suffix in its prompt, its
        own answer, the other answers to its prompt and earlier ones, and one forward verifies
        them; the tokens, their log-probs and versions are exactly those of plain decoding.
        Only the lean forward verifies: with the HF forward the engine decodes plainly. While it
        does not speculate, it counts what speculation would have accepted for the answers to one
        prompt in `speculative.shadow_every` (`speculation/shadow.py`; None: the default settings,
        0: not at all).
        """
        if model is None and model_path is None:
            raise ValueError("EmbeddedEngine needs model_path or model=")
        if max_running < 1 or max_queue < 0:
            raise ValueError(f"max_running must be >= 1 and max_queue >= 0, got {max_running}, {max_queue}")
        if kv_on_update not in ("recompute", "keep", "wait"):
            raise ValueError(f"kv_on_update must be 'recompute', 'keep' or 'wait', got {kv_on_update!r}")
        self.kv_on_update = kv_on_update
        self.device = torch.device(device)
        self.dtype = dtype
        if model is None:
            assert model_path is not None  # checked above
            from transformers import AutoModelForCausalLM

            model = AutoModelForCausalLM.from_pretrained(str(model_path), dtype=dtype)
            if tokenizer is None:
                tokenizer = try_load_tokenizer(model_path)
        self.model = model.to(device=self.device, dtype=dtype).eval()
        self.tokenizer = tokenizer
        self.model_path = str(model_path) if model_path is not None else None
        cfg = self.model.config
        self.vocab_size = int(self.model.get_input_embeddings().num_embeddings)
        model_ctx = getattr(cfg, "max_position_embeddings", None)
        self.max_context = int(max_context if max_context is not None else (model_ctx or 2048))
        self.eos_token_ids = eos_ids(self.model, tokenizer)
        self.pad_token_id = int(getattr(cfg, "pad_token_id", None) or 0)
        self.max_running = max_running
        self.max_queue = max_queue
        self.prefill_token_budget = prefill_token_budget
        self._version = int(version)
        self.prefix_sharing = prefix_sharing
        self.admit_wait_s = admit_wait_s
        self._runner = ModelRunner(
            self.model,
            self.device,
            lean=lean_forward,
            cuda_graphs=cuda_graphs,
            max_rows=max_running,
            max_positions=self.max_context + 1,
        )
        self._spec: Speculator | None = None
        # why speculative decoding was asked for and does not run (eval and the log say so); None otherwise
        self.speculation_unavailable: str | None = None
        if speculative is not None and speculative.enabled:
            if self._runner.can_verify:
                self._spec = Speculator(speculative)
            else:
                self.speculation_unavailable = f"it needs the lean forward, and {self._runner.hf_reason}"
                log.warning("speculative decoding is off for this model: %s", self.speculation_unavailable)
        shadow = speculative if speculative is not None else SpeculativeSettings()
        # speculation off: what it would have accepted, for pricing it (perfmodel/); never on the output's path
        self._shadow: ShadowSpeculation | None = (
            ShadowSpeculation(shadow) if self._spec is None and shadow.shadow_every > 0 else None
        )
        self._rng = random.Random(seed)
        # a tokenizer may know more ids than the embedding has rows (never produced; masks are cut to the logits)
        try:
            tokenizer_ids = len(tokenizer) if tokenizer is not None else 0
        except TypeError:  # a minimal tokenizer object (tests) that cannot say its size
            tokenizer_ids = 0
        self._constraints = ConstraintCompiler(tokenizer, max(self.vocab_size, tokenizer_ids), self.eos_token_ids)

        self._cv = threading.Condition()
        self._step_lock = threading.Lock()
        self._queue: collections.deque[_Request] = collections.deque()
        self._active: dict[str, _Request] = {}  # every queued or running request
        self._running: list[_Request] = []  # rows of self._cache, in order
        self._pending: list[_Request] = []  # admitted, need a (re-)prefill before decoding
        self._cache = BatchedKVCache(row_capacity=max_running)
        self._lora_base: dict[str, torch.Tensor] = {}  # LoRA: the base weights adapters apply to
        # what `weights_digest` hashes: the parameters the last load named (None: all of them),
        # or the sampled values of the last LoRA adapter loaded (merged, it is not a parameter)
        self._loaded_names: list[str] | None = None
        self._adapter_samples: Samples | None = None
        self._paused = False
        self._draining = False  # kv_on_update="wait": an update waits for the requests in flight; admit none
        self._waiters = 0  # threads waiting for a step boundary (abort, weight swap): the scheduler yields
        self._stopping = False
        self._thread: threading.Thread | None = None
        self._tokens_total = 0
        self._finished_total = 0
        self._steps = 0
        self._rate_window: collections.deque[tuple[float, int]] = collections.deque()
        self._busy = BusyIntervals()  # when the engine computed (the trace's compute spans)
        self._steps_log = StepLog()  # every forward's size and time (the cost model's material)
        self._trace: EngineSpans | None = None  # per-request spans, once `trace_into` gave a recorder

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> None:
        """Start the background scheduler thread (idempotent)."""
        if self._thread is not None and self._thread.is_alive():
            return
        self._stopping = False
        self._thread = threading.Thread(target=self._loop, name="embedded-engine", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop the scheduler; every unfinished request resolves with finish_reason "abort"."""
        with self._cv:
            self._stopping = True
            self._cv.notify_all()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        self.abort_all()

    def __enter__(self) -> EmbeddedEngine:
        self.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def trace_into(self, recorder: Any) -> None:
        """Record per-request and weight-swap spans into `recorder` (an api.spans.SpanRecorder);
        a disabled recorder turns all the engine's recording off, busy intervals included."""
        enabled = bool(getattr(recorder, "enabled", True))
        self._trace = EngineSpans(recorder) if enabled else None
        self._busy.enabled = enabled
        self._steps_log.enabled = enabled

    def tag_request(self, rid: str, tags: dict[str, int]) -> None:
        """Labels for the spans of request `rid`, submitted next (its group, episode and turn:
        request_tags.py); nothing when the engine is not traced."""
        if self._trace is not None:
            self._trace.tag(rid, tags)

    # ------------------------------------------------------------------ requests
    def submit(
        self, input_ids: Sequence[int], params: SamplingParams, rid: str | None = None, top_logprobs: int = 0
    ) -> concurrent.futures.Future:
        """Queue a request; the future resolves to a GenerationResult.

        `top_logprobs` > 0 also reports that many most likely tokens per step (OpenAI's
        `top_logprobs`), under the distribution the behaviour log-prob is taken from.

        Raises InvalidRequestError for a request that can never be served and
        QueueFullError when `max_queue` requests already wait.
        """
        return self._submit(input_ids, params, rid, top_logprobs)[1]

    async def stream(
        self, input_ids: Sequence[int], params: SamplingParams, rid: str | None = None, top_logprobs: int = 0
    ) -> AsyncIterator[GenerationResult]:
        """`generate`, token by token: yields the tokens decoded since the last yield (as a
        GenerationResult of those tokens, finish_reason "" until the last one, which carries the
        request's). Cancelling the iteration (a client that went away) aborts the request."""
        loop = asyncio.get_running_loop()
        wake = asyncio.Event()

        def notify() -> None:  # in the scheduler's thread: it must never raise there
            with contextlib.suppress(RuntimeError):  # the loop closed (the server is shutting down)
                loop.call_soon_threadsafe(wake.set)

        req, fut = self._submit(input_ids, params, rid, top_logprobs, on_token=notify)
        sent = 0
        try:
            while True:
                done = fut.done()
                if done and fut.exception() is not None:
                    raise fut.exception()  # type: ignore[misc]
                # the scheduler appends ids, log-probs, versions (and alternatives) in that order
                n = min(
                    len(req.output_ids),
                    len(req.logprobs),
                    len(req.versions),
                    len(req.top) if req.top_logprobs else len(req.versions),
                )
                if n > sent or done:
                    yield GenerationResult(
                        rid=req.rid,
                        output_ids=req.output_ids[sent:n],
                        output_logprobs=req.logprobs[sent:n],
                        output_versions=req.versions[sent:n],
                        finish_reason=(req.finish_reason or "abort") if done else "",
                        prompt_len=len(req.prompt),
                        output_top_logprobs=req.top[sent:n] if req.top_logprobs else None,
                    )
                    sent = n
                if done:
                    return
                await wake.wait()
                wake.clear()
        finally:
            if not fut.done():
                self.abort(req.rid)

    def _submit(
        self,
        input_ids: Sequence[int],
        params: SamplingParams,
        rid: str | None,
        top_logprobs: int,
        on_token: Callable[[], None] | None = None,
    ) -> tuple[_Request, concurrent.futures.Future]:
        ids = self._validate(input_ids, params)
        rid = rid if rid is not None else uuid.uuid4().hex
        seed = params.seed if params.seed is not None else self._rng.getrandbits(63)
        gen = torch.Generator(device="cpu")
        gen.manual_seed(generator_seed(seed))
        stop_ids = set(params.stop_token_ids)
        if not params.ignore_eos:
            stop_ids |= set(self.eos_token_ids)
        fut: concurrent.futures.Future = concurrent.futures.Future()
        req = _Request(
            rid, ids, params, fut, gen, frozenset(stop_ids), top_logprobs=max(0, int(top_logprobs)), on_token=on_token
        )
        if params.is_constrained:
            try:  # compiled in the caller's thread: a big schema never holds up the scheduler's steps
                req.constraint = self._constraints.compile(params.json_schema, params.grammar)
            except ConstraintError as err:
                raise InvalidRequestError(str(err)) from None
        with self._cv:
            if self._stopping:
                raise RuntimeError("engine is stopped; start() it again before submitting")
            if rid in self._active:
                raise InvalidRequestError(f"request id {rid!r} is already in flight")
            if params.max_new_tokens == 0:
                req.finish_reason = "length"
                fut.set_result(req.result())
                return req, fut
            if len(self._queue) >= self.max_queue:
                raise QueueFullError(
                    f"engine queue is full ({len(self._queue)} waiting, max_queue={self.max_queue}); retry later"
                )
            if self._trace is not None:
                self._trace.submitted(req)
            self._queue.append(req)
            self._active[rid] = req
            self._cv.notify_all()
        return req, fut

    async def generate(
        self, input_ids: Sequence[int], params: SamplingParams, rid: str | None = None, top_logprobs: int = 0
    ) -> GenerationResult:
        """`submit` for asyncio callers."""
        return await asyncio.wrap_future(self.submit(input_ids, params, rid, top_logprobs))

    @torch.inference_mode()  # removing running rows moves KV rows in place: inference tensors
    def abort(self, rid: str) -> bool:
        """Finish request `rid` now with "abort" and the tokens so far. False if it is unknown or done."""
        with self._at_step_boundary():
            with self._cv:
                req = self._active.get(rid)
                if req is None:
                    return False
                self._abort_locked([req])
            return True

    @torch.inference_mode()
    def abort_all(self) -> int:
        """Abort every queued and running request; return how many."""
        with self._at_step_boundary():
            with self._cv:
                reqs = list(self._active.values())
                self._abort_locked(reqs)
        return len(reqs)

    def _abort_locked(self, reqs: list[_Request]) -> None:
        """Holding both locks: drop `reqs` from queue, pending and the cache, and resolve them."""
        if not reqs:
            return
        gone = {id(r) for r in reqs}
        self._queue = collections.deque(r for r in self._queue if id(r) not in gone)
        self._pending = [r for r in self._pending if id(r) not in gone]
        dead = [i for i, r in enumerate(self._running) if id(r) in gone]
        if dead:
            order = self._cache.remove(dead)
            self._running = [self._running[i] for i in order]
        for r in reqs:
            r.finish_reason = "abort"
            self._resolve(r)

    # ------------------------------------------------------------------ interruption
    def pause(self) -> None:
        """Stop at the next step boundary; returns once no step is running. Requests keep their tokens."""
        with self._cv:
            self._paused = True
        with self._at_step_boundary():  # waits for a step in progress
            if self._trace is not None:
                self._trace.paused(time.perf_counter())

    def resume(self) -> None:
        with self._cv:
            self._paused = False
            if self._trace is not None:
                self._trace.resumed(time.perf_counter())
            self._cv.notify_all()

    @contextlib.contextmanager
    def _at_step_boundary(self):
        """Hold the step lock between two steps.

        CPython locks are not fair: the scheduler, re-taking `_step_lock` in a tight loop,
        could starve a thread blocked on it until every request is done. Registering as a
        waiter first makes the scheduler stand aside at the next boundary.
        """
        with self._cv:
            self._waiters += 1
        try:
            with self._step_lock:
                yield
        finally:
            with self._cv:
                self._waiters -= 1
                self._cv.notify_all()

    @property
    def paused(self) -> bool:
        return self._paused

    @property
    def version(self) -> int:
        return self._version

    def score_prompt(
        self, input_ids: Sequence[int], top_n: int = 0
    ) -> tuple[list[float | None], list[list[tuple[int, float]]] | None]:
        """Each prompt token's log-prob given the tokens before it (None for the first: nothing
        predicts it) and, with `top_n`, the most likely tokens at each position (None first).

        What `echo` + `logprobs` on /v1/completions returns (log-likelihood and multiple-choice
        evaluations). One forward of the prompt, run between two scheduler steps with the
        weights generation uses (ModelRunner.prompt_logprobs)."""
        ids = self._validate(input_ids, SamplingParams(max_new_tokens=0))
        with self._at_step_boundary():
            lps, top_ids, top_lps = self._runner.prompt_logprobs(ids, top_n)
        logprobs: list[float | None] = [None, *lps.tolist()]
        if top_ids is None or top_lps is None:
            return logprobs, None
        tops = [list(zip(i, v)) for i, v in zip(top_ids.tolist(), top_lps.tolist())]
        return logprobs, [[], *tops]

    def update_weights_from_state_dict(self, state_dict: Mapping[str, torch.Tensor], version: int) -> None:
        """Swap weights at a step boundary and invalidate every KV cache built with the old ones.

        A LoRA adapter (engines/lora_weights.py: `lora.scaling` among the keys) is merged into
        the base weights this engine had before its first adapter: W0 + scaling * (B @ A)."""
        requested = time.perf_counter()
        if self.kv_on_update == "wait":
            self._drain()
        try:
            self._swap_weights(state_dict, version, requested)
        finally:
            if self._draining:
                with self._cv:
                    self._draining = False
                    self._cv.notify_all()

    def _drain(self) -> None:
        """kv_on_update="wait": stop admitting and block until no request is running or pending."""
        with self._cv:
            self._draining = True
            self._cv.notify_all()
            while (self._running or self._pending) and not self._stopping and not self._paused:
                self._cv.wait(0.005)

    def _swap_weights(self, state_dict: Mapping[str, torch.Tensor], version: int, requested: float) -> None:
        with self._at_step_boundary():
            start, before = time.perf_counter(), self._version
            if is_adapter(state_dict):
                apply_adapter(self.model, self._lora_base, state_dict)
                self._adapter_samples = sample_tensors(state_dict)
            else:
                load_state_dict_checked(self.model, state_dict)
                self._lora_base.clear()  # full weights: a later adapter applies to these
                self._loaded_names, self._adapter_samples = list(state_dict), None
            self._runner.rebind()
            self._version = int(version)
            self._shadow_call(lambda s: s.interrupt())
            in_flight = sum(1 for r in self._running + self._pending if r.output_ids)
            if self.kv_on_update == "recompute":
                # Cached keys/values came from the old weights: drop them, re-prefill prompt + tokens so far.
                self._pending = self._running + self._pending
                self._running = []
                self._cache.clear()
            if self._trace is not None:
                end = time.perf_counter()
                if self.kv_on_update == "recompute":
                    self._trace.interrupted(self._pending, start, before, self._version)
                self._trace.weight_swap(requested, start, end, before, self._version, in_flight)
        log.info(
            "weights updated to version %d (%d requests in flight, KV cache %s)",
            version,
            in_flight,
            {"recompute": "recomputed", "keep": "kept", "wait": "drained first"}[self.kv_on_update],
        )

    def update_weights_from_disk(self, path: str | Path, version: int | None = None) -> None:
        """Load a `save_pretrained` checkpoint (safetensors) and swap it in; version defaults to current + 1.

        Reading the files happens while generation continues; only the copy into the model
        holds the scheduler at a step boundary.
        """
        state_dict = read_checkpoint(Path(path), self.dtype)
        self.update_weights_from_state_dict(state_dict, self._version + 1 if version is None else version)

    def weights_digest(self) -> str:
        """A digest of the weights this engine serves (engines/weights_digest.py), to be compared
        with what was published for its version: its parameters under the names its last load
        gave (all of them before the first load), or the last LoRA adapter as it was loaded.
        Call it between loads (the HTTP server holds its update lock): it reads the parameters
        while generation goes on, which only reads them too."""
        if self._adapter_samples is not None:
            return digest(self._adapter_samples, self.dtype)
        state = self.model.state_dict()
        names = self._loaded_names if self._loaded_names is not None else list(state)
        return digest(sample_tensors({n: state[n] for n in names}), self.dtype)

    # ------------------------------------------------------------------ introspection
    def stats(self) -> dict:
        now = time.monotonic()
        shadow = self._shadow  # the scheduler may turn it off meanwhile (_shadow_call)
        with self._cv:
            while self._rate_window and now - self._rate_window[0][0] > 10.0:
                self._rate_window.popleft()
            window = list(self._rate_window)
            return {
                "running": len(self._active) - len(self._queue),
                "queued": len(self._queue),
                "paused": self._paused,
                "version": self._version,
                "tokens_generated": self._tokens_total,
                "requests_finished": self._finished_total,
                "steps": self._steps,
                "tokens_per_s": (sum(n for _, n in window) / max(now - window[0][0], 1e-3)) if window else 0.0,
                "kv_width": self._cache.width,
                "max_running": self.max_running,
                "max_queue": self.max_queue,
                **({"speculative": self._spec.stats()} if self._spec is not None else {}),
                **({"speculative_shadow": shadow.stats()} if shadow is not None else {}),
            }

    # ------------------------------------------------------------------ validation
    def check_constraint(self, params: SamplingParams) -> str | None:
        """Why `params`' json_schema or grammar cannot be served, or None (compiles it once)."""
        if not params.is_constrained:
            return None
        try:
            self._constraints.compile(params.json_schema, params.grammar)
        except ConstraintError as err:
            return str(err)
        return None

    def _validate(self, input_ids: Sequence[int], params: SamplingParams) -> list[int]:
        return validate_request(input_ids, params, self.vocab_size, self.max_context, self.tokenizer is not None)

    # ------------------------------------------------------------------ the scheduler
    def _loop(self) -> None:
        while True:
            with self._cv:
                while not self._stopping and (
                    self._paused
                    or self._waiters
                    or not ((self._queue and not self._draining) or self._running or self._pending)
                ):
                    self._cv.wait()
                if self._stopping:
                    return
                if not (self._running or self._pending):
                    self._await_burst()
                    if self._stopping:
                        return
            with self._step_lock:
                if self._paused or self._waiters:
                    continue
                t0 = time.perf_counter()
                try:
                    self._step()
                except Exception as err:  # noqa: BLE001 - a bad step must fail its requests, not hang them
                    log.exception("engine step failed; failing the running requests")
                    self._fail_running(err)
                self._busy.note(t0, time.perf_counter())

    def take_busy_spans(self) -> list[tuple[float, float]]:
        """The (start, end) `time.perf_counter()` intervals in which the engine computed, since the
        last call: what the trace counts as the inference side's model compute."""
        return self._busy.take()

    def take_step_log(self) -> list[StepRow]:
        """Every forward since the last call (engine_spans.StepLog), perf_counter times."""
        return self._steps_log.take()

    def _await_burst(self) -> None:
        """Holding `_cv`, idle, with requests queued: wait until submissions pause (at most `admit_wait_s`).

        Why: a caller submits a whole RL step (e.g. 4 prompts x 8 answers) in a loop, and
        each `submit` wakes this thread; starting at once would prefill the first few
        requests alone and the rest a step later, twice the prefill overhead and no prefix
        sharing between the halves. A quarter of `admit_wait_s` without a new arrival ends
        the wait early, so a lone request waits ~0.5 ms.
        """
        if self.admit_wait_s <= 0:
            return
        deadline = time.monotonic() + self.admit_wait_s
        seen = -1
        while len(self._queue) != seen and len(self._queue) < self.max_running:
            seen = len(self._queue)
            left = deadline - time.monotonic()
            if left <= 0 or self._stopping or self._paused or self._waiters:
                return
            self._cv.wait(min(left, self.admit_wait_s / 4))

    def _fail_running(self, err: Exception) -> None:
        with self._cv:
            reqs = self._running + self._pending
            self._running, self._pending = [], []
            self._cache.clear()

            def drop(shadow: ShadowSpeculation) -> None:
                for r in reqs:
                    shadow.finish(r, keep=False)

            self._shadow_call(drop)
            for r in reqs:
                self._active.pop(r.rid, None)
                if self._spec is not None:
                    self._spec.finish(r, keep=False)
                if self._trace is not None:
                    self._trace.finished(r, reason="error")
                if not r.future.done():
                    r.future.set_exception(err)
                if r.on_token is not None:
                    r.on_token()

    @torch.inference_mode()
    def _step(self) -> None:
        with self._cv:
            # a caller that cancelled its future (e.g. an asyncio task) no longer wants the tokens
            gone = [r for r in (*self._running, *self._pending, *self._queue) if r.future.cancelled()]
            if gone:
                self._abort_locked(gone)
            room = self.max_running - len(self._running) - len(self._pending)
            while room > 0 and self._queue and not self._draining:
                self._pending.append(self._queue.popleft())
                room -= 1
        if self._pending:
            self._pending = self._prefill(self._pending)
        # pending left after a prefill: a pause or a weight swap is waiting, so end the step now
        if self._running and not self._pending:
            self._decode()
        self._steps += 1

    def _prefill(self, reqs: list[_Request]) -> list[_Request]:
        """Prefill `reqs` (prompt + tokens so far) in left-padded chunks; sample one token each; join the cache.

        Requests with identical tokens (the G answers of one prompt) form one group that is
        prefilled once (`prefix_sharing`); every member gets a copy of its KV rows and
        last-position logits, and samples its own first token. Chunks hold at most
        `prefill_token_budget` padded tokens of distinct sequences. Between chunks a
        waiting pause, abort or weight swap takes precedence, so its latency is one chunk,
        not a whole re-prefill of every request in flight; the requests not yet prefilled
        are returned and stay pending.
        """
        groups: dict[Any, list[_Request]] = {}
        for r in reqs:
            key = tuple(r.all_tokens()) if self.prefix_sharing else id(r)
            groups.setdefault(key, []).append(r)
        order = sorted(groups.values(), key=lambda g: len(g[0].prompt) + len(g[0].output_ids))
        chunks: list[list[list[_Request]]] = [[]]
        for g in order:
            n = len(g[0].prompt) + len(g[0].output_ids)
            if chunks[-1] and n * (len(chunks[-1]) + 1) > self.prefill_token_budget:
                chunks.append([])
            chunks[-1].append(g)
        for i, chunk in enumerate(chunks):
            if i and (self._paused or self._waiters):
                return [r for c in chunks[i:] for g in c for r in g]
            self._prefill_chunk(chunk)
        return []

    def _prefill_chunk(self, groups: list[list[_Request]]) -> None:
        """One prefill forward over the distinct sequences of `groups`; fan results out to every member."""
        reqs = [r for g in groups for r in g]
        t0 = time.perf_counter()
        if self._trace is not None:
            self._trace.prefill_started(reqs, t0)
        logits, keys, values, lens = self._runner.prefill([g[0].all_tokens() for g in groups], self.pad_token_id)
        self._steps_log.note(
            t0, time.perf_counter(), STEP_PREFILL, len(groups), sum(lens), len(lens) * max(lens), max(lens), len(reqs)
        )
        src = [j for j, g in enumerate(groups) for _ in g]  # request -> its row in the prefill batch
        if len(reqs) > len(groups):
            logits = logits.index_select(0, torch.tensor(src, dtype=torch.long, device=logits.device))
        done, finished = take_tokens(reqs, logits, self._version, self.tokenizer)
        self._count_tokens(len(reqs), finished)
        if self._trace is not None:
            self._trace.prefill_done(reqs, time.perf_counter())
        keep = [j for j in range(len(reqs)) if j not in done]
        if not keep:
            return
        rows = [src[j] for j in keep]
        if rows != list(range(len(groups))):
            idx = torch.tensor(rows, dtype=torch.long, device=keys[0].device)
            keys = [k.index_select(0, idx) for k in keys]
            values = [v.index_select(0, idx) for v in values]
        self._cache.append(keys, values, [lens[j] for j in rows])
        self._running.extend(reqs[j] for j in keep)

    def _decode(self) -> int:
        """One token for every running request in one forward over the batched cache, or, when
        the speculator has proposals, a verifying step that may emit several per request."""
        rows = self._running
        t0 = time.perf_counter()  # a verifying step's time includes finding its proposals
        drafts = self._spec.proposals(rows) if self._spec is not None else None
        if drafts is not None:
            return self._verify(rows, drafts, t0)
        self._shadow_call(lambda s: s.before_step(rows))  # outside the step's time: the cost model fits plain steps
        t0, width = time.perf_counter(), self._cache.width
        logits = self._runner.decode([r.output_ids[-1] for r in rows], self._cache)
        done, finished = take_tokens(rows, logits, self._version, self.tokenizer)
        self._count_tokens(len(rows), finished)  # resolving a finished request compares its last token (finish)
        t1 = time.perf_counter()
        self._shadow_call(lambda s: s.after_step())
        if self._spec is not None:
            self._spec.measured(len(rows), False, t1 - t0, len(rows))
        if self._steps_log.enabled:
            ctx = sum(len(r.prompt) + len(r.output_ids) for r in rows)
            self._steps_log.note(t0, t1, STEP_DECODE, len(rows), len(rows), ctx, width, len(rows))
        if done:
            order = self._cache.remove(done)
            self._running = [rows[i] for i in order]
        return len(rows)

    def _verify(self, rows: list[_Request], drafts: list[Any], t0: float) -> int:
        """Feed every row its last token and its proposal in one forward; keep what sampling
        confirms (token_intake.take_verified: every emitted token, its log-prob and its version are
        those plain decoding gives). `t0`: when the step began, finding its proposals included."""
        width = self._cache.width
        fed = [[r.output_ids[-1], *(d.tokens if d is not None else ())] for r, d in zip(rows, drafts)]
        logits = self._runner.verify(fed, self._cache)  # [fed tokens, V], packed by row
        kept, done, finished = take_verified(rows, fed, logits, self._version, self.tokenizer)
        self._count_tokens(sum(kept), finished)
        self._cache.advance_rows(kept)
        t1 = time.perf_counter()
        emitted, fed_tokens = sum(kept), sum(len(f) for f in fed)
        if self._spec is not None:
            self._spec.verified(rows, drafts, [k - 1 for k in kept])
            self._spec.measured(len(rows), True, t1 - t0, emitted, fed_tokens)
        if self._steps_log.enabled:
            ctx = sum(len(r.prompt) + len(r.output_ids) for r in rows)
            self._steps_log.note(t0, t1, STEP_VERIFY, len(rows), fed_tokens, ctx, width, emitted)
        if done:
            order = self._cache.remove(done)
            self._running = [rows[i] for i in order]
        return len(rows)

    def _count_tokens(self, n: int, finished: list[_Request]) -> None:
        """Count `n` new tokens, then resolve `finished` (a caller reading stats() after its
        result sees its tokens)."""
        with self._cv:
            self._tokens_total += n
            now = time.monotonic()
            self._rate_window.append((now, n))
            while now - self._rate_window[0][0] > 10.0:  # stats() reports tokens/s over the last 10 s
                self._rate_window.popleft()
            for r in finished:
                self._resolve(r)

    def _resolve(self, r: _Request) -> None:
        """Holding `_cv`: hand the result to the caller."""
        self._active.pop(r.rid, None)
        self._finished_total += 1
        if self._spec is not None:
            self._spec.finish(r)
        self._shadow_call(lambda s: s.finish(r))
        if self._trace is not None:
            self._trace.finished(r)
        if not r.future.done():
            r.future.set_result(r.result())
        if r.on_token is not None:
            r.on_token()

    def _shadow_call(self, call: Callable[[ShadowSpeculation], None]) -> None:
        """`call` the shadow counter, if it runs. A measurement must never fail generation: an
        error in it is logged once and turns the counting off."""
        shadow = self._shadow
        if shadow is None:
            return
        try:
            call(shadow)
        except Exception:  # noqa: BLE001 - see the docstring
            log.exception("shadow speculation counting failed; it is off from now on")
            self._shadow = None
