"""How a run starts its inference servers: the embedded engine on a CPU, SGLang on a GPU."""

from __future__ import annotations

import importlib.util
import sys

import pytest

from areal_graph.engines.inference.backends import ServerLaunch, get_backend
from areal_graph.engines.inference.server.args import build_arg_parser
from areal_graph.graph.spec import InferenceSpec
from areal_graph.runtime.orchestration.placement import inference_server_command


def _command(spec: InferenceSpec, *args, **kwargs) -> list[str]:
    """The command the executor would start for `spec`'s backend."""
    return inference_server_command(get_backend(spec.backend), ServerLaunch(spec, *args, **kwargs))


def test_embedded_server_command_passes_model_port_threads_seed_and_extra_args():
    spec = InferenceSpec(
        backend="embedded", kv_on_update="recompute", max_running_requests=48, args={"max_queue": 256, "device": "cpu"}
    )
    cmd = _command(spec, "/m", 1234, threads=3, seed=9)
    assert cmd[:3] == [sys.executable, "-m", "areal_graph.engines.inference.server.http_server"]
    opts = dict(zip(cmd[3::2], cmd[4::2]))
    assert opts == {
        "--model": "/m",
        "--host": "127.0.0.1",
        "--port": "1234",
        "--max-running": "48",
        "--threads": "3",
        "--seed": "9",
        "--name": "inference",
        "--max-queue": "256",
        "--device": "cpu",
    }


def test_embedded_server_gets_the_run_key_by_environment_name_only():
    """The key never appears in argv (`ps` shows argv to every local user): the server is told
    which environment variable holds it."""
    from areal_graph.api.process import RUN_TOKEN_ENV

    cmd = _command(InferenceSpec(kv_on_update="recompute"), "/m", 1, 1, 0, api_key="s3cret")
    assert "s3cret" not in " ".join(cmd)
    assert build_arg_parser().parse_args(cmd[3:]).api_key_env == RUN_TOKEN_ENV


def test_embedded_server_accepts_the_extra_args_it_is_given():
    """The flags inference.args produce must be ones the server's parser knows."""
    cmd = _command(InferenceSpec(kv_on_update="recompute", args={"max_queue": 8, "max_context": 128}), "/m", 1, 1, 0)
    args = build_arg_parser().parse_args(cmd[3:])
    assert (args.max_queue, args.max_context, args.port, args.model) == (8, 128, 1, "/m")


@pytest.mark.skipif(importlib.util.find_spec("sglang") is None, reason="sglang not installed (GPU machines only)")
def test_sglang_server_command():
    spec = InferenceSpec(
        backend="sglang", max_running_requests=128, args={"mem_fraction_static": 0.8, "enable_metrics": True}
    )
    cmd = _command(spec, "/m", 30001, threads=1, seed=5)
    assert cmd[:3] == [sys.executable, "-m", "sglang.launch_server"]
    assert cmd[cmd.index("--model-path") + 1] == "/m" and cmd[cmd.index("--port") + 1] == "30001"
    assert cmd[cmd.index("--mem-fraction-static") + 1] == "0.8" and "--enable-metrics" in cmd


@pytest.mark.skipif(importlib.util.find_spec("sglang") is not None, reason="sglang is installed")
def test_sglang_backend_without_sglang_is_a_clear_error():
    with pytest.raises(RuntimeError, match=r"pip install 'areal-graph\[sglang\]'"):
        _command(InferenceSpec(backend="sglang"), "/m", 1, 1, 0)
