"""Our own engine (`engines/inference/server/http_server.py`): SGLang's native API plus what RL needs.

Differences from SGLang, all on the server's side:
- `meta_info.output_token_versions`: the version of every token;
- `/pause_generation {"mode": "in_place"}`: in-flight requests wait, then resume (KV recomputed
  if the weights changed); one `/update_weights_from_disk` pauses, swaps and resumes by itself;
- `/update_weights_from_shared_memory` (weight_sync: memory) and request spans (`/get_spans`).
"""

from __future__ import annotations

import contextlib
import io
from collections.abc import Sequence
from typing import Any, NoReturn

from areal_graph.api.process import RUN_TOKEN_ENV
from areal_graph.api.sampling import SamplingParams
from areal_graph.engines.inference.backends.base import HttpCall, ServerLaunch, launch_flags
from areal_graph.engines.inference.backends.sglang import SGLangBackend
from areal_graph.engines.inference.server.args import build_arg_parser, speculative_flags


def _no_named_adapters() -> NoReturn:
    raise NotImplementedError(
        "the embedded engine is not built to serve adapters by name: it merges the adapter "
        "tensors of each weight sync into its weights (lora_adapters is False)"
    )


class EmbeddedBackend(SGLangBackend):
    name = "embedded"
    context_arg = "max_context"  # its server flag capping prompt + generation
    shared_memory_weights = True
    server_spans = True
    startup_timeout_s = 180.0
    pause_around_update = False
    pause_mode = "in_place"
    lark_grammars = True
    lora_adapters = False  # adapters arrive as tensors and are merged into the weights (engines/lora_weights.py)

    def unavailable(self, python: str | None) -> str | None:
        return None

    # SGLang's named-adapter API is not ours: the embedded engine merges each sync's adapter tensors
    def lora_launch_flags(self, rank: int, target_modules: Sequence[str], keep: int) -> list[str]:
        _no_named_adapters()

    def adapter_load_calls(self, path: str, version: int) -> list[HttpCall]:
        _no_named_adapters()

    def adapter_unload_call(self, version: int) -> HttpCall:
        _no_named_adapters()

    server_module = "areal_graph.engines.inference.server.http_server"
    model_flag = "--model"

    def server_options(self, launch: ServerLaunch) -> list[str]:
        inference = launch.inference
        options = [
            "--max-running",
            str(inference.max_running_requests),
            "--threads",
            str(launch.threads),
            "--seed",
            str(launch.seed),
            "--name",
            launch.name,
        ]
        if launch.api_key:  # the key itself travels in the environment (RUN_TOKEN_ENV), not in argv
            options += ["--api-key-env", RUN_TOKEN_ENV]
        kv = getattr(inference, "kv_on_update", "recompute")
        if kv == "auto":  # the loader resolves it with the run's staleness (graph/spec.py)
            raise ValueError("inference.kv_on_update 'auto' reached the launcher unresolved: resolve_kv_on_update")
        if kv != "recompute":
            options += ["--kv-on-update", kv]
        # inference.speculative: `--speculative on` and the settings that differ from the server's defaults
        options += speculative_flags(getattr(inference, "speculative", None))
        return options

    def args_problem(self, inference: Any) -> str | None:
        """Our server's own argument parser reads the flags `inference.args` becomes."""
        err = io.StringIO()
        with contextlib.redirect_stderr(err):
            try:
                build_arg_parser().parse_args(["--model", "-"] + launch_flags(inference.args))
            except SystemExit:
                reason = err.getvalue().strip().splitlines()[-1] if err.getvalue().strip() else "bad arguments"
                return reason.split("error: ", 1)[-1]
        return None

    def generate_call(
        self,
        input_ids: Sequence[int],
        sampling: SamplingParams,
        rid: str,
        adapter: str | None = None,
        tags: dict[str, int] | None = None,
    ) -> HttpCall:
        call = super().generate_call(input_ids, sampling, rid, adapter)
        if tags:  # ours only: SGLang refuses fields it does not know
            call.payload["trace"] = dict(tags)
        return call

    def shared_memory_update_calls(self, path: str, manifest: list[dict], version: int) -> list[HttpCall]:
        return [
            HttpCall(
                "POST",
                "/update_weights_from_shared_memory",
                {"path": path, "manifest": manifest, "weight_version": int(version)},
            )
        ]

    def weights_digest_call(self) -> HttpCall:
        return HttpCall("GET", "/get_weights_digest")

    def gpus(self, inference: Any) -> int:
        return int(str(inference.args.get("device", "cpu")).startswith("cuda"))

    def cpus(self, gen_threads: int) -> int:
        return gen_threads  # it computes on its CPU threads (SGLang, its base here, reserves 1)
