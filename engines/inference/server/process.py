"""The embedded inference server in a subprocess (tests, benchmarks, local tools): start it,
learn its URL from the line it prints once it accepts requests, stop it.

Why its own module: a launcher needs only the command and the ready line, not the server
(aiohttp, the engine, torch); http_server.py prints READY_LINE, this module waits for it.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from typing import Any

READY_LINE = "areal-graph inference server listening on"


class ServerProcess:
    """This server in a subprocess (tests, local runs): start, learn its URL, stop.

    Port 0 lets the OS pick a free port; the URL is read from the ready line on stdout, so
    there is no race between choosing a port and binding it.
    """

    def __init__(
        self,
        model: str,
        *,
        port: int = 0,
        host: str = "127.0.0.1",
        extra_args: Sequence[str] = (),
        env: dict[str, str] | None = None,
        log_path: str | None = None,
    ) -> None:
        self.cmd = [
            sys.executable,
            "-m",
            "areal_graph.engines.inference.server.http_server",
            "--model",
            str(model),
            "--host",
            host,
            "--port",
            str(port),
            *extra_args,
        ]
        self.env = env
        self.log_path = log_path
        self.proc: subprocess.Popen | None = None
        self.url: str | None = None
        self._log: Any = None

    def start(self, timeout: float = 120.0) -> str:
        """Launch and block until the server accepts requests; return its URL."""
        env = dict(os.environ, **(self.env or {}))
        self._log = open(self.log_path, "ab") if self.log_path else None
        stderr = self._log  # None inherits our stderr (pytest captures fd 2)
        self.proc = proc = subprocess.Popen(self.cmd, stdout=subprocess.PIPE, stderr=stderr, env=env, text=True)
        found: list[str] = []

        def _read() -> None:
            assert proc.stdout is not None  # stdout=PIPE
            for line in proc.stdout:
                if line.startswith(READY_LINE) and not found:
                    found.append(line.split()[-1])
            # keep draining so the child never blocks on a full pipe

        reader = threading.Thread(target=_read, daemon=True)
        reader.start()
        deadline = time.monotonic() + timeout
        while not found:
            if self.proc.poll() is not None:
                raise RuntimeError(f"inference server exited with code {self.proc.returncode}: {' '.join(self.cmd)}")
            if time.monotonic() > deadline:
                self.stop()
                raise TimeoutError(f"inference server did not start within {timeout:.0f}s")
            time.sleep(0.05)
        self.url = found[0]
        return self.url

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM (the server drains and stops its engine), SIGKILL after `timeout` s."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout)
        if getattr(self, "_log", None) is not None:
            self._log.close()
            self._log = None

    def __enter__(self) -> ServerProcess:
        self.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()
