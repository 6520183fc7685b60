"""The embedded generation engine: continuous batching and interruptible generation in torch.

It lets the whole RL system run on a laptop or CI with a tiny HF CausalLM. One background
scheduler thread owns the model and the batched KV cache; at every step it
1. admits queued requests (up to `max_running`) and prefills them in left-padded chunks of
   at most `prefill_token_budget` tokens, which yields each one's first token and its KV
   rows, written into free rows of the running cache (see `kv_cache.py`);
2. decodes every running request by one token in a single forward over the batched cache;
3. retires finished requests at once (their futures resolve, their cache rows are freed).
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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

import torch

from areal_graph.engines.inference.kv_cache import BatchedKVCache
from areal_graph.engines.inference.sampling import GenerationResult, SamplingParams, sample_tokens

log = logging.getLogger(__name__)

__all__ = [
    "EmbeddedEngine",
    "GenerationResult",
    "InvalidRequestError",
    "QueueFullError",
    "SamplingParams",
]


class InvalidRequestError(ValueError):
    """The request cannot be served as given (empty prompt, bad token id, too long, bad sampling values)."""


class QueueFullError(RuntimeError):
    """Backpressure: the waiting queue is at `max_queue`; retry later."""


@dataclass
class _Request:
    rid: str
    prompt: list[int]
    params: SamplingParams
    future: concurrent.futures.Future
    generator: torch.Generator
    stop_ids: frozenset[int]
    output_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    finish_reason: str | None = None

    def all_tokens(self) -> list[int]:
        return self.prompt + self.output_ids

    def result(self) -> GenerationResult:
        return GenerationResult(
            rid=self.rid, output_ids=list(self.output_ids), output_logprobs=list(self.logprobs),
            output_versions=list(self.versions), finish_reason=self.finish_reason or "abort",
            prompt_len=len(self.prompt),
        )


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
    ) -> None:
        if model is None and model_path is None:
            raise ValueError("EmbeddedEngine needs model_path or model=")
        if max_running < 1 or max_queue < 0:
            raise ValueError(f"max_running must be >= 1 and max_queue >= 0, got {max_running}, {max_queue}")
        self.device = torch.device(device)
        self.dtype = dtype
        if model is None:
            from transformers import AutoModelForCausalLM

            model = AutoModelForCausalLM.from_pretrained(str(model_path), dtype=dtype)
            if tokenizer is None:
                tokenizer = _try_load_tokenizer(model_path)
        self.model = model.to(device=self.device, dtype=dtype).eval()
        self.tokenizer = tokenizer
        self.model_path = str(model_path) if model_path is not None else None
        cfg = self.model.config
        self.vocab_size = int(self.model.get_input_embeddings().num_embeddings)
        model_ctx = getattr(cfg, "max_position_embeddings", None)
        self.max_context = int(max_context if max_context is not None else (model_ctx or 2048))
        self.eos_token_ids = _eos_ids(self.model, tokenizer)
        self.pad_token_id = int(getattr(cfg, "pad_token_id", None) or 0)
        self.max_running = max_running
        self.max_queue = max_queue
        self.prefill_token_budget = prefill_token_budget
        self._version = int(version)
        self._logits_to_keep = True
        self._rng = random.Random(seed)

        self._cv = threading.Condition()
        self._step_lock = threading.Lock()
        self._queue: collections.deque[_Request] = collections.deque()
        self._active: dict[str, _Request] = {}  # every queued or running request
        self._running: list[_Request] = []  # rows of self._cache, in order
        self._pending: list[_Request] = []  # admitted, need a (re-)prefill before decoding
        self._cache = BatchedKVCache(row_capacity=max_running)
        self._paused = False
        self._waiters = 0  # threads waiting for a step boundary (abort, weight swap): the scheduler yields
        self._stopping = False
        self._thread: threading.Thread | None = None
        self._tokens_total = 0
        self._finished_total = 0
        self._steps = 0
        self._rate_window: collections.deque[tuple[float, int]] = collections.deque()

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

    def __enter__(self) -> "EmbeddedEngine":
        self.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    # ------------------------------------------------------------------ requests
    def submit(
        self, input_ids: Sequence[int], params: SamplingParams, rid: str | None = None
    ) -> concurrent.futures.Future:
        """Queue a request; the future resolves to a GenerationResult.

        Raises InvalidRequestError for a request that can never be served and
        QueueFullError when `max_queue` requests already wait.
        """
        ids = self._validate(input_ids, params)
        rid = rid if rid is not None else uuid.uuid4().hex
        seed = params.seed if params.seed is not None else self._rng.getrandbits(63)
        gen = torch.Generator(device="cpu")
        gen.manual_seed(int(seed) & 0xFFFF_FFFF_FFFF_FFFF)
        stop_ids = set(params.stop_token_ids)
        if not params.ignore_eos:
            stop_ids |= set(self.eos_token_ids)
        fut: concurrent.futures.Future = concurrent.futures.Future()
        req = _Request(rid, ids, params, fut, gen, frozenset(stop_ids))
        with self._cv:
            if self._stopping:
                raise RuntimeError("engine is stopped; start() it again before submitting")
            if rid in self._active:
                raise InvalidRequestError(f"request id {rid!r} is already in flight")
            if params.max_new_tokens == 0:
                req.finish_reason = "length"
                fut.set_result(req.result())
                return fut
            if len(self._queue) >= self.max_queue:
                raise QueueFullError(
                    f"engine queue is full ({len(self._queue)} waiting, max_queue={self.max_queue}); retry later"
                )
            self._queue.append(req)
            self._active[rid] = req
            self._cv.notify_all()
        return fut

    async def generate(
        self, input_ids: Sequence[int], params: SamplingParams, rid: str | None = None
    ) -> GenerationResult:
        """`submit` for asyncio callers."""
        return await asyncio.wrap_future(self.submit(input_ids, params, rid))

    def abort(self, rid: str) -> bool:
        """Finish request `rid` now with "abort" and the tokens so far. False if it is unknown or done."""
        with self._at_step_boundary():
            with self._cv:
                req = self._active.get(rid)
                if req is None:
                    return False
                self._abort_locked([req])
            return True

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
            pass

    def resume(self) -> None:
        with self._cv:
            self._paused = False
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

    def update_weights_from_state_dict(self, state_dict: Mapping[str, torch.Tensor], version: int) -> None:
        """Swap weights at a step boundary and invalidate every KV cache built with the old ones."""
        with self._at_step_boundary():
            _load_state_dict(self.model, state_dict)
            self._version = int(version)
            # Cached keys/values came from the old weights: drop them, re-prefill prompt + tokens so far.
            self._pending = self._running + self._pending
            self._running = []
            self._cache.clear()
        log.info("weights updated to version %d (%d requests will be re-prefilled)", version, len(self._pending))

    def update_weights_from_disk(self, path: str | Path, version: int | None = None) -> None:
        """Load a `save_pretrained` checkpoint (safetensors) and swap it in; version defaults to current + 1.

        Reading the files happens while generation continues; only the copy into the model
        holds the scheduler at a step boundary.
        """
        state_dict = _read_checkpoint(Path(path), self.dtype)
        self.update_weights_from_state_dict(state_dict, self._version + 1 if version is None else version)

    # ------------------------------------------------------------------ introspection
    def stats(self) -> dict:
        now = time.monotonic()
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
            }

    # ------------------------------------------------------------------ validation
    def _validate(self, input_ids: Sequence[int], params: SamplingParams) -> list[int]:
        if not isinstance(params, SamplingParams):
            raise InvalidRequestError(f"params must be SamplingParams, got {type(params).__name__}")
        try:
            ids = [int(t) for t in input_ids]
        except (TypeError, ValueError) as err:
            raise InvalidRequestError(f"input_ids must be a list of integers: {err}") from None
        if not ids:
            raise InvalidRequestError("input_ids is empty: a request needs at least one prompt token")
        bad = [t for t in ids if not 0 <= t < self.vocab_size]
        if bad:
            raise InvalidRequestError(
                f"input_ids holds token id(s) outside the vocabulary [0, {self.vocab_size}): {bad[:5]}"
            )
        problems = params.problems()
        if problems:
            raise InvalidRequestError("bad sampling params: " + "; ".join(problems))
        if len(ids) + params.max_new_tokens > self.max_context:
            raise InvalidRequestError(
                f"prompt ({len(ids)} tokens) + max_new_tokens ({params.max_new_tokens}) exceeds "
                f"the context of {self.max_context} tokens"
            )
        if params.stop and self.tokenizer is None:
            raise InvalidRequestError("stop strings need a tokenizer, and this engine has none; use stop_token_ids")
        return ids

    # ------------------------------------------------------------------ the scheduler
    def _loop(self) -> None:
        while True:
            with self._cv:
                while not self._stopping and (
                    self._paused or self._waiters or not (self._queue or self._running or self._pending)
                ):
                    self._cv.wait()
                if self._stopping:
                    return
            with self._step_lock:
                if self._paused or self._waiters:
                    continue
                try:
                    self._step()
                except Exception as err:  # noqa: BLE001 - a bad step must fail its requests, not hang them
                    log.exception("engine step failed; failing the running requests")
                    self._fail_running(err)

    def _fail_running(self, err: Exception) -> None:
        with self._cv:
            reqs = self._running + self._pending
            self._running, self._pending = [], []
            self._cache.clear()
            for r in reqs:
                self._active.pop(r.rid, None)
                if not r.future.done():
                    r.future.set_exception(err)

    @torch.inference_mode()
    def _step(self) -> None:
        with self._cv:
            # a caller that cancelled its future (e.g. an asyncio task) no longer wants the tokens
            gone = [r for r in (*self._running, *self._pending, *self._queue) if r.future.cancelled()]
            if gone:
                self._abort_locked(gone)
            room = self.max_running - len(self._running) - len(self._pending)
            while room > 0 and self._queue:
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

        Chunks hold at most `prefill_token_budget` padded tokens. Between chunks a waiting
        pause, abort or weight swap takes precedence, so its latency is one chunk, not a
        whole re-prefill of every request in flight; the requests not yet prefilled are
        returned and stay pending.
        """
        order = sorted(reqs, key=lambda r: len(r.prompt) + len(r.output_ids))
        chunks: list[list[_Request]] = [[]]
        for r in order:
            n = len(r.prompt) + len(r.output_ids)
            if chunks[-1] and n * (len(chunks[-1]) + 1) > self.prefill_token_budget:
                chunks.append([])
            chunks[-1].append(r)
        for i, chunk in enumerate(chunks):
            if i and (self._paused or self._waiters):
                return [r for c in chunks[i:] for r in c]
            seqs = [r.all_tokens() for r in chunk]
            lens = [len(s) for s in seqs]
            width = max(lens)
            ids = torch.full((len(chunk), width), self.pad_token_id, dtype=torch.long)
            mask = torch.zeros((len(chunk), width), dtype=torch.long)
            for j, s in enumerate(seqs):
                ids[j, width - len(s):] = torch.tensor(s, dtype=torch.long)
                mask[j, width - len(s):] = 1
            pos = (mask.cumsum(1) - 1).clamp(min=0)
            from transformers.cache_utils import DynamicCache

            kw = dict(input_ids=ids.to(self.device), attention_mask=mask.to(self.device),
                      position_ids=pos.to(self.device), past_key_values=DynamicCache(), use_cache=True)
            if self._logits_to_keep:
                try:  # only the last position's logits are needed; not every HF model takes this
                    out = self.model(**kw, logits_to_keep=1)
                except TypeError:
                    self._logits_to_keep = False
                    kw["past_key_values"] = DynamicCache()
                    out = self.model(**kw)
            else:
                out = self.model(**kw)
            done = self._take_tokens(chunk, out.logits[:, -1, :])
            keep = [j for j, r in enumerate(chunk) if j not in done]
            if keep:
                layers = out.past_key_values.layers
                keys, values = [layer.keys for layer in layers], [layer.values for layer in layers]
                if len(keep) < len(chunk):
                    idx = torch.tensor(keep, dtype=torch.long, device=keys[0].device)
                    keys = [k.index_select(0, idx) for k in keys]
                    values = [v.index_select(0, idx) for v in values]
                self._cache.append(keys, values, [lens[j] for j in keep])
                self._running.extend(chunk[j] for j in keep)
        return []

    def _decode(self) -> int:
        """One token for every running request, in one forward over the batched cache."""
        rows = self._running
        last = torch.tensor([[r.output_ids[-1]] for r in rows], dtype=torch.long)
        pos = torch.tensor([[n] for n in self._cache.lens], dtype=torch.long)
        mask = self._cache.attention_mask(1)
        cache = self._cache.hf_cache(1)
        out = self.model(
            input_ids=last.to(self.device), attention_mask=mask.to(self.device), position_ids=pos.to(self.device),
            past_key_values=cache, use_cache=True,
        )
        self._cache.advance(1)
        done = self._take_tokens(rows, out.logits[:, -1, :])
        if done:
            order = self._cache.remove(done)
            self._running = [rows[i] for i in order]
        return len(rows)

    def _take_tokens(self, reqs: list[_Request], logits: torch.Tensor) -> set[int]:
        """Sample a token per request, append it; resolve and return the indices that finished."""
        tokens, logprobs = sample_tokens(logits.float().cpu(), [r.params for r in reqs], [r.generator for r in reqs])
        tokens, logprobs = tokens.tolist(), logprobs.tolist()
        done: set[int] = set()
        finished: list[_Request] = []
        for j, r in enumerate(reqs):
            t = tokens[j]
            r.output_ids.append(t)
            r.logprobs.append(logprobs[j])
            r.versions.append(self._version)
            if t in r.stop_ids or (r.params.stop and self._hits_stop_string(r)):
                r.finish_reason = "stop"
            elif len(r.output_ids) >= r.params.max_new_tokens:
                r.finish_reason = "length"
            if r.finish_reason is not None:
                done.add(j)
                finished.append(r)
        with self._cv:  # count before resolving: a caller reading stats() after its result sees its tokens
            self._tokens_total += len(reqs)
            now = time.monotonic()
            self._rate_window.append((now, len(reqs)))
            while now - self._rate_window[0][0] > 10.0:  # stats() reports tokens/s over the last 10 s
                self._rate_window.popleft()
            for r in finished:
                self._resolve(r)
        return done

    def _hits_stop_string(self, r: _Request) -> bool:
        """Did the newest token complete one of the stop strings? (decoded-text check on a tail window)."""
        longest = max(len(s) for s in r.params.stop)
        tail = r.output_ids[-(longest + 8):]
        text = self.tokenizer.decode(tail, skip_special_tokens=False)
        before = self.tokenizer.decode(tail[:-1], skip_special_tokens=False) if len(tail) > 1 else ""
        return any(s in text and s not in before for s in r.params.stop)

    def _resolve(self, r: _Request) -> None:
        """Holding `_cv`: hand the result to the caller."""
        self._active.pop(r.rid, None)
        self._finished_total += 1
        if not r.future.done():
            r.future.set_result(r.result())


# ---------------------------------------------------------------------- helpers
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "tokenizer.model")


def _try_load_tokenizer(path: str | Path) -> Any:
    """The tokenizer saved next to the model, or None.

    A directory without tokenizer files gives None: transformers would otherwise build an
    empty tokenizer from the config's model type (vocab of 1), and stop strings would then
    be matched against meaningless text.
    """
    if Path(path).is_dir() and not any((Path(path) / f).exists() for f in _TOKENIZER_FILES):
        log.info("no tokenizer files in %s; stop strings are unavailable", path)
        return None
    try:
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(str(path))
    except Exception as err:  # noqa: BLE001 - a model dir without tokenizer files is legitimate
        log.info("no tokenizer at %s (%s); stop strings are unavailable", path, type(err).__name__)
        return None


def _eos_ids(model: Any, tokenizer: Any) -> list[int]:
    """The ids that end a generation by default: generation_config, else config, else tokenizer."""
    for src in (getattr(model, "generation_config", None), model.config):
        eos = getattr(src, "eos_token_id", None) if src is not None else None
        if eos is not None:
            return [int(e) for e in (eos if isinstance(eos, (list, tuple)) else [eos])]
    if tokenizer is not None and getattr(tokenizer, "eos_token_id", None) is not None:
        return [int(tokenizer.eos_token_id)]
    return []


def _read_checkpoint(path: Path, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """State dict from a safetensors file or a save_pretrained directory (sharded or not)."""
    from safetensors.torch import load_file

    if path.is_file():
        files = [path]
    elif path.is_dir():
        files = sorted(path.glob("*.safetensors"))
    else:
        raise FileNotFoundError(f"no checkpoint at {path}")
    if not files:
        from transformers import AutoModelForCausalLM  # e.g. a pytorch_model.bin checkpoint

        return AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype).state_dict()
    sd: dict[str, torch.Tensor] = {}
    for f in files:
        sd.update(load_file(str(f)))
    return sd


def _load_state_dict(model: torch.nn.Module, state_dict: Mapping[str, torch.Tensor]) -> None:
    """Copy `state_dict` into `model`; tied parameters may be absent (saved once), anything else is an error."""
    result = model.load_state_dict(dict(state_dict), strict=False)
    if result.unexpected_keys:
        raise ValueError(f"weights have keys the model does not: {sorted(result.unexpected_keys)[:5]}")
    if result.missing_keys:
        params = dict(model.named_parameters(remove_duplicate=False))
        loaded_ptrs = {params[k].data_ptr() for k in state_dict if k in params}
        missing = [k for k in result.missing_keys if k not in params or params[k].data_ptr() not in loaded_ptrs]
        if missing:
            raise ValueError(f"weights lack keys the model needs: {sorted(missing)[:5]}")
