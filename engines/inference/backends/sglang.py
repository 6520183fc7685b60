"""SGLang (GPU only): its native HTTP API, which the embedded server also speaks.

Names and fields checked against SGLang's `http_server.py` and `io_struct.py`
(`GenerateReqInput`, `UpdateWeightFromDiskReqInput`, `PauseGenerationReqInput`, `AbortReq`):
- no per-token versions: every token of a response gets `meta_info.weight_version` (a string
  we set to str(int) on update). With pause-by-abort every token of one response came from
  the same weights, so that is exact;
- `/pause_generation {"mode": "abort"}` (SGLang's default; older SGLang ignores the body and
  always aborts): in-flight requests come back `abort` and the interruptible loop resubmits
  them; new ones wait until `/continue_generation`;
- a weight update is pause -> `/update_weights_from_disk` -> continue;
- no `logprob_start_len`: the default (-1) already returns the output log-probs, and most
  SGLang versions abort a request whose `logprob_start_len >= len(input_ids)`.
"""

from __future__ import annotations

import importlib.util
import math
from collections.abc import Sequence
from typing import Any

from areal_graph.api.sampling import SamplingParams
from areal_graph.engines.inference.backends.base import (
    HttpCall,
    InferenceBackend,
    ParsedGeneration,
    ServerLaunch,
    adapter_name,
    finish_type,
    parse_version,
)


def sampling_to_json(sampling: SamplingParams) -> dict[str, Any]:
    """SamplingParams -> SGLang `sampling_params` (greedy is temperature 0 there)."""
    sp: dict[str, Any] = {
        "max_new_tokens": int(sampling.max_new_tokens),
        "temperature": 0.0 if sampling.greedy else float(sampling.temperature),
        "top_p": float(sampling.top_p),
        "top_k": int(sampling.top_k),
        "ignore_eos": bool(sampling.ignore_eos),
    }
    if sampling.stop_token_ids:
        sp["stop_token_ids"] = [int(t) for t in sampling.stop_token_ids]
    if sampling.stop:
        sp["stop"] = list(sampling.stop)
    if sampling.seed is not None:
        sp["sampling_seed"] = int(sampling.seed)
    if sampling.has_penalties:  # the same names and meanings in SGLang and vLLM
        sp.update(
            frequency_penalty=float(sampling.frequency_penalty),
            presence_penalty=float(sampling.presence_penalty),
            repetition_penalty=float(sampling.repetition_penalty),
        )
    if sampling.json_schema is not None:
        sp["json_schema"] = sampling.json_schema  # SGLang's field, a JSON Schema as a string
    if sampling.grammar is not None:
        sp["grammar"] = sampling.grammar  # ours (a Lark grammar): the embedded server's only
    return sp


class SGLangBackend(InferenceBackend):
    name = "sglang"
    context_arg = "context_length"  # its server flag capping prompt + generation
    startup_timeout_s = 900.0  # SGLang loads CUDA kernels and captures graphs before /health: minutes
    pause_around_update = True
    pause_mode = "abort"
    lark_grammars = False  # SamplingParams.grammar (llguidance Lark): only our embedded server takes it

    def unavailable(self, python: str | None) -> str | None:
        if python is None and importlib.util.find_spec("sglang") is None:
            return (
                "inference.backend 'sglang' needs the sglang package on a GPU machine: "
                "pip install 'areal-graph[sglang]' (use backend 'embedded' on a CPU), "
                "or inference.python naming an interpreter that has it"
            )
        return None

    server_module = "sglang.launch_server"
    model_flag = "--model-path"

    def server_options(self, launch: ServerLaunch) -> list[str]:
        options = [
            "--random-seed",
            str(launch.seed),
            "--max-running-requests",
            str(launch.inference.max_running_requests),
        ]
        if launch.api_key:  # SGLang takes its key only as an argument
            options += ["--api-key", launch.api_key]
        return options

    def gpus(self, inference: Any) -> int:
        """One server spans tp x dp GPUs (`--dp-size` runs dp replicas of a tp-way model)."""
        args = inference.args
        return int(args.get("tp_size", args.get("tp", 1))) * int(args.get("dp_size", args.get("dp", 1)))

    def cpus(self, gen_threads: int) -> int:
        return 1  # its work is on its GPUs

    # ------------------------------------------------------------------ wire
    def generate_call(
        self,
        input_ids: Sequence[int],
        sampling: SamplingParams,
        rid: str,
        adapter: str | None = None,
        tags: dict[str, int] | None = None,
    ) -> HttpCall:
        if sampling.grammar is not None and not self.lark_grammars:
            raise ValueError(
                f"SamplingParams.grammar (a Lark grammar: forced tool calls, JSON answers beside "
                f"tools) is not built for inference.backend '{self.name}' yet; json_schema is"
            )
        body = {
            "input_ids": [int(t) for t in input_ids],
            "sampling_params": sampling_to_json(sampling),
            "return_logprob": True,
            "rid": rid,
            "stream": False,
        }
        if adapter is not None:
            body["lora_path"] = adapter  # SGLang's /generate names a loaded adapter by `lora_path`
        return HttpCall("POST", "/generate", body)

    def parse_generate(self, body: Any) -> ParsedGeneration:
        if isinstance(body, list):  # SGLang answers a list for batched input; we never send one
            body = body[0]
        meta = body.get("meta_info", {}) if isinstance(body, dict) else {}
        pairs = meta.get("output_token_logprobs")
        if pairs is not None:
            out_ids = [int(p[1]) for p in pairs]
            logprobs = [float(p[0]) if p[0] is not None else math.nan for p in pairs]
        else:
            out_ids = [int(t) for t in body.get("output_ids", [])]
            logprobs = [math.nan] * len(out_ids)
        if "output_ids" in body and len(body["output_ids"]) != len(out_ids):
            raise ValueError("output_ids and output_token_logprobs disagree in length")
        versions = meta.get("output_token_versions")
        versions = [int(v) for v in versions] if versions is not None and len(versions) == len(out_ids) else None
        prompt_len = meta.get("prompt_tokens")
        forced = meta.get("output_token_forced")  # the embedded server's, for constrained requests
        return ParsedGeneration(
            out_ids,
            logprobs,
            versions,
            parse_version(meta.get("weight_version")),
            finish_type(meta.get("finish_reason")),
            int(prompt_len) if prompt_len is not None else None,
            [bool(f) for f in forced] if isinstance(forced, list) and len(forced) == len(out_ids) else None,
        )

    def abort_call(self, rid: str | None, abort_all: bool) -> HttpCall:
        return HttpCall("POST", "/abort_request", {"rid": rid or "", "abort_all": bool(abort_all)})

    def pause_call(self) -> HttpCall:
        return HttpCall("POST", "/pause_generation", {"mode": self.pause_mode})

    def resume_call(self) -> HttpCall:
        return HttpCall("POST", "/continue_generation", {})

    def disk_update_calls(self, path: str, version: int) -> list[HttpCall]:
        return [
            HttpCall(
                "POST", "/update_weights_from_disk", {"model_path": str(path), "weight_version": str(int(version))}
            )
        ]

    def model_info_call(self) -> HttpCall:
        return HttpCall("GET", "/get_model_info")

    # ------------------------------------------------------------------ LoRA adapters (SGLang's documented API)
    lora_adapters = True

    def lora_launch_flags(self, rank: int, target_modules: Sequence[str], keep: int) -> list[str]:
        """Adapters loaded at run time need their largest rank and their modules declared at launch."""
        return [
            "--enable-lora",
            "--max-lora-rank",
            str(int(rank)),
            "--lora-target-modules",
            *target_modules,
            "--max-loras-per-batch",
            str(keep),
            "--max-loaded-loras",
            str(keep),
        ]

    def adapter_load_calls(self, path: str, version: int) -> list[HttpCall]:
        return [
            HttpCall("POST", "/load_lora_adapter", {"lora_name": adapter_name(version), "lora_path": str(path)}),
            HttpCall("POST", "/update_weight_version", {"new_version": str(int(version)), "abort_all_requests": False}),
        ]

    def adapter_unload_call(self, version: int) -> HttpCall:
        return HttpCall("POST", "/unload_lora_adapter", {"lora_name": adapter_name(version)})
