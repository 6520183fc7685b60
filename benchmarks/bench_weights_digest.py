"""What the weights check costs per sync (issue 49): the digest a server reports after a load, the
digest the executor reads back from what was published, and the one HTTP round trip, beside what
the sync itself costs.

For each model (the tiny-arith kit's 0.83M Qwen2, and a random Qwen2 of Qwen2-0.5B's shape, the
one benchmarks/bench_gpu.py uses: 494M parameters, 136M of them the tied embedding) and each
transport the executor checks (memory: the shared-memory file; disk: safetensors), it times,
in this process (the server's side runs the engine's own code, `EmbeddedEngine.weights_digest`):

- published: the samples read back from the published file and hashed, for the server's dtype
  (runtime/orchestration/server_weights.py: once per version, then kept)
- server:    the digest the engine takes of its parameters after a load (what GET
             /get_weights_digest computes; once per server per load)
- sync:      publish (the trainer's copy into the file, or export) + load (the engine swaps
             the weights in), what one sync costs without the check

and, for the kit, whole syncs to a real server process as the executor runs them (publish, then
`ServerWeights.sync`), with the check and without it, and GET /get_weights_digest alone. Medians.

    python benchmarks/bench_weights_digest.py                # kit + 0.5B shape (fp32, and a bf16 server)
    python benchmarks/bench_weights_digest.py --quick        # kit only

Writes benchmarks/results/weights_digest.json. CPU only, no downloads (random weights).
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"

from areal_graph.engines import shared_weights  # noqa: E402
from areal_graph.engines.inference.engine import EmbeddedEngine  # noqa: E402
from areal_graph.engines.weights_digest import digest, sample_safetensors, sample_shared_file  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_gpu import QWEN2_05B  # noqa: E402  (Qwen2-0.5B's shape, as the GPU benchmark builds it)

console = Console(width=150)


def kit_model_dir() -> Path:
    from areal_graph.modelkit.builtin import BUILTIN_KITS, ensure_kit

    return ensure_kit(BUILTIN_KITS["tiny-arith"]).model_dir


def build_model(shape: str) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM, Qwen2Config, Qwen2ForCausalLM

    if shape == "kit":
        return AutoModelForCausalLM.from_pretrained(kit_model_dir(), dtype=torch.float32).eval()
    torch.manual_seed(0)
    return Qwen2ForCausalLM(Qwen2Config(**QWEN2_05B, bos_token_id=1, eos_token_id=2, pad_token_id=0)).eval()


def median_s(fn: Callable[[], Any], repeats: int) -> tuple[float, Any]:
    times, out = [], None
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), out


def cells(
    shape: str,
    trainer: torch.nn.Module,
    server_model: torch.nn.Module,
    server_dtype: torch.dtype,
    repeats: int,
    shm_dir: Path,
    disk_dir: Path,
) -> list[dict]:
    """Both transports for one model and one server dtype (`server_model`: the server's starting weights)."""
    state = {k: v.detach() for k, v in trainer.state_dict().items()}
    params = sum(p.numel() for p in trainer.parameters())
    engine = EmbeddedEngine(model=server_model, dtype=server_dtype, max_running=2)
    out = []
    # memory: the trainer's copy into the shared file, the engine's load of its views
    dtype_name = str(server_dtype).removeprefix("torch.")
    shm = str(shm_dir / f"{shape}-{dtype_name}-weights")
    publish_s, manifest = median_s(lambda: shared_weights.publish(shm, state), repeats)
    load_s, _ = median_s(lambda: engine.update_weights_from_state_dict(shared_weights.read(shm, manifest), 1), repeats)
    dtype_name = str(server_dtype).removeprefix("torch.")
    published_s, want = median_s(lambda: digest(sample_shared_file(shm, manifest), server_dtype), repeats)
    server_s, got = median_s(engine.weights_digest, repeats)
    assert got == want, f"{shape}: the engine's digest is not the published one"
    out.append(cell(shape, params, "memory", dtype_name, publish_s + load_s, published_s, server_s))
    Path(shm).unlink(missing_ok=True)
    # disk: the trainer's export (safetensors), the engine's load from the directory
    directory = disk_dir / f"{shape}-{dtype_name}-v1"
    export_s, _ = median_s(lambda: trainer.save_pretrained(directory, safe_serialization=True), 1)
    load_s, _ = median_s(lambda: engine.update_weights_from_disk(directory, 2), max(1, repeats // 2))
    published_s, want = median_s(lambda: digest(sample_safetensors(directory), server_dtype), repeats)
    server_s, got = median_s(engine.weights_digest, repeats)
    assert got == want, f"{shape}: the engine's digest is not the exported one"
    out.append(cell(shape, params, "disk", dtype_name, export_s + load_s, published_s, server_s))
    return out


def cell(
    shape: str, params: int, transport: str, dtype: str, sync_s: float, published_s: float, server_s: float
) -> dict:
    check = published_s + server_s
    return {
        "model": shape,
        "params": params,
        "transport": transport,
        "server_dtype": dtype,
        "sync_ms": round(sync_s * 1e3, 2),
        "published_digest_ms": round(published_s * 1e3, 3),
        "server_digest_ms": round(server_s * 1e3, 3),
        "check_ms": round(check * 1e3, 3),
        "check_share": round(check / sync_s, 5),
    }


def real_syncs(rounds: int, per_round: int) -> dict[str, float]:
    """Syncs of the kit's model to a real embedded server process, as the executor runs them
    (`SharedMemorySync.publish`, then `ServerWeights.sync`: load, check, commit), with the check
    and without it (rounds interleaved), and GET /get_weights_digest alone; medians in ms."""
    from areal_graph.engines.inference.client import InferenceClient, ServerPool
    from areal_graph.engines.inference.server.process import ServerProcess
    from areal_graph.runtime.orchestration.server_weights import ServerWeights
    from areal_graph.runtime.orchestration.weight_sync import SharedMemorySync

    trainer = build_model("kit")
    states = [{k: v + 0.01 * i for k, v in trainer.state_dict().items()} for i in range(1, 4)]
    version = [0]

    def publish_weights(method: str, /, path: str) -> list[dict]:
        return shared_weights.publish(path, states[version[0] % len(states)])

    class Unchecked(ServerWeights):
        async def _check(self, index: int, client: Any, published: Any) -> None:
            return None

    with tempfile.TemporaryDirectory() as tmp:
        proc = ServerProcess(
            str(kit_model_dir()), extra_args=["--threads", "1"], log_path=str(Path(tmp) / "server.log")
        )
        proc.start()
        transport = SharedMemorySync(publish_weights, str(Path(tmp) / "w"))
        ways = {
            "unchecked": Unchecked(transport, ["inference-0"]),
            "checked": ServerWeights(transport, ["inference-0"]),
        }

        async def measure() -> dict[str, float]:
            pool = ServerPool([InferenceClient(proc.url)])
            times: dict[str, list[float]] = {"unchecked": [], "checked": [], "round_trip": []}
            try:
                for _ in range(rounds):
                    for way, server_weights in ways.items():
                        for _ in range(per_round):
                            version[0] += 1
                            t0 = time.perf_counter()
                            published = await asyncio.to_thread(transport.publish, version[0])
                            await server_weights.sync(pool, published)
                            times[way].append(time.perf_counter() - t0)
                    for _ in range(per_round):
                        t0 = time.perf_counter()
                        await pool.clients[0].weights_digest()
                        times["round_trip"].append(time.perf_counter() - t0)
            finally:
                await pool.close()
            return {k: round(statistics.median(v) * 1e3, 3) for k, v in times.items()}

        try:
            return asyncio.run(measure())
        finally:
            proc.stop()
            transport.cleanup()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="the kit's model only")
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--out", type=Path, default=RESULTS / "weights_digest.json")
    args = ap.parse_args(argv)
    torch.set_num_threads(max(1, torch.get_num_threads()))
    rows: list[dict] = []
    shapes = [("kit", [torch.float32], args.repeats)]
    if not args.quick:
        shapes.append(("0.5B", [torch.float32, torch.bfloat16], max(3, args.repeats // 2)))
    in_ram = "/dev/shm" if Path("/dev/shm").is_dir() else None  # where weight_sync: memory writes
    with tempfile.TemporaryDirectory(dir=in_ram) as shm_dir, tempfile.TemporaryDirectory() as disk_dir:
        for shape, dtypes, repeats in shapes:
            console.print(f"[bold]{shape}[/bold]: building the model ...")
            base = build_model(shape)
            trainer = copy.deepcopy(base)
            with torch.no_grad():  # another version than the one the server starts on
                for p in trainer.parameters():
                    p.add_(0.01)
            for dtype in dtypes:
                rows += cells(shape, trainer, copy.deepcopy(base), dtype, repeats, Path(shm_dir), Path(disk_dir))
            del base, trainer
    real = real_syncs(rounds=4, per_round=10 * args.repeats)
    table = Table(title="the weights check per sync (medians)")
    for col in (
        "model",
        "transport",
        "server dtype",
        "sync ms",
        "published digest ms",
        "server digest ms",
        "check ms",
        "check / sync",
    ):
        table.add_column(col, justify="right")
    for r in rows:
        table.add_row(
            f"{r['model']} ({r['params'] / 1e6:.2f}M)",
            r["transport"],
            r["server_dtype"],
            f"{r['sync_ms']:.1f}",
            f"{r['published_digest_ms']:.2f}",
            f"{r['server_digest_ms']:.2f}",
            f"{r['check_ms']:.2f}",
            f"{100 * r['check_share']:.2f}%",
        )
    console.print(table)
    console.print(
        f"kit, a real server process: a sync {real['unchecked']:.2f} ms without the check, "
        f"{real['checked']:.2f} ms with it (+{real['checked'] - real['unchecked']:.2f} ms); "
        f"GET /get_weights_digest alone {real['round_trip']:.2f} ms"
    )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(
        json.dumps(
            {"rows": rows, "kit_real_sync_ms": real, "threads": torch.get_num_threads(), "argv": sys.argv},
            indent=1,
        )
    )
    console.print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
