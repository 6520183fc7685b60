"""Weight sync with LoRA: the adapters alone against the full (merged) weights, per step.

For each model (the tiny-arith kit's 0.83M Qwen2, and random Qwen2s of 40M and 166M parameters,
a 32k vocabulary) it
trains LoRA adapters one step, then times what one memory-path sync does, both ways, in
process (no sockets: the shared-memory file is what crosses to the server):
- collect:  `TrainEngine.state_dict_for_sync` (adapters, or merge + copy of every weight)
- publish:  copy into the shared-memory file (engines/shared_weights.py)
- apply:    read the file and `EmbeddedEngine.update_weights_from_state_dict` (for adapters:
            W0 + s B A into the frozen base; for merged: load every weight)
and the bytes that crossed. Cells are interleaved (adapter, merged, adapter, ...) and the
median of `--repeats` is reported, so the ratio holds on a noisy shared machine.

    python benchmarks/bench_lora_sync.py                 # kit model + 2 larger shapes
    python benchmarks/bench_lora_sync.py --quick         # kit model only
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"

from areal_graph.data.packed import PackedBatch  # noqa: E402
from areal_graph.engines import shared_weights  # noqa: E402
from areal_graph.engines.inference.engine import EmbeddedEngine  # noqa: E402
from areal_graph.engines.training.train_engine import TrainEngine  # noqa: E402

LORA = {"r": 8, "alpha": 16, "dropout": 0.0, "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj"]}


def model_of(shape: str) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM, Qwen2Config, Qwen2ForCausalLM

    if shape == "kit":
        from areal_graph.modelkit.builtin import BUILTIN_KITS, ensure_kit

        return AutoModelForCausalLM.from_pretrained(ensure_kit(BUILTIN_KITS["tiny-arith"]).model_dir).eval()
    hidden, layers, inter = {"40M": (512, 8, 1536), "166M": (896, 12, 3584)}[shape]
    torch.manual_seed(0)
    cfg = Qwen2Config(
        vocab_size=32000,
        hidden_size=hidden,
        intermediate_size=inter,
        num_hidden_layers=layers,
        num_attention_heads=hidden // 64,
        num_key_value_heads=2,
        tie_word_embeddings=True,
    )
    return Qwen2ForCausalLM(cfg).eval()


def one_sync(trainer: TrainEngine, server: EmbeddedEngine, path: str, version: int) -> dict[str, float]:
    t0 = time.perf_counter()
    state = trainer.state_dict_for_sync(copy=False)
    t1 = time.perf_counter()
    manifest = shared_weights.publish(path, state)
    t2 = time.perf_counter()
    server.update_weights_from_state_dict(shared_weights.read(path, manifest), version)
    t3 = time.perf_counter()
    return {
        "collect_s": t1 - t0,
        "publish_s": t2 - t1,
        "apply_s": t3 - t2,
        "total_s": t3 - t0,
        "bytes": float(sum({e["offset"]: e["nbytes"] for e in manifest}.values())),
    }


def measure(shape: str, repeats: int) -> list[dict]:
    rows = {}
    engines = {}
    for sync in ("adapter", "merged"):
        trainer = TrainEngine(model_of(shape), lr=1e-3, lora={**LORA, "sync": sync})
        batch = PackedBatch.from_sequences(
            {"input_ids": [[5, 6, 7, 8, 9, 10]] * 2, "loss_mask": [[0, 0, 1, 1, 1, 1]] * 2}
        )
        trainer.train_step(batch, lambda lp, ent, mb: (-(lp * mb["loss_mask"]).sum(), {}))  # B no longer 0
        engines[sync] = (trainer, EmbeddedEngine(model=model_of(shape), max_running=2))
        rows[sync] = []
    with tempfile.TemporaryDirectory(dir="/dev/shm" if Path("/dev/shm").is_dir() else None) as tmp:
        for r in range(repeats):
            for sync in ("adapter", "merged"):  # interleaved
                trainer, server = engines[sync]
                rows[sync].append(one_sync(trainer, server, f"{tmp}/{sync}.bin", r + 1))
    params = sum(p.numel() for p in model_of(shape).parameters())
    out = []
    for sync, cells in rows.items():
        med = {k: statistics.median(c[k] for c in cells) for k in cells[0]}
        out.append({"model": shape, "params": params, "sync": sync, **med})
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="the kit model only")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    shapes = ["kit"] if args.quick else ["kit", "40M", "166M"]
    results = [row for shape in shapes for row in measure(shape, args.repeats)]
    table = Table(
        title=f"LoRA weight sync, r {LORA['r']} on q/k/v/o (median of {args.repeats}, {args.threads} threads)"
    )
    for col in (
        "model",
        "params",
        "sync",
        "MB moved",
        "collect ms",
        "publish ms",
        "apply ms",
        "total ms",
        "x less time",
        "x less bytes",
    ):
        table.add_column(col, justify="right")
    by = {(r["model"], r["sync"]): r for r in results}
    for r in results:
        merged = by[(r["model"], "merged")]
        table.add_row(
            r["model"],
            f"{r['params'] / 1e6:.2f}M",
            r["sync"],
            f"{r['bytes'] / 1e6:.3f}",
            f"{r['collect_s'] * 1e3:.1f}",
            f"{r['publish_s'] * 1e3:.1f}",
            f"{r['apply_s'] * 1e3:.1f}",
            f"{r['total_s'] * 1e3:.1f}",
            f"{merged['total_s'] / r['total_s']:.1f}" if r["sync"] == "adapter" else "",
            f"{merged['bytes'] / r['bytes']:.0f}" if r["sync"] == "adapter" else "",
        )
    Console().print(table)
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = RESULTS / "lora_sync.json"
    out.write_text(
        json.dumps({"lora": LORA, "threads": args.threads, "repeats": args.repeats, "rows": results}, indent=2) + "\n"
    )
    Console().print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
