"""A process pool that scores many (completion, answer) pairs without ever hanging or failing the caller.

Why a process pool: sympy-based verification can take unbounded time on adversarial output
(a model will eventually produce `\\boxed{9^{9^{9^9}}}`), and a reward function may be user
code that raises or loops. Each item runs in a worker process with a per-item timeout; a hung
worker is killed, the pool replaced, and the item scores 0 with status "timeout".
math_verify's own timeouts use SIGALRM, which only works in a process's main thread: pool
workers run tasks in their main thread, so they keep working there (tested).
"""

from __future__ import annotations

import logging
import math
import multiprocessing
import os
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from concurrent.futures import wait as futures_wait
from dataclasses import dataclass
from typing import Literal

import psutil

from areal_graph.api.episode import Episode
from areal_graph.api.reward_fns import resolve_reward_fn, wants_episode

log = logging.getLogger(__name__)

Status = Literal["ok", "error", "timeout"]


@dataclass(frozen=True)
class RewardResult:
    reward: float
    status: Status
    detail: str = ""


_worker_fns: dict[str, Callable[..., float]] = {}


def _worker_score(fn_path: str, completion: str, answer: str, episode: dict | None = None) -> tuple[float, Status, str]:
    """Runs inside a pool worker. Never raises: user errors come back as status "error"
    (as plain strings, so nothing exotic has to be pickled back). `episode` (a dict) is
    given to functions that take one (api/episode.py)."""
    try:
        fn = _worker_fns.get(fn_path)
        if fn is None:
            fn = _worker_fns[fn_path] = resolve_reward_fn(fn_path)
        if episode is not None:
            value = float(fn(completion, answer, episode=Episode.from_dict(episode)))
        else:
            value = float(fn(completion, answer))
        if not math.isfinite(value):
            return 0.0, "error", f"reward fn returned non-finite {value!r}"
        return value, "ok", ""
    except BaseException as exc:  # noqa: BLE001 - a user fn may raise anything, even SystemExit
        return 0.0, "error", f"{type(exc).__name__}: {exc}"[:500]


def _exit_with_owner(owner_pid: int, owner_started: float, poll_s: float = 1.0) -> None:
    """Pool-worker initializer: exit when the process that owns the pool is gone.

    Why: workers fork from the forkserver, not from the owner, and each holds both ends of
    its call queue, so a SIGKILLed owner (a reward worker killed, a run stopped hard) would
    leave them, and through them the forkserver (with sympy loaded), alive for ever.
    """

    def watch() -> None:
        while True:
            time.sleep(poll_s)
            try:
                owner = psutil.Process(owner_pid)
                alive = owner.create_time() == owner_started and owner.status() != psutil.STATUS_ZOMBIE
            except psutil.Error:
                alive = False
            if not alive:
                os._exit(0)

    threading.Thread(target=watch, name="owner-watch", daemon=True).start()


def _worker_warmup(fn_path: str) -> bool:
    """Import the reward fn once so the first real item's timeout does not pay for imports."""
    fn = _worker_fns.get(fn_path) or resolve_reward_fn(fn_path)
    _worker_fns[fn_path] = fn
    if fn_path == "math_verify":
        fn("\\boxed{1}", "1")  # math_verify builds its parsers lazily on first use
    return True


class RewardPool:
    """Scores (completion, answer) pairs in worker processes with a per-item timeout.

    `score` never raises for a bad item: an item whose function raises scores 0 with status
    "error", one that runs past `timeout_s` scores 0 with status "timeout" (its worker is
    killed and the pool replaced; other items that were running on the killed pool are
    re-run on the new one). Every failure is logged as a warning.

    At most `num_workers` items are in flight, so an item's clock starts when it is handed
    to an idle worker, not while it waits in a queue behind slow items.

    Calls from several threads (the reward host serves several gRPC calls at once) take turns,
    one batch at a time: the workers are shared, so two calls' items would queue behind each
    other with their clocks running, and a timeout replaces the whole pool, which would kill the
    other call's items under it (its cancelled futures never finish: its call waited forever).
    """

    def __init__(
        self,
        fn: str = "math_verify",
        timeout_s: float = 5.0,
        num_workers: int = 2,
        start_method: str = "forkserver",
        warmup_timeout_s: float = 120.0,
    ) -> None:
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
        if num_workers < 1:
            raise ValueError(f"num_workers must be >= 1, got {num_workers}")
        if start_method not in ("forkserver", "spawn"):
            raise ValueError(
                f"start_method must be 'forkserver' or 'spawn' (fork is unsafe with threads), got {start_method!r}"
            )
        self.wants_episode = wants_episode(resolve_reward_fn(fn))  # fail fast, in the caller, on a wrong path
        self.fn = fn
        self.timeout_s = timeout_s
        self.num_workers = num_workers
        self.warmup_timeout_s = warmup_timeout_s
        self._ctx = multiprocessing.get_context(start_method)
        if start_method == "forkserver":
            # Workers fork from the server with math_verify/sympy already imported: a worker that
            # replaces a killed one starts in milliseconds instead of seconds. (Only takes effect
            # if this process has not started its forkserver yet.)
            self._ctx.set_forkserver_preload(["areal_graph.nodes.math_reward", "math_verify"])
        self._executor: ProcessPoolExecutor | None = None
        self._turn = threading.Lock()  # one `score` call at a time (the class docstring says why)
        self.pools_replaced = 0
        self._start()

    # ------------------------------------------------------------------ lifecycle
    def _new_executor(self) -> ProcessPoolExecutor:
        me = os.getpid()
        return ProcessPoolExecutor(
            max_workers=self.num_workers,
            mp_context=self._ctx,
            initializer=_exit_with_owner,
            initargs=(me, psutil.Process(me).create_time()),
        )

    def _start(self) -> None:
        self._executor = self._new_executor()
        warm = [self._executor.submit(_worker_warmup, self.fn) for _ in range(self.num_workers)]
        done, not_done = futures_wait(warm, timeout=self.warmup_timeout_s)
        for f in done:
            if f.exception() is not None:
                log.warning("reward pool warm-up failed: %s", f.exception())
        if not_done:
            log.warning("reward pool warm-up did not finish in %.0f s; replacing the pool", self.warmup_timeout_s)
            self._kill()
            self._executor = self._new_executor()

    def _kill(self) -> None:
        """Kill every worker (the only way to stop a running task) and drop the executor."""
        executor, self._executor = self._executor, None
        if executor is None:
            return
        processes = list(getattr(executor, "_processes", {}).values())  # private, but the only handle
        for p in processes:
            try:
                p.kill()
            except Exception:  # noqa: BLE001 - already gone
                pass
        executor.shutdown(wait=False, cancel_futures=True)
        for p in processes:
            p.join(timeout=5)

    def _replace(self) -> None:
        self._kill()
        self.pools_replaced += 1
        self._start()

    def close(self) -> None:
        if self._executor is not None:
            self._executor.shutdown(wait=True, cancel_futures=True)
            self._executor = None

    def __enter__(self) -> RewardPool:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ------------------------------------------------------------------ scoring
    def _submit(self, completion: str, answer: str, episode: dict | None) -> Future:
        if self._executor is None:
            self._start()
        assert self._executor is not None
        try:
            return self._executor.submit(_worker_score, self.fn, completion, answer, episode)
        except RuntimeError:  # broken pool (a worker died); start a fresh one and retry once
            self._replace()
        try:
            assert self._executor is not None
            return self._executor.submit(_worker_score, self.fn, completion, answer, episode)
        except RuntimeError as exc:  # still broken: report this item as an error, never raise
            failed: Future = Future()
            failed.set_exception(exc)
            return failed

    def score(
        self, completions: Sequence[str], answers: Sequence[str], episodes: Sequence[Episode] | None = None
    ) -> list[RewardResult]:
        """One RewardResult per pair, in order. `episodes` reach functions that take one (else unused)."""
        if len(completions) != len(answers):
            raise ValueError(f"score: {len(completions)} completions but {len(answers)} answers")
        if episodes is not None and len(episodes) != len(completions):
            raise ValueError(f"score: {len(completions)} completions but {len(episodes)} episodes")
        if self.wants_episode and episodes is None:
            episodes = [Episode(c, a) for c, a in zip(completions, answers)]
        shipped = [e.as_dict() for e in episodes] if self.wants_episode and episodes is not None else None
        with self._turn:
            return self._score(completions, answers, shipped)

    def _score(
        self, completions: Sequence[str], answers: Sequence[str], shipped: list[dict] | None
    ) -> list[RewardResult]:
        results: list[RewardResult | None] = [None] * len(completions)
        pending = list(range(len(completions)))[::-1]  # a stack: pop() gives the lowest index
        running: dict[Future, tuple[int, float]] = {}
        while pending or running:
            while pending and len(running) < self.num_workers:
                i = pending.pop()
                running[self._submit(completions[i], answers[i], shipped[i] if shipped else None)] = (
                    i,
                    time.monotonic(),
                )
            next_deadline = min(start for _, start in running.values()) + self.timeout_s
            futures_wait(
                list(running), timeout=max(0.0, next_deadline - time.monotonic()), return_when="FIRST_COMPLETED"
            )
            # done() and not what wait() returns: a future cancelled by its executor's shutdown is
            # done, yet wait() never reports it, and the loop would spin on it
            for f in [f for f in running if f.done()]:
                i, _start = running.pop(f)
                results[i] = self._result_of(f, i)
            now = time.monotonic()
            expired = [f for f, (_, start) in running.items() if now - start >= self.timeout_s and not f.done()]
            if expired:
                for f in expired:
                    i, _ = running.pop(f)
                    log.warning("reward item %d timed out after %.1f s; killing its worker", i, self.timeout_s)
                    results[i] = RewardResult(0.0, "timeout", f"no result after {self.timeout_s} s")
                # The innocent items on the killed pool are re-run with a fresh clock.
                pending.extend(i for i, _ in sorted(running.values(), reverse=True))
                running.clear()
                self._replace()
        return [r if r is not None else RewardResult(0.0, "error", "lost") for r in results]

    def _result_of(self, f: Future, i: int) -> RewardResult:
        try:
            value, status, detail = f.result(timeout=0)
        except (FutureTimeout, Exception) as exc:  # noqa: BLE001 - e.g. BrokenProcessPool
            value, status, detail = 0.0, "error", f"{type(exc).__name__}: {exc}"
        if status != "ok":
            log.warning("reward item %d: %s (%s); scored 0", i, status, detail)
        return RewardResult(value, status, detail)
