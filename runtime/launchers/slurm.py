"""An sbatch script that runs a workflow on a SLURM allocation (pure: text in, text out).

Why a Ray cluster across the allocation, rather than one srun per worker: the run's
processes are started, watched and restarted by the controller through a launcher, and
restarts need a way to start a process again on a chosen node while the job runs. Ray's
placement group does that (runtime/launchers/ray.py), and bringing Ray up across a SLURM
allocation is Ray's documented recipe: `ray start --head` on the first node, `ray start
--address` on the others, each as one srun step holding that node's CPUs and GPUs; the
controller runs in the batch step on the first node and joins with
`runtime.launcher=ray runtime.ray_address=HEAD:PORT`.

Heterogeneous placement: the first `train_nodes` nodes advertise the Ray resource
`areal_train`, the rest `areal_inference`; the Ray launcher pins inference servers to the
latter and model workers to the former (other workers go where there is room). Weights then
cross nodes, so the run uses `runtime.weight_sync=disk` with its run directory on the shared
file system the job sees (checkpoints and weights are written there).

One node needs none of this: the script runs `areal-graph run` with the local launcher
(`launcher="local"`), unless Ray is asked for.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field
from typing import Literal

from areal_graph.runtime.launchers.base import INFERENCE_NODE_RESOURCE, NODE_RESOURCE_UNITS, TRAIN_NODE_RESOURCE

RAY_JOIN_TIMEOUT_S = 300


@dataclass(frozen=True)
class SlurmLayout:
    """The allocation and how its nodes are split. Validated on construction (ValueError)."""

    nodes: int = 1
    gpus_per_node: int = 0
    cpus_per_node: int | None = None  # None: whole nodes (--exclusive), every CPU SLURM gives
    inference_nodes: int | None = None  # None: half the nodes (rounded down) when there are 2 or more
    partition: str | None = None
    time: str | None = None  # SLURM's formats: "MM", "HH:MM:SS", "D-HH"
    account: str | None = None
    job_name: str = "areal-graph"
    launcher: Literal["auto", "local", "ray"] = "auto"  # auto: local on 1 node, ray on more
    ray_port: int | None = None  # None: 20000 + job id % 20000 (two jobs on one node do not collide)
    sbatch_options: tuple[str, ...] = ()  # extra "#SBATCH" lines, e.g. "--qos=high"

    def __post_init__(self) -> None:
        problems = []
        if self.nodes < 1:
            problems.append(f"nodes must be >= 1, got {self.nodes}")
        if self.gpus_per_node < 0:
            problems.append(f"gpus per node must be >= 0, got {self.gpus_per_node}")
        if self.cpus_per_node is not None and self.cpus_per_node < 1:
            problems.append(f"cpus per node must be >= 1, got {self.cpus_per_node}")
        if self.inference_nodes is not None and self.nodes > 1 and not 1 <= self.inference_nodes < self.nodes:
            problems.append(
                f"inference nodes must be between 1 and nodes - 1 ({self.nodes - 1}) so that "
                f"training has a node, got {self.inference_nodes}"
            )
        if self.inference_nodes not in (None, 0) and self.nodes == 1:
            problems.append("one node cannot be split: inference and training share it (leave inference nodes unset)")
        if self.launcher == "local" and self.nodes > 1:
            problems.append("the local launcher runs on one node; more nodes need launcher 'ray'")
        if self.ray_port is not None and not 1024 <= self.ray_port < 65536:
            problems.append(f"ray port must be in 1024..65535, got {self.ray_port}")
        for option in self.sbatch_options:
            if not option.startswith("--") or "\n" in option:
                problems.append(f"sbatch option {option!r} must be one '--name[=value]'")
        if problems:
            raise ValueError("; ".join(problems))

    @property
    def uses_ray(self) -> bool:
        return self.launcher == "ray" or (self.launcher == "auto" and self.nodes > 1)

    @property
    def n_inference(self) -> int:
        """Nodes whose inference servers run there (0: one node shared by everything)."""
        if self.nodes == 1:
            return 0
        return self.inference_nodes if self.inference_nodes is not None else self.nodes // 2

    @property
    def n_train(self) -> int:
        return self.nodes - self.n_inference


@dataclass(frozen=True)
class SlurmJob:
    """What the job runs, with absolute paths as every node sees them (a shared file system)."""

    workflow: str
    run_dir: str
    workdir: str
    areal_graph: str  # the areal-graph command
    python: str  # the Python that has ray (waits for the cluster)
    ray: str  # the ray command
    overrides: tuple[str, ...] = ()
    command_line: str = ""  # how the script was made, for its header
    env: dict[str, str] = field(default_factory=dict)  # exported before anything starts


def render_sbatch(layout: SlurmLayout, job: SlurmJob) -> str:
    """The whole sbatch script (see module docstring)."""
    parts = [_header(layout, job), _preamble(layout, job)]
    if layout.uses_ray:
        parts += [_ray_cluster(layout), _run_line(layout, job, ray=True)]
    else:
        parts.append(_run_line(layout, job, ray=False))
    return "\n".join(parts) + "\n"


def _header(layout: SlurmLayout, job: SlurmJob) -> str:
    lines = ["#!/bin/bash"]
    if job.command_line:
        lines.append(f"# Generated by: {job.command_line}")
    lines.append(f"# {placement_summary(layout)}")
    sbatch = [
        f"--job-name={layout.job_name}",
        f"--nodes={layout.nodes}",
        "--ntasks-per-node=1",
        f"--output={job.run_dir}/slurm-%j.out",
    ]
    sbatch.append(f"--cpus-per-task={layout.cpus_per_node}" if layout.cpus_per_node else "--exclusive")
    if layout.gpus_per_node:
        sbatch.append(f"--gpus-per-task={layout.gpus_per_node}")
    for name in ("partition", "time", "account"):
        if getattr(layout, name):
            sbatch.append(f"--{name}={getattr(layout, name)}")
    sbatch += list(layout.sbatch_options)
    return "\n".join(lines + [f"#SBATCH {opt}" for opt in sbatch])


def placement_summary(layout: SlurmLayout) -> str:
    """One line: which node runs what."""
    if not layout.uses_ray:
        return "1 node: controller, workers and inference servers together (local launcher)."
    if layout.nodes == 1:
        return "1 node, Ray: controller, workers and inference servers together (one Ray node)."
    return (
        f"{layout.nodes} nodes, Ray: {_nodes(1, layout.n_train)} train (controller on node 1, model workers; "
        f"Ray resource {TRAIN_NODE_RESOURCE}), {_nodes(layout.n_train + 1, layout.nodes)} serve inference "
        f"(Ray resource {INFERENCE_NODE_RESOURCE}); weights cross nodes through the run directory."
    )


def _nodes(first: int, last: int) -> str:
    return f"node {first}" if first == last else f"nodes {first}-{last}"


def _preamble(layout: SlurmLayout, job: SlurmJob) -> str:
    q = shlex.quote
    lines = [
        "set -euo pipefail",
        "",
        "# Commands and paths (override any of them in the environment of sbatch).",
        f"AREAL_GRAPH=${{AREAL_GRAPH:-{q(job.areal_graph)}}}",
        f"WORKFLOW={q(job.workflow)}",
        f"RUN_DIR={q(job.run_dir)}",
        'mkdir -p "$RUN_DIR"',
        f"cd {q(job.workdir)}",
    ]
    if layout.uses_ray:
        port = str(layout.ray_port) if layout.ray_port else "$((20000 + SLURM_JOB_ID % 20000))"
        lines[4:4] = [f"RAY=${{RAY:-{q(job.ray)}}}", f"PYTHON=${{PYTHON:-{q(job.python)}}}"]
        lines.append(f"RAY_PORT={port}")
        lines.append(f"CPUS_PER_NODE={layout.cpus_per_node or '${SLURM_CPUS_ON_NODE}'}")
        lines.append(f"GPUS_PER_NODE={layout.gpus_per_node}")
        lines += [
            "# Ray token authentication: a secret for this job, which every srun step inherits.",
            "export RAY_AUTH_MODE=token",
            "RAY_AUTH_TOKEN=$(\"$PYTHON\" -c 'import secrets; print(secrets.token_hex(32))')",
            "export RAY_AUTH_TOKEN",
        ]
    lines += [f"export {k}={q(v)}" for k, v in sorted(job.env.items())]
    return "\n".join(lines)


def _ray_cluster(layout: SlurmLayout) -> str:
    """Ray head on this node (the batch step's), one Ray node per other node, then wait for all."""
    train = (
        _resources(TRAIN_NODE_RESOURCE)
        if layout.nodes > 1
        else _resources(TRAIN_NODE_RESOURCE, INFERENCE_NODE_RESOURCE)
    )
    infer = _resources(INFERENCE_NODE_RESOURCE)
    step = 'srun --nodes=1 --ntasks=1 --nodelist="$node" --cpus-per-task="$CPUS_PER_NODE"' + (
        ' --gpus-per-task="$GPUS_PER_NODE"' if layout.gpus_per_node else ""
    )
    ray_node = '"$RAY" start --num-cpus="$CPUS_PER_NODE" --num-gpus="$GPUS_PER_NODE" --include-dashboard=false --disable-usage-stats --block'
    return f"""
# This node (the batch step's) is node 1: the Ray head, a training node, and the controller's.
mapfile -t ALL_NODES < <(scontrol show hostnames "$SLURM_JOB_NODELIST")
OTHER_NODES=()
for n in "${{ALL_NODES[@]}}"; do
  if [[ "$n" != "$SLURMD_NODENAME" ]]; then OTHER_NODES+=("$n"); fi
done
# The address the other nodes reach this one at (set HEAD_IP to pick another network).
HEAD_IP=${{HEAD_IP:-$(hostname -I 2>/dev/null | awk '{{print $1}}')}}
HEAD_IP=${{HEAD_IP:-$(hostname --ip-address | awk '{{print $1}}')}}
RAY_ADDRESS_OF_JOB="$HEAD_IP:$RAY_PORT"
TRAIN_NODES={layout.n_train}  # nodes 1..TRAIN_NODES train; the other {layout.n_inference} serve inference
trap 'kill $(jobs -p) 2>/dev/null || true; wait || true' EXIT

wait_for_ray_nodes() {{  # until $1 Ray nodes are alive (fails the job after {RAY_JOIN_TIMEOUT_S} s)
  "$PYTHON" - "$RAY_ADDRESS_OF_JOB" "$1" <<'PY'
import sys, time
import ray
ray.init(address=sys.argv[1], logging_level="ERROR", log_to_driver=False)
want, deadline = int(sys.argv[2]), time.time() + {RAY_JOIN_TIMEOUT_S}
while (alive := sum(1 for n in ray.nodes() if n["Alive"])) < want:
    if time.time() > deadline:
        sys.exit(f"only {{alive}} of {{want}} Ray nodes joined within {RAY_JOIN_TIMEOUT_S} s")
    time.sleep(2)
print(f"Ray cluster up: {{alive}} node(s), {{ray.cluster_resources()}}", flush=True)
PY
}}

node="$SLURMD_NODENAME"
{step} \\
  {ray_node} --head --node-ip-address="$HEAD_IP" --port="$RAY_PORT" --resources={train} &
wait_for_ray_nodes 1
for ((i = 0; i < ${{#OTHER_NODES[@]}}; i++)); do
  node="${{OTHER_NODES[$i]}}"
  if ((i + 1 < TRAIN_NODES)); then resources={_resources(TRAIN_NODE_RESOURCE)}; else resources={infer}; fi
  {step} \\
    {ray_node} --address="$RAY_ADDRESS_OF_JOB" --resources="$resources" &
done
wait_for_ray_nodes {layout.nodes}"""


def _resources(*names: str) -> str:
    """A --resources value, single-quoted JSON for the shell."""
    return "'{" + ", ".join(f'"{n}": {NODE_RESOURCE_UNITS}' for n in names) + "}'"


def _run_line(layout: SlurmLayout, job: SlurmJob, ray: bool) -> str:
    overrides = list(job.overrides)
    if ray:
        overrides.append("runtime.launcher=ray")
        if layout.nodes > 1:  # servers and trainers on different machines: no shared memory between them
            overrides.append("runtime.weight_sync=disk")
    args = " ".join(shlex.quote(o) for o in overrides)
    address = ' runtime.ray_address="$RAY_ADDRESS_OF_JOB"' if ray else ""
    return (
        "\n# The run itself (the controller), in the batch step on the first node.\n"
        f'"$AREAL_GRAPH" run "$WORKFLOW" --run-dir "$RUN_DIR"{address}' + (f" {args}" if args else "")
    )
