"""verifiers tasksets as prompt data: `verifiers:<taskset>?size=N&env=<env id>&<field>=<value>`.

Why a dataset: the engine's unit of work is a prompt group, and `eval`, the run's evaluation and
`--resume` all need to know which tasks exist. Each row is one task of the taskset (its first
`size` tasks, as verifiers' own `take(size)` gives them): the question is the task's opening
conversation (system prompt and prompt, what `eval --show` displays), the answer is JSON saying
where the task is ({"verifiers": taskset, "env": ..., "options": ..., "size": N, "task": i}), which
is all the rollout class (workflows/rollout/verifiers_env.py) needs to replay it. Other query
fields are the taskset's own config fields (`seed=3`, `split=test`), values read as JSON when
they parse (numbers, true/false) and as text otherwise.

verifiers pins `openai<3`, so it runs in its own virtualenv (found by data/verifiers_venv.py:
AREAL_VERIFIERS_PYTHON, or a `.venv-verifiers` that `make install-verifiers` made): listing the
tasks is a call to workflows/rollout/verifiers_runner.py there, and what it fails with is said in
the user's words by data/verifiers_failures.py. Rows are listed again on every run (a taskset is
the user's code and may have changed; listing takes seconds), written where reasoning_gym rows go.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
from pathlib import Path
from typing import Any

from areal_graph.data import verifiers_failures, verifiers_venv
from areal_graph.data.arith import write_jsonl

SCHEME = "verifiers:"
PYTHON_ENV = verifiers_venv.PYTHON_ENV
INSTALL = verifiers_venv.INSTALL
MAX_SIZE = 100_000
LIST_TIMEOUT_S = 300
PACKAGE = Path(__file__).resolve().parent.parent  # the areal_graph package (the repository root)
RUNNER = PACKAGE / "workflows" / "rollout" / "verifiers_runner.py"
# The shipped example environments (workflows/verifiers_envs/) are importable by name.
EXAMPLES = PACKAGE / "workflows" / "verifiers_envs"


class VerifiersError(ValueError):
    """A verifiers: spec that cannot be served, or an environment that failed."""


class ListingFailed(VerifiersError):
    """verifiers could not load the taskset: `reason` is what it said, in the user's words."""

    def __init__(self, taskset: str, reason: str) -> None:
        super().__init__(f"verifiers could not list taskset {taskset!r}: {reason}")
        self.reason = reason


def python() -> str:
    """The python of verifiers' virtualenv (data/verifiers_venv.py says where it is looked for)."""
    try:
        return verifiers_venv.find_python()
    except verifiers_venv.VerifiersVenvError as err:
        raise VerifiersError(str(err)) from None


def runner_env() -> dict[str, str]:
    """The environment the runner starts with: this process's (its PYTHONPATH holds the workflow's
    folder and python_path, item 'where user code lives') plus the shipped examples."""
    env = dict(os.environ)
    paths = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    env["PYTHONPATH"] = os.pathsep.join([*paths, str(EXAMPLES)])
    return env


def _value(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return text


def parse_spec(spec: str) -> dict[str, Any]:
    """`verifiers:vf_arith?size=500&seed=1` -> the runner's spec {taskset, env, options, size}."""
    taskset, _, query = str(spec)[len(SCHEME) :].partition("?")
    if not taskset:
        raise VerifiersError(f"{spec!r}: name a taskset, e.g. {SCHEME}vf_arith?size=500")
    out: dict[str, Any] = {"taskset": taskset, "env": "", "options": {}, "size": 1000}
    for part in query.split("&") if query else []:
        key, sep, value = part.partition("=")
        if not sep or not key:
            raise VerifiersError(f"{spec!r}: {part!r} is not key=value")
        if key == "size":
            try:
                out["size"] = int(value)
            except ValueError:
                raise VerifiersError(f"{spec!r}: size must be an integer") from None
        elif key == "env":
            out["env"] = value
        else:
            out["options"][key] = _value(value)
    if not 1 <= out["size"] <= MAX_SIZE:
        raise VerifiersError(f"{spec!r}: size must be in [1, {MAX_SIZE}]")
    return out


def check_spec(spec: str) -> str | None:
    """What is wrong with `spec` (None: nothing): its grammar, verifiers' venv, and whether verifiers
    loads the taskset (its import path and config fields; a listing of one task, a few seconds)."""
    try:
        parsed = parse_spec(spec)
        python()
        list_tasks({**parsed, "size": 1})
    except VerifiersError as err:
        return str(err)
    except subprocess.TimeoutExpired:
        return f"{spec!r}: verifiers did not load the taskset within {LIST_TIMEOUT_S} s"
    return None


def list_tasks(spec: dict[str, Any]) -> list[dict[str, Any]]:
    """The taskset's first `size` tasks as prompt rows, listed by verifiers itself."""
    env = runner_env()
    done = subprocess.run(
        [python(), str(RUNNER), "list", json.dumps(spec)],
        capture_output=True,
        text=True,
        env=env,
        timeout=LIST_TIMEOUT_S,
    )
    lines = [json.loads(line) for line in done.stdout.splitlines() if line.strip()]
    failed = [line for line in lines if "error" in line]
    if failed:  # the runner's own line says it; its traceback is not for the console
        raise ListingFailed(spec["taskset"], explain(failed[0], env))
    if done.returncode != 0:
        tail = "\n".join(done.stderr.strip().splitlines()[-5:])
        raise VerifiersError(f"verifiers could not list taskset {spec['taskset']!r} (exit {done.returncode}):\n{tail}")
    return lines


def explain(failure: dict[str, Any], env: dict[str, str]) -> str:
    """A runner's error line (`{"error": ..., "not_importable": {...}}`) in the user's words: a package
    verifiers cannot import is said with where it was looked for and the `python_path:` that fixes it."""
    if "not_importable" in failure:
        return verifiers_failures.explain_not_importable(failure["not_importable"], env.get("PYTHONPATH", ""))
    return str(failure["error"])


def materialize(spec: str, root: Path) -> Path:
    parsed = parse_spec(spec)
    key = hashlib.sha256(json.dumps(parsed, sort_keys=True).encode()).hexdigest()[:12]
    path = root / "verifiers" / f"{parsed['taskset']}-{key}.jsonl"
    return write_jsonl(list_tasks(parsed), path)


def cache_path(spec: str, root: Path) -> None:
    """None: a taskset's rows are listed again on every run (a taskset is the user's code), so no
    file written earlier stands for them."""
    return None


def sample_rows(spec: str, n: int) -> list[dict[str, Any]]:
    """The first `n` tasks of `spec` as prompt rows, listed by verifiers (the first tasks of a
    taskset are the same whatever its size): what `validate` renders to see whether they fit."""
    parsed = parse_spec(spec)
    return list_tasks({**parsed, "size": min(n, parsed["size"])})
