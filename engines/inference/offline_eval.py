"""Offline evaluation of a model directory on a prompt dataset: greedy accuracy and pass@k.

Generation goes through the embedded engine (continuous batching, so a few hundred prompts
take seconds on a tiny model) and scoring through the same `RewardPool` the RL reward node
uses, so "correct" means exactly what the reward means during training.

pass@k uses the unbiased estimator of Chen et al. (2021) from n >= k samples per prompt:
1 - C(n - c, k) / C(n, k), averaged over prompts, where c of the n samples are correct.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

from areal_graph.api.env_metrics import env_metric_means
from areal_graph.api.episode import Episode, episode_from_tokens
from areal_graph.api.rollout import Trajectory
from areal_graph.data.datasets import load_prompts
from areal_graph.engines.inference.rollout_eval import generate_with_rollout, policy_text
from areal_graph.tools.reward_pool import RewardPool

log = logging.getLogger(__name__)


def pass_at_k(n: int, c: int, k: int) -> float:
    """Probability that at least one of k samples drawn without replacement from n (c correct) is correct."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass_at_k needs 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def accuracy_by_source(sources: list[str], correct: list[bool]) -> dict[str, dict[str, float]]:
    """{source: {"prompts": n, "greedy_accuracy": share correct}} ("" counts as "(none)")."""
    out: dict[str, dict[str, float]] = {}
    for source, ok in zip(sources, correct):
        row = out.setdefault(source or "(none)", {"prompts": 0, "greedy_accuracy": 0.0})
        row["prompts"] += 1
        row["greedy_accuracy"] += float(ok)
    for row in out.values():
        row["greedy_accuracy"] /= row["prompts"]
    return dict(sorted(out.items()))


def evaluate_model(
    model_dir: str | Path,
    data: str | Path,
    *,
    limit: int | None = None,
    k: int = 0,
    n_samples: int | None = None,
    temperature: float = 1.0,
    max_new_tokens: int = 64,
    prompt_template: str | None = None,
    question_key: str = "question",
    answer_key: str = "answer",
    layout: str = "auto",
    source_key: str = "data_source",
    reward_fn: str = "math_verify",
    reward_timeout_s: float = 5.0,
    seed: int = 0,
    max_running: int = 128,
    on_progress: Callable[[int, int], None] | None = None,
    rollout: Any = None,
    speculative: Any = None,
) -> dict[str, Any]:
    """Greedy accuracy (and pass@k from `n_samples` >= k samples when k > 0) on `data`.

    `rollout` (a `Rollout` instance, e.g. a multi-turn tool agent) generates each answer as
    an episode, as during RL (engines/inference/rollout_eval.py): `max_new_tokens` is then per
    turn and the scored text is the policy's own tokens; with trajectories that count tool
    calls the result also has `greedy_tool_call_rate` (and `sample_tool_call_rate`).
    Returns a JSON-ready dict; `per_prompt` lists each prompt's greedy completion and counts;
    `by_source` the greedy accuracy per data source when the rows name one (`source_key`).
    `speculative` (the engine's SpeculativeSettings) turns on speculative decoding: the answers
    are the same, generation faster where they repeat their prompt or each other; the result then
    has the engine's `speculative` counts (proposed and accepted tokens, tokens per forward).
    """
    from areal_graph.engines.inference.engine import EmbeddedEngine, SamplingParams

    n = (k if n_samples is None else n_samples) if k else 0  # samples only serve pass@k
    if k < 0 or (k and n < k):
        raise ValueError(f"need k >= 0 and n_samples >= k, got k={k}, n_samples={n_samples}")
    t0 = time.perf_counter()
    engine = EmbeddedEngine(
        str(model_dir), max_running=max_running, max_queue=1 << 30, seed=seed, speculative=speculative
    )
    tok = engine.tokenizer
    if tok is None:
        raise ValueError(f"{model_dir} has no tokenizer (save it next to the model with save_pretrained)")
    prompts, report = load_prompts(
        data,
        tok,
        prompt_template=prompt_template,
        question_key=question_key,
        answer_key=answer_key,
        max_prompt_tokens=engine.max_context - max_new_tokens,
        layout=layout,
        source_key=source_key,
    )
    if limit is not None:
        prompts = prompts[:limit]
    if not prompts:
        raise ValueError(f"{data}: no usable prompts ({report})")
    greedy = SamplingParams(max_new_tokens=max_new_tokens, temperature=0.0)
    requests: list[tuple[int, SamplingParams]] = [(i, greedy) for i in range(len(prompts))]
    for i in range(len(prompts)):
        for j in range(n):
            requests.append(
                (
                    i,
                    SamplingParams(
                        max_new_tokens=max_new_tokens, temperature=temperature, seed=seed * 1_000_003 + i * 1009 + j
                    ),
                )
            )
    t_gen = time.perf_counter()
    with engine:
        if rollout is None:
            trajectories = _generate_plain(engine, prompts, requests, on_progress)
        else:
            trajectories = generate_with_rollout(engine, rollout, prompts, requests, on_progress)
        spec_stats = engine.stats().get("speculative")
    gen_s = time.perf_counter() - t_gen
    texts = [policy_text(tok, t) for t in trajectories]
    answers = [prompts[i].answer for i, _ in requests]
    tool_calls = (
        [int(t.info["tool_calls"]) for t in trajectories]
        if rollout is not None and all("tool_calls" in t.info for t in trajectories)
        else None
    )
    # each answer as the RL run's reward node sees it (turns, info): for an episode reward, and for --show
    episodes = episodes_of(tok, trajectories, texts, answers)
    with RewardPool(fn=reward_fn, timeout_s=reward_timeout_s, num_workers=1) as pool:
        scores = pool.score(texts, answers, episodes if pool.wants_episode else None)
    correct = [s.reward > 0.5 for s in scores]
    per_prompt: list[dict[str, Any]] = [
        {
            "id": p.id,
            "answer": p.answer,
            "greedy": texts[i],
            "greedy_correct": correct[i],
            "greedy_reward": scores[i].reward,
            "greedy_turns": [[t.role, t.text] for t in episodes[i].turns if t.role != "prompt"],
            "samples_correct": 0,
            **({"source": p.source} if p.source else {}),
        }
        for i, p in enumerate(prompts)
    ]
    for (i, _), ok in zip(requests[len(prompts) :], correct[len(prompts) :]):
        per_prompt[i]["samples_correct"] += int(ok)
    out: dict[str, Any] = {
        "model": str(model_dir),
        "data": str(data),
        "prompts": len(prompts),
        "skipped_rows": report.total_skipped,
        "greedy_accuracy": sum(correct[: len(prompts)]) / len(prompts),  # correct: reward > 0.5, as the run's eval
        "greedy_reward_mean": sum(r.reward for r in scores[: len(prompts)]) / len(prompts),
        "reward_failures": sum(s.status != "ok" for s in scores),
        "generated_tokens": sum(t.num_generated for t in trajectories),
        "seconds": round(time.perf_counter() - t0, 2),
        "generation_seconds": round(gen_s, 2),
    }
    if spec_stats is not None:
        out["speculative"] = spec_stats
    elif engine.speculation_unavailable is not None:  # asked for and not possible: say so, never run silently without
        out["speculative"] = {"unavailable": engine.speculation_unavailable}
    if tool_calls is not None:
        out["greedy_tool_call_rate"] = sum(c > 0 for c in tool_calls[: len(prompts)]) / len(prompts)
        for p, c in zip(per_prompt, tool_calls):
            p["greedy_tool_calls"] = c
        if n:
            out["sample_tool_call_rate"] = sum(c > 0 for c in tool_calls[len(prompts) :]) / (n * len(prompts))
    if k:
        out.update(
            {
                "k": k,
                "n_samples": n,
                "temperature": temperature,
                f"pass@{k}": sum(pass_at_k(n, p["samples_correct"], k) for p in per_prompt) / len(prompts),
                "sample_accuracy": sum(p["samples_correct"] for p in per_prompt) / (n * len(prompts)),
            }
        )
    env = env_metric_means([t.info for t in trajectories[: len(prompts)]], prefix="")
    if env:
        out["env"] = env  # the rollout's info["metrics"], greedy answers
    if any(p.source for p in prompts):
        out["by_source"] = accuracy_by_source([p.source for p in prompts], correct[: len(prompts)])
    out["per_prompt"] = per_prompt
    return out


def _generate_plain(
    engine: Any, prompts: list, requests: list, on_progress: Callable[[int, int], None] | None
) -> list[Trajectory]:
    """One completion per request, as a one-turn trajectory (prompt, then the answer)."""
    futures = [engine.submit(prompts[i].input_ids, p) for i, p in requests]
    out = []
    for done, ((i, _), f) in enumerate(zip(requests, futures), start=1):
        r = f.result()
        out.append(
            Trajectory.from_generation(
                prompts[i].input_ids,
                r.output_ids,
                r.output_logprobs,
                r.output_versions,
                r.finish_reason,
                answer=prompts[i].answer,
            )
        )
        if on_progress is not None:
            on_progress(done, len(futures))
    return out


def episodes_of(tokenizer: Any, trajectories: list[Trajectory], texts: list[str], answers: list[str]) -> list[Episode]:
    """Each trajectory's Episode, built as the reward node builds it (api/episode.py)."""
    decode = partial(tokenizer.batch_decode, skip_special_tokens=True)
    return [
        episode_from_tokens(decode, t.input_ids, t.loss_mask, text, answer, t.info, t.no_eos)
        for t, text, answer in zip(trajectories, texts, answers)
    ]
