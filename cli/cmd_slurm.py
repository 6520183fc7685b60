"""`areal-graph slurm WORKFLOW [--nodes N --gpus-per-node G ...] [KEY=VALUE ...]`: write an sbatch script.

The script (runtime/launchers/slurm.py says how and why) brings a Ray cluster up across the
allocation, inference servers on some nodes and training on the others, and runs the
workflow there; on one node it runs the workflow with the local launcher. The workflow is
validated here first, and what it asks for is checked against the layout (GPUs of the
inference servers against the inference nodes, the model workers' against the training
nodes), so a job does not wait in the queue to fail.
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

from rich.console import Console


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "slurm",
        help="write (and optionally submit) an sbatch script that runs a workflow on a SLURM cluster",
        description=(
            "Write an sbatch script for WORKFLOW: on 2 or more nodes it starts Ray on every node of the "
            "allocation (the first nodes for training, the others for inference servers) and runs the "
            "workflow with runtime.launcher=ray and runtime.weight_sync=disk; on 1 node it runs the workflow "
            "with the local launcher. Paths must be on a file system every node sees."
        ),
        epilog="Example: areal-graph slurm workflows/ppo_async.yaml --nodes 4 --gpus-per-node 8 --inference-nodes 3 "
        "--partition gpu --time 04:00:00 --out job.sbatch inference.backend=sglang",
    )
    p.add_argument("workflow", type=Path, help="workflow YAML file")
    p.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="overrides passed to the run, as for `run`")
    p.add_argument("--nodes", type=int, default=1, help="nodes to allocate (default 1)")
    p.add_argument("--gpus-per-node", type=int, default=0, help="GPUs per node (default 0)")
    p.add_argument("--cpus-per-node", type=int, default=None, help="CPUs per node (default: whole nodes, --exclusive)")
    p.add_argument(
        "--inference-nodes",
        type=int,
        default=None,
        help="nodes for inference servers, the rest train (default: half, rounded down)",
    )
    p.add_argument("--partition", default=None)
    p.add_argument("--time", default=None, help="time limit in SLURM's format, e.g. 04:00:00")
    p.add_argument("--account", default=None)
    p.add_argument("--job-name", default=None, help="default: areal-<workflow name>")
    p.add_argument(
        "--launcher",
        choices=["auto", "local", "ray"],
        default="auto",
        help="auto (default): local on 1 node, ray on more; ray also works on 1 node",
    )
    p.add_argument("--ray-port", type=int, default=None, help="Ray head port (default: derived from the job id)")
    p.add_argument(
        "--sbatch-option",
        action="append",
        default=[],
        metavar="--NAME[=VALUE]",
        help="an extra #SBATCH line, e.g. --sbatch-option=--qos=high (repeatable)",
    )
    p.add_argument("--run-dir", type=Path, default=None, help="the run directory (default: runtime.run_dir, now)")
    p.add_argument("--out", type=Path, default=None, help="where to write the script (default: RUN_DIR/job.sbatch)")
    p.add_argument("--submit", action="store_true", help="submit the script with sbatch after writing it")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from areal_graph.graph.loader import WorkflowError, load_workflow
    from areal_graph.runtime.launchers.slurm import SlurmJob, SlurmLayout, render_sbatch

    console = Console(stderr=True, soft_wrap=True)
    try:
        spec = load_workflow(args.workflow, overrides=list(args.overrides))
    except WorkflowError as err:
        console.print(f"[red]{args.workflow}: the workflow has {len(err.problems)} problem(s):[/]")
        for problem in err.problems:
            console.print(f"  - {problem}", markup=False, highlight=False)
        return 1
    try:
        layout = SlurmLayout(
            nodes=args.nodes,
            gpus_per_node=args.gpus_per_node,
            cpus_per_node=args.cpus_per_node,
            inference_nodes=args.inference_nodes,
            partition=args.partition,
            time=args.time,
            account=args.account,
            job_name=args.job_name or f"areal-{spec.name}",
            launcher=args.launcher,
            ray_port=args.ray_port,
            sbatch_options=tuple(args.sbatch_option),
        )
    except ValueError as err:
        console.print(f"[red]layout: {err}[/]", highlight=False)
        return 2
    shortfalls = gpu_problems(spec, layout)
    for shortfall in shortfalls:
        console.print(f"[red]{shortfall}[/]", highlight=False)
    if shortfalls:
        return 1
    run_dir = (
        args.run_dir or Path(spec.runtime.run_dir.format(name=spec.name, timestamp=time.strftime("%Y%m%d-%H%M%S")))
    ).resolve()
    run_dir.mkdir(parents=True, exist_ok=True)  # sbatch writes the job's output there from the start
    bin_dir = Path(sys.executable).parent
    job = SlurmJob(
        workflow=str(args.workflow.resolve()),
        run_dir=str(run_dir),
        workdir=os.getcwd(),
        areal_graph=shutil.which("areal-graph", path=str(bin_dir)) or str(bin_dir / "areal-graph"),
        python=sys.executable,
        ray=str(bin_dir / "ray"),
        overrides=tuple(args.overrides),
        command_line="areal-graph "
        + shlex.join(getattr(args, "argv", None) or ["slurm", str(args.workflow), *args.overrides]),
        env={k: v for k, v in os.environ.items() if k in ("AREAL_GRAPH_CACHE", "PYTHONPATH")},
    )
    out = (args.out or run_dir / "job.sbatch").resolve()
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(render_sbatch(layout, job))
        out.chmod(0o755)
    except OSError as err:
        console.print(f"cannot write the script to {out}: {err.strerror or err}", style="red", markup=False)
        return 1
    print(out)
    if args.submit:
        return submit(out, console)
    return 0


def gpu_problems(spec, layout) -> list[str]:
    """Where the workflow asks more GPUs than its side of the allocation has (empty: it fits)."""
    from areal_graph.engines.inference.backends import get_backend
    from areal_graph.graph.plan import build_plan
    from areal_graph.runtime.orchestration.placement import process_demands

    demands = process_demands(build_plan(spec), get_backend(spec.inference.backend), 1, 1)
    need_inference = sum(d.gpus for d in demands if d.role == "inference")
    need_train = sum(d.gpus for d in demands if d.role != "inference")
    g = layout.gpus_per_node
    if layout.n_inference == 0:  # one node shared by all
        have = {"the node": (need_inference + need_train, g)}
    else:
        have = {
            f"the {layout.n_inference} inference node(s)": (need_inference, layout.n_inference * g),
            f"the {layout.n_train} training node(s)": (need_train, layout.n_train * g),
        }
    return [
        f"{where} {'has' if where == 'the node' else 'have'} {got} GPU(s) but the workflow's processes there ask {need} "
        f"(inference servers x GPUs each, model workers x dp_size on CUDA)"
        for where, (need, got) in have.items()
        if need > got
    ]


def submit(script: Path, console: Console) -> int:
    """sbatch the script; print the job id line sbatch prints."""
    if shutil.which("sbatch") is None:
        console.print("[red]sbatch is not on PATH: submit the script on the cluster's login node[/]")
        return 1
    done = subprocess.run(["sbatch", str(script)], capture_output=True, text=True)
    if done.returncode != 0:
        console.print(f"[red]sbatch failed:[/] {done.stderr.strip()}", highlight=False)
        return done.returncode
    print(done.stdout.strip())
    return 0
