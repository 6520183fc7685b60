"""A Model Context Protocol server over stdio, as a rollout worker holds it: started once, shared
by every episode of the worker, closed at shutdown.

Why a class of our own around the SDK's client (`mcp.ClientSession` over `mcp.stdio_client`):
- **Lifetime.** The SDK's client is a pair of async context managers whose task groups must be
  entered and left by one task. A rollout worker runs many episodes as many tasks on one loop,
  for the whole run; so one owner task enters them, keeps the session open, and leaves them
  when `aclose` asks. Episodes call through the session from their own tasks (JSON-RPC
  requests carry ids: concurrent calls are safe).
- **Errors a user can act on.** A server that cannot start, exits, or does not answer is
  reported with the command line, the cause and the tail of the server's stderr (kept in a
  bounded buffer, and in the log at debug level), never as the SDK's bare "Connection closed".
- **Calls that fail are answers.** A tool that reports an error, times out, or is refused by the
  server comes back as an `McpCallResult` with `is_error` set: the agent shows it to the policy,
  as the calculator agent shows a bad expression. Only a dead server raises (`McpServerError`).

`mcp` is an optional dependency (`pip install 'areal-graph[mcp]'`): it is imported when a server
starts, so this module imports without it.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import os
import shlex
import shutil
import sys
import threading
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger(__name__)

__all__ = [
    "McpServerError",
    "McpServerParams",
    "McpToolInfo",
    "McpCallResult",
    "McpToolServer",
    "mcp_missing",
    "probe_server",
]

INSTALL_HINT = "pip install 'areal-graph[mcp]' (the official `mcp` SDK)"
STDERR_TAIL_LINES = 20
STDERR_TAIL_CHARS = 2000
# Environment variables the server inherits from the rollout worker on top of the SDK's safe set
# (HOME, PATH, USER, ...): Python servers must import what the worker imports.
INHERITED_ENV = ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")


def mcp_missing() -> str | None:
    """Why the MCP SDK cannot be used here (None: it can)."""
    try:
        import mcp  # noqa: F401
    except ImportError as err:
        return f"the MCP tools need the `mcp` package ({err}): {INSTALL_HINT}"
    return None


class McpServerError(RuntimeError):
    """The MCP server could not start, did not answer in time, died, or lacks a tool asked for."""


@dataclass(frozen=True)
class McpServerParams:
    """How to start the server (rollout_args of the MCP tool agent).

    `command` "python" or "python3" runs the interpreter of the rollout worker itself
    (`sys.executable`), so a Python server runs in the environment the run runs in."""

    command: str
    args: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)
    cwd: str | None = None
    startup_timeout_s: float = 30.0
    call_timeout_s: float = 30.0

    @property
    def executable(self) -> str:
        return sys.executable if self.command in ("python", "python3") else self.command

    def describe(self) -> str:
        """The command line as a user would type it (for error messages)."""
        return shlex.join([self.command, *self.args])

    def environment(self) -> dict[str, str]:
        """What the server gets on top of the SDK's safe defaults: INHERITED_ENV, then `env`."""
        inherited = {k: os.environ[k] for k in INHERITED_ENV if k in os.environ}
        return {**inherited, **self.env}

    def problem(self) -> str | None:
        """What is wrong with these parameters without starting anything (None: nothing)."""
        if not self.command.strip():
            return "command is empty: name the program that starts the MCP server"
        exe = self.executable
        if os.sep in exe or (os.altsep and os.altsep in exe):
            base = exe if os.path.isabs(exe) or self.cwd is None else os.path.join(self.cwd, exe)
            if not os.path.exists(base):
                return f"command {self.command!r} does not exist"
        elif shutil.which(exe, path=self.environment().get("PATH", os.environ.get("PATH"))) is None:
            return f"command {self.command!r} is not on PATH"
        if self.cwd is not None and not os.path.isdir(self.cwd):
            return f"cwd {self.cwd!r} is not a folder"
        for name in ("startup_timeout_s", "call_timeout_s"):
            if not getattr(self, name) > 0:
                return f"{name} must be > 0, got {getattr(self, name)}"
        return None


@dataclass(frozen=True)
class McpToolInfo:
    """One tool as the server lists it (tools/list)."""

    name: str
    description: str
    input_schema: dict[str, Any]

    def openai_schema(self) -> dict[str, Any]:
        """The tool in the OpenAI `tools` shape, which chat templates render (Qwen2.5, Hermes)."""
        function: dict[str, Any] = {"name": self.name}
        if self.description:
            function["description"] = self.description
        function["parameters"] = self.input_schema or {"type": "object", "properties": {}}
        return {"type": "function", "function": function}

    def missing_arguments(self, arguments: dict[str, Any]) -> list[str]:
        """The required arguments (per the input schema) that `arguments` lacks."""
        required = self.input_schema.get("required") if isinstance(self.input_schema, dict) else None
        return [str(r) for r in required or () if r not in arguments]


@dataclass(frozen=True)
class McpCallResult:
    """The server's answer to one call, as text (non-text content named by its type)."""

    text: str
    is_error: bool = False


def _content_text(content: list[Any]) -> str:
    parts = []
    for item in content:
        text = getattr(item, "text", None)
        parts.append(text if isinstance(text, str) else f"[{getattr(item, 'type', 'content')}]")
    return "\n".join(parts)


class _StderrTail:
    """Reads the server's stderr pipe in a thread: the last lines for error messages, all of them
    to the log at debug level. Bounded, whatever the server writes."""

    def __init__(self, label: str) -> None:
        read_fd, write_fd = os.pipe()
        self.file = os.fdopen(write_fd, "w")  # the server's stderr (stdio_client's errlog)
        self._lines: collections.deque[str] = collections.deque(maxlen=STDERR_TAIL_LINES)
        self._thread = threading.Thread(target=self._pump, args=(read_fd, label), name="mcp-stderr", daemon=True)
        self._thread.start()

    def _pump(self, read_fd: int, label: str) -> None:
        with os.fdopen(read_fd, "r", errors="replace") as pipe:
            for line in pipe:
                self._lines.append(line.rstrip("\n"))
                log.debug("mcp server %s: %s", label, line.rstrip("\n"))

    def close(self, wait_s: float = 2.0) -> None:
        """Close our end of the pipe and let the reader drain what the (exited) server wrote."""
        with contextlib.suppress(OSError):
            self.file.close()
        self._thread.join(timeout=wait_s)

    def tail(self) -> str:
        text = "\n".join(self._lines)
        return text[-STDERR_TAIL_CHARS:]


class McpToolServer:
    """One MCP server process and its client session, started on first use (`start`), shared by
    every caller on the loop it started on, restarted by `start` after it died."""

    def __init__(self, params: McpServerParams) -> None:
        self.params = params
        self._session: Any = None
        self._tools: dict[str, McpToolInfo] = {}
        self._owner: asyncio.Task | None = None
        self._closing: asyncio.Event | None = None
        self._start_lock: asyncio.Lock | None = None
        self._stderr: _StderrTail | None = None
        self._dead: str | None = None  # why the running session can no longer be used

    @property
    def tools(self) -> dict[str, McpToolInfo]:
        """The tools the server listed at start, by name."""
        return dict(self._tools)

    @property
    def running(self) -> bool:
        return self._session is not None and self._dead is None

    async def start(self) -> dict[str, McpToolInfo]:
        """Start the server (once; again after it died) and list its tools; McpServerError when it
        cannot start or does not answer within `startup_timeout_s`."""
        if self._start_lock is None:
            self._start_lock = asyncio.Lock()
        async with self._start_lock:
            if self.running:
                return self.tools
            if self._owner is not None:
                await self.aclose()
            problem = mcp_missing()
            if problem:
                raise McpServerError(problem)
            self._dead = None
            self._closing = asyncio.Event()
            self._stderr = _StderrTail(self.params.describe())
            ready: asyncio.Future = asyncio.get_running_loop().create_future()
            self._owner = asyncio.create_task(self._own(ready), name=f"mcp-server {self.params.describe()}")
            try:
                await ready
            except McpServerError as err:
                await self._reap()  # the process is gone: its stderr is complete
                raise self._with_stderr(str(err)) from None
            except BaseException:
                await self._reap()
                raise
            log.info("MCP server `%s` started: tools %s", self.params.describe(), ", ".join(self._tools) or "(none)")
            return self.tools

    async def _own(self, ready: asyncio.Future) -> None:
        """The owner task: enter the SDK's transport and session, list the tools, hold them open
        until `aclose`, leave them (which stops the server process)."""
        import anyio
        from mcp import ClientSession, StdioServerParameters, stdio_client

        p = self.params
        server = StdioServerParameters(command=p.executable, args=list(p.args), env=p.environment(), cwd=p.cwd)
        assert self._stderr is not None and self._closing is not None
        try:
            async with stdio_client(server, errlog=self._stderr.file) as (read, write):
                async with ClientSession(read, write) as session:
                    with anyio.fail_after(p.startup_timeout_s):
                        await session.initialize()
                        tools = await _list_all_tools(session)
                    self._tools = tools
                    self._session = session
                    ready.set_result(None)
                    await self._closing.wait()
        except BaseException as err:
            if not ready.done():
                ready.set_exception(self._startup_error(err))
            elif not isinstance(err, asyncio.CancelledError):
                self._dead = f"{type(err).__name__}: {err}"
                log.warning("MCP server `%s` session ended: %s", p.describe(), self._dead)
            if isinstance(err, asyncio.CancelledError):
                raise
        finally:
            self._session = None

    def _startup_error(self, err: BaseException) -> McpServerError:
        p = self.params
        err = _leaf(err)
        if isinstance(err, TimeoutError):
            why = f"did not answer initialize and tools/list within startup_timeout_s={p.startup_timeout_s:g} s"
        elif isinstance(err, OSError):
            why = f"could not be started: {err}"
        elif isinstance(err, asyncio.CancelledError):
            why = "was cancelled while starting"
        elif getattr(err, "code", None) == _connection_closed():
            why = "exited (or closed its stdout) before it answered initialize"
        else:
            why = f"exited or failed before it answered ({_describe(err)})"
        return McpServerError(f"MCP server `{p.describe()}` {why}")

    async def _reap(self) -> None:
        """Ask the owner task to leave the session, wait for it (the SDK stops the process, bounded),
        cancel it if it hangs, and drain the stderr reader: the tail is then complete."""
        owner, self._owner = self._owner, None
        if owner is not None:
            if self._closing is not None:
                self._closing.set()
            with contextlib.suppress(Exception):  # TimeoutError: cancelled below
                await asyncio.wait_for(asyncio.shield(owner), timeout=10)
            if not owner.done():
                owner.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await owner
        if self._stderr is not None:
            await asyncio.to_thread(self._stderr.close)

    def stderr_tail(self) -> str:
        return self._stderr.tail() if self._stderr is not None else ""

    def _with_stderr(self, message: str) -> McpServerError:
        """`message` and the tail of the server's stderr: most servers say there why they failed."""
        tail = self.stderr_tail()
        suffix = f"; its stderr ends:\n{tail}" if tail.strip() else " (it wrote nothing to stderr)"
        return McpServerError(message + suffix)

    async def call(self, name: str, arguments: dict[str, Any]) -> McpCallResult:
        """tools/call; an error of the tool or of the request is a result with `is_error`, a dead
        server an McpServerError (with its stderr)."""
        from mcp import MCPError, types

        session = self._session
        if session is None or self._dead is not None:
            raise self._with_stderr(
                f"MCP server `{self.params.describe()}` is not running ({self._dead or 'not started'})"
            )
        try:
            result = await session.call_tool(name, arguments, read_timeout_seconds=self.params.call_timeout_s)
        except MCPError as err:
            if err.code == types.REQUEST_TIMEOUT:
                return McpCallResult(
                    f"Error: the tool {name!r} did not answer within {self.params.call_timeout_s:g} s", True
                )
            if err.code == types.CONNECTION_CLOSED:
                self._dead = "it closed the connection"
                await asyncio.sleep(0.2)  # let its last stderr lines arrive
                raise self._with_stderr(
                    f"MCP server `{self.params.describe()}` closed the connection during a call"
                ) from None
            return McpCallResult(f"Error: {err.message or _describe(err)}", True)
        return McpCallResult(_content_text(list(result.content or [])), bool(result.is_error))

    async def aclose(self) -> None:
        """Stop the server (closes its stdin, then the SDK's bounded terminate/kill) and the reader."""
        self._session = None
        await self._reap()
        self._closing = None


async def _list_all_tools(session: Any) -> dict[str, McpToolInfo]:
    """Every page of tools/list."""
    from mcp import types

    tools: dict[str, McpToolInfo] = {}
    cursor: str | None = None
    for _ in range(1000):
        params = types.PaginatedRequestParams(cursor=cursor) if cursor else None
        page = await session.list_tools(params=params)
        for t in page.tools:
            tools[t.name] = McpToolInfo(t.name, t.description or "", dict(t.input_schema or {}))
        cursor = page.next_cursor
        if not cursor:
            break
    return tools


def _connection_closed() -> int:
    from mcp import types

    return int(types.CONNECTION_CLOSED)


def _leaf(err: BaseException) -> BaseException:
    """An exception group's first leaf (anyio's task groups wrap what they raise), else `err`."""
    while isinstance(err, BaseExceptionGroup) and err.exceptions:
        err = err.exceptions[0]
    return err


def _describe(err: BaseException) -> str:
    """An exception in one line."""
    err = _leaf(err)
    text = str(err)
    return f"{type(err).__name__}: {text}" if text else type(err).__name__


def probe_server(params: McpServerParams) -> dict[str, McpToolInfo]:
    """Start the server, list its tools, stop it: what `validate` does before a run. Call it from
    a thread with no running event loop; McpServerError says what failed."""

    async def go() -> dict[str, McpToolInfo]:
        server = McpToolServer(params)
        try:
            return await server.start()
        finally:
            await server.aclose()

    return asyncio.run(go())
