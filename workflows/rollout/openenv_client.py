"""One OpenEnv episode session over OpenEnv's WebSocket route, with errors that say what to do.

Why our own few lines rather than openenv-core's `EnvClient`: its API changed between releases
(sync in 0.2, async in 0.3) while the wire protocol did not. An OpenEnv server keeps an episode's
environment per WebSocket session at `/ws` (its plain HTTP `/reset` and `/step` build a fresh
environment per request, so they cannot play a multi-step episode): messages
`{"type": "reset", "data": {seed, ...}}`, `{"type": "step", "data": <action fields>}`, answered by
`{"type": "observation", "data": {"observation": {...}, "reward": r, "done": d}}` or
`{"type": "error", "data": {"message", "code"}}`; `{"type": "close"}` ends the session. Every wait
(connecting, each answer) is bounded by `timeout_s`, so an environment that does not answer fails
the episode with its URL and the timeout rather than hanging the run.
"""

from __future__ import annotations

import asyncio
import json
import logging
from dataclasses import dataclass
from typing import Any

import aiohttp

log = logging.getLogger(__name__)


class OpenEnvError(RuntimeError):
    """An OpenEnv environment that cannot be reached, does not answer, or answers with an error."""


@dataclass
class StepResult:
    """What the environment answered to reset or step: its observation's own fields, reward, done."""

    observation: dict[str, Any]
    reward: float | None
    done: bool


def ws_url(base_url: str) -> str:
    """`http://host:port[/prefix]` -> `ws://host:port[/prefix]/ws` (https -> wss; ws/wss kept)."""
    url = base_url.rstrip("/")
    for http, ws in (("https://", "wss://"), ("http://", "ws://")):
        if url.startswith(http):
            url = ws + url[len(http) :]
    return url + "/ws"


class OpenEnvSession:
    """One episode's session: `async with OpenEnvSession(url, timeout_s, http) as env: await env.reset(...)`."""

    def __init__(self, base_url: str, timeout_s: float, http: aiohttp.ClientSession) -> None:
        self.base_url, self.timeout_s, self.http = base_url, float(timeout_s), http
        self.url = ws_url(base_url)
        self._ws: aiohttp.ClientWebSocketResponse | None = None

    def _where(self) -> str:
        return f"the OpenEnv environment at {self.base_url} ({self.url})"

    async def __aenter__(self) -> OpenEnvSession:
        try:
            self._ws = await asyncio.wait_for(
                self.http.ws_connect(self.url, max_msg_size=0, autoping=True), self.timeout_s
            )
        except TimeoutError:
            raise OpenEnvError(
                f"{self._where()} did not accept a session within timeout_s={self.timeout_s:g} s: check that "
                "its server is up and answering (an OpenEnv server answers GET /health), or raise "
                "rollout_args.timeout_s if it is slow to start episodes"
            ) from None
        except aiohttp.WSServerHandshakeError as err:
            raise OpenEnvError(
                f"{self._where()} refused the WebSocket session (HTTP {err.status}): is this an OpenEnv server "
                "(openenv-core >= 0.2, which serves episodes at /ws)? If it is at a path, give the URL with it"
            ) from None
        except aiohttp.ClientError as err:
            raise OpenEnvError(
                f"{self._where()} could not be reached ({err}): is its server running? Start it "
                "(e.g. `uvicorn your_env.server.app:app --port 8000`) and give that URL in rollout_args.url, "
                "or name the environment in rollout_args.env (module:Class or module:app) to start it here"
            ) from None
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        ws, self._ws = self._ws, None
        if ws is None or ws.closed:
            return
        try:
            await asyncio.wait_for(ws.send_str(json.dumps({"type": "close"})), self.timeout_s)
            await asyncio.wait_for(ws.close(), self.timeout_s)
        except (TimeoutError, aiohttp.ClientError, ConnectionError):
            log.debug("%s: closing the session failed", self._where(), exc_info=True)

    async def _call(self, message: dict[str, Any], what: str) -> dict[str, Any]:
        if self._ws is None:
            raise OpenEnvError(f"{self._where()}: {what} outside the session (use `async with`)")
        try:
            await asyncio.wait_for(self._ws.send_str(json.dumps(message)), self.timeout_s)
            msg = await asyncio.wait_for(self._ws.receive(), self.timeout_s)
        except TimeoutError:
            raise OpenEnvError(
                f"{self._where()} did not answer {what} within timeout_s={self.timeout_s:g} s: the environment "
                "is stuck or slower than that; raise rollout_args.timeout_s if its steps take longer"
            ) from None
        except (aiohttp.ClientError, ConnectionError) as err:
            raise OpenEnvError(f"{self._where()} dropped the session during {what} ({err})") from None
        if msg.type != aiohttp.WSMsgType.TEXT:
            raise OpenEnvError(
                f"{self._where()} closed the session during {what} ({msg.type.name}"
                + (f", code {self._ws.close_code}" if self._ws.close_code is not None else "")
                + "): the server may have hit its session limit or crashed; its log says which"
            )
        try:
            answer = json.loads(msg.data)
        except ValueError:
            raise OpenEnvError(
                f"{self._where()} answered {what} with text that is not JSON: {msg.data[:200]!r}"
            ) from None
        if answer.get("type") == "error":
            data = answer.get("data") or {}
            raise OpenEnvError(
                f"{self._where()} answered {what} with an error: {data.get('message', data)} "
                f"(code {data.get('code', '?')})"
            )
        return answer.get("data") or {}

    @staticmethod
    def _result(data: dict[str, Any]) -> StepResult:
        reward = data.get("reward")
        return StepResult(
            observation=dict(data.get("observation") or {}),
            reward=None if reward is None else float(reward),
            done=bool(data.get("done", False)),
        )

    async def reset(self, **kwargs: Any) -> StepResult:
        """A new episode (`seed`, `episode_id` and any keyword the environment's reset takes)."""
        return self._result(await self._call({"type": "reset", "data": kwargs}, "reset"))

    async def step(self, action: dict[str, Any]) -> StepResult:
        """One action, as the fields of the environment's Action class."""
        return self._result(await self._call({"type": "step", "data": action}, "step"))


__all__ = ["OpenEnvError", "OpenEnvSession", "StepResult", "ws_url"]
