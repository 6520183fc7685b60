"""Starts an OpenEnv environment here, without containers: a uvicorn server in a child process on
a free loopback port, serving OpenEnv's own FastAPI app for the environment.

Why a process and not the rollout's own event loop: an environment's step is user code that may
block or hold the GIL; in its own process it cannot stall generation, and the episode goes over
the same protocol (OpenEnv's /ws session) as an environment at a URL, so both paths are one path.

`target` is `module:attr`, where attr is either an OpenEnv `Environment` subclass (its app is
built with `create_fastapi_app`, the Action and Observation classes read from its
`Environment[Action, Observation, State]` base) or an ASGI app (`module:app`, what
`uvicorn module:app` would serve: an OpenEnv environment's `server/app.py`).

    python -m areal_graph.workflows.rollout.openenv_server pkg.env:MyEnvironment --port 8011
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import logging
import os
import socket
import subprocess
import sys
import tempfile
import time
import typing
from typing import Any

import aiohttp

from areal_graph.workflows.rollout.openenv_client import OpenEnvError

log = logging.getLogger(__name__)

PIP = "pip install 'openenv-core==0.2.1'"


def openenv_environment_base() -> type:
    try:
        from openenv.core.env_server import Environment
    except ImportError:
        raise OpenEnvError(f"starting an OpenEnv environment here needs openenv-core: {PIP}") from None
    return Environment


def load_target(target: str) -> Any:
    """The object `module:attr` names, or an OpenEnvError that says what is wrong and what to do."""
    module, sep, attr = str(target).partition(":")
    if not sep or not module or not attr:
        raise OpenEnvError(
            f"rollout_args.env {target!r}: name the environment as module:Class (an OpenEnv Environment "
            "subclass) or module:app (its FastAPI app), e.g. areal_graph.workflows.openenv_envs.arith:ArithEnvironment"
        )
    try:
        mod = importlib.import_module(module)
    except ImportError as err:
        raise OpenEnvError(
            f"rollout_args.env {target!r}: cannot import {module!r} ({err}); put its package on the import path "
            "(next to the workflow file, in the workflow's python_path, or pip-installed), or serve it yourself "
            "and give rollout_args.url instead"
        ) from None
    if not hasattr(mod, attr):
        names = sorted(n for n in vars(mod) if not n.startswith("_"))
        raise OpenEnvError(f"rollout_args.env {target!r}: module {module!r} has no {attr!r} (it has: {names})")
    return getattr(mod, attr)


def env_models(cls: type) -> tuple[type, type]:
    """The (Action, Observation) classes of an `Environment[Action, Observation, State]` subclass."""
    base = openenv_environment_base()
    for klass in cls.__mro__:
        for orig in getattr(klass, "__orig_bases__", ()):
            if typing.get_origin(orig) is base:
                args = typing.get_args(orig)
                if len(args) >= 2 and all(isinstance(a, type) for a in args[:2]):
                    return args[0], args[1]
    raise OpenEnvError(
        f"{cls.__module__}.{cls.__qualname__}: its Action and Observation classes cannot be read from its bases; "
        "subclass Environment[YourAction, YourObservation, YourState], or give its app as module:app"
    )


def session_limit(target: str, max_sessions: int) -> int:
    """How many episodes the started server can hold at once: an Environment that does not declare
    SUPPORTS_CONCURRENT_SESSIONS gets one (OpenEnv refuses more), an app what the rollout allows."""
    obj = load_target(target)
    if isinstance(obj, type) and issubclass(obj, openenv_environment_base()):
        env_models(obj)  # checked here, where the error reaches the run, not in the server's log
        return max_sessions if getattr(obj, "SUPPORTS_CONCURRENT_SESSIONS", False) else 1
    if isinstance(obj, type) or not callable(obj):
        raise OpenEnvError(
            f"rollout_args.env {target!r} is {type(obj).__name__}, neither an OpenEnv Environment subclass nor an app"
        )
    return max_sessions


def build_app(target: str, max_sessions: int) -> Any:
    """The ASGI app serving `target` (see the module docstring)."""
    obj = load_target(target)
    base = openenv_environment_base()
    if isinstance(obj, type) and issubclass(obj, base):
        from openenv.core.env_server import create_fastapi_app

        action_cls, observation_cls = env_models(obj)
        return create_fastapi_app(
            obj, action_cls, observation_cls, max_concurrent_envs=session_limit(target, max_sessions)
        )
    return obj


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class LocalServer:
    """The environment's server process: `await start()` returns its URL once it answers."""

    def __init__(self, target: str, max_sessions: int, start_timeout_s: float) -> None:
        self.target, self.max_sessions, self.start_timeout_s = target, max_sessions, start_timeout_s
        self.proc: subprocess.Popen[bytes] | None = None
        self.url = ""
        self._log = tempfile.NamedTemporaryFile(prefix="openenv-server-", suffix=".log", delete=False)

    def log_tail(self, n: int = 3000) -> str:
        try:
            with open(self._log.name, "rb") as f:
                return f.read().decode(errors="replace")[-n:].strip()
        except OSError:
            return ""

    async def start(self) -> str:
        port = free_port()
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)  # the workflow's folder, python_path
        cmd = [
            sys.executable,
            "-m",
            __name__,
            self.target,
            "--port",
            str(port),
            "--max-sessions",
            str(self.max_sessions),
        ]
        self.proc = subprocess.Popen(cmd, stdout=self._log, stderr=subprocess.STDOUT, env=env)
        self.url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + self.start_timeout_s
        async with aiohttp.ClientSession() as http:
            while time.monotonic() < deadline:
                if self.proc.poll() is not None:
                    raise OpenEnvError(
                        f"the OpenEnv environment {self.target!r} exited (code {self.proc.returncode}) before it "
                        f"served; its output:\n{self.log_tail()}"
                    )
                try:
                    async with http.get(self.url + "/health", timeout=aiohttp.ClientTimeout(total=2)) as r:
                        if r.status < 500:
                            log.info(
                                "OpenEnv environment %s serving at %s (pid %d)", self.target, self.url, self.proc.pid
                            )
                            return self.url
                except (aiohttp.ClientError, TimeoutError):
                    pass
                await asyncio.sleep(0.1)
        await self.stop()
        raise OpenEnvError(
            f"the OpenEnv environment {self.target!r} did not answer at {self.url} within "
            f"start_timeout_s={self.start_timeout_s:g} s; its output:\n{self.log_tail()}"
        )

    async def stop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is not None and proc.poll() is None:
            proc.terminate()
            try:
                await asyncio.to_thread(proc.wait, 10)
            except subprocess.TimeoutExpired:
                proc.kill()
                await asyncio.to_thread(proc.wait)
        self._log.close()
        try:
            os.unlink(self._log.name)
        except OSError:
            pass


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Serve an OpenEnv environment (module:Class or module:app).")
    parser.add_argument("target")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--max-sessions", type=int, default=64)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO)
    import uvicorn

    uvicorn.run(build_app(args.target, args.max_sessions), host=args.host, port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
