"""Data parallelism for the training engine: DDP on CPU (gloo), FSDP2 where CUDA is available.

Kept apart from engines/training/train_engine.py so that the engine's single-process path reads as
plain torch and everything that talks to `torch.distributed` lives here.

Why these two: FSDP2 (`torch.distributed.fsdp.fully_shard`) shards parameters, gradients and
optimizer state, so a model larger than one device's memory trains, and it casts to bf16 for
compute while reducing gradients in fp32. DDP keeps a full replica per rank and all-reduces
gradients; on CPU, where memory is plentiful and there is no bf16 speed-up, it is the simpler
and cheaper choice. FSDP2 also runs on CPU with gloo (fp32), which is how the tests check it
on a machine without a GPU.

Both reducers *average* gradients over ranks; the engine scales each rank's loss by the world
size so that the result is the *sum* of the ranks' shares, i.e. the full-batch gradient.

A run's model with `dp_size` > 1 joins its ranks with `init_from_env` (the torchrun
environment its launcher sets) and relays each call from rank 0 to the others as bytes with
`broadcast_bytes` (runtime/hosts/dp_model_host.py).
"""

from __future__ import annotations

import contextlib
import datetime
import inspect
import json
import logging
import os
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist

from areal_graph.engines.training.step_stats import combine_pieces

log = logging.getLogger(__name__)

MODES: tuple[str, ...] = ("auto", "none", "ddp", "fsdp")


def world() -> tuple[int, int]:
    """(rank, world size) of the default process group; (0, 1) when there is none."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


# How long a rank waits for the next command of rank 0 (see `init_from_env`): between two calls
# of a model a run may generate, evaluate or save for a long time, and a waiting rank is idle.
COMMAND_TIMEOUT = datetime.timedelta(days=7)
ENV_KEYS: tuple[str, ...] = ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE")


def init_from_env() -> dist.ProcessGroup:
    """Join the process group that the torchrun-style environment describes (MASTER_ADDR,
    MASTER_PORT, RANK, WORLD_SIZE, LOCAL_RANK); returns the gloo group commands travel on.

    The default group runs gloo for CPU tensors and, where CUDA is available, NCCL for CUDA
    tensors (one group, the backend chosen per tensor): a rank learns its model's device only
    from rank 0's first command, which must travel before any device is known. Commands get
    a group of their own with a long timeout (`COMMAND_TIMEOUT`): a rank blocks in it between
    calls, while the compute collectives keep the default timeout, so a rank that stops
    mid-step still fails within minutes instead of hanging for days.
    """
    missing = [k for k in ENV_KEYS if not os.environ.get(k)]
    if missing:
        raise RuntimeError(
            f"a data-parallel rank needs {', '.join(missing)} in its environment "
            "(the launcher sets them for models with dp_size > 1)"
        )
    if not dist.is_initialized():
        backend = "cpu:gloo,cuda:nccl" if torch.cuda.is_available() else "gloo"
        dist.init_process_group(backend, init_method="env://")
        log.info(
            "rank %d/%d joined the process group (%s) at %s:%s",
            dist.get_rank(),
            dist.get_world_size(),
            backend,
            os.environ["MASTER_ADDR"],
            os.environ["MASTER_PORT"],
        )
    return dist.new_group(backend="gloo", timeout=COMMAND_TIMEOUT)


def broadcast_bytes(payload: bytes | None, group: dist.ProcessGroup) -> bytes:
    """`payload` of rank 0 on every rank of `group` (others pass None): a length, then the bytes."""
    size = torch.tensor([len(payload) if payload is not None else 0], dtype=torch.int64)
    dist.broadcast(size, src=0, group=group)
    if payload is not None:
        data = torch.frombuffer(bytearray(payload), dtype=torch.uint8) if payload else torch.empty(0, dtype=torch.uint8)
    else:
        data = torch.empty(int(size), dtype=torch.uint8)
    if data.numel():
        dist.broadcast(data, src=0, group=group)
    return payload if payload is not None else data.numpy().tobytes()


def resolve_mode(parallel: str, device: torch.device) -> str:
    """The data-parallel mode to use: "none" without a multi-process group, else DDP or FSDP.

    "auto" picks FSDP on CUDA and DDP otherwise. An explicit "ddp"/"fsdp" is honoured even
    with one process (useful to exercise the wrapped path), but needs an initialised group.
    """
    if parallel not in MODES:
        raise ValueError(f"parallel must be one of {MODES}, got {parallel!r}")
    _, size = world()
    if parallel == "none":
        return "none"
    if parallel == "auto":
        if size == 1:
            return "none"
        return "fsdp" if device.type == "cuda" else "ddp"
    if not (dist.is_available() and dist.is_initialized()):
        raise RuntimeError(f"parallel={parallel!r} needs torch.distributed.init_process_group() first")
    return parallel


def local_device(device: str | torch.device, mode: str) -> torch.device:
    """A bare "cuda" becomes this process's GPU (LOCAL_RANK) under data parallelism, or the
    only GPU it sees when its launcher gave it one (Ray sets CUDA_VISIBLE_DEVICES per process)."""
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:  # set_device needs an index: it refuses a bare "cuda"
        if mode != "none" and torch.cuda.device_count() > 1:
            index = int(os.environ.get("LOCAL_RANK", "0"))
        else:
            index = torch.cuda.current_device()
        device = torch.device("cuda", index)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    return device


def wrap_ddp(model: torch.nn.Module, device: torch.device) -> torch.nn.Module:
    """DDP wrapper (broadcasts rank 0's parameters at construction).

    Buffers are not re-broadcast every forward: the only ones a CausalLM has (rotary
    frequencies) are constants, and a broadcast per forward would be a collective per
    micro-batch for nothing.
    """
    from torch.nn.parallel import DistributedDataParallel

    # torch >= 2.13 renamed the switch (the old name warns); older torch knows only the old one
    no_buffer_sync = (
        {"forward_sync_buffers": False}
        if "forward_sync_buffers" in inspect.signature(DistributedDataParallel.__init__).parameters
        else {"broadcast_buffers": False}
    )
    return DistributedDataParallel(
        model, device_ids=[device.index] if device.type == "cuda" else None, **no_buffer_sync
    )


def broadcast_from_rank0(model: torch.nn.Module) -> None:
    """Overwrite every rank's parameters and buffers with rank 0's, so replicas start equal."""
    with torch.no_grad():
        for tensor in model.state_dict().values():
            dist.broadcast(tensor, src=0)


def shard_fsdp(model: torch.nn.Module, param_dtype: torch.dtype | None) -> torch.nn.Module:
    """FSDP2 in place: one unit per decoder layer plus the root (embeddings, norm, tied lm_head).

    Parameters are first broadcast from rank 0: unlike DDP, `fully_shard` takes each rank's
    shard from its own copy, so differently initialised replicas would silently diverge.
    `param_dtype` (bf16 on GPU) is the compute dtype; gradients are reduced in fp32.
    """
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    broadcast_from_rank0(model)
    policy = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32 if param_dtype else None)
    layers = getattr(getattr(model, "model", None), "layers", None)
    if layers is None:
        log.warning("%s has no .model.layers: sharding it as a single FSDP unit", type(model).__name__)
    for layer in layers or []:
        fully_shard(layer, mp_policy=policy)
    fully_shard(model, mp_policy=policy)
    return model


@contextlib.contextmanager
def grad_sync(wrapped: torch.nn.Module, mode: str, sync: bool) -> Iterator[None]:
    """Reduce gradients across ranks in this backward only if `sync` (the last micro-batch):
    earlier micro-batches accumulate locally, so a step costs one reduction, not one per
    micro-batch."""
    if mode == "ddp" and not sync:
        with wrapped.no_sync():
            yield
        return
    if mode == "fsdp":
        wrapped.set_requires_gradient_sync(sync)
    yield


def all_reduce_sum_(tensor: torch.Tensor) -> torch.Tensor:
    dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
    return tensor


def all_gather_json(obj: Any, device: torch.device) -> list[Any]:
    """Every rank's `obj` (JSON-serialisable), in rank order.

    JSON bytes rather than `all_gather_object`: that one unpickles what other processes
    send, which docs/design.md rules out for anything received over a socket.
    """
    _, size = world()
    data = torch.tensor(list(json.dumps(obj).encode()), dtype=torch.uint8, device=device)
    n = torch.tensor([data.numel()], dtype=torch.int64, device=device)
    sizes = [torch.zeros_like(n) for _ in range(size)]
    dist.all_gather(sizes, n)
    width = max(int(s) for s in sizes)
    padded = torch.zeros(width, dtype=torch.uint8, device=device)
    padded[: data.numel()] = data
    chunks = [torch.zeros_like(padded) for _ in range(size)]
    dist.all_gather(chunks, padded)
    return [json.loads(bytes(c[: int(s)].cpu().tolist()).decode()) for c, s in zip(chunks, sizes)]


def sum_dicts(dicts: list[dict[str, float]]) -> dict[str, float]:
    """The ranks' stats as one (sums; maxima for `_max` keys: engines/training/step_stats.py)."""
    return combine_pieces(dicts)


def as_local_scalar(value: torch.Tensor) -> torch.Tensor:
    """A DTensor result (FSDP's grad norm) as a plain tensor; other tensors unchanged."""
    full = getattr(value, "full_tensor", None)
    return full() if callable(full) else value


# --------------------------------------------------------------------------- FSDP state dicts
def fsdp_full_model_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Gathered, CPU state dict: on rank 0 only (others get {}). A collective: all ranks call it."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))


def fsdp_load_model_state(model: torch.nn.Module, state: dict[str, torch.Tensor]) -> None:
    """Load a full (unsharded) state dict that every rank holds; missing tied weights are fine."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    set_model_state_dict(model, state, options=StateDictOptions(full_state_dict=True, strict=False))


def fsdp_full_optim_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """Gathered optimizer state keyed by parameter name, on rank 0 only. A collective."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

    return get_optimizer_state_dict(model, optimizer, options=StateDictOptions(full_state_dict=True, cpu_offload=True))


def fsdp_load_optim_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer, state: dict[str, Any]) -> None:
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

    set_optimizer_state_dict(model, optimizer, state, options=StateDictOptions(full_state_dict=True))


def optim_state_ids_to_names(state: dict[str, Any], names: list[str]) -> dict[str, Any]:
    """torch's optimizer state (parameters numbered in `model.parameters()` order) keyed by
    parameter name instead: the form FSDP's state-dict API reads and writes."""
    return {
        "state": {names[int(i)]: s for i, s in state["state"].items()},
        "param_groups": [{**g, "params": [names[int(i)] for i in g["params"]]} for g in state["param_groups"]],
    }


def optim_state_names_to_ids(state: dict[str, Any], names: list[str]) -> dict[str, Any]:
    """The inverse of `optim_state_ids_to_names`."""
    index = {n: i for i, n in enumerate(names)}
    return {
        "state": {index[n]: s for n, s in state["state"].items()},
        "param_groups": [{**g, "params": [index[n] for n in g["params"]]} for g in state["param_groups"]],
    }
