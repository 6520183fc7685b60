"""The embedded inference server's command line, without the server.

Why a module of its own: `validate` checks a workflow's `inference.args` with this very parser
(`backends/embedded.py:EmbeddedBackend.args_problem`), and must not load torch and the engine
to do it; the server (`http_server.py:main`) parses its argv with it.
"""

from __future__ import annotations

import argparse

__all__ = ["build_arg_parser", "DTYPES"]

# --dtype: torch's names for the weight and compute types the engine takes
DTYPES: dict[str, str] = {"float32": "float32", "bfloat16": "bfloat16", "float16": "float16"}


def build_arg_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m areal_graph.engines.inference.server.http_server",
        description="Serve a model with the embedded engine behind SGLang's native HTTP API.",
    )
    p.add_argument("--model", required=True, help="model directory (HF format)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=30000, help="0 picks a free port (printed on stdout)")
    p.add_argument("--max-running", type=int, default=64, help="sequences decoded together (continuous batching)")
    p.add_argument("--max-queue", type=int, default=1024, help="waiting requests beyond which /generate answers 503")
    p.add_argument(
        "--max-context", type=int, default=None, help="prompt + generation token limit (default: the model's)"
    )
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    p.add_argument(
        "--kv-on-update",
        default="recompute",
        choices=["recompute", "keep", "wait"],
        help="at a weight update, recompute the KV cache of requests in flight (default), keep it, "
        "or wait for them to finish before swapping",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--weight-version", type=int, default=0, help="version of the weights loaded at start")
    p.add_argument("--device", default="cpu")
    p.add_argument(
        "--dtype",
        default="float32",
        choices=sorted(DTYPES),
        help="weights and compute (bfloat16 on a GPU: half the memory traffic per decoded token)",
    )
    p.add_argument("--name", default="inference", help="the process name in trace spans")
    p.add_argument(
        "--max-prompt-chars",
        type=int,
        default=None,
        help="/v1 prompts longer than this are refused before tokenizing (default: 32 per token of context)",
    )
    p.add_argument(
        "--served-model-name",
        default=None,
        help="the model's id on /v1 (default: the model directory's name, not its path)",
    )
    p.add_argument(
        "--api-key-env",
        default=None,
        metavar="VAR",
        help="require the API key held in environment variable VAR (Authorization: Bearer KEY)",
    )
    return p
