"""OpenEnvEpisode: an episode against an OpenEnv environment (reset, step with the model's reply,
reward and done from the environment) as one multi-turn trajectory.

Where the environment is: `url` (an OpenEnv server someone runs: `uvicorn pkg.server.app:app`, a
Hugging Face Space, a container) or `env: module:Class` / `module:app`, which this rollout starts
here in a child process on a free loopback port, without containers
(workflows/rollout/openenv_server.py), and stops when its worker shuts down. Either way each
episode is one OpenEnv session over the server's WebSocket route (workflows/rollout/openenv_client.py).

An episode: `reset(seed=...)`, the seed read from the prompt row (its answer's JSON `seed`, else a
stable hash of the row's id), so the G answers of a group play the same episode and a resumed run
plays the same episodes again. The reset observation, rendered as text, is the first user turn
(the tokenizer's chat template); each reply of the policy goes into the Action's `action_field`;
each later observation is appended as a user turn in ChatML after the policy's own tokens
(token-exact: what is trained is what was sampled). It ends when the environment says done, at
`max_turns` replies, or when the next turn would pass `max_total_tokens`. The reward is the sum
of the rewards the environment gave (`reward: last`: the last one), in `info["reward"]` for the
reward node's `fn: agent`; an episode the environment did not end gets what it gave so far.
The row's own prompt text is not used: the environment says what the task is.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
from typing import Any
from urllib.parse import urlparse

from areal_graph.api.rollout import PromptLike, Rollout, Trajectory
from areal_graph.api.sampling import SamplingParams
from areal_graph.data.datasets import format_prompt
from areal_graph.engines.inference.interruptible import generate_interruptible
from areal_graph.workflows.rollout.chatml_turns import ChatMLTurns
from areal_graph.workflows.rollout.openenv_client import OpenEnvError, OpenEnvSession, StepResult
from areal_graph.workflows.rollout.openenv_server import LocalServer, session_limit

log = logging.getLogger(__name__)

REWARDS = ("sum", "last")
SEED_RANGE = 2**31  # OpenEnv's reset request takes a non-negative seed


def episode_seed(prompt: PromptLike) -> int:
    """The environment seed of a prompt row: its answer's JSON `seed` when it has one, else a
    stable hash of its id (the same row, the same episode, in every process and run)."""
    try:
        ref = json.loads(prompt.answer)
    except (TypeError, ValueError):
        ref = None
    if isinstance(ref, dict) and isinstance(ref.get("seed"), int):
        return int(ref["seed"]) % SEED_RANGE
    digest = hashlib.sha256(str(getattr(prompt, "id", "")).encode()).digest()
    return int.from_bytes(digest[:8], "big") % SEED_RANGE


def observation_text(observation: dict[str, Any], field: str) -> str:
    """An observation as the text of a user turn: `field` when given, else its only text field,
    else all its fields as JSON."""
    if field:
        if field not in observation:
            raise OpenEnvError(
                f"rollout_args.observation_field {field!r}: the observation has no such field (it has {sorted(observation)})"
            )
        value = observation[field]
        return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    texts = [v for v in observation.values() if isinstance(v, str)]
    if len(texts) == 1:
        return texts[0]
    return json.dumps(observation, ensure_ascii=False, sort_keys=True)


class OpenEnvEpisode(Rollout):
    """See the module docstring. rollout_args: exactly one of `env` and `url`; `max_turns`,
    `max_total_tokens`, `timeout_s` (each wait on the environment), `start_timeout_s` (a started
    server's start), `action_field`, `observation_field`, `reset_args` (more keywords for reset),
    `reward` (sum or last), `max_sessions` (episodes at once against the environment)."""

    def __init__(
        self,
        tokenizer_path: str,
        env: str = "",
        url: str = "",
        max_turns: int = 8,
        max_total_tokens: int = 1024,
        timeout_s: float = 30.0,
        start_timeout_s: float = 60.0,
        action_field: str = "message",
        observation_field: str = "",
        reset_args: dict[str, Any] | None = None,
        reward: str = "sum",
        max_sessions: int = 256,
    ) -> None:
        problem = self.check_args(
            dict(env=env, url=url, max_turns=max_turns, max_total_tokens=max_total_tokens, timeout_s=timeout_s)
            | dict(start_timeout_s=start_timeout_s, reward=reward, max_sessions=max_sessions, reset_args=reset_args)
        )
        if problem:
            raise ValueError(problem)
        from transformers import AutoTokenizer

        self.tok = AutoTokenizer.from_pretrained(tokenizer_path)
        self.turns = ChatMLTurns(self.tok, "OpenEnvEpisode")
        self.env, self.url = env, url.rstrip("/")
        self.max_turns, self.max_total_tokens = max_turns, max_total_tokens
        self.timeout_s, self.start_timeout_s = float(timeout_s), float(start_timeout_s)
        self.action_field, self.observation_field = action_field, observation_field
        self.reset_args = dict(reset_args or {})
        self.reward, self.max_sessions = reward, max_sessions
        self._server: LocalServer | None = None
        self._http: Any = None
        self._sessions: asyncio.Semaphore | None = None
        self._starting: asyncio.Lock | None = None

    @classmethod
    def check_args(cls, rollout_args: dict[str, Any]) -> str | None:
        env, url = rollout_args.get("env") or "", rollout_args.get("url") or ""
        if bool(env) == bool(url):
            return (
                "rollout_args: give exactly one of env (module:Class or module:app, started here) and url "
                "(an OpenEnv server's http://host:port)"
            )
        if env and (not isinstance(env, str) or env.count(":") != 1 or not all(env.split(":"))):
            return f"rollout_args.env {env!r}: name it as module:Class (an OpenEnv Environment) or module:app"
        if url:
            parsed = urlparse(str(url))
            if parsed.scheme not in ("http", "https", "ws", "wss") or not parsed.netloc:
                return f"rollout_args.url {url!r}: an OpenEnv server's address, e.g. http://127.0.0.1:8000"
        for name in ("max_turns", "max_total_tokens", "max_sessions"):
            if name in rollout_args and (not isinstance(rollout_args[name], int) or rollout_args[name] < 1):
                return f"rollout_args.{name} must be a positive integer, got {rollout_args[name]!r}"
        for name in ("timeout_s", "start_timeout_s"):
            value = rollout_args.get(name, 1.0)
            if not isinstance(value, int | float) or value <= 0:
                return f"rollout_args.{name} must be a positive number of seconds, got {value!r}"
        if rollout_args.get("reward", "sum") not in REWARDS:
            return f"rollout_args.reward must be one of {REWARDS}, got {rollout_args.get('reward')!r}"
        if not isinstance(rollout_args.get("reset_args") or {}, dict):
            return "rollout_args.reset_args: a mapping of keywords for the environment's reset"
        if env:
            import importlib.util

            if importlib.util.find_spec("openenv") is None:
                return "rollout_args.env: starting an OpenEnv environment here needs openenv-core: pip install 'openenv-core==0.2.1'"
            try:  # the class (or app) imports and is one: said at validate, not when the first episode starts
                session_limit(str(env), 1)
            except OpenEnvError as err:
                return str(err)
        return None

    async def _ready(self) -> str:
        """The environment's URL, its server started on first use; the shared HTTP session."""
        import aiohttp

        if self._starting is None:
            self._starting = asyncio.Lock()
        async with self._starting:
            if self._http is None:
                self._http = aiohttp.ClientSession()
            if self.env and self._server is None:
                limit = session_limit(self.env, self.max_sessions)
                server = LocalServer(self.env, limit, self.start_timeout_s)
                self.url = await server.start()
                self._server = server
                self._sessions = asyncio.Semaphore(limit)
            if self._sessions is None:
                self._sessions = asyncio.Semaphore(self.max_sessions)
        return self.url

    def _reward(self, rewards: list[float]) -> float:
        if not rewards:
            return 0.0
        return float(sum(rewards)) if self.reward == "sum" else float(rewards[-1])

    async def episode(self, prompt: PromptLike, client: Any, sampling: SamplingParams, j: int, seed: int) -> Trajectory:
        url = await self._ready()
        assert self._sessions is not None
        async with self._sessions, OpenEnvSession(url, self.timeout_s, self._http) as env:
            first = await env.reset(seed=seed, episode_id=f"{getattr(prompt, 'id', '')}/{j}", **self.reset_args)
            if first.done:
                raise OpenEnvError(
                    f"the OpenEnv environment at {url} said done at reset (seed {seed}): nothing to play"
                )
            text = format_prompt(self.tok, observation_text(first.observation, self.observation_field))
            ids = self.tok(text, add_special_tokens=False).input_ids
            traj = Trajectory(list(ids), [0] * len(ids), [0.0] * len(ids), [-1] * len(ids), answer=prompt.answer)
            traj.sample_id = j
            rewards: list[float] = []
            result: StepResult = first
            turns = 0
            for turn in range(self.max_turns):
                gen = await generate_interruptible(client, traj.input_ids, sampling.for_answer(j, turn))
                traj.append(gen.output_ids, generated=True, logprobs=gen.output_logprobs, versions=gen.output_versions)
                traj.finish_reason = gen.finish_reason
                turns += 1
                reply = self.tok.decode(gen.output_ids, skip_special_tokens=True).strip()
                result = await env.step({self.action_field: reply})
                if result.reward is not None:
                    rewards.append(result.reward)
                if result.done or gen.finish_reason == "abort":  # a reply cut at the length limit is still an action
                    break
                more = self.turns.user_turn(
                    observation_text(result.observation, self.observation_field), self.turns.closed(gen.output_ids)
                )
                if len(traj.input_ids) + len(more) >= self.max_total_tokens:
                    break
                traj.append(more, generated=False)
        traj.info.update(
            reward=self._reward(rewards),
            metrics={"turns": turns, "finished": result.done, "reward_steps": len(rewards)},
            seed=seed,
        )
        return traj

    async def run(self, prompt: PromptLike, client: Any, group_size: int, sampling: SamplingParams) -> list[Trajectory]:
        seed = episode_seed(prompt)
        return list(await asyncio.gather(*(self.episode(prompt, client, sampling, j, seed) for j in range(group_size))))

    async def aclose(self) -> None:
        """Stop the server this rollout started and close its HTTP session."""
        if self._server is not None:
            await self._server.stop()
            self._server = None
        if self._http is not None:
            await self._http.close()
            self._http = None


__all__ = ["OpenEnvEpisode", "episode_seed", "observation_text"]
