"""Embedded engine (continuous batching) vs HF `generate` with static batches, and pause latency.

Workload: a long-tailed request mix (output lengths lognormal, set per request through
max_new_tokens with ignore_eos), prompts of 16-64 tokens, all arriving at t=0. The static
baseline takes batches of 64 in arrival order and runs each until its longest request is
done (what a non-continuous server does); both sides count only the tokens each request
asked for. Greedy decoding, fp32, same thread count, same random Qwen2 (hidden 256,
4 layers, vocab 1024, ~3.2M parameters).

Second measurement: with 64 requests in flight, how long `pause()` takes to return (the
step boundary), and a full interruption - pause, swap weights, resume - until every
request has produced a token with the new weights (the re-prefill of all 64).

    python benchmarks/bench_generation.py               # 256 requests
    python benchmarks/bench_generation.py --repeats 2   # interleaved repeats, best of each
    python benchmarks/bench_generation.py --quick       # 128 requests, about a minute

Prints a table and writes benchmarks/results/generation[_quick].json. The wall-time ratio
is the headline; the CPU-time ratio is printed too because on a shared machine another
tenant's load can hit one side of the comparison and not the other.

`--rl-step`: the workload an RL training step gives the engine (see bench_rl_step.py): the
builtin kit's model and prompts, 4 prompts x 8 answers submitted at once, temperature 1,
64 new tokens at most, vs HF `generate` on the same 32 left-padded prompts (what TRL's
GRPOTrainer does), interleaved round by round at 1 and at 2 torch threads.

    python benchmarks/bench_generation.py --rl-step              # 20 rounds per thread count
    python benchmarks/bench_generation.py --rl-step --ablate     # + engine without lean forward / sharing

It prints a table and writes benchmarks/results/generation_rl_step.json.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import time
from pathlib import Path

import torch
from rich.console import Console
from rich.table import Table

from areal_graph.engines.inference.engine import EmbeddedEngine
from areal_graph.engines.inference.sampling import SamplingParams

RESULTS = Path(__file__).resolve().parent / "results"


def build_model(seed: int = 0):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    cfg = Qwen2Config(
        vocab_size=1024,
        hidden_size=256,
        intermediate_size=704,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=2048,
        tie_word_embeddings=True,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
    )
    return Qwen2ForCausalLM(cfg).eval()


def workload(n: int, seed: int, median_out: int, sigma: float, max_out: int) -> list[tuple[list[int], int]]:
    g = torch.Generator().manual_seed(seed)
    reqs = []
    for _ in range(n):
        plen = int(torch.randint(16, 65, (1,), generator=g))
        prompt = torch.randint(3, 1024, (plen,), generator=g).tolist()
        z = float(torch.randn(1, generator=g))
        out = int(min(max_out, max(4, round(median_out * math.exp(sigma * z)))))
        reqs.append((prompt, out))
    return reqs


def _sync(device: torch.device) -> None:
    """Wait for queued GPU work, so wall time covers it (a no-op on the CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def run_hf_static(model, reqs, batch: int) -> tuple[float, float, int]:
    """Serve `reqs` with HF generate in static batches of `batch` (left-padded).

    Returns (wall s, CPU s of this process, decoded rows x steps incl. the padding of rows
    already done).
    """
    computed = 0
    c0, t0 = time.process_time(), time.perf_counter()
    with torch.inference_mode():
        for i in range(0, len(reqs), batch):
            chunk = reqs[i : i + batch]
            width = max(len(p) for p, _ in chunk)
            ids = torch.zeros(len(chunk), width, dtype=torch.long)
            mask = torch.zeros(len(chunk), width, dtype=torch.long)
            for j, (p, _) in enumerate(chunk):
                ids[j, width - len(p) :] = torch.tensor(p)
                mask[j, width - len(p) :] = 1
            longest = max(n for _, n in chunk)
            model.generate(
                input_ids=ids.to(model.device),
                attention_mask=mask.to(model.device),
                max_new_tokens=longest,
                min_new_tokens=longest,
                do_sample=False,
                pad_token_id=0,
            )
            _sync(model.device)
            computed += longest * len(chunk)
    return time.perf_counter() - t0, time.process_time() - c0, computed


def run_engine(model, reqs, max_running: int) -> tuple[float, float, int]:
    """Serve `reqs` with the engine; returns (wall s, CPU s of this process, decode steps)."""
    with EmbeddedEngine(model=model, device=model.device, max_running=max_running, max_queue=len(reqs)) as eng:
        steps0 = eng.stats()["steps"]
        c0, t0 = time.process_time(), time.perf_counter()
        futs = [eng.submit(p, SamplingParams(max_new_tokens=n, greedy=True, ignore_eos=True)) for p, n in reqs]
        results = [f.result() for f in futs]
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        steps = eng.stats()["steps"] - steps0
    produced = sum(len(r.output_ids) for r in results)
    assert produced == sum(n for _, n in reqs), "engine lost or added tokens"
    return wall, cpu, steps


def run_pause_latency(model, other_state, repeats: int) -> dict:
    """Pause latency and full interrupt (pause, swap, resume, first new-version token) with 64 in flight.

    The interrupt cycle is dominated by re-prefilling every in-flight request (prompt +
    tokens so far) with the new weights, so the tokens re-prefilled are reported with it.
    """
    pause_ms, cycle_ms, reprefill = [], [], []
    prompts = workload(64, seed=99, median_out=32, sigma=0.0, max_out=64)
    with EmbeddedEngine(model=model, device=model.device, max_running=64) as eng:
        futs = [
            eng.submit(p, SamplingParams(max_new_tokens=1500, greedy=True, ignore_eos=True), rid=f"p{i}")
            for i, (p, _) in enumerate(prompts)
        ]
        for r in range(repeats):
            time.sleep(0.3)  # let decoding run
            t0 = time.perf_counter()
            eng.pause()
            t1 = time.perf_counter()
            reprefill.append(sum(len(r.prompt) + len(r.output_ids) for r in eng._running + eng._pending))
            eng.update_weights_from_state_dict(other_state if r % 2 == 0 else model.state_dict(), eng.version + 1)
            target = eng.version
            steps = eng.stats()["steps"]
            eng.resume()
            while eng.stats()["steps"] <= steps:  # the first step after resume re-prefills all 64
                time.sleep(0.0005)
            t2 = time.perf_counter()
            pause_ms.append((t1 - t0) * 1e3)
            cycle_ms.append((t2 - t0) * 1e3)
            assert eng.version == target
        eng.abort_all()
        results = [f.result() for f in futs]
    assert all(r.output_versions == sorted(r.output_versions) for r in results)
    return {
        "pause_ms_median": statistics.median(pause_ms),
        "pause_ms_max": max(pause_ms),
        "interrupt_cycle_ms_median": statistics.median(cycle_ms),
        "interrupt_cycle_ms_max": max(cycle_ms),
        "reprefill_tokens_median": statistics.median(reprefill),
        "interrupt_repeats": repeats,
        "in_flight": 64,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--quick",
        action="store_true",
        help="128 requests (two static batches), outputs <= 256, 3 interrupt repeats (about a minute)",
    )
    ap.add_argument("--requests", type=int, default=256)
    ap.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch threads for both sides (default 1: on a shared 2-core box, 2 OpenMP threads "
        "spin against other processes and every matmul slows by 10-20x)",
    )
    ap.add_argument(
        "--repeats", type=int, default=1, help="interleaved HF/engine repeats; the best of each side is reported"
    )
    ap.add_argument("--device", default="cpu", help="torch device for both sides, e.g. cuda (default cpu)")
    ap.add_argument("--median-out", type=int, default=64)
    ap.add_argument("--sigma", type=float, default=0.8)
    ap.add_argument("--max-out", type=int, default=512)
    ap.add_argument("--rl-step", action="store_true", help="the RL-step workload instead (bench_rl_step.py)")
    ap.add_argument("--rounds", type=int, default=20, help="--rl-step: timed rounds per thread count")
    ap.add_argument("--thread-counts", default="1,2", help="--rl-step: torch thread counts to compare")
    ap.add_argument(
        "--ablate",
        action="store_true",
        help="--rl-step: also time the engine without the lean forward and without prefix sharing",
    )
    args = ap.parse_args()
    if args.rl_step:
        from bench_rl_step import main_rl_step

        return main_rl_step(args, RESULTS)
    n = 128 if args.quick else args.requests
    if args.quick:
        args.max_out = min(args.max_out, 256)
    torch.set_num_threads(args.threads)
    model = build_model(0).to(args.device)
    reqs = workload(n, seed=0, median_out=args.median_out, sigma=args.sigma, max_out=args.max_out)
    useful = sum(o for _, o in reqs)
    console = Console()
    console.print(
        f"{n} requests, {useful} output tokens (median {statistics.median(o for _, o in reqs)}, "
        f"max {max(o for _, o in reqs)}), {args.device}, {args.threads} thread(s), {args.repeats} repeat(s)"
    )

    run_engine(model, reqs[:8], 64)  # warm-up
    hf, eng = [], []
    for _ in range(args.repeats):  # interleaved, so a burst of load from other tenants hits both sides
        hf.append(run_hf_static(model, reqs, 64))
        eng.append(run_engine(model, reqs, 64))
    hf_s, hf_cpu, hf_computed = min(hf)
    eng_s, eng_cpu, eng_steps = min(eng)
    latency = run_pause_latency(model, build_model(1).state_dict(), 3 if args.quick else 8)

    res = {
        "requests": n,
        "output_tokens": useful,
        "threads": args.threads,
        "device": args.device,
        "quick": args.quick,
        "median_out": args.median_out,
        "sigma": args.sigma,
        "max_out": args.max_out,
        "repeats": args.repeats,
        "hf_static_s": hf_s,
        "hf_static_tok_s": useful / hf_s,
        "hf_static_cpu_s": hf_cpu,
        "hf_static_decoded_rows": hf_computed,
        "hf_static_useful_fraction": useful / hf_computed,
        "engine_s": eng_s,
        "engine_tok_s": useful / eng_s,
        "engine_cpu_s": eng_cpu,
        "engine_steps": eng_steps,
        "speedup": hf_s / eng_s,
        "speedup_cpu_time": hf_cpu / eng_cpu,
        "speedup_per_repeat": [h[0] / e[0] for h, e in zip(hf, eng)],
        **latency,
    }
    table = Table(title="generation: embedded engine vs HF generate (static batches of 64)")
    table.add_column("measure")
    table.add_column("value", justify="right")
    table.add_row("HF generate, static batches: tok/s", f"{res['hf_static_tok_s']:.0f}")
    table.add_row("  useful share of its decoded rows", f"{res['hf_static_useful_fraction']:.0%}")
    table.add_row("embedded engine, continuous: tok/s", f"{res['engine_tok_s']:.0f}")
    table.add_row("speed-up, wall time (same run)", f"{res['speedup']:.2f}x")
    table.add_row("speed-up, CPU time (less sensitive to other tenants)", f"{res['speedup_cpu_time']:.2f}x")
    if args.repeats > 1:
        table.add_row("speed-up per repeat", " ".join(f"{x:.2f}x" for x in res["speedup_per_repeat"]))
    table.add_row(
        "pause() latency, 64 in flight: median / max ms", f"{res['pause_ms_median']:.1f} / {res['pause_ms_max']:.1f}"
    )
    table.add_row(
        "pause+swap+resume to first new token: median / max ms",
        f"{res['interrupt_cycle_ms_median']:.0f} / {res['interrupt_cycle_ms_max']:.0f}",
    )
    table.add_row("  tokens re-prefilled per interrupt (median)", f"{res['reprefill_tokens_median']:.0f}")
    console.print(table)
    RESULTS.mkdir(parents=True, exist_ok=True)
    suffix = ("_quick" if args.quick else "") + ("" if args.device == "cpu" else f"_{args.device.split(':')[0]}")
    out = RESULTS / f"generation{suffix}.json"
    out.write_text(json.dumps(res, indent=2))
    console.print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
