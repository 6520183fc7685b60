"""What an inference backend is to the rest of the system: how to start it and how to talk to it.

One backend is one file in this package (`embedded.py`, `sglang.py`, `vllm.py`), registered in
`__init__.py`. `InferenceClient` (client.py) turns the HTTP calls a backend describes into
requests with retries, version tracking and interruption handling; the executor starts the
command a backend builds. Outside this package only the schema names the backends (the
`inference.backend` Literal, checked against `BACKENDS` by a test) and the loader knows that
sglang cannot take weights through shared memory (the graph layer does not import engines).

The calls are plain data (`HttpCall`) and the parsers pure functions of a response body, so
each backend's wire format can be tested without a server.
"""

from __future__ import annotations

import logging
import math
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from areal_graph.api.sampling import SamplingParams

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class HttpCall:
    """One HTTP request to an inference server: `payload` is sent as JSON (None: no body)."""

    method: str
    path: str
    payload: Any = None
    text_reply: bool = False  # the server answers plain text, not JSON (vLLM's LoRA endpoints)


@dataclass(frozen=True)
class WeightsReport:
    """What a server says it holds after a load: the version it labels its weights with and a
    digest of them (engines/weights_digest.py) as held in `dtype` ('float32', 'bfloat16', ...)."""

    version: int
    digest: str
    dtype: str


@dataclass(frozen=True)
class ParsedGeneration:
    """One generate response, in the backend-neutral form the client builds its result from.

    `versions` is per output token (None for a token whose weights the server did not label:
    the version at submission applies), or None when the server reports one version for the
    whole response (`response_version`, None when it reports none: the client's own applies)."""

    output_ids: list[int]
    output_logprobs: list[float]
    versions: list[int | None] | None
    response_version: int | None
    finish_reason: str  # stop | length | abort
    prompt_len: int | None
    forced: list[bool] | None = None  # constrained decoding: per token, the grammar's only choice


@dataclass(frozen=True)
class ServerLaunch:
    """What one inference server is started with (`InferenceBackend.command` builds its command
    line from it): the workflow's `inference` section, the model, where it listens, its torch
    threads, its seed, its name and the run's secret (None: no key)."""

    inference: Any  # graph.spec.InferenceSpec (engines/ does not import graph/)
    model_path: str
    port: int
    threads: int
    seed: int
    name: str = "inference"
    api_key: str | None = None
    host: str = "127.0.0.1"


class InferenceBackend:
    """Base class: the embedded server's behaviour where a backend does not say otherwise."""

    name: str = ""
    # Can load weights a trainer on this machine published into shared memory (weight_sync: memory).
    shared_memory_weights: bool = False
    # Records request spans and answers /get_spans and /get_clock (the run's trace reads them).
    server_spans: bool = False
    # Seconds a fresh server may take to answer /health (kernel loading, graph capture, compile).
    startup_timeout_s: float = 180.0

    # ------------------------------------------------------------------ launch
    def unavailable(self, python: str | None) -> str | None:
        """Why this backend cannot start here (None: it can). `python`: inference.python."""
        return None

    def model_problem(self, head_dim: int | None) -> str | None:
        """Why this backend cannot serve a model of this attention head width here (None: it can)."""
        return None

    def args_problem(self, inference: Any) -> str | None:
        """What is wrong with `inference.args` for this backend's server (None: nothing known),
        checked before a run starts rather than when its servers refuse to start."""
        return None

    # The server flag (as an `inference.args` key) that caps prompt + generation below the
    # model's own context; None: the server always serves the model's.
    context_arg: str | None = None

    def context_limit(self, inference: Any) -> int | None:
        """The token limit `inference.args` sets on prompt + generation (None: the model's own),
        which `validate` measures the prompts against."""
        if self.context_arg is None:
            return None
        for key in (self.context_arg, self.context_arg.replace("_", "-")):
            value = inference.args.get(key)
            if value is not None:
                try:
                    return int(value)
                except (TypeError, ValueError):
                    return None
        return None

    # The server's entry point: `<python> -m <server_module> <model_flag> <model> --host H --port P`.
    server_module: str = ""
    model_flag: str = "--model"

    def command(self, launch: ServerLaunch) -> list[str]:
        """The server's command line: its interpreter runs `server_module` on the model, bound to
        `launch.host:port`, then the backend's own options (`server_options`), then
        `inference.args` as `--flag value` options (`launch_flags`)."""
        options = self.server_options(launch)
        inference = launch.inference
        return [
            self.interpreter(inference),
            "-m",
            self.server_module,
            self.model_flag,
            launch.model_path,
            "--host",
            launch.host,
            "--port",
            str(launch.port),
            *options,
            *launch_flags(inference.args),
        ]

    def server_options(self, launch: ServerLaunch) -> list[str]:
        """This backend's own options (seed, request limit, key, ...), between the address and `inference.args`."""
        raise NotImplementedError

    def environment(self, api_key: str | None) -> dict[str, str]:
        """Extra environment of the server process."""
        return {}

    def gpus(self, inference: Any) -> int:
        """GPUs one server uses (Ray reserves them)."""
        return 0

    def cpus(self, gen_threads: int) -> int:
        """CPU threads one server computes with (Ray reserves them)."""
        return gen_threads

    def thread_cap(self, gen_threads: int) -> int:
        """What the launcher caps the server's OpenMP/BLAS/torch thread pools at (OMP_NUM_THREADS)."""
        return gen_threads

    @staticmethod
    def interpreter(inference: Any) -> str:
        """The Python that runs the server: inference.python (relative to where the run started), else this one."""
        return os.path.abspath(inference.python) if inference.python else sys.executable

    # ------------------------------------------------------------------ wire
    def generate_call(
        self,
        input_ids: Sequence[int],
        sampling: SamplingParams,
        rid: str,
        adapter: str | None = None,
        tags: dict[str, int] | None = None,
    ) -> HttpCall:
        """`adapter`: the served adapter to generate with (backends with `lora_adapters`), else the base.
        `tags`: the request's group, episode and turn (request_tags.py), for a server that records
        them on its trace spans; others leave them out."""
        raise NotImplementedError

    def parse_generate(self, body: Any) -> ParsedGeneration:
        raise NotImplementedError

    def abort_call(self, rid: str | None, abort_all: bool) -> HttpCall:
        raise NotImplementedError

    def pause_call(self) -> HttpCall:
        """Stop decoding for a weight update (requests wait in place, or come back `abort`)."""
        raise NotImplementedError

    def resume_call(self) -> HttpCall:
        raise NotImplementedError

    def disk_update_calls(self, path: str, version: int) -> list[HttpCall]:
        """The calls that load weights from `path` and label them `version`."""
        raise NotImplementedError

    def shared_memory_update_calls(self, path: str, manifest: list[dict], version: int) -> list[HttpCall]:
        """The calls that load weights a trainer on this machine published into shared memory
        (engines/shared_weights.py: the file at `path`, described by `manifest`)."""
        raise NotImplementedError(f"the {self.name} backend cannot load weights from shared memory")

    # Wrap the update calls in pause_call ... resume_call (the server does not pause itself).
    pause_around_update: bool = False

    # ------------------------------------------------------------------ LoRA adapters (lora.sync: adapter)
    # Serves LoRA adapters itself (vLLM, SGLang): each weight sync loads the trainer's adapter
    # directory under a name of its own version, and requests name the adapter they want
    # (`adapter_name`). The embedded engine merges adapters into its weights instead (False).
    lora_adapters: bool = False

    def lora_launch_flags(self, rank: int, target_modules: Sequence[str], keep: int) -> list[str]:
        """Server flags for serving adapters of rank `rank` on `target_modules`, `keep` at once."""
        raise NotImplementedError(f"adapter-only LoRA sync to the {self.name} backend is not built")

    def lora_environment(self) -> dict[str, str]:
        """Extra environment of a server that loads adapters at run time."""
        return {}

    def adapter_load_calls(self, path: str, version: int) -> list[HttpCall]:
        """Load the peft adapter directory `path` as `adapter_name(version)` and label the server `version`."""
        raise NotImplementedError(f"adapter-only LoRA sync to the {self.name} backend is not built")

    def adapter_unload_call(self, version: int) -> HttpCall:
        raise NotImplementedError(f"adapter-only LoRA sync to the {self.name} backend is not built")

    def model_info_call(self) -> HttpCall:
        raise NotImplementedError

    def parse_model_info_version(self, body: Any) -> int | None:
        return parse_version(body.get("weight_version")) if isinstance(body, dict) else None

    # ------------------------------------------------------------------ what a server holds
    # The call that asks a server for its weights' version and digest (engines/weights_digest.py),
    # which the executor checks after every load; None: the server cannot say (vLLM, SGLang), and
    # its loads go unchecked (runtime/orchestration/server_weights.py says so once).
    def weights_digest_call(self) -> HttpCall | None:
        return None

    def parse_weights_digest(self, body: Any) -> WeightsReport:
        """The server's answer to `weights_digest_call`; a ValueError naming what is missing."""
        version = parse_version(body.get("weight_version")) if isinstance(body, dict) else None
        if version is None or not isinstance(body.get("digest"), str) or not isinstance(body.get("dtype"), str):
            raise ValueError(f"a weights digest needs weight_version, digest and dtype; the server answered {body!r}")
        return WeightsReport(version, body["digest"], body["dtype"])


ADAPTER_PREFIX = "policy-lora-v"


def adapter_name(version: int) -> str:
    """The served name of the policy's adapter at `version` (requests select it by this name)."""
    return f"{ADAPTER_PREFIX}{int(version)}"


def parse_version(x: Any) -> int | None:
    """A weight version label as an int (servers label their initial weights 'default')."""
    try:
        return int(x)
    except (TypeError, ValueError):
        return None


def finish_type(kind: Any) -> str:
    """A server's finish reason as stop | length | abort (anything unknown, or unfinished, is abort)."""
    if isinstance(kind, dict):
        kind = kind.get("type")
    if kind in ("stop", "length", "abort"):
        return kind
    if kind is not None:  # None: SGLang's value while a streamed request is unfinished
        log.warning("unknown finish_reason %r; treating it as abort", kind)
    return "abort"


def logprob_or_nan(x: Any) -> float:
    return float(x) if x is not None else math.nan


def launch_flags(args: dict[str, Any]) -> list[str]:
    """`inference.args` as `--flag value` options: underscores become dashes, `true` a bare flag."""
    out: list[str] = []
    for key, value in args.items():
        flag = "--" + str(key).replace("_", "-")
        if value is True:
            out.append(flag)
        elif value is not False and value is not None:  # 0 and 0.0 are values (0 == False)
            out += [flag, str(value)]
    return out
