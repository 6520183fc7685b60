"""How fast a PackedBatch moves controller -> worker over loopback gRPC.

For 1, 16 and 64 MiB batches (one float32 per-token key) it measures, in MiB/s of payload:
- upload:      Execute of a method that returns nothing (controller -> worker only)
- round trip:  Execute of `echo` (the batch goes there and back; counted once per direction)
- one message: the same upload with the whole tensor in a single message (what a unary call
               would do) instead of 1 MiB chunks
- codec only:  encode + decode in process, no socket (the cost of (de)serialising)
- memcpy:      numpy copy of the same bytes (the ceiling)
All in one run so the ratios hold even on a noisy shared machine.

    python benchmarks/bench_grpc_transfer.py           # 5 repeats per cell
    python benchmarks/bench_grpc_transfer.py --quick   # 2 repeats (< 60 s)
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"

from areal_graph.data.packed import PackedBatch  # noqa: E402
from areal_graph.runtime.launchers.local import LocalLauncher  # noqa: E402
from areal_graph.runtime.rpc.tensor_codec import DEFAULT_CHUNK_BYTES, decode_batch, encode_batch  # noqa: E402
from areal_graph.runtime.rpc.worker_client import WorkerClient  # noqa: E402


def batch_of(mib: int) -> PackedBatch:
    n = mib * 2**20 // 4
    return PackedBatch(torch.tensor([0, n // 2, n], dtype=torch.int32), {"x": torch.randn(n)})


def median_time(fn, repeats: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="2 repeats per cell")
    parser.add_argument("--sizes", type=int, nargs="+", default=[1, 16, 64], help="batch sizes in MiB")
    args = parser.parse_args(argv)
    repeats = 2 if args.quick else 5
    torch.set_num_threads(1)

    rows = []
    with tempfile.TemporaryDirectory() as tmp, LocalLauncher(tmp, pythonpath=[ROOT / "tests"]) as launcher:
        address = launcher.start_worker("bench", threads=1)
        launcher.wait_healthy(60)
        chunked = WorkerClient(address, name="bench", timeout=300)
        single = WorkerClient(address, name="bench", timeout=300, chunk_bytes=1 << 30)
        chunked.configure("echo", "support.grpc_test_nodes:EchoNode", {})
        for mib in args.sizes:
            b = batch_of(mib)
            raw = b.tokens["x"].numpy()
            dst = np.empty_like(raw)
            t_up = median_time(lambda: chunked.execute("echo", "nothing", b), repeats)
            t_rt = median_time(lambda: chunked.execute("echo", "echo", b), repeats)
            t_one = median_time(lambda: single.execute("echo", "nothing", b), repeats)
            t_codec = median_time(lambda: decode_batch(encode_batch(b, DEFAULT_CHUNK_BYTES)), repeats)
            t_copy = median_time(lambda: np.copyto(dst, raw), repeats)
            rows.append(
                {
                    "mib": mib,
                    "upload_mib_s": mib / t_up,
                    "round_trip_mib_s": 2 * mib / t_rt,
                    "one_message_upload_mib_s": mib / t_one,
                    "codec_only_mib_s": mib / t_codec,
                    "memcpy_mib_s": mib / t_copy,
                }
            )
        chunked.close()
        single.close()

    table = Table(title=f"loopback gRPC transfer, MiB/s (median of {repeats})")
    cols = ["mib", "upload_mib_s", "round_trip_mib_s", "one_message_upload_mib_s", "codec_only_mib_s", "memcpy_mib_s"]
    headers = ["MiB", "upload", "round trip", "one message", "codec only", "memcpy"]
    for h in headers:
        table.add_column(h, justify="right")
    for r in rows:
        table.add_row(*(f"{r[c]:.0f}" for c in cols))
    Console().print(table)
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = RESULTS / "grpc_transfer.json"
    out.write_text(json.dumps({"repeats": repeats, "chunk_bytes": DEFAULT_CHUNK_BYTES, "rows": rows}, indent=2))
    Console().print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
