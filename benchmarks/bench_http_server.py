"""What the HTTP hop costs: the embedded engine in-process vs. behind the SGLang-style server.

Same random tiny Qwen2, same requests (greedy, ignore_eos, fixed length), measured in one
run so the ratio survives the noise of a shared machine. Also times a weight update with
requests in flight (the interruptible path) as seen by the client.

    python benchmarks/bench_http_server.py [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path

import torch
from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parent


def build_model(path: Path, hidden: int, layers: int, seed: int) -> None:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    cfg = Qwen2Config(
        vocab_size=1024,
        hidden_size=hidden,
        intermediate_size=hidden * 2,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=1024,
        tie_word_embeddings=True,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
    )
    Qwen2ForCausalLM(cfg).eval().save_pretrained(path)


def prompts(n: int, length: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(0)
    return [[1] + torch.randint(3, 1000, (length - 1,), generator=g).tolist() for _ in range(n)]


def bench_in_process(model_dir: Path, reqs: list[list[int]], new_tokens: int, max_running: int) -> float:
    from areal_graph.engines.inference.engine import EmbeddedEngine
    from areal_graph.engines.inference.sampling import SamplingParams

    engine = EmbeddedEngine(str(model_dir), max_running=max_running)
    engine.start()
    try:
        params = SamplingParams(max_new_tokens=new_tokens, greedy=True, ignore_eos=True)
        engine.submit(reqs[0], SamplingParams(max_new_tokens=2, greedy=True)).result()  # warm-up
        t0 = time.perf_counter()
        futs = [engine.submit(r, params) for r in reqs]
        n = sum(len(f.result().output_ids) for f in futs)
        return n / (time.perf_counter() - t0)
    finally:
        engine.stop()


async def bench_http(url: str, reqs: list[list[int]], new_tokens: int, update_dir: Path | None) -> tuple[float, float]:
    from areal_graph.engines.inference.client import InferenceClient
    from areal_graph.engines.inference.interruptible import generate_interruptible
    from areal_graph.engines.inference.sampling import SamplingParams

    client = InferenceClient(url)
    try:
        params = SamplingParams(max_new_tokens=new_tokens, greedy=True, ignore_eos=True)
        await client.generate(reqs[0], SamplingParams(max_new_tokens=2, greedy=True))
        t0 = time.perf_counter()
        tasks = [asyncio.create_task(generate_interruptible(client, r, params)) for r in reqs]
        update_s = float("nan")
        if update_dir is not None:
            await asyncio.sleep(0.2)
            t_u = time.perf_counter()
            await client.update_weights_from_disk(str(update_dir), client.version + 1)
            update_s = time.perf_counter() - t_u
        gens = await asyncio.gather(*tasks)
        n = sum(len(g.output_ids) for g in gens)
        return n / (time.perf_counter() - t0), update_s
    finally:
        await client.close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="small sizes, < 60 s")
    ap.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch threads for both sides (2 threads on a busy 2-core machine thrash)",
    )
    args = ap.parse_args()
    torch.set_num_threads(min(args.threads, 2))
    from areal_graph.engines.inference.server.process import ServerProcess

    sizes = [(16, 64)] if args.quick else [(16, 128), (64, 128)]
    hidden, layers = (128, 2) if args.quick else (256, 4)
    console = Console()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        m0, m1 = Path(tmp, "m0"), Path(tmp, "m1")
        build_model(m0, hidden, layers, 0)
        build_model(m1, hidden, layers, 1)
        max_running = max(n for n, _ in sizes)
        server = ServerProcess(
            str(m0), extra_args=["--threads", str(min(args.threads, 2)), "--max-running", str(max_running)]
        )
        server.start()
        try:
            repeats = 2 if args.quick else 3
            for n, new in sizes:
                reqs = prompts(n, 32)
                # interleaved repeats, best of each: the machine is shared and noisy
                local = remote = with_update = 0.0
                update_s = float("inf")
                for r in range(repeats):
                    local = max(local, bench_in_process(m0, reqs, new, max_running))
                    remote = max(remote, asyncio.run(bench_http(server.url, reqs, new, None))[0])
                    tps, us = asyncio.run(bench_http(server.url, reqs, new, m1 if r % 2 == 0 else m0))
                    with_update, update_s = max(with_update, tps), min(update_s, us)
                rows.append(
                    {
                        "requests": n,
                        "new_tokens": new,
                        "in_process_tok_s": local,
                        "http_tok_s": remote,
                        "http_over_in_process": remote / local,
                        "http_with_update_tok_s": with_update,
                        "update_latency_s": update_s,
                        "repeats": repeats,
                    }
                )
        finally:
            server.stop()
    table = Table(title=f"embedded engine: in-process vs HTTP (hidden {hidden}, {layers} layers)")
    for col in (
        "requests",
        "new tok",
        "in-process tok/s",
        "HTTP tok/s",
        "HTTP / in-proc",
        "HTTP+update tok/s",
        "update s",
    ):
        table.add_column(col, justify="right")
    for r in rows:
        table.add_row(
            str(r["requests"]),
            str(r["new_tokens"]),
            f"{r['in_process_tok_s']:.0f}",
            f"{r['http_tok_s']:.0f}",
            f"{r['http_over_in_process']:.2f}",
            f"{r['http_with_update_tok_s']:.0f}",
            f"{r['update_latency_s']:.3f}",
        )
    console.print(table)
    out = ROOT / "results" / "http_server.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"quick": args.quick, "hidden": hidden, "layers": layers, "rows": rows}, indent=2))
    console.print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
