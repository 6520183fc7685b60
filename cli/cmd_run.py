"""`areal-graph run WORKFLOW.yaml [key=value ...]`: validate, launch, train, report."""

from __future__ import annotations

import argparse
import logging
import time
from collections import deque
from pathlib import Path
from typing import TYPE_CHECKING

from rich.console import Console
from rich.live import Live
from rich.table import Table

if TYPE_CHECKING:
    from areal_graph.cli.prompt_fit import PromptCheck
    from areal_graph.graph.spec import WorkflowSpec
    from areal_graph.runtime.observability.run_dir import RunDir

log = logging.getLogger(__name__)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "run",
        help="run an RL workflow (the main job)",
        description=(
            "Validate WORKFLOW, start inference servers and gRPC workers (local subprocesses, or Ray actors "
            "with runtime.launcher=ray: docs/scaling.md), "
            "and run the RL loop: rollouts generate continuously under the staleness bound, "
            "each step trains on B trajectories and pushes new weights to the servers. "
            "Writes config, metrics (JSONL), traces, checkpoints and the final model to the run directory."
        ),
        epilog="Example: areal-graph run workflows/ppo_async.yaml runtime.steps=20 models.actor.train.lr=1e-5",
    )
    p.add_argument(
        "workflow",
        type=Path,
        nargs="?",
        default=None,
        help="workflow YAML file (omitted with --resume: the run's own config.yaml is used)",
    )
    p.add_argument(
        "overrides",
        nargs="*",
        metavar="KEY=VALUE",
        help="override any field, e.g. runtime.steps=10 nodes.train.clip_eps=0.1",
    )
    p.add_argument("--run-dir", type=Path, default=None, help="where to write the run (default: runtime.run_dir)")
    p.add_argument(
        "--resume",
        type=Path,
        default=None,
        metavar="RUN_DIR",
        help="continue a run from its latest complete checkpoint, with the workflow it ran "
        "(RUN_DIR/config.yaml; KEY=VALUE overrides such as runtime.steps=N still apply)",
    )
    p.set_defaults(func=run)


class RunDisplay:
    """Live status for a terminal; one log line per step when output is not a terminal."""

    COLUMNS = [
        ("step", "step", "{:.0f}"),
        ("version", "ver", "{:.0f}"),
        ("reward/mean", "reward", "{:.3f}"),
        ("eval/accuracy", "test acc", "{:.3f}"),
        ("staleness/mean", "staleness", "{:.2f}"),
        ("buffer/size", "buffer", "{:.0f}"),
        ("rollout/groups_in_flight", "in flight", "{:.0f}"),
        ("time/step", "step s", "{:.1f}"),
        ("time/wait_batch", "wait s", "{:.1f}"),
    ]

    def __init__(self, console: Console, total_steps: int) -> None:
        self.console = console
        self.total = total_steps
        self.rows: deque[dict] = deque(maxlen=12)  # the last steps shown; a long run must not keep them all
        self.steps = 0
        self.last_acc: float | None = None
        self.live = Live(self._table(), console=console, refresh_per_second=2) if console.is_terminal else None
        self.t0 = time.time()

    def __enter__(self):
        if self.live:
            self.live.__enter__()
        return self

    def __exit__(self, *exc):
        if self.live:
            self.live.__exit__(*exc)

    def _table(self) -> Table:
        elapsed = time.time() - self.t0 if hasattr(self, "t0") else 0.0
        t = Table(title=f"areal-graph  step {self.steps}/{self.total}  {elapsed:.0f}s", expand=False)
        for _, title, _ in self.COLUMNS:
            t.add_column(title, justify="right")
        for row in self.rows:
            t.add_row(*[fmt.format(row[k]) if k in row else "" for k, _, fmt in self.COLUMNS])
        return t

    def on_eval(self, step: int, acc: float) -> None:
        self.last_acc = acc
        if not self.live:
            self.console.print(f"eval step {step}: greedy test accuracy {acc:.3f}")

    def on_step(self, step: int, stats: dict) -> None:
        self.steps = int(stats.get("step", self.steps + 1))
        self.rows.append(stats)
        if self.live:
            self.live.update(self._table())
        else:
            parts = [f"{title}={fmt.format(stats[k])}" for k, title, fmt in self.COLUMNS if k in stats]
            self.console.print("  ".join(parts))


def run(args: argparse.Namespace) -> int:
    """The command. Ctrl-C at any moment (kit build, startup, training, evaluation, shutdown)
    stops every process of the run and exits with 130 within seconds, one line on stderr:
    runtime/launchers/interrupt.py says why that takes more than catching KeyboardInterrupt."""
    from areal_graph.api.process import limit_malloc_arenas
    from areal_graph.runtime.launchers.interrupt import exit_interrupted, exit_on_interrupt

    limit_malloc_arenas()  # before the run's threads: the owner's memory stays flat over a long run
    started: list[RunDir] = []  # the run directory, once there is one (for the message)
    with exit_on_interrupt():
        try:
            return _run(args, started)
        except KeyboardInterrupt:
            where = ""
            if started:
                path = started[0].path
                where = f"; run directory {path}"
                if started[0].latest_checkpoint() is not None:
                    where += f" (continue it: areal-graph run --resume {path})"
            Console(stderr=True, soft_wrap=True).print(
                f"[yellow]interrupted[/]: every process of the run was stopped{where}", highlight=False
            )
            exit_interrupted()


def _run(args: argparse.Namespace, started: list[RunDir]) -> int:
    """Load and check the workflow, open the run directory, train; each stage answers a user's
    mistake with a message and an exit code, never a traceback."""
    from areal_graph.cli.preflight import preflight
    from areal_graph.cli.prompt_fit import check_prompts

    console = Console(soft_wrap=True)  # log lines stay whole when output is a file or a pipe
    loaded = _load_spec(args, console)
    if isinstance(loaded, int):
        return loaded
    spec, overrides = loaded
    try:  # before the run folder exists: a typo (a builtin name, inference.args) leaves nothing behind
        preflight(spec)
    except ValueError as err:
        console.print(str(err), style="red", markup=False, highlight=False)
        return 1
    prompts = check_prompts(spec)  # prompts that cannot fit the policy's context, before anything starts
    if _say_prompt_problems(prompts, console):
        return 1
    opened = _open_run_dir(args, spec, overrides, console)
    if isinstance(opened, int):
        return opened
    run_dir, ckpt = opened
    started.append(run_dir)
    console.print(
        f"[bold]areal-graph run[/] {spec.name}: {spec.runtime.steps} steps, batch {spec.runtime.batch_size}, "
        f"max staleness {spec.runtime.max_staleness} -> {run_dir.path}"
    )
    t0 = time.time()
    try:
        spec = _resolve_builtins(spec, console)
    except ValueError as err:
        console.print(f"[red]{err}[/]", highlight=False)
        return 1
    if not prompts.complete and _say_prompt_problems(check_prompts(spec), console):  # a kit built just now
        return 1
    return _train(spec, run_dir, ckpt, console, t0)


def _say_prompt_problems(prompts: PromptCheck, console: Console) -> bool:
    """Print the prompts that cannot fit the policy's context (cli/prompt_fit.py); whether there were any."""
    for line in prompts.problems:
        console.print(line, style="red", markup=False, highlight=False)
    return bool(prompts.problems)


def _load_spec(args: argparse.Namespace, console: Console) -> tuple[WorkflowSpec, list[str]] | int:
    """The workflow to run (the named file, or the resumed run's own config.yaml) with the
    overrides applied, or an exit code after saying what is wrong."""
    from areal_graph.graph.dump import dump_workflow
    from areal_graph.graph.loader import WorkflowError, load_workflow, load_workflow_text
    from areal_graph.runtime.observability.run_dir import CONFIG_FILENAME

    overrides = list(args.overrides)
    if args.resume is not None and args.workflow is not None and "=" in str(args.workflow):
        overrides.insert(0, str(args.workflow))  # `run --resume DIR runtime.steps=20`: no workflow given
        args.workflow = None
    if args.resume is None and args.workflow is None:
        console.print("[red]give a WORKFLOW file (or --resume RUN_DIR)[/]")
        return 2
    # a path, not a RunDir: that would create the folder a mistyped --resume names
    source = Path(args.resume) / CONFIG_FILENAME if args.resume is not None else args.workflow
    try:
        if args.resume is None:
            return load_workflow(args.workflow, overrides=overrides), overrides
        if not source.is_file():
            console.print(f"[red]{args.resume}: not a run directory (no config.yaml)[/]")
            return 1
        spec = load_workflow_text(source.read_text(encoding="utf-8"), overrides, file=str(source))
        if args.workflow is not None and dump_workflow(load_workflow(args.workflow, overrides)) != dump_workflow(spec):
            console.print(
                f"[red]--resume continues the workflow {args.resume} ran ({source}), and "
                f"{args.workflow} differs from it: drop {args.workflow} (KEY=VALUE overrides, "
                f"e.g. runtime.steps=N, still apply)[/]"
            )
            return 2
        return spec, overrides
    except WorkflowError as err:
        console.print(f"[red]{source}: the workflow has {len(err.problems)} problem(s):[/]")
        for problem in err.problems:
            console.print(f"  - {problem}", markup=False, highlight=False)
        return 1


def _open_run_dir(
    args: argparse.Namespace, spec: WorkflowSpec, overrides: list[str], console: Console
) -> tuple[RunDir, Path | None] | int:
    """A new run directory with the workflow as run in its config.yaml, or (--resume) the old one
    and its latest complete checkpoint; an exit code when there is nothing to resume."""
    from areal_graph.graph.dump import dump_workflow
    from areal_graph.runtime.observability.run_dir import CONFIG_FILENAME, RunDir

    if args.resume:
        run_dir = RunDir(args.resume)
        ckpt = run_dir.latest_checkpoint()
        if ckpt is None:
            console.print(f"[red]{args.resume}: no complete checkpoint to resume from[/]")
            return 1
        if overrides:  # the run continues under them: config.yaml says so
            run_dir.write_text("config.yaml", dump_workflow(spec, header=f"resumed with {' '.join(overrides)}"))
        return run_dir, ckpt
    root = args.run_dir or Path(spec.runtime.run_dir.format(name=spec.name, timestamp=time.strftime("%Y%m%d-%H%M%S")))
    held = [name for name in (CONFIG_FILENAME, "metrics.jsonl", "checkpoints") if (Path(root) / name).exists()]
    if held:  # two runs in one folder: metrics appended, an old checkpoint resumed under a new config
        console.print(
            f"[red]{root} already holds a run ({', '.join(held)}): continue it with "
            f"`areal-graph run --resume {root}`, or give another --run-dir[/]",
            highlight=False,
        )
        return 2
    run_dir = RunDir(root)
    run_dir.write_text(
        "config.yaml",
        dump_workflow(
            spec,
            header=f"the workflow this run ran: {args.workflow}"
            + (f" with {' '.join(overrides)}" if overrides else "")
            + "\nrepeat it: areal-graph run <this file>; continue it: areal-graph run --resume <run dir>",
        ),
    )
    return run_dir, None


def _train(spec: WorkflowSpec, run_dir: RunDir, ckpt: Path | None, console: Console, t0: float) -> int:
    """The RL loop with its live display (auto-resuming as the workflow allows); a failure ends as
    a message naming the process logs and the end state (what was not trained), success as a
    one-line summary."""
    from areal_graph.runtime.launchers.interrupt import interrupted
    from areal_graph.runtime.orchestration.controller import RunFailed
    from areal_graph.runtime.orchestration.run import run_with_auto_resume

    def say_failed(err: Exception) -> None:
        console.print(f"[red bold]run failed:[/] {type(err).__name__}: ", end="")
        console.print(str(err), markup=False, highlight=False)

    def say_resumed(err: RunFailed, checkpoint: Path, resumes: int) -> None:
        say_failed(err)
        console.print(
            f"[yellow]auto-resume {resumes} of at most {spec.runtime.auto_resume}: going on "
            f"from {checkpoint.name} in fresh processes[/]"
        )

    with RunDisplay(console, spec.runtime.steps) as display:
        try:
            state = run_with_auto_resume(spec, run_dir, display=display, resume_from=ckpt, on_resume=say_resumed)
        except Exception as err:  # noqa: BLE001 - every failure ends as a message, not a traceback
            if interrupted():  # a call failed because Ctrl-C is stopping its process: no failure, no resume
                raise KeyboardInterrupt from err
            if not isinstance(err, RunFailed):
                log.debug("run failed", exc_info=True)
            say_failed(err)
            if isinstance(err, RunFailed) and err.resumable:
                why = (
                    "no complete checkpoint (runtime.save_every)"
                    if run_dir.latest_checkpoint() is None
                    else f"runtime.auto_resume is {spec.runtime.auto_resume} and was used {err.resumes} times"
                )
                console.print(f"not resumed automatically: {why}")
            # end_state.json: the counters at the stop, why it stopped, the work generated but not trained
            where = [
                f"{what}: {path}"
                for what, path in (("process logs", run_dir.logs_dir), ("end state", run_dir.end_state_path))
                if path.exists()
            ]  # a run that failed before its processes started has neither
            if where:
                console.print("; ".join(where))
            _say_trackers(console, spec, run_dir)
            return 1
    accs = [h["eval/accuracy"] for h in state.history]
    summary = f"done in {time.time() - t0:.0f}s: {state.step} steps, {state.trajectories_trained} trajectories trained"
    if accs:
        summary += f"; greedy test accuracy {accs[0]:.3f} -> {accs[-1]:.3f}"
    console.print(f"[green]{summary}[/]")
    console.print(f"run directory: {run_dir.path}  (trace: areal-graph trace {run_dir.path})")
    _say_trackers(console, spec, run_dir)
    return 0


def _say_trackers(console: Console, spec, run_dir: RunDir) -> None:
    """How to look at what the experiment trackers wrote (runtime.loggers): W&B runs offline and
    is uploaded later; MLflow's default store is a folder in the run directory."""
    from areal_graph.runtime.observability.trackers import TrackerSettings, is_file_store

    loggers = spec.runtime.loggers
    if "wandb" in loggers:
        console.print(f"W&B (offline): wandb sync {run_dir.path / 'wandb'}/offline-run-*", highlight=False)
    if "mlflow" in loggers:
        uri = TrackerSettings.for_run(spec, run_dir.path).mlflow_uri
        env = "MLFLOW_ALLOW_FILE_STORE=true " if is_file_store(uri) else ""  # MLflow 3 asks for it
        console.print(
            f"MLflow: {env}mlflow ui --backend-store-uri {uri}  (the UI needs: pip install mlflow)", highlight=False
        )


def _resolve_builtins(spec, console: Console):
    """The spec with `builtin:` paths resolved, building kits now, in this process and with
    progress on screen: a first build takes minutes, and inside the workers it would be silent."""
    from areal_graph.cli.cmd_init_model import kit_progress
    from areal_graph.data.generated import SCHEMES
    from areal_graph.modelkit.builtin import PREFIX, resolve_builtin_paths

    paths = [m.path for m in spec.models.values()] + [spec.data.train, spec.data.eval or ""]
    if not any(p.startswith((PREFIX, *SCHEMES)) for p in paths):
        return spec
    with kit_progress(console) as progress:
        return resolve_builtin_paths(spec, progress)
