"""Real worker subprocesses over loopback: configure, execute, call, errors, tokens, big batches."""

from __future__ import annotations

import time
from pathlib import Path

import grpc
import pytest
import torch

from areal_graph.data.packed import PackedBatch
from areal_graph.runtime.launchers.local import LocalLauncher
from areal_graph.runtime.rpc.worker_client import WorkerClient, WorkerError
from support.paths import TESTS


@pytest.fixture(scope="module")
def worker(tmp_path_factory):
    launcher = LocalLauncher(tmp_path_factory.mktemp("logs"), pythonpath=[TESTS])
    try:
        address = launcher.start_worker("w-test", threads=1)
        launcher.wait_healthy(timeout=60)
        client = WorkerClient(address, name="w-test", timeout=60)
        client.configure("echo", "support.grpc_test_nodes:EchoNode", {"scale": 1.5, "label": "E"})
        yield client
        client.close()
    finally:
        launcher.shutdown()


def _mixed_batch() -> PackedBatch:
    gen = torch.Generator().manual_seed(0)
    lens = [5, 1, 0, 9]
    n, total = len(lens), sum(lens)
    cu = torch.tensor([0, 5, 6, 6, 15], dtype=torch.int32)
    return PackedBatch(
        cu,
        {
            "input_ids": torch.randint(0, 1000, (total,), generator=gen),
            "loss_mask": torch.randint(0, 2, (total,), generator=gen).bool(),
            "behav_logprobs": -torch.rand(total, generator=gen),
            "h": torch.randn(total, generator=gen).bfloat16(),
            "versions": torch.randint(-1, 5, (total,), generator=gen, dtype=torch.int32),
            "f16": torch.randn(total, generator=gen).half(),
        },
        {"rewards": torch.rand(n, dtype=torch.float64, generator=gen), "group_id": torch.arange(n)},
        {"answer": ["42", "π ≈ 3.14", "", "multi\nline"], "prompt_id": ["a", "b", "c", "d"]},
    )


def test_health_reports_name_and_impls(worker: WorkerClient) -> None:
    h = worker.health()
    assert h["ok"] and h["name"] == "w-test" and "echo" in h["impls"]


def test_echo_round_trips_every_dtype_and_meta(worker: WorkerClient) -> None:
    b = _mixed_batch()
    out = worker.execute("echo", "echo", b)
    assert torch.equal(out.cu_seqlens, b.cu_seqlens)
    for part in ("tokens", "seqs"):
        for k, v in getattr(b, part).items():
            got = getattr(out, part)[k]
            assert got.dtype == v.dtype and torch.equal(got, v), k
    assert out.meta == b.meta


def test_execute_passes_args_and_computes_remotely(worker: WorkerClient) -> None:
    b = _mixed_batch()
    out = worker.execute("echo", "double", b, key="behav_logprobs", out_key="y")
    expected = [float(x) * 2 * 1.5 for x in b.tokens["behav_logprobs"].tolist()]
    assert out.tokens["y"].tolist() == pytest.approx(expected, rel=1e-6)
    out = worker.execute("echo", "seq_sum", b, key="input_ids")
    ref = [sum(b.tokens["input_ids"][int(b.cu_seqlens[i]) : int(b.cu_seqlens[i + 1])].tolist()) for i in range(4)]
    assert out.seqs["sum"].tolist() == ref
    assert out.meta["label"] == ["E-0", "E-1", "E-2", "E-3"]
    assert worker.execute("echo", "nothing", b).keys() == set()


def test_large_batch_is_streamed(worker: WorkerClient) -> None:
    n = 50 * 2**20 // 4  # 50 MiB of float32
    x = torch.randn(n)
    b = PackedBatch(torch.tensor([0, n // 2, n], dtype=torch.int32), {"x": x})
    out = worker.execute("echo", "echo", b)
    assert torch.equal(out.tokens["x"], x)


def test_small_batches_go_in_one_message_and_large_ones_stream(worker: WorkerClient, monkeypatch) -> None:
    """The two wire paths give the same results; which one a call takes depends on its size."""
    used: list[str] = []
    for name in ("Execute", "ExecuteOne"):
        real = getattr(worker._stub, name)
        monkeypatch.setattr(worker._stub, name, lambda *a, _n=name, _r=real, **k: (used.append(_n), _r(*a, **k))[1])
    small = _mixed_batch()
    assert worker.execute("echo", "echo", small).meta == small.meta
    n = 12 * 2**20 // 4  # 12 MiB: over the one-message limit
    x = torch.randn(n)
    assert torch.equal(
        worker.execute("echo", "echo", PackedBatch(torch.tensor([0, n], dtype=torch.int32), {"x": x})).tokens["x"], x
    )
    assert used == ["ExecuteOne", "Execute"]


def test_remote_exception_surfaces_with_traceback(worker: WorkerClient) -> None:
    with pytest.raises(WorkerError) as info:
        worker.execute("echo", "fail", _mixed_batch(), message="kaput-123")
    e = info.value
    assert e.worker == "w-test" and e.impl == "echo" and e.method == "fail"
    assert e.code == grpc.StatusCode.INTERNAL
    text = str(e)
    assert "deliberate failure: kaput-123" in text and "Traceback" in text and "grpc_test_nodes.py" in text
    assert worker.health()["ok"]  # still serving


def test_call_returns_json_and_errors_name_the_method(worker: WorkerClient) -> None:
    assert worker.call("echo", "set_version", version=7) == {"version": 7, "label": "E"}
    with pytest.raises(WorkerError, match=r"(?s)'crash_call'.*KeyError.*no such weights"):
        worker.call("echo", "crash_call")
    with pytest.raises(WorkerError, match="no public method 'nope'"):
        worker.call("echo", "nope")
    with pytest.raises(WorkerError, match="no implementation named 'ghost'"):
        worker.execute("ghost", "echo", _mixed_batch())


def test_unencodable_batch_is_refused_before_sending(worker: WorkerClient) -> None:
    b = PackedBatch(torch.tensor([0, 2], dtype=torch.int32), {"c": torch.zeros(2, dtype=torch.complex64)})
    with pytest.raises(TypeError, match="tokens key 'c' has dtype torch.complex64"):
        worker.execute("echo", "echo", b)
    b = PackedBatch(torch.tensor([0, 1], dtype=torch.int32), meta={"m": [None]})
    with pytest.raises(TypeError, match=r"meta 'm'\[0\] is NoneType"):
        worker.execute("echo", "echo", b)


def test_configure_errors_are_reported(worker: WorkerClient) -> None:
    with pytest.raises(WorkerError, match="cannot build this node"):
        worker.configure("bad", "support.grpc_test_nodes:BrokenInit", {})
    with pytest.raises(WorkerError, match="must look like"):
        worker.configure("bad", "grpc_test_nodes.EchoNode", {})
    with pytest.raises(WorkerError, match="no module named"):
        worker.configure("bad", "no_such_module_xyz:Thing", {})


def test_stats_return_spans_once(worker: WorkerClient) -> None:
    worker.stats()  # drain
    worker.execute("echo", "echo", _mixed_batch(), _step=3, _version=2)
    worker.call("echo", "set_version", version=1)
    s = worker.stats()
    assert s["name"] == "w-test" and s["rss_bytes"] > 0 and s["uptime_s"] > 0 and s["calls"] >= 2
    names = [sp["name"] for sp in s["spans"]]
    assert names == ["echo.echo", "echo.set_version"]
    sp = s["spans"][0]
    assert sp["worker"] == "w-test" and sp["end"] >= sp["start"] and sp["args"]["step"] == 3
    assert sp["args"]["version"] == 2
    assert worker.stats()["spans"] == []


def test_concurrent_calls_from_threads(worker: WorkerClient) -> None:
    from concurrent.futures import ThreadPoolExecutor

    b = _mixed_batch()
    with ThreadPoolExecutor(8) as pool:
        outs = list(pool.map(lambda i: worker.execute("echo", "seq_sum", b, key="input_ids"), range(16)))
    assert all(torch.equal(o.seqs["sum"], outs[0].seqs["sum"]) for o in outs)


def test_many_long_calls_run_concurrently(worker: WorkerClient) -> None:
    """Rollout calls block for a whole generation; 32 of them must overlap, not queue."""
    from concurrent.futures import ThreadPoolExecutor

    b = _mixed_batch()
    t0 = time.perf_counter()
    with ThreadPoolExecutor(32) as pool:
        outs = list(pool.map(lambda i: worker.execute("echo", "sleep", b, seconds=1.0), range(32)))
    assert time.perf_counter() - t0 < 16.0  # serial would be 32 s; any real overlap halves it
    assert all(o.meta == b.meta for o in outs)


def test_token_required_off_loopback(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AREAL_TEST_TOKEN", "s3cret-token")
    with LocalLauncher(tmp_path, pythonpath=[TESTS]) as launcher:
        address = launcher.start_worker("w-open", host="0.0.0.0", token_env="AREAL_TEST_TOKEN")
        launcher.wait_healthy(timeout=60)
        assert address.startswith("127.0.0.1:")
        for token in (None, "wrong"):
            with WorkerClient(address, token=token, name="w-open") as c, pytest.raises(WorkerError) as info:
                c.health()
            assert info.value.code == grpc.StatusCode.UNAUTHENTICATED
        with WorkerClient(address, token="s3cret-token", name="w-open") as c:
            assert c.health()["name"] == "w-open"
            c.configure("e", "support.grpc_test_nodes:EchoNode", {})
            assert c.execute("e", "echo", _mixed_batch()).meta["answer"][1] == "π ≈ 3.14"


def test_non_loopback_bind_without_token_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    from areal_graph.runtime.rpc.worker_server import is_loopback, main, serve

    with pytest.raises(ValueError, match="refusing to bind '0.0.0.0' without a token"):
        serve("w-bad", host="0.0.0.0", port=0)
    with pytest.raises(SystemExit):
        main(["--name", "w-bad", "--host", "0.0.0.0", "--port", "0"])
    assert "refusing to bind" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["--name", "w-bad", "--token-env", "AREAL_SURELY_UNSET_VAR"])
    assert "AREAL_SURELY_UNSET_VAR" in capsys.readouterr().err
    assert is_loopback("127.0.0.2") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("0.0.0.0") and not is_loopback("10.0.0.1") and not is_loopback("myhost")


def test_shutdown_rpc_stops_the_worker(tmp_path: Path) -> None:
    with LocalLauncher(tmp_path, pythonpath=[TESTS]) as launcher:
        address = launcher.start_worker("w-stop")
        launcher.wait_healthy(timeout=60)
        WorkerClient(address).shutdown()
        launcher.procs["w-stop"].popen.wait(timeout=10)
        assert launcher.procs["w-stop"].popen.returncode == 0
