"""Whole runs through the CLI, as a user starts them: a tiny kit (random model, trained
tokenizer, arithmetic rows), a shipped workflow pointed at it, `areal-graph run` in a
subprocess, its metrics read back, and a process of the run killed on cue."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil

from areal_graph.runtime.observability.run_dir import METRICS_FILENAME, read_metrics_file
from support.paths import WORKFLOWS, child_env

SMALL = [
    "runtime.steps=3",
    "runtime.batch_size=8",
    "nodes.rollout.group_size=4",
    "nodes.rollout.sampling.max_new_tokens=12",
    "runtime.eval_every=3",
    "data.eval_size=4",
    "runtime.save_every=2",
    "runtime.max_tokens_per_microbatch=256",
    "nodes.reward.fn=support.e2e_rewards:length_parity",
]


def build_kit(root: Path) -> Path:
    """Into `root`: a model dir (random tiny Qwen2 + a tokenizer trained on the rows) and
    train/test JSONL. The e2e tests' `kit` fixture (tests/conftest.py) builds it once."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from areal_graph.data.arith import generate, write_jsonl
    from areal_graph.modelkit.tokenizer import save_tokenizer, train_tokenizer

    rows = generate(seed=3, n=48)
    write_jsonl(rows[:40], root / "train.jsonl")
    write_jsonl(rows[40:], root / "test.jsonl")
    tok = train_tokenizer([r["question"] + " " + r["solution"] for r in rows], vocab_size=300)
    save_tokenizer(tok, root / "model")
    import torch

    torch.manual_seed(0)
    cfg = Qwen2Config(
        vocab_size=len(tok),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        tie_word_embeddings=True,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        bos_token_id=tok.bos_token_id,
    )
    Qwen2ForCausalLM(cfg).save_pretrained(root / "model")
    return root


def write_workflow(kit: Path, tmp: Path, workflow: str = "ppo_async.yaml") -> Path:
    """A shipped workflow pointed at the test kit instead of the builtin one."""
    text = (WORKFLOWS / workflow).read_text()
    text = text.replace("builtin:tiny-arith", str(kit / "model"))
    text = text.replace("builtin:arith/train", str(kit / "train.jsonl")).replace(
        "builtin:arith/test", str(kit / "test.jsonl")
    )
    path = tmp / "wf.yaml"
    path.write_text(text)
    return path


def run_cli(wf: Path, run_dir: Path, *overrides: str, timeout: float = 240) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "areal_graph.cli.main", "run", str(wf), "--run-dir", str(run_dir), *overrides]
    env = child_env(COLUMNS="200")
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)


def read_metrics(run_dir: Path) -> list[dict]:
    """The run's metrics.jsonl, through the one reader; a run under test leaves no damaged line."""
    path = run_dir / METRICS_FILENAME
    assert path.is_file(), f"{path} does not exist"
    read = read_metrics_file(path)
    assert read.damaged == 0, f"{path}: {read.damaged} damaged line(s)"
    return read.records


def kill_during_run(proc: subprocess.Popen, run_dir: Path, victim_name: str, after_step: int) -> int:
    """SIGKILL the run's process `victim_name` once `after_step` steps are logged; its pid."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        metrics = run_dir / "metrics.jsonl"
        if metrics.exists() and sum("time/step" in line for line in metrics.read_text().splitlines()) >= after_step:
            for child in psutil.Process(proc.pid).children(recursive=True):
                cmdline = " ".join(child.cmdline())
                if f"--name {victim_name} " in cmdline + " ":
                    child.send_signal(signal.SIGKILL)
                    return child.pid
        time.sleep(0.05)
    raise AssertionError(f"the run never reached step {after_step}")


VERL_SOURCES = ("arith/a", "arith/b")


def write_verl_parquet(kit: Path, out: Path) -> tuple[Path, Path]:
    """The kit's train and test JSONL rewritten in verl's layout as parquet files in `out`:
    `prompt` a list of chat messages, `reward_model.ground_truth`, `data_source` alternating
    between VERL_SOURCES, `extra_info.index`."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    paths = []
    for split in ("train", "test"):
        rows = [json.loads(line) for line in (kit / f"{split}.jsonl").read_text().splitlines() if line.strip()]
        verl = [
            {
                "data_source": VERL_SOURCES[i % 2],
                "prompt": [{"role": "user", "content": r["question"]}],
                "ability": "math",
                "reward_model": {"style": "rule", "ground_truth": str(r["answer"])},
                "extra_info": {"split": split, "index": i},
            }
            for i, r in enumerate(rows)
        ]
        paths.append(out / f"{split}.parquet")
        pq.write_table(pa.Table.from_pylist(verl), paths[-1])
    return paths[0], paths[1]
