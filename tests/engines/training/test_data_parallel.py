"""data_parallel.py's helpers with values: mode choice, stats reduction, optimizer-state renaming,
gradient-sync switching, and the collectives across two real CPU ranks (gloo).

tests/engines/training/test_train_dp.py checks that whole DDP/FSDP train steps on two ranks
equal one process; it cannot tell which helper is at fault when they do not. Here each helper
is checked on its own: the single-process ones directly (`grad_sync` against a stand-in
wrapper), and the collectives (`init_from_env`, `broadcast_bytes`, `all_gather_json`,
`all_reduce_sum_`, `broadcast_from_rank0`) in two small forked worker processes (under a
second) whose results the test compares with values computed here. DDP and FSDP
wrapping themselves are left to test_train_dp.py (constructing DDP alone costs seconds).
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os

import pytest
import torch
import torch.distributed as dist

from areal_graph.engines.training import data_parallel as dp
from areal_graph.runtime.launchers.local import free_port


# --------------------------------------------------------------------------- one process
@pytest.fixture
def no_group():
    if dist.is_available() and dist.is_initialized():
        pytest.skip("a process group is initialised in this process")


def test_constants():
    assert dp.MODES == ("auto", "none", "ddp", "fsdp")
    assert dp.ENV_KEYS == ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE")
    assert dp.COMMAND_TIMEOUT.days == 7


def test_world_without_a_group_is_rank_0_of_1(no_group):
    assert dp.world() == (0, 1)


def test_resolve_mode_without_a_group(no_group):
    cpu = torch.device("cpu")
    assert dp.resolve_mode("none", cpu) == "none"
    assert dp.resolve_mode("auto", cpu) == "none" and dp.resolve_mode("auto", torch.device("cuda")) == "none"
    for mode in ("ddp", "fsdp"):
        with pytest.raises(RuntimeError, match=f"parallel='{mode}' needs torch.distributed.init_process_group"):
            dp.resolve_mode(mode, cpu)
    with pytest.raises(ValueError, match=r"parallel must be one of \('auto', 'none', 'ddp', 'fsdp'\), got 'zero'"):
        dp.resolve_mode("zero", cpu)


def test_local_device_leaves_a_cpu_alone():
    for mode in ("none", "ddp", "fsdp"):
        assert dp.local_device("cpu", mode) == torch.device("cpu")
    assert dp.local_device(torch.device("cpu"), "ddp") == torch.device("cpu")


def test_init_from_env_names_what_is_missing(monkeypatch):
    for key in dp.ENV_KEYS:
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("RANK", "")  # set but empty counts as missing
    with pytest.raises(RuntimeError, match="needs MASTER_PORT, RANK, WORLD_SIZE in its environment"):
        dp.init_from_env()


def test_sum_dicts_adds_shares_and_keeps_maxima():
    ranks = [{"loss": 1.0, "n_tokens": 2, "gap_max": 0.3}, {"loss": 0.5, "n_tokens": 3, "gap_max": 0.7, "extra": 1}]
    assert dp.sum_dicts(ranks) == {"loss": 1.5, "n_tokens": 5.0, "gap_max": 0.7, "extra": 1.0}
    assert dp.sum_dicts([{"gap_max": -2.0}, {"gap_max": -3.0}]) == {"gap_max": -2.0}
    assert dp.sum_dicts([]) == {}


def test_as_local_scalar():
    plain = torch.tensor(2.5)
    assert dp.as_local_scalar(plain) is plain

    class Sharded:  # a DTensor's interface: full_tensor() gathers it
        def full_tensor(self):
            return torch.tensor(4.0)

    assert dp.as_local_scalar(Sharded()).item() == 4.0


class FakeWrapped:
    def __init__(self) -> None:
        self.events: list = []

    def no_sync(self):
        events = self.events

        class Ctx:
            def __enter__(self):
                events.append("no_sync")

            def __exit__(self, *exc):
                events.append("synced again")
                return False

        return Ctx()

    def set_requires_gradient_sync(self, sync: bool) -> None:
        self.events.append(("fsdp_sync", sync))


@pytest.mark.parametrize(
    "mode, sync, events",
    [
        ("ddp", False, ["no_sync", "body", "synced again"]),
        ("ddp", True, ["body"]),
        ("fsdp", False, [("fsdp_sync", False), "body"]),
        ("fsdp", True, [("fsdp_sync", True), "body"]),
        ("none", False, ["body"]),
        ("none", True, ["body"]),
    ],
)
def test_grad_sync_switches_the_wrapper(mode, sync, events):
    wrapped = FakeWrapped()
    with dp.grad_sync(wrapped, mode, sync):
        wrapped.events.append("body")
    assert wrapped.events == events


def adam_like_state():
    """An optimizer state in the format of torch's `Optimizer.state_dict()` (parameters numbered in
    `model.parameters()` order, two groups), built by hand: a real torch.optim costs seconds to import."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2, bias=False))
    params = dict(model.named_parameters())
    state = {
        i: {"step": torch.tensor(1.0), "exp_avg": torch.randn_like(p), "exp_avg_sq": torch.rand_like(p)}
        for i, p in enumerate(params.values())
    }
    groups = [{"lr": 1e-3, "betas": (0.9, 0.999), "params": [0, 1]}, {"lr": 5e-4, "betas": (0.9, 0.999), "params": [2]}]
    return {"state": state, "param_groups": groups}, list(params), params


def test_optimizer_state_by_name_and_back():
    state, names, params = adam_like_state()
    assert names == ["0.weight", "0.bias", "2.weight"]
    by_name = dp.optim_state_ids_to_names(state, names)
    assert set(by_name["state"]) == set(names)
    assert [g["params"] for g in by_name["param_groups"]] == [["0.weight", "0.bias"], ["2.weight"]]
    assert [g["lr"] for g in by_name["param_groups"]] == [1e-3, 5e-4]
    for i, name in enumerate(names):
        assert by_name["state"][name]["exp_avg"].shape == params[name].shape
        assert by_name["state"][name]["exp_avg"] is state["state"][i]["exp_avg"]  # renamed, not copied
    assert state["param_groups"][0]["params"] == [0, 1]  # the input is left as it was
    back = dp.optim_state_names_to_ids(by_name, names)
    assert back["param_groups"] == state["param_groups"]
    assert back["state"].keys() == state["state"].keys()
    for i, s in state["state"].items():
        assert all(torch.equal(back["state"][i][k], v) for k, v in s.items())


def test_optimizer_state_ids_may_be_strings():
    """A state that went through JSON-like formats has str ids: they still map to names."""
    state = {"state": {"1": {"step": 3}}, "param_groups": [{"lr": 0.1, "params": ["0", "1"]}]}
    assert dp.optim_state_ids_to_names(state, ["a", "b"]) == {
        "state": {"b": {"step": 3}},
        "param_groups": [{"lr": 0.1, "params": ["a", "b"]}],
    }


# --------------------------------------------------------------------------- two ranks
def rank_main(rank: int, port: int, out_path: str) -> None:
    """One rank: join through the torchrun-style environment, run each collective, write what it got."""
    os.environ.update(
        {
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
            "RANK": str(rank),
            "WORLD_SIZE": "2",
            "LOCAL_RANK": str(rank),
        }
    )
    torch.set_num_threads(1)
    group = dp.init_from_env()
    rank, size = dp.world()
    cpu = torch.device("cpu")
    out = {"world": [rank, size], "auto": dp.resolve_mode("auto", cpu), "ddp": dp.resolve_mode("ddp", cpu)}

    big = ("h\u00e9llo-" * 5000).encode()  # 35 KB, not ASCII
    out["bytes"] = dp.broadcast_bytes(big if rank == 0 else None, group).decode()
    out["empty"] = dp.broadcast_bytes(b"" if rank == 0 else None, group).decode()
    out["gather"] = dp.all_gather_json(
        {"rank": rank, "text": "\u00fc" * (1 + 50 * rank), "v": list(range(rank + 1))}, cpu
    )
    t = torch.tensor([rank + 1.0, 10.0 * rank])
    out["sum_is_in_place"] = dp.all_reduce_sum_(t) is t
    out["sum"] = t.tolist()

    torch.manual_seed(rank)
    lin = torch.nn.Linear(3, 2)
    lin.register_buffer("steps", torch.full((2,), float(rank)))
    dp.broadcast_from_rank0(lin)
    out["broadcast"] = {k: v.tolist() for k, v in lin.state_dict().items()}
    dist.destroy_process_group()
    with open(out_path, "w") as f:
        json.dump(out, f)


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory):
    """Two forked ranks (fork: torch is already imported here, so they start at once)."""
    if dist.is_initialized():
        pytest.skip("a process group is initialised in this process")
    tmp = tmp_path_factory.mktemp("dp")
    port = free_port()
    ctx = mp.get_context("fork")
    procs = [ctx.Process(target=rank_main, args=(rank, port, str(tmp / f"rank{rank}.json"))) for rank in range(2)]
    for p in procs:
        p.start()
    try:
        for p in procs:
            p.join(timeout=120)
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join()
    assert [p.exitcode for p in procs] == [0, 0]
    return [json.loads((tmp / f"rank{rank}.json").read_text()) for rank in range(2)]


def test_ranks_join_from_the_environment(two_ranks):
    assert [r["world"] for r in two_ranks] == [[0, 2], [1, 2]]
    assert all(r["auto"] == "ddp" and r["ddp"] == "ddp" for r in two_ranks)  # auto on CPU with 2 ranks


def test_broadcast_bytes_gives_every_rank_rank_0s_payload(two_ranks):
    expected = "h\u00e9llo-" * 5000
    assert [r["bytes"] == expected for r in two_ranks] == [True, True]
    assert [r["empty"] for r in two_ranks] == ["", ""]


def test_all_gather_json_in_rank_order_with_different_lengths(two_ranks):
    gathered = [{"rank": 0, "text": "\u00fc", "v": [0]}, {"rank": 1, "text": "\u00fc" * 51, "v": [0, 1]}]
    assert [r["gather"] for r in two_ranks] == [gathered, gathered]


def test_all_reduce_sums_in_place(two_ranks):
    assert [r["sum"] for r in two_ranks] == [[3.0, 10.0], [3.0, 10.0]]
    assert all(r["sum_is_in_place"] for r in two_ranks)


def test_rank_0s_parameters_and_buffers_reach_every_rank(two_ranks):
    torch.manual_seed(0)
    ref = torch.nn.Linear(3, 2)
    expected = {"weight": ref.weight.tolist(), "bias": ref.bias.tolist(), "steps": [0.0, 0.0]}
    for r in two_ranks:
        assert r["broadcast"].keys() == expected.keys()
        for k, v in expected.items():
            assert torch.allclose(torch.tensor(r["broadcast"][k]), torch.tensor(v)), k


@pytest.mark.parametrize(
    "mode,gpus,local_rank,expected",
    [("none", 1, None, 0), ("none", 4, "2", 3), ("fsdp", 1, "0", 0), ("fsdp", 4, "2", 2), ("ddp", 2, "1", 1)],
)
def test_local_device_gives_a_bare_cuda_an_index(monkeypatch, mode, gpus, local_rank, expected):
    """torch.cuda.set_device refuses a bare "cuda" (no index): a model with `device: cuda` on one
    process takes the current GPU (3 here), a data-parallel rank its LOCAL_RANK's."""
    chosen = []
    monkeypatch.setattr(torch.cuda, "device_count", lambda: gpus)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0 if gpus == 1 else 3)
    monkeypatch.setattr(torch.cuda, "set_device", lambda d: chosen.append(d))
    if local_rank is None:
        monkeypatch.delenv("LOCAL_RANK", raising=False)
    else:
        monkeypatch.setenv("LOCAL_RANK", local_rank)
    device = dp.local_device("cuda", mode)
    assert device == torch.device("cuda", expected) and chosen == [device]
    assert dp.local_device("cuda:1", mode) == torch.device("cuda", 1)
