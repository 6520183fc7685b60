"""The first lines of every engine-started process (gRPC workers, data-parallel ranks)."""

from __future__ import annotations

import logging
import os

from areal_graph.api.process import die_with_parent, pin_to_cores


def prepare_worker_process(name: str) -> None:
    """Die with the parent, log with `name` in each line, and take the cores (AREAL_CPU_CORES) and
    the torch thread count (AREAL_TORCH_THREADS) the launcher chose."""
    die_with_parent()
    pin_to_cores()
    logging.basicConfig(level=logging.INFO, format=f"%(asctime)s [{name}] %(levelname)s %(name)s: %(message)s")
    threads = os.environ.get("AREAL_TORCH_THREADS")
    if threads:
        import torch

        torch.set_num_threads(int(threads))
