"""The engine and the trainer on one GPU, for a model of Qwen2-0.5B's shape (random weights).

Four parts, each a table and a section of the JSON (issue 23, items 2, 3 and 6):

- decode: tokens/s of the embedded engine at batch 1, 64 and 256 (bf16, greedy, prompts of
  128 tokens, 128 new tokens, ignore_eos), with CUDA graphs (engines/inference/cuda_graphs.py)
  and without, against HF `generate` on the same model and the
  bound the GPU's memory bandwidth sets. A decode step must read every weight once and each
  row's KV cache, so tokens/s <= B * bandwidth / (weight bytes + B * KV bytes per row); the
  bandwidth is measured here (a device-to-device copy). Decode time is the difference of
  two runs (128 and 2 new tokens), so prefill is left out. The GPU time of a step (kernels
  alone, from the profiler) against its wall time says how much is per-step overhead.
- speculative: the verifying step of speculative decoding against the plain decode step, alone,
  at batch 1, 64 and 256 with every row fed 1 + 1, 2 or 4 tokens (issue 46): the tokens a row
  must emit per verifying forward to break even (perfmodel/engine_probe.py `probe_verify`).
- train: one optimizer step over 32 x 512 tokens: lean forward fp32, lean forward and the HF
  forward in bf16 mixed precision (autocast; fp32 master weights), and FSDP2 on one rank in
  bf16 (MixedPrecisionPolicy): step time, tokens/s, model FLOP utilisation (6 N T against
  the card's dense bf16 peak) and peak memory.
- sync: new weights from the trainer (fp32, cuda:0) into the engine (bf16, cuda:0): through
  disk (safetensors, what `weight_sync: disk` does), through shared memory (what
  `weight_sync: memory` does between the two processes of a run), and CUDA tensor to CUDA
  tensor in one process (the floor: no host memory at all; the in-process transport,
  runtime/orchestration/weight_sync.py `InProcessWeightSync`).

    python benchmarks/bench_gpu.py --out DIR            # all parts (about 2 minutes on an H100)
    python benchmarks/bench_gpu.py --only decode,sync   # some of them
    python benchmarks/bench_gpu.py --quick              # a small model: checks the script runs

Writes DIR/gpu_bench.json (default benchmarks/results/). Needs CUDA.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from rich.console import Console
from rich.table import Table

from areal_graph.data.packed import PackedBatch
from areal_graph.engines import shared_weights
from areal_graph.engines.inference.engine import EmbeddedEngine
from areal_graph.engines.inference.sampling import SamplingParams
from areal_graph.engines.training.train_engine import TrainEngine
from areal_graph.runtime.orchestration.weight_sync import InProcessWeightSync

RESULTS = Path(__file__).resolve().parent / "results"
# Qwen2-0.5B's shape: 494M parameters, 136M of them the (tied) embedding
QWEN2_05B = dict(
    vocab_size=151_936,
    hidden_size=896,
    intermediate_size=4864,
    num_hidden_layers=24,
    num_attention_heads=14,
    num_key_value_heads=2,
    max_position_embeddings=4096,
    rope_theta=1_000_000.0,
    rms_norm_eps=1e-6,
    tie_word_embeddings=True,
)
QUICK = dict(
    QWEN2_05B,
    vocab_size=4096,
    hidden_size=128,
    intermediate_size=256,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
)
PEAK_BF16_TFLOPS = 989.0  # H100/H200 SXM dense bf16 (the vendor's figure)
console = Console()


def build_model(shape: dict, dtype: torch.dtype, device: str, seed: int = 0):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    cfg = Qwen2Config(**shape, bos_token_id=1, eos_token_id=2, pad_token_id=0)
    with torch.device(device):
        model = Qwen2ForCausalLM(cfg)
    return model.to(dtype).eval()


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    sync()
    t0 = time.perf_counter()
    out = fn()
    sync()
    return time.perf_counter() - t0, out


def copy_bandwidth(device: str) -> float:
    """Bytes/s of a device-to-device copy, counting bytes read and written."""
    if device != "cuda":
        return float("nan")
    x = torch.empty(1 << 30, dtype=torch.uint8, device=device)
    y = torch.empty_like(x)
    y.copy_(x)
    times = [timed(lambda: y.copy_(x))[0] for _ in range(5)]
    return 2 * x.numel() / min(times)


# ------------------------------------------------------------------------------------ decode
def engine_decode(eng: EmbeddedEngine, prompts: list[list[int]], new: int) -> float:
    params = SamplingParams(max_new_tokens=new, greedy=True, ignore_eos=True)
    wall, results = timed(lambda: [f.result() for f in [eng.submit(p, params) for p in prompts]])
    assert all(len(r.output_ids) == new for r in results), "engine lost or added tokens"
    return wall


def hf_decode(model, prompts: list[list[int]], new: int) -> float:
    ids = torch.tensor(prompts, device=model.device)
    with torch.inference_mode():
        return timed(
            lambda: model.generate(
                input_ids=ids,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=new,
                min_new_tokens=new,
                do_sample=False,
                pad_token_id=0,
            )
        )[0]


def kernel_time_per_step(eng: EmbeddedEngine, prompts: list[list[int]], new: int) -> float | None:
    """Mean GPU kernel time of one engine step over a run (profiler), or None if unavailable."""
    try:
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            steps0 = eng.stats()["steps"]
            engine_decode(eng, prompts, new)
            steps = eng.stats()["steps"] - steps0
        total_us = sum(getattr(e, "self_device_time_total", 0.0) for e in prof.key_averages())
        return total_us / 1e6 / max(steps, 1)
    except Exception:  # the profiler is a diagnostic here, never the result
        console.print(f"[yellow]profiler unavailable: {traceback.format_exc(limit=1)}")
        return None


def bench_decode(shape: dict, device: str, batches: list[int], prompt_len: int, new: int, with_hf: bool) -> dict:
    model = build_model(shape, torch.bfloat16, device)
    n_params = sum(p.numel() for p in model.parameters())
    weight_bytes = n_params * 2
    cfg = model.config
    head_dim = cfg.hidden_size // cfg.num_attention_heads
    kv_per_token = cfg.num_hidden_layers * 2 * cfg.num_key_value_heads * head_dim * 2  # bytes, bf16
    bandwidth = copy_bandwidth(device)
    g = torch.Generator().manual_seed(0)
    prompts = {
        b: [torch.randint(3, cfg.vocab_size, (prompt_len,), generator=g).tolist() for _ in range(b)] for b in batches
    }
    rows: list[dict] = [{"batch": b} for b in batches]
    for label, graphs in (("graphs", True), ("eager", False)):
        eng = EmbeddedEngine(
            model=model,
            device=device,
            dtype=torch.bfloat16,
            max_running=max(batches),
            max_queue=4 * max(batches),
            max_context=prompt_len + new + 8,
            prefill_token_budget=8192,
            prefix_sharing=False,
            cuda_graphs=graphs,
        )
        eng.start()
        try:
            engine_decode(eng, [[5] * 16] * 4, 4)  # warm-up: kernels, allocator
            for row in rows:
                b = row["batch"]
                # untimed first: it captures this batch's graph (a capture costs hundreds of
                # milliseconds, which inside the timed short run would be subtracted from the long one)
                engine_decode(eng, prompts[b], 4)
                t_short = engine_decode(eng, prompts[b], 2)
                t_long = engine_decode(eng, prompts[b], new)
                decode_s = max(t_long - t_short, 1e-9)
                row[f"{label}_tok_s"] = b * (new - 2) / decode_s
                row[f"{label}_step_ms"] = decode_s / (new - 2) * 1e3
                ctx = prompt_len + new / 2
                bound_step_s = (weight_bytes + b * ctx * kv_per_token) / bandwidth
                row["bound_tok_s"] = b / bound_step_s
                row[f"{label}_share_of_bound"] = bound_step_s / (decode_s / (new - 2))
                if device == "cuda" and graphs:
                    kernel_s = kernel_time_per_step(eng, prompts[b], new)
                    row["gpu_kernel_ms_per_step"] = None if kernel_s is None else kernel_s * 1e3
                console.print({label: row})
            if graphs:
                runner_graphs = eng._runner.graphs
                captured = None if runner_graphs is None else runner_graphs.captures
        finally:
            eng.stop()
        del eng
    if with_hf:
        for row in rows:
            b = row["batch"]
            hf_long, hf_short = hf_decode(model, prompts[b], new), hf_decode(model, prompts[b], 2)
            row["hf_tok_s"] = b * (new - 2) / max(hf_long - hf_short, 1e-9)
    del model
    torch.cuda.empty_cache() if device == "cuda" else None
    table = Table(title=f"decode, {n_params / 1e6:.0f}M params bf16, prompt {prompt_len}, {new} new tokens")
    for col in (
        "batch",
        "engine + CUDA graphs tok/s",
        "engine eager tok/s",
        "HF generate tok/s",
        "bandwidth bound tok/s",
        "graphs: share of bound",
        "graphs step ms",
        "GPU kernels ms/step",
    ):
        table.add_column(col, justify="right")
    for r in rows:
        kernel = r.get("gpu_kernel_ms_per_step")
        table.add_row(
            str(r["batch"]),
            f"{r['graphs_tok_s']:.0f}",
            f"{r['eager_tok_s']:.0f}",
            f"{r.get('hf_tok_s', float('nan')):.0f}",
            f"{r['bound_tok_s']:.0f}",
            f"{r['graphs_share_of_bound']:.1%}",
            f"{r['graphs_step_ms']:.2f}",
            "-" if kernel is None else f"{kernel:.2f}",
        )
    console.print(table)
    return {
        "params": n_params,
        "weight_bytes": weight_bytes,
        "kv_bytes_per_token": kv_per_token,
        "copy_bandwidth_bytes_s": bandwidth,
        "prompt_len": prompt_len,
        "new_tokens": new,
        "graphs_captured": captured,
        "rows": rows,
    }


# ------------------------------------------------------------------------------- speculative
def bench_speculative(shape: dict, device: str, batches: list[int], width: int, drafts: tuple[int, ...]) -> dict:
    """The verifying step (speculative decoding) against the plain decode step, alone, at each
    batch size: what feeding every row 1 + k tokens costs in plain steps
    (perfmodel/engine_probe.py `probe_verify`, the same steps the cost model probes on the CPU).

    Why this and not tokens/s with speculation on: with random weights, what a proposal would get
    accepted says nothing of a trained policy's answers. The cost ratio is what carries over: a
    verifying step pays when its rows emit more than `verify / plain` tokens each (1 + the
    accepted share of the proposal). On the tiny kits' CPU that was ~1.2-1.4 at one row and
    ~2.3 at 8 rows with 4 fed tokens (docs/speculative_decoding.md); a GPU step that reads every
    weight to compute a few tokens should come much closer to 1."""
    from areal_graph.perfmodel.engine_probe import probe_verify

    model = build_model(shape, torch.bfloat16 if device == "cuda" else torch.float32, device)
    with tempfile.TemporaryDirectory() as tmp:
        model.save_pretrained(tmp)
        del model
        got = probe_verify(tmp, max(batches), [width], drafts=drafts, device=device, rows=batches)
    if not got:
        raise RuntimeError("the verifying step could not be probed (no lean forward for this model)")
    rows: list[dict] = []
    for b in batches:
        mine = [g for g in got if g[0] == b]
        row: dict[str, Any] = {"batch": b, "width": width, "plain_ms": mine[0][4] * 1e3}
        for _, _, extra, verify_s, plain_s in mine:
            k = extra // b
            row[f"verify_k{k}_ms"] = verify_s * 1e3
            row[f"break_even_k{k}"] = verify_s / plain_s  # tokens a row must emit per verifying forward
        rows.append(row)
    table = Table(title=f"verifying vs plain decode step, context {width}, alone (speculative decoding)")
    for col in ("batch", "plain step ms", *(f"fed 1+{k}: ms (break-even tokens/row)" for k in drafts)):
        table.add_column(col, justify="right")
    for r in rows:
        table.add_row(
            str(r["batch"]),
            f"{r['plain_ms']:.2f}",
            *(f"{r[f'verify_k{k}_ms']:.2f} ({r[f'break_even_k{k}']:.2f})" for k in drafts),
        )
    console.print(table)
    torch.cuda.empty_cache() if device == "cuda" else None
    return {"width": width, "drafts": list(drafts), "rows": rows}


# ------------------------------------------------------------------------------------- train
def train_batch(n: int, length: int, vocab: int, seed: int = 0) -> PackedBatch:
    g = torch.Generator().manual_seed(seed)
    prompt = length // 4
    seqs = [torch.randint(3, vocab, (length,), generator=g).tolist() for _ in range(n)]
    masks = [[0] * prompt + [1] * (length - prompt) for _ in range(n)]
    return PackedBatch.from_sequences({"input_ids": seqs, "loss_mask": masks})


def nll(batch: PackedBatch):
    total = float(batch["loss_mask"].sum())
    return lambda lp, ent, mb: (-(lp * mb["loss_mask"].float()).sum() / total, {})


def one_rank_group() -> None:
    import socket

    import torch.distributed as dist

    if dist.is_initialized():
        return
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    backend = "cpu:gloo,cuda:nccl" if torch.cuda.is_available() else "gloo"
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)


def bench_train(shape: dict, device: str, n_seqs: int, length: int, mb_tokens: int, steps: int) -> dict:
    batch = train_batch(n_seqs, length, shape["vocab_size"])
    configs: list[tuple[str, dict]] = [
        ("lean fp32", {"lean": True, "mixed_precision": None}),
        ("lean bf16 (autocast)", {"lean": True, "mixed_precision": torch.bfloat16}),
        ("HF forward bf16 (autocast)", {"lean": False, "mixed_precision": torch.bfloat16}),
        ("FSDP2 1 rank bf16 (HF forward)", {"parallel": "fsdp"}),
    ]
    rows = []
    for label, kw in configs:
        try:
            if kw.get("parallel") == "fsdp":
                one_rank_group()
            if device == "cuda":
                torch.cuda.empty_cache()
                torch.cuda.reset_peak_memory_stats()
            model = build_model(shape, torch.float32, device)
            n_params = sum(p.numel() for p in model.parameters())
            eng = TrainEngine(model, lr=1e-5, device=device, **kw)
            times, losses = [], []
            for i in range(steps + 1):
                dt, stats = timed(lambda: eng.train_step(batch, nll(batch), max_tokens_per_mb=mb_tokens))
                losses.append(stats["loss"])
                if i:  # the first step pays for kernel selection and the allocator
                    times.append(dt)
            step_s = statistics.median(times)
            flops = 6 * n_params * batch.num_tokens
            row = {
                "config": label,
                "step_s": step_s,
                "tokens_per_s": batch.num_tokens / step_s,
                "mfu": flops / step_s / (PEAK_BF16_TFLOPS * 1e12),
                "losses": losses,
                "lean": eng._lean is not None,
                "parallel": eng.parallel,
                "peak_mem_gib": torch.cuda.max_memory_allocated() / 2**30 if device == "cuda" else None,
                "master_dtype": str(next(eng.model.parameters()).dtype),
            }
            del model  # the engine goes with the next iteration's assignment
        except Exception as err:  # one configuration failing must not hide the others' figures
            row = {"config": label, "error": f"{type(err).__name__}: {err}", "trace": traceback.format_exc(limit=8)}
        rows.append(row)
        console.print({k: v for k, v in row.items() if k != "trace"})
    table = Table(title=f"one training step, {n_seqs} x {length} tokens, micro-batches of {mb_tokens} tokens")
    for col in ("config", "step s", "tokens/s", "MFU (bf16 peak)", "peak GiB", "loss first -> last"):
        table.add_column(col, justify="right")
    for r in rows:
        if "error" in r:
            table.add_row(r["config"], "error", r["error"][:60], "", "", "")
            continue
        table.add_row(
            r["config"],
            f"{r['step_s']:.3f}",
            f"{r['tokens_per_s']:.0f}",
            f"{r['mfu']:.1%}",
            "-" if r["peak_mem_gib"] is None else f"{r['peak_mem_gib']:.1f}",
            f"{r['losses'][0]:.3f} -> {r['losses'][-1]:.3f}",
        )
    console.print(table)
    return {"tokens": batch.num_tokens, "rows": rows}


# -------------------------------------------------------------------------------------- sync
def bench_sync(shape: dict, device: str, repeats: int) -> dict:
    trainer = TrainEngine(build_model(shape, torch.float32, device), lr=1e-5, device=device)
    eng = EmbeddedEngine(
        model=build_model(shape, torch.bfloat16, device, seed=1), device=device, dtype=torch.bfloat16, max_running=8
    )
    eng.start()
    direct = InProcessWeightSync(trainer)  # CUDA to CUDA: the engine takes the trainer's tensors
    out: dict[str, list[float]] = {
        "disk_write_s": [],
        "disk_load_s": [],
        "shm_publish_s": [],
        "shm_load_s": [],
        "cuda_direct_s": [],
    }
    version = 0
    try:
        with tempfile.TemporaryDirectory(prefix="areal-sync-", dir=".") as tmp:
            shm = f"/dev/shm/areal-bench-{time.time_ns()}"
            for r in range(repeats):
                dt, path = timed(lambda: trainer.export_hf(Path(tmp) / f"v{r}"))
                out["disk_write_s"].append(dt)
                version += 1
                out["disk_load_s"].append(timed(lambda: eng.update_weights_from_disk(path, version))[0])
                dt, manifest = timed(lambda: shared_weights.publish(shm, trainer.state_dict_for_sync(copy=False)))
                out["shm_publish_s"].append(dt)
                version += 1
                out["shm_load_s"].append(
                    timed(lambda: eng.update_weights_from_state_dict(shared_weights.read(shm, manifest), version))[0]
                )
                version += 1
                out["cuda_direct_s"].append(timed(lambda: asyncio.run(direct.apply(eng, direct.publish(version))))[0])
            Path(shm).unlink(missing_ok=True)
        # the engine now holds exactly the trainer's weights, rounded to bf16 (greedy tokens would
        # not tell: a random model's logits are near-uniform and bf16 kernels break ties differently)
        theirs = trainer.state_dict_for_sync(copy=False)
        exact = all(torch.equal(t, theirs[k].to(t.dtype)) for k, t in eng.model.state_dict().items() if k in theirs)
    finally:
        eng.stop()
    nbytes = sum(t.numel() * t.element_size() for t in trainer.state_dict_for_sync(copy=False).values())
    med = {k: statistics.median(v) for k, v in out.items()}
    table = Table(
        title=f"weight sync trainer (fp32) -> engine (bf16), {nbytes / 2**30:.2f} GiB fp32, median of {repeats}"
    )
    for col in ("path", "trainer side s", "engine side s", "total s"):
        table.add_column(col, justify="right")
    table.add_row(
        "disk (safetensors)",
        f"{med['disk_write_s']:.3f}",
        f"{med['disk_load_s']:.3f}",
        f"{med['disk_write_s'] + med['disk_load_s']:.3f}",
    )
    table.add_row(
        "shared memory",
        f"{med['shm_publish_s']:.3f}",
        f"{med['shm_load_s']:.3f}",
        f"{med['shm_publish_s'] + med['shm_load_s']:.3f}",
    )
    table.add_row("CUDA -> CUDA, one process", "0", f"{med['cuda_direct_s']:.3f}", f"{med['cuda_direct_s']:.3f}")
    console.print(table)
    return {"bytes_fp32": nbytes, "median_s": med, "all_s": out, "engine_weights_equal_trainer_bf16": exact}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=RESULTS, help="folder for gpu_bench.json")
    ap.add_argument("--only", default="decode,speculative,train,sync", help="comma-separated parts")
    ap.add_argument("--quick", action="store_true", help="a small model and few steps: checks the script runs")
    ap.add_argument("--device", default="cuda", help="cuda (the point), or cpu with --quick to check the script")
    args = ap.parse_args(argv)
    shape = QUICK if args.quick else QWEN2_05B
    parts = [p.strip() for p in args.only.split(",") if p.strip()]
    args.out.mkdir(parents=True, exist_ok=True)
    out_path = args.out / ("gpu_bench_quick.json" if args.quick else "gpu_bench.json")
    result: dict[str, Any] = {
        "device": torch.cuda.get_device_name() if args.device == "cuda" else args.device,
        "torch": torch.__version__,
        "shape": shape,
    }
    if args.device == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = False  # fp32 means fp32 in these figures
    failed = False
    for part in parts:
        t0 = time.perf_counter()
        try:
            if part == "decode":
                result[part] = bench_decode(
                    shape,
                    args.device,
                    [1, 4] if args.quick else [1, 64, 256],
                    16 if args.quick else 128,
                    8 if args.quick else 128,
                    with_hf=True,
                )
            elif part == "train":
                result[part] = bench_train(
                    shape,
                    args.device,
                    4 if args.quick else 32,
                    32 if args.quick else 512,
                    64 if args.quick else 8192,
                    1 if args.quick else 3,
                )
            elif part == "sync":
                result[part] = bench_sync(shape, args.device, 1 if args.quick else 3)
            elif part == "speculative":
                result[part] = bench_speculative(
                    shape, args.device, [1, 4] if args.quick else [1, 64, 256], 32 if args.quick else 256, (1, 2, 4)
                )
            else:
                raise ValueError(f"unknown part {part!r} (decode, speculative, train, sync)")
        except Exception as err:  # report and go on: one broken part must not lose the others
            failed = True
            result[part] = {"error": f"{type(err).__name__}: {err}", "trace": traceback.format_exc()}
            console.print(f"[red]{part} failed:[/red] {traceback.format_exc()}")
        result.setdefault("seconds", {})[part] = time.perf_counter() - t0
        out_path.write_text(json.dumps(result, indent=2, default=str))
    console.print(f"wrote {out_path}")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
