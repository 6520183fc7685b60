"""`areal-graph slurm`: the sbatch scripts it writes, checked as text, run against stub commands
(srun, scontrol, ray, python, areal-graph record what they are asked), and, in a slow test,
submitted to a real single-node slurmctld/slurmd when one answers (`sinfo` works)."""

from __future__ import annotations

import os
import re
import shutil
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from areal_graph.cli.main import main
from areal_graph.runtime.launchers.slurm import SlurmJob, SlurmLayout, render_sbatch
from support.e2e import SMALL, write_workflow
from support.paths import REPO

WORKFLOW = REPO / "workflows" / "grpo_sync.yaml"


def job(tmp: Path, stubs: Path | None = None) -> SlurmJob:
    bin_dir = stubs or Path("/opt/venv/bin")
    return SlurmJob(
        workflow=str(WORKFLOW),
        run_dir=str(tmp / "run"),
        workdir=str(tmp),
        areal_graph=str(bin_dir / "areal-graph"),
        python=str(bin_dir / "python"),
        ray=str(bin_dir / "ray"),
        overrides=("runtime.steps=7", "nodes.train.clip_eps=0.1"),
    )


def bash_n(script: str, tmp: Path) -> None:
    path = tmp / "check.sbatch"
    path.write_text(script)
    done = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def sbatch_options(script: str) -> dict[str, str]:
    return dict((m.group(1), m.group(2) or "") for m in re.finditer(r"^#SBATCH --([\w-]+)=?(\S*)$", script, re.M))


@pytest.mark.parametrize("nodes,inference,gpus", [(1, None, 0), (2, None, 8), (4, None, 8), (4, 3, 4)])
def test_layouts_render_valid_bash_with_the_expected_steps(tmp_path: Path, nodes, inference, gpus) -> None:
    layout = SlurmLayout(nodes=nodes, inference_nodes=inference, gpus_per_node=gpus, partition="gpu", time="01:00:00")
    script = render_sbatch(layout, job(tmp_path))
    bash_n(script, tmp_path)
    opts = sbatch_options(script)
    assert opts["nodes"] == str(nodes) and opts["ntasks-per-node"] == "1" and opts["partition"] == "gpu"
    assert opts["time"] == "01:00:00" and "exclusive" in opts  # whole nodes when no CPU count is given
    assert opts.get("gpus-per-task") == (str(gpus) if gpus else None)
    run_line = script.strip().splitlines()[-1]
    assert run_line.startswith('"$AREAL_GRAPH" run "$WORKFLOW" --run-dir "$RUN_DIR"')
    assert "runtime.steps=7 nodes.train.clip_eps=0.1" in run_line
    if nodes == 1:  # one node: the local launcher, no Ray, no srun
        assert "srun" not in script and "ray" not in run_line.lower()
        return
    assert len(re.findall(r"^\s*srun ", script, re.M)) == 2  # the head's step, and one in the loop over the other nodes
    assert f"TRAIN_NODES={nodes - (inference or nodes // 2)}" in script
    assert "--head" in script and f"wait_for_ray_nodes {nodes}" in script
    assert 'runtime.ray_address="$RAY_ADDRESS_OF_JOB"' in run_line
    assert run_line.endswith("runtime.launcher=ray runtime.weight_sync=disk")


def test_bad_layouts_are_refused_with_the_reason() -> None:
    with pytest.raises(ValueError, match="between 1 and nodes - 1"):
        SlurmLayout(nodes=2, inference_nodes=2)
    with pytest.raises(ValueError, match="local launcher runs on one node"):
        SlurmLayout(nodes=3, launcher="local")
    with pytest.raises(ValueError, match="one node cannot be split"):
        SlurmLayout(nodes=1, inference_nodes=1)
    with pytest.raises(ValueError, match="must be one '--name"):
        SlurmLayout(sbatch_options=("--qos=x\necho pwned",))


STUBS = {
    # every stub appends one line to $STUB_LOG saying how it was called
    "scontrol": 'echo "scontrol $*" >> "$STUB_LOG"; for ((i = 1; i <= STUB_NODES; i++)); do echo "node$i"; done',
    "srun": 'args=(); while [[ "$1" == --* ]]; do args+=("$1"); shift; done; '
    'echo "srun ${args[*]}" >> "$STUB_LOG"; exec "$@"',
    "ray": 'echo "ray $*" >> "$STUB_LOG"; if [[ " $* " == *" --block "* ]]; then exec sleep 60; fi',
    # the wait for Ray nodes: until that many `ray start` calls were made (as Ray would see them join)
    "python": 'if [[ "$1" == "-c" ]]; then echo token123; exit; fi; cat > /dev/null; '
    'for i in $(seq 100); do (($(grep -c "^ray start" "$STUB_LOG") >= $3)) && break; sleep 0.1; done; '
    'echo "wait $3 at $2" >> "$STUB_LOG"',
    "areal-graph": 'echo "areal-graph $* token=${RAY_AUTH_TOKEN:-none} mode=${RAY_AUTH_MODE:-none}" >> "$STUB_LOG"',
}


def run_with_stubs(script_path: Path, tmp: Path, nodelist_len: int = 4) -> list[str]:
    stubs = tmp / "stubs"
    stubs.mkdir(exist_ok=True)
    for name, body in STUBS.items():
        (stubs / name).write_text("#!/bin/bash\n" + body + "\n")
        (stubs / name).chmod(stat.S_IRWXU)
    log = tmp / "calls.log"
    clean = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}  # a Ray test earlier sets some
    env = {
        **clean,
        "PATH": f"{stubs}:{os.environ['PATH']}",
        "STUB_LOG": str(log),
        "SLURM_JOB_ID": "123",
        "SLURM_JOB_NODELIST": f"node[1-{nodelist_len}]",
        "STUB_NODES": str(nodelist_len),
        "SLURMD_NODENAME": "node1",
        "SLURM_CPUS_ON_NODE": "8",
        "AREAL_GRAPH": str(stubs / "areal-graph"),
        "RAY": str(stubs / "ray"),
        "PYTHON": str(stubs / "python"),
    }
    done = subprocess.run(["bash", str(script_path)], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    return log.read_text().splitlines()


def test_four_node_script_starts_ray_with_roles_and_runs_on_it(tmp_path: Path) -> None:
    """Through the CLI: 1 training + 3 inference nodes; every command the script runs, in order."""
    out = tmp_path / "job.sbatch"
    assert (
        main(
            [
                "slurm",
                str(WORKFLOW),
                "--nodes",
                "4",
                "--gpus-per-node",
                "2",
                "--inference-nodes",
                "3",
                "--run-dir",
                str(tmp_path / "run"),
                "--out",
                str(out),
                "runtime.steps=7",
            ]
        )
        == 0
    )
    assert (tmp_path / "run").is_dir()  # sbatch writes the job's output there from the start
    calls = run_with_stubs(out, tmp_path)
    assert calls[0] == "scontrol show hostnames node[1-4]"
    srun = [c for c in calls if c.startswith("srun")]
    nodes = [re.search(r"--nodelist=(\S+)", c).group(1) for c in srun]
    assert nodes[0] == "node1" and sorted(nodes[1:]) == ["node2", "node3", "node4"]  # the others start at once
    assert all("--cpus-per-task=8 --gpus-per-task=2" in c for c in srun)
    rays = [c for c in calls if c.startswith("ray ")]
    head = rays[0]
    assert "--head" in head and '{"areal_train": 1000}' in head and "--port=20123" in head and "--num-gpus=2" in head
    ip = re.search(r"--node-ip-address=(\S+)", head).group(1)
    assert all(f"--address={ip}:20123" in r and '{"areal_inference": 1000}' in r for r in rays[1:]) and len(rays) == 4
    assert [c for c in calls if c.startswith("wait")] == [f"wait 1 at {ip}:20123", f"wait 4 at {ip}:20123"]
    run = calls[-1]
    assert run.startswith(f"areal-graph run {WORKFLOW} --run-dir {tmp_path / 'run'} runtime.ray_address={ip}:20123")
    assert "runtime.steps=7 runtime.launcher=ray runtime.weight_sync=disk token=token123 mode=token" in run


def test_two_node_default_split_and_one_node_local(tmp_path: Path) -> None:
    two = tmp_path / "two.sbatch"
    two.write_text(render_sbatch(SlurmLayout(nodes=2), job(tmp_path)))
    calls = run_with_stubs(two, tmp_path, nodelist_len=2)
    rays = [c for c in calls if c.startswith("ray ")]
    assert len(rays) == 2 and "areal_train" in rays[0] and "areal_inference" in rays[1]
    one = tmp_path / "one.sbatch"
    one.write_text(render_sbatch(SlurmLayout(nodes=1), job(tmp_path)))
    (tmp_path / "calls.log").unlink()
    calls = run_with_stubs(one, tmp_path, nodelist_len=1)
    assert calls == [
        f"areal-graph run {WORKFLOW} --run-dir {tmp_path / 'run'} runtime.steps=7 "
        "nodes.train.clip_eps=0.1 token=none mode=none"
    ]


def test_the_command_refuses_a_layout_without_the_gpus_the_workflow_asks(tmp_path: Path, capsys) -> None:
    code = main(
        [
            "slurm",
            str(WORKFLOW),
            "--nodes",
            "2",
            "--gpus-per-node",
            "0",
            "--run-dir",
            str(tmp_path / "r"),
            "inference.args.device=cuda",
        ]
    )
    assert code == 1
    assert "the 1 inference node(s) have 0 GPU(s) but the workflow's processes there ask 1" in capsys.readouterr().err
    assert main(["slurm", str(WORKFLOW), "--nodes", "2", "--inference-nodes", "2"]) == 2  # layout error


def _slurm_answers() -> bool:
    if shutil.which("sinfo") is None:
        return False
    try:
        return subprocess.run(["sinfo", "-h"], capture_output=True, timeout=10).returncode == 0
    except subprocess.TimeoutExpired:
        return False


@pytest.mark.slow
@pytest.mark.skipif(not _slurm_answers(), reason="no SLURM cluster answers here (sinfo fails); see docs/scaling.md")
def test_sbatch_runs_a_tiny_workflow_through_ray_to_completion(kit, tmp_path: Path) -> None:
    """The generated script, submitted for real: Ray head in an srun step, the run joined to it."""
    pytest.importorskip("ray")
    wf = write_workflow(kit, tmp_path, "grpo_sync.yaml")
    run_dir = tmp_path / "run"
    env = {**os.environ, "PYTHONPATH": str(REPO / "tests")}
    overrides = [o for o in SMALL if not o.startswith("runtime.save_every")]
    done = subprocess.run(
        [
            str(Path(sys.executable).parent / "areal-graph"),
            "slurm",
            str(wf),
            "--launcher",
            "ray",
            "--cpus-per-node",
            str(os.cpu_count()),
            "--time",
            "10",
            "--run-dir",
            str(run_dir),
            "--submit",
            *overrides,
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    job_id = re.search(r"Submitted batch job (\d+)", done.stdout).group(1)
    deadline = time.monotonic() + 400
    state = ""
    while time.monotonic() < deadline:
        state = subprocess.run(["scontrol", "show", "job", job_id], capture_output=True, text=True).stdout
        if re.search(r"JobState=(COMPLETED|FAILED|CANCELLED|TIMEOUT)", state):
            break
        time.sleep(3)
    output = (run_dir / f"slurm-{job_id}.out").read_text()
    assert "JobState=COMPLETED" in state and "ExitCode=0:0" in state, output[-3000:]
    assert "Ray cluster up: 1 node(s)" in output and "done in" in output
    assert len([line for line in (run_dir / "metrics.jsonl").read_text().splitlines() if '"time/step"' in line]) == 3
