"""The embedded inference server's command line, without the server.

Why a module of its own: `validate` checks a workflow's `inference.args` with this very parser
(`backends/embedded.py:EmbeddedBackend.args_problem`), and must not load torch and the engine
to do it; the server (`http_server.py:main`) parses its argv with it.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

from areal_graph.engines.inference.speculation.speculator import SpeculativeSettings

__all__ = ["build_arg_parser", "DTYPES", "speculative_settings", "speculative_flags"]

_SPEC_DEFAULTS = SpeculativeSettings()


def _int_at_least(low: int, high: int | None = None) -> Callable[[str], int]:
    """An argparse type: an integer in [low, high] (high None: no upper bound)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if value < low or (high is not None and value > high):
            raise argparse.ArgumentTypeError(
                f"must be in [{low}, {high}], got {value}" if high is not None else f"must be >= {low}, got {value}"
            )
        return value

    parse.__name__ = "integer"  # argparse names the type in its messages
    return parse


# --speculative-<field>: the settings' integer fields, their ranges and what they do
_SPECULATIVE_FLAGS: tuple[tuple[str, int, int | None, str, str], ...] = (
    ("max_draft", 1, 16, "K", "tokens a request proposes at most per step, in [1, 16]"),
    ("max_rows", 1, None, "N", "speculate only while N requests or fewer are running"),
    ("min_match", 1, None, "N", "shortest context suffix that counts as a match"),
    ("max_match", 1, None, "N", "longest suffix looked up first, >= --speculative-min-match"),
    ("history_prompts", 1, None, "N", "prompts whose finished answers are kept as draft material for later requests"),
    ("history_answers", 0, None, "N", "finished answers kept per prompt; 0 keeps none"),
    (
        "shadow_every",
        0,
        None,
        "N",
        "with speculation off, count what it would have accepted for the answers to one prompt in N; 0 counts nothing",
    ),
)

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
    spec = p.add_argument_group(
        "speculative decoding",
        "without a draft model (engines/inference/speculation/): the output is exactly that of plain "
        "decoding; only the speed changes",
    )
    spec.add_argument(
        "--speculative",
        default="off",
        choices=["on", "off"],
        help="propose each running answer's next tokens from its prompt, its own text, the other answers "
        "to its prompt and earlier ones, and verify them in one forward (default off)",
    )
    for field, low, high, metavar, what in _SPECULATIVE_FLAGS:
        default = getattr(_SPEC_DEFAULTS, field)
        spec.add_argument(
            "--speculative-" + field.replace("_", "-"),
            type=_int_at_least(low, high),
            default=default,
            metavar=metavar,
            help=f"{what} (default: {default if default is not None else 'decided per batch size from measured throughput'})",
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


def speculative_settings(args: argparse.Namespace) -> SpeculativeSettings:
    """The engine's SpeculativeSettings from parsed `--speculative*` flags; ValueError names the
    flag of a combination the parser cannot check by itself (max-match below min-match)."""
    if args.speculative_max_match < args.speculative_min_match:
        raise ValueError(
            f"--speculative-max-match ({args.speculative_max_match}) must be >= --speculative-min-match "
            f"({args.speculative_min_match})"
        )
    values = {field: getattr(args, "speculative_" + field) for field, *_ in _SPECULATIVE_FLAGS}
    return SpeculativeSettings(enabled=args.speculative == "on", **values)


def speculative_flags(settings: object) -> list[str]:
    """The server flags that ask for `settings` (SpeculativeSettings, or any object with its fields,
    such as the workflow's inference.speculative): `--speculative on` when it is on, and each
    setting that differs from the server's default, on or off (with speculation off the engine
    still proposes, to count what would have been accepted: `shadow_every`)."""
    out = ["--speculative", "on"] if getattr(settings, "enabled", False) else []
    for name, *_ in _SPECULATIVE_FLAGS:
        value = getattr(settings, name, getattr(_SPEC_DEFAULTS, name))
        if value is not None and value != getattr(_SPEC_DEFAULTS, name):
            out += ["--speculative-" + name.replace("_", "-"), str(value)]
    return out
