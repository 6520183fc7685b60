"""Hugging Face TRL's synchronous `GRPOTrainer` against areal-graph (async and sync), same kit.

    pip install -e '.[bench]'                              # TRL: an optional extra, never a runtime dependency
    python benchmarks/bench_vs_trl.py                      # 4 interleaved rounds of 200 steps (~20 min, 2 cores)
    python benchmarks/bench_vs_trl.py --quick              # 5 steps, 1 round, eval on 50 problems
    python benchmarks/bench_vs_trl.py --baseline-tree /tmp/x/areal_graph   # + an older checkout's rows
    python benchmarks/bench_vs_trl.py --omp-passive        # OMP_WAIT_POLICY=PASSIVE for every process

Systems, each a fresh process per round:

- `trl`: this script re-run as a worker subprocess (`--trl-worker`) that trains the kit's model
  with `trl.GRPOTrainer` and saves it (model + tokenizer, `save_pretrained`) at the end.
- `areal-graph async` / `areal-graph sync`: `areal-graph run workflows/ppo_async.yaml` and
  `workflows/grpo_sync.yaml` with `runtime.steps=N runtime.eval_every=0 runtime.save_every=0
  runtime.seed=S --run-dir <tmp>` (the final model lands in `<run dir>/final_model`).
- with `--baseline-tree PATH`, `areal-graph@baseline async` / `sync`: the same two runs from an
  older checkout: PATH is the package directory (e.g. a `git worktree` of an older commit placed
  at /tmp/x/areal_graph); the run gets `PYTHONPATH=<parent of PATH>` and PATH's own workflow
  files, and the script checks that `import areal_graph` resolves into PATH. This is how a
  before/after is measured in one interleaved run.

Each round runs every system once, in an order rotated by one per round (round r starts with
system r mod n), so slow phases of the shared machine spread over all systems. Round r uses seed
1 + r for every system (round 0 = the workflows' own seed 1), so the accuracy ranges show
seed-to-seed spread too (with one seed, TRL's accuracy repeated exactly in every check here). Reported per
system: medians (and min-max) of the window and of the process's total wall time, per round the
ratio TRL time / areal time (and baseline / current) and the median of those ratios, and the
final greedy accuracy. Ratios are taken within a round, never across rounds.

What is timed
-------------
- The window = the N training steps. TRL: a `TrainerCallback`, from `on_step_begin` of the first
  step to `on_step_end` of step N; it holds step 1's generation and everything between steps
  (TRL's logging), and excludes imports, model load, trainer construction and the final save.
  areal-graph: from metrics.jsonl, `time(N) - time(1) + time/step(1) + time/wait_batch(1)`:
  `time` is the wall clock when a step's metrics line is written, `time/step` is step 1's
  train-side time and `time/wait_batch` its wait for the first batch, so step 1's first
  generation is inside the window as it is for TRL. (Without that first wait:
  `window_excl_first_wait_s` in the JSON.) Server start, worker start, model load and the
  final export are outside.
- median step x N: the median step duration times N, a noise-robust view of the window (TRL:
  per-step callback times; areal-graph: the differences of consecutive metrics lines, step 1 as
  above).
- total = wall time of the whole process (`areal-graph run` or the TRL worker), start to exit;
  CPU = user + system time of that process tree (from the rusage of waited-for children).
- TRL per step (optional extras, read from wrapped private methods; absent if TRL renames them):
  `generate_s` (HF `generate` alone), `gen_score_s` (generate, decode, reward, advantages),
  `train_s` = step time - gen_score_s (forward/backward, optimizer step, logging).
- Accuracy: `areal-graph eval <final model> --data builtin:arith/test --json ...` (greedy, all
  500 problems; `--eval-limit` / `--quick` take the first K) of *this* checkout for every
  model, so all are scored by the same evaluator. Not timed.

The matching
------------
- Model and tokenizer: `builtin:tiny-arith` (0.83M-parameter Qwen2), loaded with
  `AutoModelForCausalLM` / `AutoTokenizer`, fp32 (TRL: `bf16=False`, `fp16=False`).
- Prompts: `builtin:arith/train`; TRL gets the conversational `[{"role": "user", "content":
  question}]` and applies the kit's chat template itself. The script checks once, before any
  run, that TRL's tokenisation call (`apply_chat_template(..., add_generation_prompt=True,
  tokenize=True, return_dict=True)`) gives exactly areal-graph's prompt ids for all 20,000
  training prompts, and the TRL worker checks again the ids its trainer really generates from
  on the first step; a mismatch stops the benchmark.
- Reward: areal-graph's `math_reward(completion, answer)` (math-verify), on the completion
  decoded with `skip_special_tokens=True` (both sides).
- 200 steps of 4 prompts x 8 answers (`num_generations=8`, `per_device_train_batch_size=32`,
  `gradient_accumulation_steps=1`), temperature 1, top-p 1, no top-k, 64 new tokens at most.
- One optimizer update per batch (`num_iterations=1`, TRL's `steps_per_generation=1`), AdamW
  (`optim="adamw_torch"`, betas 0.9/0.999, eps 1e-8, weight decay 0) at lr 2e-5 constant, no
  warmup, grad-norm clip 1.0, no KL (`beta=0`), PPO clip 0.2, token-mean loss over the batch
  (`loss_type="dapo"` = areal's `agg: token-mean`).
- CPU (`use_cpu=True`), `gradient_checkpointing=False` (TRL's default is True), 2 torch threads
  for TRL (`torch.set_num_threads(2)`, OMP 2); areal-graph sync gives generation and training 2
  threads each in turn, async 1 + 1 running at once (its own `thread_split`).
- No evaluation during training, no checkpoints during training (TRL `save_strategy="no"`,
  `eval_strategy="no"`, `report_to="none"`), the final model saved once.

Noise: OpenMP spin-waits
-------------------------
On this shared 2-core machine a TRL run stalls now and then: a normal step takes ~0.5 s at
~2 CPU-seconds per wall-second, a stalled one 5-25 s at ~1 CPU-second per wall-second (the
JSON's `slow_steps`, `slow_steps_excess_s`, `step_cpu_s`). That is OpenMP's active spin-wait
with 2 threads when another process holds a core: one thread spins at a barrier while the other
waits to be scheduled. In a test with one busy-loop process beside it, 20 TRL steps took 78 s
with 2 threads (default wait policy), 22 s with OMP_WAIT_POLICY=PASSIVE and 25 s with 1 thread.
areal-graph async runs 1 thread per process and is not exposed to it; areal-graph sync runs 2
(one process at a time). The default measures every system as shipped; `--omp-passive` sets
OMP_WAIT_POLICY=PASSIVE for every process of every system; the median-step column and the CPU
column are the checks against stalls either way. Interleave rounds and compare medians.

What still differs
------------------
- Architecture: TRL is one process; generation (HF `generate` on a left-padded static batch of
  32, the same fp32 model object), reward and training alternate. areal-graph runs an embedded
  inference server, gRPC model/reward workers and a controller; generation uses its own
  continuous-batching engine; new weights are pushed to the server after every step. Async
  (max staleness 4) overlaps generation with training and trains on up to 4-step-old samples
  with the decoupled PPO loss; sync generates each batch with the current weights.
- Padding vs packing: TRL pads prompts left and completions right and runs the policy on the
  padded [32, prompt+completion] batch (one forward for the loss, entropy computed too);
  areal-graph packs sequences without padding into rows (`max_tokens_per_microbatch` 2048).
  With one update per batch neither does a separate forward for the old/proximal log-probs:
  TRL uses the detached current ones (ratio == 1); areal-graph since 19d7e99 fuses `prox_logp`
  into the training forward (older checkouts, e.g. as --baseline-tree, run it as an extra
  forward per step).
- Loss: both are the clipped PPO surrogate averaged over all generated tokens of the batch.
  areal-graph's is decoupled PPO (ratio against the recomputed proximal policy, times the
  behaviour importance weight pi_prox/pi_behav, tokens with weight > 5 masked); in sync that
  weight is 1 up to engine numerics. TRL's ratio is exactly 1 at the single update (clip
  inactive): a plain token-mean policy gradient.
- Advantages: TRL `(r - group mean) / (group sample std + 1e-4)` (`scale_rewards="group"`);
  areal-graph `(r - group mean) / (group population std + 1e-6)` and then a global
  normalisation of the token advantages over the batch (mean 0, std 1 over generated tokens).
  Same sign and ranking; the scale differs per batch.
- Prompt order: both shuffle the training set with their own seeded RNG, so the prompts seen
  in the 200 steps differ (800 of 20,000 each).
- Reward execution: TRL calls `math_reward` inline in the trainer process (math-verify's own
  5 s timeout); areal-graph scores in a 2-process pool with a per-item 5 s timeout.
- Logging: TRL averages its metrics and prints them every 10 steps (its default
  `logging_steps`), with a tqdm bar; areal-graph writes a metrics JSONL line and TensorBoard
  scalars every step and merges tracing spans.
- Random streams differ (HF sampling vs the engine's seeded sampler), so two runs never see
  the same completions even with the same seed.
- Startup (outside the window, inside `total_s`): TRL imports trl/accelerate/datasets and
  builds a `datasets.Dataset`; areal-graph starts and health-checks its server and workers.

Output: a rich table, per-round lines while running, and benchmarks/results/vs_trl.json
(vs_trl_quick.json with --quick) with the settings, versions, the token-id check and every
round's raw numbers (per-step TRL timings included).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"

INSTALL_HINT = "TRL is not installed: this benchmark needs the optional bench extra: pip install -e '.[bench]'"

TRL_SYSTEM = "trl"
SYSTEMS_CURRENT = [("areal-graph async", "ppo_async"), ("areal-graph sync", "grpo_sync")]
SYSTEMS_BASELINE = [("areal-graph@baseline async", "ppo_async"), ("areal-graph@baseline sync", "grpo_sync")]

# The matched settings (also written to the JSON). areal-graph takes them from its workflow files.
MATCHED = {
    "model": "builtin:tiny-arith",
    "train_data": "builtin:arith/train",
    "eval_data": "builtin:arith/test",
    "prompts_per_step": 4,
    "answers_per_prompt": 8,
    "batch_size": 32,
    "temperature": 1.0,
    "top_p": 1.0,
    "max_new_tokens": 64,
    "lr": 2e-5,
    "lr_schedule": "constant",
    "weight_decay": 0.0,
    "grad_clip": 1.0,
    "clip_eps": 0.2,
    "kl_coef": 0.0,
    "loss_agg": "token-mean (TRL loss_type=dapo)",
    "updates_per_batch": 1,
    "dtype": "float32",
    "trl_torch_threads": 2,
}


# =============================================================================== TRL worker
def trl_worker(args: argparse.Namespace) -> int:
    """Runs in its own process: train with TRL's GRPOTrainer, save, write timings as JSON."""
    t_proc = time.time()
    os.environ.setdefault("OMP_NUM_THREADS", str(MATCHED["trl_torch_threads"]))
    try:
        import trl
        from trl import GRPOConfig, GRPOTrainer
    except ImportError as err:
        print(f"{INSTALL_HINT} ({err})", file=sys.stderr)
        return 2
    import dataclasses

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback

    from areal_graph.data.datasets import format_prompt, reference_answer
    from areal_graph.modelkit.builtin import resolve_dataset_path, resolve_model_path
    from areal_graph.nodes.math_reward import math_reward

    torch.set_num_threads(MATCHED["trl_torch_threads"])
    out = Path(args.trl_worker)
    out.mkdir(parents=True, exist_ok=True)
    model_dir = resolve_model_path(MATCHED["model"])
    tok = AutoTokenizer.from_pretrained(str(model_dir))
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)

    from datasets import Dataset

    rows = [
        json.loads(line)
        for line in Path(resolve_dataset_path(MATCHED["train_data"])).read_text().splitlines()
        if line.strip()
    ]
    dataset = Dataset.from_list(
        [
            {"prompt": [{"role": "user", "content": r["question"]}], "answer": reference_answer(r["answer"])}
            for r in rows
        ]
    )

    def arith_reward(prompts, completions, answer, **kwargs):  # TRL's reward-function signature
        return [math_reward(c[0]["content"] if isinstance(c, list) else c, a) for c, a in zip(completions, answer)]

    ckpt_field = {f.name for f in dataclasses.fields(GRPOConfig)}
    checkpointing = (
        {"activation_checkpointing": False}
        if "activation_checkpointing" in ckpt_field
        else {"gradient_checkpointing": False}
    )
    config = GRPOConfig(
        output_dir=str(out / "trainer"),
        use_cpu=True,
        bf16=False,
        fp16=False,
        **checkpointing,
        max_steps=args.steps,
        seed=args.seed,
        learning_rate=MATCHED["lr"],
        lr_scheduler_type="constant",
        warmup_steps=0,
        weight_decay=MATCHED["weight_decay"],
        max_grad_norm=MATCHED["grad_clip"],
        optim="adamw_torch",
        per_device_train_batch_size=MATCHED["batch_size"],
        gradient_accumulation_steps=1,
        num_generations=MATCHED["answers_per_prompt"],
        num_iterations=1,
        max_completion_length=MATCHED["max_new_tokens"],
        temperature=MATCHED["temperature"],
        top_p=MATCHED["top_p"],
        top_k=0,
        beta=MATCHED["kl_coef"],
        epsilon=MATCHED["clip_eps"],
        loss_type="dapo",
        scale_rewards="group",
        save_strategy="no",
        eval_strategy="no",
        report_to="none",
    )
    if config.gradient_checkpointing or config.bf16 or config.steps_per_generation != 1:
        raise RuntimeError(
            f"TRL config not as matched: gradient_checkpointing={config.gradient_checkpointing}, "
            f"bf16={config.bf16}, steps_per_generation={config.steps_per_generation}"
        )

    class Timing(TrainerCallback):
        def __init__(self) -> None:
            self.begin: list[float] = []
            self.end: list[float] = []
            self.train_begin: float | None = None
            self.cpu_begin: list[float] = []
            self.cpu_end: list[float] = []
            self.logs: list[dict] = []

        def on_train_begin(self, a, state, control, **kw):
            self.train_begin = time.time()
            self.threads = torch.get_num_threads()

        def on_step_begin(self, a, state, control, **kw):
            self.begin.append(time.perf_counter())
            self.cpu_begin.append(time.process_time())

        def on_step_end(self, a, state, control, **kw):
            self.end.append(time.perf_counter())
            self.cpu_end.append(time.process_time())

        def on_log(self, a, state, control, logs=None, **kw):
            if logs:
                self.logs.append(
                    {"step": state.global_step, **{k: v for k, v in logs.items() if isinstance(v, (int, float))}}
                )

    timing = Timing()
    gen_s: list[float] = []
    gen_score_s: list[float] = []
    id_check: dict[str, Any] = {}

    class TimedGRPOTrainer(GRPOTrainer):
        """GRPOTrainer with per-step generate / generate+score timings and a check of the
        prompt ids it really generates from (private hooks: skipped if TRL renames them)."""

        if hasattr(GRPOTrainer, "_tokenize_prompts"):

            def _tokenize_prompts(self, prompts):
                result = super()._tokenize_prompts(prompts)
                if not id_check:
                    want = [
                        tok(format_prompt(tok, p[0]["content"]), add_special_tokens=False).input_ids for p in prompts
                    ]
                    got = [list(map(int, ids)) for ids in result[0]]
                    id_check.update(checked=len(prompts), mismatches=sum(g != w for g, w in zip(got, want)))
                    if id_check["mismatches"]:
                        i = next(k for k, (g, w) in enumerate(zip(got, want)) if g != w)
                        raise RuntimeError(
                            f"TRL's prompt ids differ from areal-graph's for {prompts[i]!r}:\n"
                            f"  trl:         {got[i]}\n  areal-graph: {want[i]}"
                        )
                return result

        if hasattr(GRPOTrainer, "_generate_single_turn"):

            def _generate_single_turn(self, *a, **kw):
                t0 = time.perf_counter()
                result = super()._generate_single_turn(*a, **kw)
                gen_s.append(time.perf_counter() - t0)
                return result

        if hasattr(GRPOTrainer, "_generate_and_score_completions"):

            def _generate_and_score_completions(self, *a, **kw):
                t0 = time.perf_counter()
                result = super()._generate_and_score_completions(*a, **kw)
                if self.model.training:
                    gen_score_s.append(time.perf_counter() - t0)
                return result

    math_reward("\\boxed{1}", "1")  # math-verify builds its parsers on first use (areal-graph warms its pool too)
    trainer = TimedGRPOTrainer(
        model=model,
        reward_funcs=[arith_reward],
        args=config,
        train_dataset=dataset,
        processing_class=tok,
        callbacks=[timing],
    )
    trainer.train()
    t_save = time.perf_counter()
    final = out / "final_model"
    trainer.model.save_pretrained(str(final))
    tok.save_pretrained(str(final))
    save_s = time.perf_counter() - t_save

    n = min(len(timing.begin), len(timing.end))
    step_s = [timing.end[i] - timing.begin[i] for i in range(n)]
    median_step = statistics.median(step_s) if n else 0.0
    result = {
        "trl_version": trl.__version__,
        "steps": n,
        "window_s": timing.end[n - 1] - timing.begin[0] if n else None,
        "window_median_step_s": statistics.median(step_s) * n if n else None,
        "startup_s": (timing.train_begin or t_proc) - t_proc,
        "torch_threads": getattr(timing, "threads", None),
        "save_s": save_s,
        "final_model": str(final),
        "step_s": step_s,
        "step_cpu_s": [timing.cpu_end[i] - timing.cpu_begin[i] for i in range(n)],
        "generate_s": gen_s[:n] if len(gen_s) >= n else None,
        "gen_score_s": gen_score_s[:n] if len(gen_score_s) >= n else None,
        "id_check_in_trainer": id_check or None,
        "logs": timing.logs,
    }
    # steps over 3x the median: on a shared 2-core machine these are mostly OpenMP spin-waits (see --omp-passive)
    result["slow_steps"] = sum(x > 3 * median_step for x in step_s)
    result["slow_steps_excess_s"] = sum(x - median_step for x in step_s if x > 3 * median_step)
    if result["gen_score_s"] is not None:
        result["train_s"] = [s - g for s, g in zip(step_s, result["gen_score_s"])]
    rewards = [entry["reward"] for entry in timing.logs if "reward" in entry]
    result["reward_last_log"] = rewards[-1] if rewards else None
    (out / "trl_result.json").write_text(json.dumps(result))
    return 0


# =============================================================================== driver side
def check_prompt_ids() -> dict:
    """TRL's conversational tokenisation == areal-graph's prompt ids, for every training prompt."""
    from transformers import AutoTokenizer

    from areal_graph.data.datasets import load_prompts
    from areal_graph.modelkit.builtin import resolve_dataset_path, resolve_model_path

    t0 = time.perf_counter()
    tok = AutoTokenizer.from_pretrained(str(resolve_model_path(MATCHED["model"])))
    path = resolve_dataset_path(MATCHED["train_data"])
    rows = [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
    prompts, report = load_prompts(path, tok)
    if len(prompts) != len(rows):
        raise SystemExit(
            f"token-id check: areal-graph loaded {len(prompts)} of {len(rows)} rows ({report}); "
            "the two sides would not see the same prompts"
        )
    mismatches, first = 0, None
    for lo in range(0, len(rows), 1000):
        convs = [[{"role": "user", "content": r["question"]}] for r in rows[lo : lo + 1000]]
        # the call GRPOTrainer._tokenize_prompts makes for conversational prompts
        ids = tok.apply_chat_template(conversation=convs, add_generation_prompt=True, tokenize=True, return_dict=True)[
            "input_ids"
        ]
        for j, got in enumerate(ids):
            want = prompts[lo + j].input_ids
            if list(got) != list(want):
                mismatches += 1
                if first is None:
                    first = (rows[lo + j]["question"], list(got), list(want))
    if mismatches:
        q, got, want = first
        raise SystemExit(
            f"token-id check FAILED: {mismatches} of {len(rows)} prompts tokenise differently "
            f"for TRL (conversational) and areal-graph; first: {q!r}\n  trl: {got}\n  areal-graph: {want}"
        )
    return {"prompts_checked": len(rows), "mismatches": 0, "seconds": time.perf_counter() - t0}


def _tail(path: Path, n: int = 3000) -> str:
    try:
        return path.read_text(errors="replace")[-n:]
    except OSError:
        return ""


def _run(cmd: list[str], log_path: Path, env: dict | None = None, cwd: Path | None = None) -> tuple[int, float, float]:
    """Run a process to its end with output to `log_path`: (exit code, wall s, CPU s of its process tree).

    The CPU time is user + system of every descendant that was waited for (rusage of children),
    a check on the wall times of a shared machine: another tenant's load stretches wall time
    but not the CPU a run needed."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    with open(log_path, "w") as log:
        rc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=cwd).returncode
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return rc, wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def run_eval(model_dir: Path, out_json: Path, limit: int | None, log_path: Path) -> dict:
    cmd = [
        sys.executable,
        "-m",
        "areal_graph.cli.main",
        "eval",
        str(model_dir),
        "--data",
        MATCHED["eval_data"],
        "--json",
        str(out_json),
        "--show",
        "0",
    ]
    if limit:
        cmd += ["--limit", str(limit)]
    rc, _, _ = _run(cmd, log_path, cwd=ROOT)
    if rc != 0:
        raise RuntimeError(f"eval of {model_dir} failed ({rc}):\n{_tail(log_path)}")
    res = json.loads(out_json.read_text())
    return {"greedy_accuracy": res["greedy_accuracy"], "eval_problems": res["prompts"]}


def run_trl(run_dir: Path, steps: int, seed: int) -> dict:
    run_dir.mkdir(parents=True, exist_ok=True)
    env = dict(
        os.environ,
        OMP_NUM_THREADS=str(MATCHED["trl_torch_threads"]),
        MKL_NUM_THREADS=str(MATCHED["trl_torch_threads"]),
        TOKENIZERS_PARALLELISM="false",
    )
    cmd = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--trl-worker",
        str(run_dir),
        "--steps",
        str(steps),
        "--seed",
        str(seed),
    ]
    log_path = run_dir / "trl.log"
    load = os.getloadavg()[0]
    rc, total, cpu = _run(cmd, log_path, env=env, cwd=ROOT)
    if rc != 0:
        raise RuntimeError(f"TRL run failed ({rc}):\n{_tail(log_path)}")
    res = json.loads((run_dir / "trl_result.json").read_text())
    res.update(total_s=total, total_cpu_s=cpu, loadavg_1min_at_start=load)
    res["model_dir"] = res.pop("final_model")
    return res


def areal_window(metrics: list[dict]) -> dict:
    """The N-step window from metrics.jsonl (see the module docstring)."""
    steps = sorted((m for m in metrics if "time/step" in m), key=lambda m: m["step"])
    if not steps:
        raise RuntimeError("metrics.jsonl has no step lines")
    first, last = steps[0], steps[-1]
    excl = last["time"] - first["time"] + first["time/step"]
    step_s = [first["time/step"] + float(first.get("time/wait_batch", 0.0))]
    step_s += [b["time"] - a["time"] for a, b in zip(steps, steps[1:])]
    sums = {}
    for key in sorted({k for m in steps for k in m if k.startswith("time/")}):
        sums[key] = sum(float(m.get(key, 0.0)) for m in steps)
    return {
        "steps": len(steps),
        "window_s": excl + float(first.get("time/wait_batch", 0.0)),
        "window_excl_first_wait_s": excl,
        "window_median_step_s": statistics.median(step_s) * len(step_s),
        "step_s": step_s,
        "time_sums_s": sums,
        "reward_mean_last10": sum(m.get("reward/mean", 0.0) for m in steps[-10:]) / len(steps[-10:]),
        "staleness_mean": sum(m.get("staleness/mean", 0.0) for m in steps) / len(steps),
    }


def run_areal(tree: Path, workflow: str, run_dir: Path, steps: int, seed: int, pythonpath: str | None) -> dict:
    overrides = [f"runtime.steps={steps}", "runtime.eval_every=0", "runtime.save_every=0", f"runtime.seed={seed}"]
    cmd = [
        sys.executable,
        "-m",
        "areal_graph.cli.main",
        "run",
        str(tree / "workflows" / f"{workflow}.yaml"),
        *overrides,
        "--run-dir",
        str(run_dir),
    ]
    env = dict(os.environ)
    if pythonpath:
        env["PYTHONPATH"] = os.pathsep.join([pythonpath] + [p for p in [env.get("PYTHONPATH")] if p])
    log_path = run_dir.parent / f"{run_dir.name}.log"
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    load = os.getloadavg()[0]
    rc, total, cpu = _run(cmd, log_path, env=env, cwd=tree)
    if rc != 0:
        raise RuntimeError(f"areal-graph run {workflow} failed ({rc}):\n{_tail(log_path)}")
    from areal_graph.runtime.observability.run_dir import METRICS_FILENAME, read_metrics_file

    metrics = read_metrics_file(run_dir / METRICS_FILENAME).records
    res = areal_window(metrics)
    res.update(
        total_s=total,
        total_cpu_s=cpu,
        loadavg_1min_at_start=load,
        overrides=overrides,
        model_dir=str(run_dir / "final_model"),
    )
    return res


def baseline_pythonpath(tree: Path) -> str:
    """PYTHONPATH that makes `import areal_graph` resolve into `tree`; fails loudly otherwise."""
    if tree.name != "areal_graph":
        raise SystemExit(
            f"--baseline-tree {tree}: the directory must be named areal_graph (its parent goes on "
            "PYTHONPATH so that `import areal_graph` finds it)"
        )
    if not (tree / "__init__.py").exists() or not (tree / "workflows").is_dir():
        raise SystemExit(f"--baseline-tree {tree}: not an areal-graph checkout (no __init__.py or workflows/)")
    pp = str(tree.parent)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([pp] + [p for p in [os.environ.get("PYTHONPATH")] if p]))
    where = subprocess.run(
        [sys.executable, "-c", "import areal_graph, os; print(os.path.realpath(areal_graph.__file__))"],
        capture_output=True,
        text=True,
        env=env,
        cwd=tree.parent,
    )
    got = Path(where.stdout.strip()) if where.returncode == 0 else None
    if got is None or got.parent != tree.resolve():
        raise SystemExit(
            f"--baseline-tree {tree}: with PYTHONPATH={pp}, `import areal_graph` resolves to "
            f"{got or where.stderr.strip()[-500:]}, not into {tree}"
        )
    return pp


def git_commit(path: Path) -> str | None:
    try:
        out = subprocess.run(
            ["git", "-C", str(path), "describe", "--always", "--dirty", "--abbrev=12"],
            capture_output=True,
            text=True,
            timeout=10,
        )
        return out.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def _stats(values: list[float]) -> dict | None:
    values = [v for v in values if v is not None]
    if not values:
        return None
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "n": len(values)}


def summarise(rounds: list[dict], systems: list[str]) -> dict:
    summary: dict[str, Any] = {"systems": {}, "ratios": {}}
    for s in systems:
        ok = [r["runs"][s] for r in rounds if s in r["runs"] and "error" not in r["runs"][s]]
        summary["systems"][s] = {
            "runs_ok": len(ok),
            "runs": sum(s in r["runs"] for r in rounds),
            "window_s": _stats([x.get("window_s") for x in ok]),
            "total_s": _stats([x.get("total_s") for x in ok]),
            "total_cpu_s": _stats([x.get("total_cpu_s") for x in ok]),
            "window_median_step_s": _stats([x.get("window_median_step_s") for x in ok]),
            "window_s_per_step": _stats(
                [x["window_s"] / x["steps"] for x in ok if x.get("window_s") and x.get("steps")]
            ),
            "greedy_accuracy": _stats([x.get("greedy_accuracy") for x in ok]),
        }
        if s == TRL_SYSTEM:
            summary["systems"][s]["generate_s_per_step"] = _stats(
                [statistics.mean(x["generate_s"]) for x in ok if x.get("generate_s")]
            )
            summary["systems"][s]["train_s_per_step"] = _stats(
                [statistics.mean(x["train_s"]) for x in ok if x.get("train_s")]
            )

    def ratio(num: str, den: str, key: str) -> list[float]:
        out = []
        for r in rounds:
            a, b = r["runs"].get(num, {}), r["runs"].get(den, {})
            if a.get(key) and b.get(key) and "error" not in a and "error" not in b:
                out.append(a[key] / b[key])
        return out

    pairs = [(TRL_SYSTEM, s) for s in systems if s != TRL_SYSTEM]
    pairs += [(b, c) for (b, _), (c, _) in zip(SYSTEMS_BASELINE, SYSTEMS_CURRENT) if b in systems]
    for num, den in pairs:
        for key in ("window_s", "total_s", "window_median_step_s"):
            per_round = ratio(num, den, key)
            summary["ratios"][f"{num} / {den} ({key})"] = {"per_round": per_round, **(_stats(per_round) or {})}
    return summary


def print_table(console, summary: dict, systems: list[str], steps: int, rounds: int) -> None:
    from rich.table import Table

    def fmt(st: dict | None, f: str = "{:.1f}", pct: bool = False) -> str:
        if not st:
            return "-"
        conv = (lambda v: f"{100 * v:.1f}%") if pct else (lambda v: f.format(v))
        return conv(st["median"]) if st["n"] == 1 else f"{conv(st['median'])} [{conv(st['min'])}-{conv(st['max'])}]"

    table = Table(
        title=f"TRL GRPOTrainer vs areal-graph: {steps} steps, {rounds} interleaved round(s); "
        "median \\[min-max]; ratios within a round"
    )
    for col in (
        "system",
        "ok",
        "window s",
        "s/step",
        "median step x N",
        "total s",
        "CPU s",
        "TRL/this window",
        "TRL/this med.step",
        "TRL/this total",
        "greedy acc",
    ):
        table.add_column(col, justify="right", no_wrap=(col == "system"))
    for s in systems:
        st = summary["systems"][s]
        rw = summary["ratios"].get(f"{TRL_SYSTEM} / {s} (window_s)")
        rt = summary["ratios"].get(f"{TRL_SYSTEM} / {s} (total_s)")
        rm = summary["ratios"].get(f"{TRL_SYSTEM} / {s} (window_median_step_s)")
        table.add_row(
            s,
            f"{st['runs_ok']}/{st['runs']}",
            fmt(st["window_s"]),
            fmt(st["window_s_per_step"], "{:.3f}"),
            fmt(st["window_median_step_s"]),
            fmt(st["total_s"]),
            fmt(st["total_cpu_s"], "{:.0f}"),
            fmt(rw if rw and rw.get("n") else None, "{:.2f}x"),
            fmt(rm if rm and rm.get("n") else None, "{:.2f}x"),
            fmt(rt if rt and rt.get("n") else None, "{:.2f}x"),
            fmt(st["greedy_accuracy"], pct=True),
        )
    console.print(table)
    trl = summary["systems"].get(TRL_SYSTEM, {})
    if trl.get("generate_s_per_step"):
        console.print(
            f"TRL per step (median of round means): generate {trl['generate_s_per_step']['median']:.3f} s, "
            f"train (step - generate/score) {trl['train_s_per_step']['median']:.3f} s"
        )
    for key, val in summary["ratios"].items():
        if key.startswith("areal-graph@baseline") and val.get("n"):  # > 1: this checkout is faster
            console.print(
                f"{key} (> 1: this checkout faster): median {val['median']:.2f}x, per round "
                + ", ".join(f"{v:.2f}" for v in val["per_round"])
            )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=4, help="interleaved rounds (default 4)")
    ap.add_argument("--steps", type=int, default=200, help="training steps per run (default 200)")
    ap.add_argument("--quick", action="store_true", help="5 steps, 1 round, eval on 50 problems: checks that it works")
    ap.add_argument(
        "--eval-limit", type=int, default=None, help="evaluate on the first K test problems (default all 500)"
    )
    ap.add_argument(
        "--baseline-tree",
        type=Path,
        default=None,
        help="an older areal-graph package directory (named areal_graph; its parent goes on PYTHONPATH): "
        "adds rows areal-graph@baseline async/sync",
    )
    ap.add_argument(
        "--work-dir", type=Path, default=None, help="keep run directories here (default: a temp dir, removed)"
    )
    ap.add_argument("--out", type=Path, default=None, help="JSON path (default benchmarks/results/vs_trl[_quick].json)")
    ap.add_argument("--seed", type=int, default=1, help="seed of round 0; round r uses seed + r (default 1)")
    ap.add_argument(
        "--omp-passive",
        action="store_true",
        help="run every process with OMP_WAIT_POLICY=PASSIVE (no OpenMP spin-waiting; see the docstring)",
    )
    ap.add_argument("--trl-worker", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)

    if args.trl_worker:
        return trl_worker(args)
    if importlib.util.find_spec("trl") is None:
        print(INSTALL_HINT, file=sys.stderr)
        return 2
    if args.quick:
        args.steps, args.rounds = 5, 1
        args.eval_limit = args.eval_limit or 50
    if args.steps < 1 or args.rounds < 1:
        ap.error("--steps and --rounds must be >= 1")

    if args.omp_passive:
        os.environ["OMP_WAIT_POLICY"] = "PASSIVE"  # inherited by every run, its workers and the evals
    from rich.console import Console

    console = Console() if sys.stdout.isatty() else Console(width=200)  # a pipe or log file: no wrapping
    baseline_pp = None
    systems = [TRL_SYSTEM] + [s for s, _ in SYSTEMS_CURRENT]
    if args.baseline_tree is not None:
        args.baseline_tree = args.baseline_tree.resolve()
        baseline_pp = baseline_pythonpath(args.baseline_tree)
        systems += [s for s, _ in SYSTEMS_BASELINE]
    workflow_of = dict(SYSTEMS_CURRENT + SYSTEMS_BASELINE)

    console.print("checking that TRL's conversational prompts tokenise to areal-graph's ids ...")
    id_check = check_prompt_ids()
    console.print(f"  identical for all {id_check['prompts_checked']} training prompts ({id_check['seconds']:.1f} s)")

    import torch
    import transformers
    import trl

    versions = {
        "trl": trl.__version__,
        "transformers": transformers.__version__,
        "torch": torch.__version__,
        "python": platform.python_version(),
        "areal_graph": git_commit(ROOT),
        "areal_graph_baseline": git_commit(args.baseline_tree) if args.baseline_tree else None,
        "cpu_count": os.cpu_count(),
    }
    for name in ("accelerate", "datasets"):
        try:
            versions[name] = __import__(name).__version__
        except ImportError:
            pass

    out_path = args.out or RESULTS / ("vs_trl_quick.json" if args.quick else "vs_trl.json")
    settings = {
        "steps": args.steps,
        "rounds": args.rounds,
        "eval_limit": args.eval_limit,
        "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"),
        "seeds": [args.seed + r for r in range(args.rounds)],
        "systems": systems,
        "matched": MATCHED,
        "areal_overrides": ["runtime.steps=N", "runtime.eval_every=0", "runtime.save_every=0", "runtime.seed=S"],
        "baseline_tree": str(args.baseline_tree) if args.baseline_tree else None,
        "window": "TRL: on_step_begin(step 1) -> on_step_end(step N); areal-graph: "
        "time(N) - time(1) + time/step(1) + time/wait_batch(1) from metrics.jsonl",
    }
    work = args.work_dir or Path(tempfile.mkdtemp(prefix="areal-vs-trl-"))
    work.mkdir(parents=True, exist_ok=True)
    rounds: list[dict] = []
    failures = 0

    def write_json() -> None:
        out_path.parent.mkdir(parents=True, exist_ok=True)
        out_path.write_text(
            json.dumps(
                {
                    "settings": settings,
                    "versions": versions,
                    "token_id_check": id_check,
                    "rounds": rounds,
                    "summary": summarise(rounds, systems),
                },
                indent=2,
            )
            + "\n"
        )

    t_all = time.perf_counter()
    try:
        for r in range(args.rounds):
            seed = args.seed + r
            order = systems[r % len(systems) :] + systems[: r % len(systems)]
            rec: dict[str, Any] = {"round": r, "seed": seed, "order": order, "runs": {}}
            rounds.append(rec)
            for s in order:
                run_dir = work / f"r{r}" / s.replace(" ", "_").replace("@", "-")
                console.print(f"[bold]round {r + 1}/{args.rounds}[/] {s} (seed {seed}) ...", highlight=False)
                try:
                    if s == TRL_SYSTEM:
                        res = run_trl(run_dir, args.steps, seed)
                    elif s.startswith("areal-graph@baseline"):
                        res = run_areal(args.baseline_tree, workflow_of[s], run_dir, args.steps, seed, baseline_pp)
                    else:
                        res = run_areal(ROOT, workflow_of[s], run_dir, args.steps, seed, None)
                    res.update(
                        run_eval(
                            Path(res["model_dir"]),
                            run_dir.parent / f"{run_dir.name}.eval.json",
                            args.eval_limit,
                            run_dir.parent / f"{run_dir.name}.eval.log",
                        )
                    )
                except Exception as exc:  # noqa: BLE001 - record, go on with the other systems
                    failures += 1
                    res = {"error": str(exc)}
                    console.print(f"  [red]failed:[/] {str(exc)[-2000:]}", highlight=False)
                else:
                    extra = ""
                    if res.get("generate_s"):
                        extra = (
                            f", generate {statistics.mean(res['generate_s']):.3f} s/step"
                            f", train {statistics.mean(res['train_s']):.3f} s/step"
                        )
                    console.print(
                        f"  window {res['window_s']:.1f} s, total {res['total_s']:.1f} s, "
                        f"greedy acc {res['greedy_accuracy']:.1%} ({res['eval_problems']} problems){extra}",
                        highlight=False,
                    )
                res.pop("model_dir", None)
                rec["runs"][s] = res
                write_json()
    finally:
        if args.work_dir is None:
            shutil.rmtree(work, ignore_errors=True)

    settings["benchmark_wall_s"] = time.perf_counter() - t_all
    write_json()
    print_table(console, summarise(rounds, systems), systems, args.steps, args.rounds)
    console.print(f"wrote {out_path}" + (f" ({failures} run(s) failed)" if failures else ""))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
