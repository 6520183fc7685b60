"""runtime/process_setup.py: the first lines of every worker process. `prepare_worker_process`
arms the parent-death signal when the launcher asked for it (and only then), logs with the
worker's name in every line, and takes the launcher's torch thread count.

The signal and the logging setup are process-wide, so they are checked in one short child
process (no torch there: it is imported only when a thread count is asked for); the thread
count is checked in this process and put back."""

from __future__ import annotations

import json
import logging
import subprocess
import sys

import torch

from areal_graph.runtime import process_setup
from support.paths import child_env

CHILD = r"""
import ctypes, json, logging, os, sys

def pdeathsig():
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    sig = ctypes.c_int(-1)
    libc.prctl(2, ctypes.byref(sig))  # PR_GET_PDEATHSIG
    return sig.value

before = pdeathsig()
from areal_graph.runtime.process_setup import prepare_worker_process
prepare_worker_process(sys.argv[1])
logging.getLogger("areal_graph.test").info("hello from the worker")
logging.getLogger("areal_graph.test").debug("not shown: INFO and up")
print(json.dumps({"before": before, "sig": pdeathsig(), "env_left": os.environ.get("AREAL_DIE_WITH_PARENT"),
                  "torch": "torch" in sys.modules}))
"""


def _child(name: str, **env: str) -> tuple[dict, str]:
    base = child_env(**env)
    for key in ("AREAL_TORCH_THREADS", "AREAL_DIE_WITH_PARENT"):
        if key not in env:
            base.pop(key, None)
    proc = subprocess.run([sys.executable, "-c", CHILD, name], capture_output=True, text=True, timeout=60, env=base)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1]), proc.stderr


def test_a_worker_arms_the_death_signal_when_asked_and_names_itself_in_every_log_line():
    seen, log = _child("reward", AREAL_DIE_WITH_PARENT="1")
    assert seen["before"] == 0 and seen["sig"] == 15  # SIGTERM when the parent exits
    assert seen["env_left"] is None  # consumed: the worker's own children do not inherit the request
    assert seen["torch"] is False  # no thread count asked for: torch is not imported for it
    lines = [ln for ln in log.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].endswith("[reward] INFO areal_graph.test: hello from the worker")


def test_without_the_request_no_death_signal_is_armed():
    seen, _ = _child("functions", AREAL_DIE_WITH_PARENT="0")
    assert seen["sig"] == 0 and seen["env_left"] is None


def test_the_thread_count_comes_from_the_launcher(monkeypatch):
    configured: list[dict] = []
    monkeypatch.setattr(logging, "basicConfig", lambda **kw: configured.append(kw))  # keep pytest's logging as it is
    monkeypatch.delenv("AREAL_DIE_WITH_PARENT", raising=False)
    before = torch.get_num_threads()
    target = 2 if before != 2 else 1
    try:
        monkeypatch.setenv("AREAL_TORCH_THREADS", str(target))
        process_setup.prepare_worker_process("model-actor")
        assert torch.get_num_threads() == target
        monkeypatch.setenv("AREAL_TORCH_THREADS", "")  # empty: left as it is
        torch.set_num_threads(before)
        process_setup.prepare_worker_process("model-actor")
        assert torch.get_num_threads() == before
    finally:
        torch.set_num_threads(before)
    assert configured[0]["level"] == logging.INFO and "[model-actor]" in configured[0]["format"]
