"""`areal-graph serve MODEL_DIR`: the embedded engine behind SGLang's native HTTP API."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from areal_graph.engines.inference.server.routes import routes_text


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "serve",
        help="serve a model over HTTP (SGLang- and OpenAI-compatible API)",
        description=(
            "Start the embedded inference engine (continuous batching, interruptible generation, "
            "weight updates from disk) behind the subset of SGLang's native HTTP API that RL uses and "
            "OpenAI's API (chat template, tools as Hermes-style <tool_call> blocks, n, logprobs, "
            "streaming, the Responses API). "
            "Point any SGLang client (or areal-graph's InferenceClient), or the official openai package "
            "(base_url=http://HOST:PORT/v1, api_key=the key), at it. Every route it serves:\n\n" + routes_text()
        ),
        epilog=(
            "Example: areal-graph serve builtin:tiny-arith --port 30000\n"
            "With a key: export KEY=$(openssl rand -hex 32); areal-graph serve builtin:tiny-arith --api-key-env KEY\n"
            'then: curl -s localhost:30000/generate -d \'{"input_ids": [1, 2, 3], '
            '"sampling_params": {"max_new_tokens": 8, "temperature": 0}, "return_logprob": true}\'\n'
            'or: curl -s localhost:30000/v1/chat/completions -d \'{"model": "m", '
            '"messages": [{"role": "user", "content": "What is 2 + 3?"}], "max_tokens": 16}\''
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "model", metavar="MODEL_DIR", help="HF-format model directory, or builtin:NAME (e.g. builtin:tiny-arith)"
    )
    p.add_argument("--host", default="127.0.0.1", help="interface to listen on (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=30000, help="port (default 30000; 0 picks a free one)")
    p.add_argument("--max-running", type=int, default=64, help="sequences decoded together (default 64)")
    p.add_argument("--max-queue", type=int, default=1024, help="queued requests before 503 (default 1024)")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    p.add_argument("--seed", type=int, default=0, help="sampling seed (default 0)")
    p.add_argument("--device", default="cpu", help="torch device for the model, e.g. cpu or cuda (default cpu)")
    p.add_argument(
        "--max-context",
        type=int,
        default=None,
        help="prompt + generation token limit (default: the model's max_position_embeddings)",
    )
    p.add_argument(
        "--dtype",
        default="float32",
        choices=["float32", "bfloat16", "float16"],
        help="weights and compute dtype (default float32; bfloat16 on a GPU)",
    )
    p.add_argument(
        "--served-model-name",
        default=None,
        metavar="NAME",
        help="the model's id on /v1/models (default: the builtin's name, or the model directory's)",
    )
    p.add_argument(
        "--max-prompt-chars",
        type=int,
        default=None,
        metavar="N",
        help="prompts longer than this many characters are refused before tokenizing "
        "(default: 32 per token of context)",
    )
    p.add_argument(
        "--speculative",
        default="off",
        choices=["on", "off"],
        help="speculative decoding without a draft model: each running answer proposes the tokens that "
        "followed its last few tokens in its prompt, its own text and the other answers to its prompt, "
        "and one forward verifies them. The output is exactly that of plain decoding (default off)",
    )
    p.add_argument(
        "--api-key-env",
        default=None,
        metavar="VAR",
        help="require the API key held in environment variable VAR: every request but GET /health "
        "must send 'Authorization: Bearer KEY' (an OpenAI client's api_key). Default: no key, "
        "and only --host 127.0.0.1 is allowed",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import torch
    from rich.console import Console

    from areal_graph.api.fields import device_check
    from areal_graph.engines.inference.server import http_server
    from areal_graph.modelkit.builtin import PREFIX, resolve_model_path

    console = Console(stderr=True)
    if args.port < 0 or args.port > 65535:
        console.print(f"[red]--port must be in 0..65535, got {args.port}[/]")
        return 2
    for flag, value, least in (
        ("--max-running", args.max_running, 1),
        ("--max-queue", args.max_queue, 0),
        ("--threads", args.threads, 1),
        ("--max-context", args.max_context, 2),
        ("--max-prompt-chars", args.max_prompt_chars, 1),
    ):
        if value is not None and value < least:
            console.print(f"[red]{flag} must be >= {least}, got {value}[/]")
            return 2
    if (problem := device_check(args.device)) is not None:
        console.print(f"[red]--device {problem}, got {args.device!r}[/]")
        return 2
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        console.print(f"[red]--device {args.device}: this machine has no CUDA device (or torch is a CPU build)[/]")
        return 2
    if args.api_key_env and not os.environ.get(args.api_key_env):
        console.print(f"[red]--api-key-env {args.api_key_env}: that environment variable is not set or empty[/]")
        return 2
    if not args.api_key_env and args.host not in ("127.0.0.1", "localhost", "::1"):
        console.print(
            f"[red]--host {args.host} exposes the server beyond this machine: give it a key with "
            f"--api-key-env VAR (export VAR=$(openssl rand -hex 32))[/]"
        )
        return 2
    try:
        if args.model.startswith(PREFIX):  # a kit's first build takes minutes: show it (cmd_init_model.kit_progress)
            from areal_graph.cli.cmd_init_model import kit_progress

            with kit_progress(console) as progress:
                model = str(resolve_model_path(args.model, progress))
        else:
            model = str(resolve_model_path(args.model))
    except ValueError as err:
        console.print(f"[red]{err}[/]")
        return 1

    if not Path(model).is_dir():
        console.print(f"[red]MODEL_DIR {args.model!r}: no such directory[/]")
        return 1
    console.print(
        f"[bold]areal-graph serve[/] {args.model} on http://{args.host}:{args.port} "
        f"(max running {args.max_running}); Ctrl-C stops"
    )
    argv = [
        "--model",
        model,
        "--host",
        args.host,
        "--port",
        str(args.port),
        "--max-running",
        str(args.max_running),
        "--max-queue",
        str(args.max_queue),
        "--seed",
        str(args.seed),
    ]
    if args.threads is not None:
        argv += ["--threads", str(args.threads)]
    if args.max_context is not None:
        argv += ["--max-context", str(args.max_context)]
    argv += ["--device", args.device, "--dtype", args.dtype]
    if args.max_prompt_chars is not None:
        argv += ["--max-prompt-chars", str(args.max_prompt_chars)]
    name = args.served_model_name or (args.model.removeprefix(PREFIX) if args.model.startswith(PREFIX) else None)
    if name:
        argv += ["--served-model-name", name]
    if args.api_key_env:
        argv += ["--api-key-env", args.api_key_env]
    if args.speculative == "on":
        argv += ["--speculative", "on"]
    return http_server.main(argv)
