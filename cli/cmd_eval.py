"""`areal-graph eval MODEL --data FILE`: greedy accuracy and pass@k of a model on a dataset."""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "eval",
        help="accuracy of a model on a dataset (greedy, and pass@k with sampling)",
        description=(
            "Generate answers with the embedded engine and score them with the same reward the RL "
            "run uses (math-verify by default). Reports greedy accuracy and, with -k, pass@k by "
            "the unbiased estimator from --samples >= k sampled answers per problem."
        ),
        epilog=(
            "Examples:\n"
            "  areal-graph eval builtin:tiny-arith --data builtin:arith/test\n"
            "  areal-graph eval runs/ppo_async-*/final_model --data builtin:arith/test -k 8 --json out.json\n"
            "  areal-graph eval builtin:tiny-calc --data builtin:calc/test \\\n"
            "      --rollout-class areal_graph.workflows.rollout.calculator_agent:CalculatorAgent"
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("model", metavar="MODEL_DIR", help="HF-format model directory (with tokenizer), or builtin:NAME")
    p.add_argument("--data", required=True, help="JSONL/JSON/parquet file with question and answer fields, or builtin:NAME")
    p.add_argument("--limit", type=int, default=None, help="evaluate only the first N problems")
    p.add_argument("-k", type=int, default=0, help="also report pass@k from sampled answers (default: greedy only)")
    p.add_argument("--samples", type=int, default=None, help="sampled answers per problem for pass@k (default k)")
    p.add_argument("--temperature", type=float, default=1.0, help="sampling temperature for pass@k (default 1.0)")
    p.add_argument("--max-new-tokens", type=int, default=64, help="generation length limit (default 64)")
    p.add_argument("--prompt-template", default=None, help="format string with {question} (default: the question)")
    p.add_argument("--question-key", default="question", help="question field of a row (default question)")
    p.add_argument("--answer-key", default="answer", help="reference-answer field of a row (default answer); "
                   "a dotted path reaches into nested fields (reward_model.ground_truth)")
    p.add_argument("--layout", choices=("auto", "fields", "verl"), default="auto",
                   help="verl: question from `prompt` (chat messages), answer from reward_model.ground_truth; "
                        "auto (default): verl for rows without --question-key that have verl's fields")
    p.add_argument("--source-key", default="data_source",
                   help="field naming a row's source: accuracy is also shown per source (default data_source)")
    p.add_argument("--reward", default="math_verify", help="reward fn: math_verify or module:function")
    p.add_argument("--seed", type=int, default=0, help="sampling seed (default 0)")
    p.add_argument("--rollout-class", default=None, metavar="MODULE:CLASS",
                   help="generate each answer as an episode of this rollout class, as RL does (multi-turn "
                        "agents with tools); --max-new-tokens is then per turn")
    p.add_argument("--json", dest="json_out", type=Path, default=None, help="also write the full result (per problem) here")
    p.add_argument("--show", type=int, default=3, help="print this many greedy answers (default 3)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.markup import escape
    from rich.progress import Progress
    from rich.table import Table

    from areal_graph.cli.console import output_console

    from areal_graph.cli.cmd_init_model import kit_progress
    from areal_graph.data.datasets import DatasetError
    from areal_graph.modelkit.builtin import resolve_dataset_path, resolve_model_path
    from areal_graph.engines.inference.offline_eval import evaluate_model

    console = output_console()
    err = Console(stderr=True, soft_wrap=True)
    if args.k < 0 or (args.samples is not None and args.samples < max(args.k, 1)):
        err.print(f"[red]-k must be >= 0 and --samples >= k (got -k {args.k}, --samples {args.samples})[/]")
        return 2
    if args.samples is not None and args.k == 0:
        err.print(f"[red]--samples {args.samples} without -k: samples are drawn for pass@k only (give -k)[/]")
        return 2
    if args.json_out is not None and args.json_out.is_dir():
        err.print(f"[red]--json {args.json_out} is a directory: give a file path[/]")
        return 2
    if args.limit is not None and args.limit < 1:
        err.print(f"[red]--limit must be >= 1, got {args.limit}[/]")
        return 2
    try:
        with kit_progress(err) as progress:  # a builtin kit's first build takes minutes
            model = resolve_model_path(args.model, progress)
            data = resolve_dataset_path(args.data, progress)
    except ValueError as exc:
        err.print(f"[red]{exc}[/]")
        return 2
    if not (model / "config.json").exists():
        err.print(f"[red]MODEL_DIR {args.model!r}: no config.json in {model} (expected a save_pretrained directory)[/]")
        return 1
    rollout = None
    if args.rollout_class:
        from areal_graph.engines.inference.rollout_eval import make_rollout

        try:
            rollout = make_rollout(args.rollout_class, str(model))
        except (ValueError, TypeError) as exc:  # ImportPathError is a ValueError
            err.print(f"[red]--rollout-class: {exc}[/]")
            return 2
    try:
        with Progress(console=err, transient=True) as progress:
            task = progress.add_task("generating", total=None)
            result = evaluate_model(
                model, data, limit=args.limit, k=args.k, n_samples=args.samples, temperature=args.temperature,
                max_new_tokens=args.max_new_tokens, prompt_template=args.prompt_template,
                question_key=args.question_key, answer_key=args.answer_key, layout=args.layout,
                source_key=args.source_key, reward_fn=args.reward, seed=args.seed,
                on_progress=lambda done, total: progress.update(task, completed=done, total=total),
                rollout=rollout,
            )
    except (DatasetError, ValueError) as exc:
        err.print(f"[red]{exc}[/]")
        return 1
    table = Table(title=f"{args.model} on {args.data}", title_justify="left")
    table.add_column("metric")
    table.add_column("value", justify="right")
    table.add_row("problems", str(result["prompts"]))
    table.add_row("greedy accuracy", f"{result['greedy_accuracy']:.1%}")
    if "greedy_tool_call_rate" in result:
        table.add_row("greedy answers calling a tool", f"{result['greedy_tool_call_rate']:.1%}")
    if args.k:
        table.add_row(f"pass@{args.k} (n={result['n_samples']}, T={args.temperature:g})", f"{result[f'pass@{args.k}']:.1%}")
        table.add_row("mean sample accuracy", f"{result['sample_accuracy']:.1%}")
    for source, row in result.get("by_source", {}).items():
        table.add_row(escape(f"  {source} ({row['prompts']:.0f})"), f"{row['greedy_accuracy']:.1%}")
    if result["skipped_rows"]:
        table.add_row("rows skipped", str(result["skipped_rows"]))
    if result["reward_failures"]:
        table.add_row("reward failures (scored 0)", str(result["reward_failures"]))
    table.add_row("time", f"{result['seconds']:.1f} s ({result['generated_tokens'] / max(result['generation_seconds'], 1e-9):.0f} tok/s)")
    console.print(table)
    for p in result["per_prompt"][: args.show]:
        mark = "[green]✓[/]" if p["greedy_correct"] else "[red]✗[/]"
        console.print(f"{mark} [dim]{escape(str(p['id']))} (answer {escape(str(p['answer']))}):[/] "
                      + escape(p["greedy"].replace("\n", " | ")), highlight=False)  # model text is not markup
    if args.json_out:
        try:
            args.json_out.parent.mkdir(parents=True, exist_ok=True)
            args.json_out.write_text(json.dumps(result, indent=2) + "\n")
        except OSError as exc:
            err.print(f"cannot write {args.json_out}: {exc.strerror or exc}", style="red", markup=False)
            return 1
        err.print(f"wrote {args.json_out}")
    return 0
