"""`areal-graph eval MODEL --data FILE`: greedy accuracy and pass@k of a model on a dataset."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import logging
import os
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "eval",
        help="accuracy of a model on a dataset (greedy, and pass@k with sampling)",
        description=(
            "Generate answers with the embedded engine and score them with a reward (math-verify by "
            "default). With --workflow, everything the RL run's own evaluation uses comes from the "
            "workflow: its eval data and prompt settings, its rollout class and arguments (multi-turn "
            "episodes), its per-turn length limit and its reward node's function, so the two agree. "
            "An answer is correct when its reward is above 0.5 (the run's eval/accuracy rule). "
            "Reports greedy accuracy and, with -k, pass@k by the unbiased estimator from "
            "--samples >= k sampled answers per problem."
        ),
        epilog=(
            "Examples:\n"
            "  areal-graph eval builtin:tiny-arith --data builtin:arith/test\n"
            "  areal-graph eval runs/my_env-*/final_model --workflow runs/my_env-*/config.yaml\n"
            "  areal-graph eval runs/ppo_async-*/final_model --data builtin:arith/test -k 8 --json out.json\n"
            "  areal-graph eval builtin:tiny-calc --data builtin:calc/test \\\n"
            "      --rollout-class areal_graph.workflows.rollout.calculator_agent:CalculatorAgent"
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("model", metavar="MODEL_DIR", help="HF-format model directory (with tokenizer), or builtin:NAME")
    p.add_argument(
        "--workflow",
        type=Path,
        default=None,
        metavar="WORKFLOW.yaml",
        help="evaluate as this workflow's run does (a run's RUN/config.yaml works): data.eval and its "
        "prompt settings, the rollout node's class, arguments and max_new_tokens, the first reward "
        "node's fn; flags given as well override it",
    )
    p.add_argument(
        "--data",
        default=None,
        help="JSONL/JSON/parquet file with question and answer fields, or builtin:NAME (required without --workflow)",
    )
    p.add_argument("--limit", type=int, default=None, help="evaluate only the first N problems")
    p.add_argument("-k", type=int, default=0, help="also report pass@k from sampled answers (default: greedy only)")
    p.add_argument("--samples", type=int, default=None, help="sampled answers per problem for pass@k (default k)")
    p.add_argument("--temperature", type=float, default=1.0, help="sampling temperature for pass@k (default 1.0)")
    p.add_argument("--max-new-tokens", type=int, default=None, help="generation length limit (default 64)")
    p.add_argument("--prompt-template", default=None, help="format string with {question} (default: the question)")
    p.add_argument("--question-key", default=None, help="question field of a row (default question)")
    p.add_argument(
        "--answer-key",
        default=None,
        help="reference-answer field of a row (default answer); "
        "a dotted path reaches into nested fields (reward_model.ground_truth)",
    )
    p.add_argument(
        "--layout",
        choices=("auto", "fields", "verl"),
        default=None,
        help="verl: question from `prompt` (chat messages), answer from reward_model.ground_truth; "
        "auto (default): verl for rows without --question-key that have verl's fields",
    )
    p.add_argument(
        "--source-key",
        default=None,
        help="field naming a row's source: accuracy is also shown per source (default data_source)",
    )
    p.add_argument(
        "--reward",
        default=None,
        help="reward fn: a builtin (agent, code, code_fraction, math_verify, reasoning_gym) or "
        "module:function; default: the one that scores the data (reasoning_gym for reasoning_gym:<task> "
        "data, the task's own scorer; agent for games and verifiers tasks; math_verify otherwise), "
        "or the workflow's with --workflow",
    )
    p.add_argument("--seed", type=int, default=0, help="sampling seed (default 0)")
    p.add_argument(
        "--rollout-class",
        default=None,
        metavar="MODULE:CLASS",
        help="generate each answer as an episode of this rollout class, as RL does (multi-turn "
        "agents with tools); --max-new-tokens is then per turn",
    )
    p.add_argument(
        "--speculative",
        choices=("on", "off"),
        default=None,
        help="speculative decoding without a draft model (the answers are exactly the same, generation "
        "faster where they repeat their prompt or each other); default: the workflow's "
        "inference.speculative with --workflow, else off. With --workflow, on keeps its other "
        "speculative settings",
    )
    p.add_argument(
        "--json", dest="json_out", type=Path, default=None, help="also write the full result (per problem) here"
    )
    p.add_argument("--show", type=int, default=3, help="print this many greedy answers (default 3)")
    p.set_defaults(func=run)


PLAIN_DEFAULTS = {
    "max_new_tokens": 64,
    "question_key": "question",
    "answer_key": "answer",
    "layout": "auto",
    "source_key": "data_source",
}


def workflow_settings(spec: Any) -> dict[str, Any]:
    """What the workflow's own evaluation uses, as this command's settings: its eval data and
    prompt settings, its rollout node's class, arguments and per-turn length limit, and the
    reward fn its eval/accuracy is read from (the first `reward` node, as the controller does)."""
    rollout = next((n for n in spec.nodes.values() if n.kind == "rollout"), None)
    reward = next((n for n in spec.nodes.values() if n.kind == "reward"), None)
    if reward is None:
        raise ValueError(
            f"{spec.source}: no `reward` node: eval scores answers with a reward node's fn "
            "(a reward model or a judge is not run here)"
        )
    d = spec.data
    out: dict[str, Any] = {
        "data": d.eval,
        "limit": d.eval_size,
        "prompt_template": d.prompt_template,
        "question_key": d.question_key,
        "answer_key": d.answer_key,
        "layout": d.layout,
        "source_key": d.source_key,
        "reward": reward.params.fn,
        "reward_why": f"the workflow's node {reward.name!r}",
        "reward_timeout_s": reward.params.timeout_s,
        "speculative": dataclasses.asdict(spec.inference.speculative),
    }
    if rollout is not None:
        out.update(
            rollout_class=rollout.params.rollout_class,
            rollout_args=dict(rollout.params.rollout_args),
            max_new_tokens=rollout.params.sampling.max_new_tokens,
        )
    return out


def settings(args: argparse.Namespace, err: Any) -> dict[str, Any] | None:
    """The flags merged over the workflow's settings (a flag given wins) over the plain defaults;
    None after saying what is wrong."""
    from areal_graph.cli.cmd_validate import load_or_report

    merged: dict[str, Any] = dict(
        PLAIN_DEFAULTS,
        reward_timeout_s=5.0,
        rollout_args={},
        prompt_template=None,
        rollout_class=None,
        data=None,
        limit=None,
        speculative={"enabled": False},
    )
    if args.workflow is not None:
        spec = load_or_report(args.workflow, [], err)
        if spec is None:
            return None
        try:
            merged.update(workflow_settings(spec))
        except ValueError as exc:
            err.print(f"[red]--workflow {exc}[/]")
            return None
    for key in (
        "data",
        "limit",
        "max_new_tokens",
        "prompt_template",
        "question_key",
        "answer_key",
        "layout",
        "source_key",
        "reward",
        "rollout_class",
    ):
        if getattr(args, key) is not None:
            merged[key] = getattr(args, key)
    if args.reward is not None:
        merged["reward_why"] = "--reward"
    if args.speculative is not None:  # the flag wins over the workflow's enabled; its other settings stay
        merged["speculative"] = {**merged["speculative"], "enabled": args.speculative == "on"}
    if merged.get("data") is None:
        err.print("[red]give --data FILE (or --workflow WORKFLOW.yaml with a data.eval)[/]")
        return None
    pick_reward(merged, err)
    return merged


def pick_reward(merged: dict[str, Any], err: Any) -> None:
    """The reward fn when none was given: the one that scores the data (api/reward_fit.py: a
    reasoning-gym task's own scorer for its rows, not math-verify, which reads a number out of the
    row's JSON). A --reward that cannot score the data is used as told, with a warning saying why."""
    from rich.markup import escape

    from areal_graph.api.reward_fit import data_kind, misfits

    kind = data_kind(str(merged["data"]))
    if merged.get("reward") is None:
        merged["reward"] = kind.rewards[0]
        merged["reward_why"] = f"picked for {kind.name} data; --reward to change"
        return
    for problem in misfits(merged["reward"], [("--data", str(merged["data"]))]):
        err.print(f"[yellow]warning:[/] {escape(problem)} (scoring with {escape(merged['reward'])} as told)")


def run(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.markup import escape
    from rich.progress import Progress
    from rich.table import Table

    from areal_graph.cli.cmd_init_model import kit_progress
    from areal_graph.cli.console import output_console
    from areal_graph.data.datasets import DatasetError
    from areal_graph.engines.inference.offline_eval import evaluate_model
    from areal_graph.modelkit.builtin import resolve_dataset_path, resolve_model_path

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
    conf = settings(args, err)
    if conf is None:
        return 2
    try:
        with kit_progress(err) as progress:  # a builtin kit's first build takes minutes
            model = resolve_model_path(args.model, progress)
            data = resolve_dataset_path(conf["data"], progress)
    except ValueError as exc:
        err.print(f"[red]{exc}[/]")
        return 2
    if not (model / "config.json").exists():
        err.print(f"[red]MODEL_DIR {args.model!r}: no config.json in {model} (expected a save_pretrained directory)[/]")
        return 1
    rollout = None
    if conf.get("rollout_class"):
        from areal_graph.engines.inference.rollout_eval import make_rollout

        try:
            rollout = make_rollout(conf["rollout_class"], str(model), **conf["rollout_args"])
        except (ValueError, TypeError) as exc:  # ImportPathError is a ValueError
            err.print(f"[red]{'--rollout-class' if args.rollout_class else 'the rollout node of --workflow'}: {exc}[/]")
            return 2
    speculative = None
    if conf["speculative"]["enabled"]:
        from areal_graph.engines.inference.speculation.speculator import SpeculativeSettings

        speculative = SpeculativeSettings(**conf["speculative"])
    log_path = failure_log_path()
    try:
        with Progress(console=err, transient=True) as progress, logged_to(log_path):
            task = progress.add_task("generating", total=None)
            result = evaluate_model(
                model,
                data,
                limit=conf["limit"],
                k=args.k,
                n_samples=args.samples,
                temperature=args.temperature,
                max_new_tokens=conf["max_new_tokens"],
                prompt_template=conf["prompt_template"],
                question_key=conf["question_key"],
                answer_key=conf["answer_key"],
                layout=conf["layout"],
                source_key=conf["source_key"],
                reward_fn=conf["reward"],
                reward_timeout_s=conf["reward_timeout_s"],
                seed=args.seed,
                on_progress=lambda done, total: progress.update(task, completed=done, total=total),
                rollout=rollout,
                speculative=speculative,
            )
    except DatasetError as exc:
        err.print(f"[red]{exc}[/]")
        return 1
    except Exception as exc:  # noqa: BLE001 - a rollout, reward or engine that raised: one line, traceback logged
        what = f"the rollout class {conf['rollout_class']}" if conf.get("rollout_class") else "generation"
        err.print(one_line_failure(what, exc, log_path), style="red", markup=False, highlight=False, soft_wrap=True)
        return 1
    log_path.unlink(missing_ok=True)  # nothing failed: the log of this evaluation is not worth a file
    table = Table(title=f"{args.model} on {conf['data']}", title_justify="left")
    table.add_column("metric")
    table.add_column("value", justify="right")
    table.add_row("reward", escape(f"{conf['reward']} ({conf['reward_why']})"))
    table.add_row("problems", str(result["prompts"]))
    table.add_row("greedy accuracy (reward > 0.5)", f"{result['greedy_accuracy']:.1%}")
    table.add_row("mean greedy reward", f"{result['greedy_reward_mean']:.3f}")
    for key, value in result.get("env", {}).items():
        table.add_row(escape(f"env: {key} (mean)"), f"{value:.3f}")
    if "greedy_tool_call_rate" in result:
        table.add_row("greedy answers calling a tool", f"{result['greedy_tool_call_rate']:.1%}")
    if args.k:
        table.add_row(
            f"pass@{args.k} (n={result['n_samples']}, T={args.temperature:g})", f"{result[f'pass@{args.k}']:.1%}"
        )
        table.add_row("mean sample accuracy", f"{result['sample_accuracy']:.1%}")
    for source, row in result.get("by_source", {}).items():
        table.add_row(escape(f"  {source} ({row['prompts']:.0f})"), f"{row['greedy_accuracy']:.1%}")
    if result["skipped_rows"]:
        table.add_row("rows skipped", str(result["skipped_rows"]))
    if result["reward_failures"]:
        table.add_row("reward failures (scored 0)", str(result["reward_failures"]))
    if "speculative" in result:  # tokens an answer gained per verifying forward (1 is plain decoding)
        sp = result["speculative"]
        if "unavailable" in sp:
            table.add_row("speculative", escape(f"[off] {sp['unavailable']}"))
        else:
            table.add_row(
                "speculative: tokens per answer per forward",
                f"{sp['tokens_per_forward']:.2f} ({sp['steps']} verifying steps)"
                if sp["steps"]
                else "no verifying step",
            )
    table.add_row(
        "time",
        f"{result['seconds']:.1f} s ({result['generated_tokens'] / max(result['generation_seconds'], 1e-9):.0f} tok/s)",
    )
    console.print(table)
    for p in result["per_prompt"][: args.show]:
        show_answer(console, p)
    if args.json_out:
        try:
            args.json_out.parent.mkdir(parents=True, exist_ok=True)
            args.json_out.write_text(json.dumps(result, indent=2) + "\n")
        except OSError as exc:
            err.print(f"cannot write {args.json_out}: {exc.strerror or exc}", style="red", markup=False)
            return 1
        err.print(f"wrote {args.json_out}")
    return 0


def failure_log_path() -> Path:
    """Where an evaluation's log goes (kept only when it fails): `eval` has no run folder, so the
    temp folder, one file per invocation."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    return Path(tempfile.gettempdir()) / f"areal-graph-eval-{stamp}-{os.getpid()}.log"


class _NoTracebacks(logging.Filter):
    """Keeps records that carry a traceback off the console: they are in the log file."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.exc_info is None


@contextlib.contextmanager
def logged_to(path: Path) -> Iterator[None]:
    """Every log record of the evaluation (INFO and up: a verifiers runner's stderr, a server's
    errors) into `path`, as a run's worker logs hold them; the console keeps its warnings but not
    their tracebacks. Why: a rollout that fails is one line on the console, not 40."""
    root = logging.getLogger()
    handler = logging.FileHandler(path, delay=True)  # no file unless something is logged
    handler.setLevel(logging.INFO)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    quiet = _NoTracebacks()
    consoles = {h: h.level for h in root.handlers}
    level = root.level
    for h in consoles:  # the console shows what it showed before (-v), the file more
        h.addFilter(quiet)
        h.setLevel(max(h.level, level))
    root.setLevel(min(level, logging.INFO))
    root.addHandler(handler)
    try:
        yield
    except BaseException:
        logging.getLogger(__name__).error("evaluation failed", exc_info=True)
        raise
    finally:
        root.removeHandler(handler)
        handler.close()
        root.setLevel(level)
        for h, was in consoles.items():
            h.removeFilter(quiet)
            h.setLevel(was)


def one_line_failure(what: str, exc: BaseException, log_path: Path) -> str:
    """`what` failed, the exception's first line, where its traceback is."""
    lines = str(exc).strip().splitlines()
    message = f"{type(exc).__name__}: {lines[0] if lines else ''}" + (" (...)" if len(lines) > 1 else "")
    return f"eval: {what} failed: {message} (traceback in {log_path})"


def show_answer(console: Any, p: dict[str, Any]) -> None:
    """One greedy answer: a mark, its id and reference, then each turn after the prompt on its own
    line, labelled (the policy's and the environment's), so a multi-turn episode reads as one."""
    from rich.markup import escape

    from areal_graph.data.reasoning_gym import display_answer

    mark = "[green]✓[/]" if p["greedy_correct"] else "[red]✗[/]"
    console.print(
        f"{mark} [dim]{escape(str(p['id']))} (answer {escape(display_answer(str(p['answer'])))}, "
        f"reward {p['greedy_reward']:g}):[/]",
        highlight=False,
    )
    for role, text in p.get("greedy_turns") or [["assistant", p["greedy"]]]:
        label = "model" if role == "assistant" else "env"
        console.print(f"    [bold]{label}:[/] " + escape(text.strip().replace("\n", " | ")), highlight=False)
