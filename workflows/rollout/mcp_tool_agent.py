"""McpToolAgent: a multi-turn tool agent whose tools come from an MCP server started over stdio.

The rollout worker starts the server once (`command` + `args`, with `env` and `cwd`), lists its
tools (tools/list) and keeps the session for the whole run; every episode of the worker calls
through it (tools/call), concurrently. `aclose` stops the server when the worker shuts down.

What the policy sees and writes is the calculator agent's protocol (Hermes / Qwen2.5,
api/tool_calls.py): the tools' schemas go into the prompt through the chat template's `tools`
(templates that render them, as Qwen2.5's does; the builtin kits' templates do not, so their
prompt is unchanged), the policy writes `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`
and ends its turn; every call of the turn goes to the server and the replies come back as
`tool` messages followed by the next assistant header.

Token-exact, as every rollout here: the prompt is tokenised once; the policy's sampled tokens are
appended as sampled (loss_mask 1, their behaviour log-probs and versions); the tool messages are
encoded and appended (loss_mask 0, log-prob 0, version -1). Nothing already in the sequence is
re-rendered, so the trajectory decodes to the conversation and the loss covers only the policy.

A call the server cannot take is the policy's mistake, answered as a tool message and counted,
never an exception: a call to a tool not offered (`Error: unknown tool ...`, counted in
`env/mcp_unknown_tool_calls`), bad JSON or missing required arguments, a tool's own error, a
call that times out (`env/mcp_tool_errors`). A server that cannot start or dies raises
`McpServerError` with its command and the tail of its stderr; `validate` starts the server
once beforehand (`check_data`), so those errors, and a tool named in `tools` that the server
does not list, come before any process of the run starts.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import logging
import uuid
from typing import Any

from areal_graph.api.rollout import PromptLike, Rollout, Trajectory
from areal_graph.api.sampling import SamplingParams
from areal_graph.api.tool_calls import ToolCall, parse_tool_calls, tool_turn_text
from areal_graph.engines.inference.interruptible import generate_interruptible
from areal_graph.tools.mcp_client import (
    McpServerError,
    McpServerParams,
    McpToolInfo,
    McpToolServer,
    mcp_missing,
    probe_server,
)

log = logging.getLogger(__name__)

METRICS = ("mcp_calls", "mcp_tool_errors", "mcp_unknown_tool_calls")


def server_params(rollout_args: dict[str, Any]) -> McpServerParams:
    """The server's launch parameters from `rollout_args`; TypeError/ValueError naming the field."""
    command = rollout_args.get("command")
    if not isinstance(command, str):
        raise TypeError(f"command must be the server's program as a string (e.g. python), got {command!r}")
    args = rollout_args.get("args") or []
    if not isinstance(args, (list, tuple)) or not all(isinstance(a, (str, int, float)) for a in args):
        raise TypeError(f"args must be a list of strings, got {args!r}")
    env = rollout_args.get("env") or {}
    if not isinstance(env, dict) or not all(isinstance(k, str) for k in env):
        raise TypeError(f"env must map variable names to values, got {env!r}")
    cwd = rollout_args.get("cwd")
    if cwd is not None and not isinstance(cwd, str):
        raise TypeError(f"cwd must be a folder, got {cwd!r}")
    return McpServerParams(
        command=command,
        args=tuple(str(a) for a in args),
        env={k: str(v) for k, v in env.items()},
        cwd=cwd,
        startup_timeout_s=float(rollout_args.get("startup_timeout_s", 30.0)),
        call_timeout_s=float(rollout_args.get("call_timeout_s", 30.0)),
    )


def _tool_names(value: Any) -> tuple[str, ...] | None:
    if value is None:
        return None
    if not isinstance(value, (list, tuple)) or not all(isinstance(t, str) and t for t in value) or not value:
        raise TypeError(f"tools must be a non-empty list of tool names (or left out: all of them), got {value!r}")
    return tuple(value)


def select_tools(
    listed: dict[str, McpToolInfo], wanted: tuple[str, ...] | None, describe: str
) -> dict[str, McpToolInfo]:
    """The tools to offer: all listed, or those `wanted`; McpServerError naming what is missing
    and what the server has."""
    if wanted is None:
        if not listed:
            raise McpServerError(f"MCP server `{describe}` lists no tools")
        return dict(listed)
    missing = [t for t in wanted if t not in listed]
    if missing:
        have = ", ".join(repr(t) for t in listed) or "none"
        raise McpServerError(
            f"MCP server `{describe}` does not list the tool(s) {', '.join(repr(t) for t in missing)} "
            f"named in rollout_args.tools; it lists: {have}"
        )
    return {t: listed[t] for t in wanted}


# validate calls check_data once per dataset (train, eval): one server start per configuration
_PROBED: dict[str, str | None] = {}


def _probe_problem(params: McpServerParams, wanted: tuple[str, ...] | None) -> str | None:
    key = repr((params, wanted))
    if key not in _PROBED:
        try:
            try:
                asyncio.get_running_loop()
                with concurrent.futures.ThreadPoolExecutor(1) as pool:  # asyncio.run needs a loop-free thread
                    listed = pool.submit(probe_server, params).result()
            except RuntimeError:
                listed = probe_server(params)
            select_tools(listed, wanted, params.describe())
            _PROBED[key] = None
        except McpServerError as err:
            _PROBED[key] = str(err)
    return _PROBED[key]


class McpToolAgent(Rollout):
    """Episodes of up to `max_turns` policy turns; each turn's tool calls go to the MCP server."""

    def __init__(
        self,
        tokenizer_path: str,
        command: str,
        args: list[str] | None = None,
        env: dict[str, str] | None = None,
        cwd: str | None = None,
        tools: list[str] | None = None,
        startup_timeout_s: float = 30.0,
        call_timeout_s: float = 30.0,
        max_turns: int = 3,
        max_total_tokens: int = 256,
        max_result_chars: int = 500,
        max_concurrent_calls: int = 32,
        tools_in_prompt: bool = True,
        max_interruptions: int = 100,
    ) -> None:
        from transformers import AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(tokenizer_path)
        self.params = server_params(
            dict(
                command=command,
                args=args,
                env=env,
                cwd=cwd,
                startup_timeout_s=startup_timeout_s,
                call_timeout_s=call_timeout_s,
            )
        )
        self.wanted = _tool_names(tools)
        self.max_turns = max_turns
        self.max_total_tokens = max_total_tokens
        self.max_result_chars = max_result_chars
        self.max_concurrent_calls = max_concurrent_calls
        self.tools_in_prompt = tools_in_prompt
        self.max_interruptions = max_interruptions
        self.server = McpToolServer(self.params)
        self.offered: dict[str, McpToolInfo] = {}
        self._gate: asyncio.Semaphore | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    # ------------------------------------------------------------------ validation
    @classmethod
    def check_args(cls, rollout_args: dict[str, Any]) -> str | None:
        """The arguments' types, the `mcp` package, the command on PATH: cheap, nothing started."""
        problem = mcp_missing()
        if problem:
            return problem
        try:
            params = server_params(rollout_args)
            _tool_names(rollout_args.get("tools"))
        except (TypeError, ValueError) as err:
            return str(err)
        return params.problem()

    @classmethod
    def check_data(cls, rollout_args: dict[str, Any], dataset: str) -> str | None:
        """Start the server once, list its tools, stop it: a server that cannot start, does not
        answer within startup_timeout_s or lacks a tool named in `tools` fails `validate`."""
        if cls.check_args(rollout_args) is not None:
            return None  # the workflow check already said what is wrong
        return _probe_problem(server_params(rollout_args), _tool_names(rollout_args.get("tools")))

    # ------------------------------------------------------------------ the server
    async def _ensure_server(self) -> None:
        loop = asyncio.get_running_loop()
        if self._loop is not None and self._loop is not loop:  # a new loop (offline eval): a new session
            log.warning("MCP tools: a new event loop; starting the server again for it")
            self.server = McpToolServer(self.params)
            self._gate = None
        self._loop = loop
        if self._gate is None:
            self._gate = asyncio.Semaphore(self.max_concurrent_calls)
        if not self.server.running:
            listed = await self.server.start()
            self.offered = select_tools(listed, self.wanted, self.params.describe())

    async def aclose(self) -> None:
        """Stop the server (the worker is shutting down)."""
        await self.server.aclose()

    # ------------------------------------------------------------------ the prompt
    def prompt_ids(self, prompt: PromptLike) -> list[int]:
        """The prompt's tokens with the tools' schemas, where the chat template renders them; the
        prompt as given where it does not (then nothing is re-tokenised)."""
        ids = [int(t) for t in prompt.input_ids]
        if not self.tools_in_prompt or not getattr(self.tokenizer, "chat_template", None):
            return ids
        from areal_graph.engines.openai.chat_format import encode_text, render_chat_prompt
        from areal_graph.workflows.rollout.openai_agent import prompt_messages

        messages = prompt_messages(prompt, self.tokenizer)
        schemas = [t.openai_schema() for t in self.offered.values()]
        with_tools = render_chat_prompt(self.tokenizer, messages, schemas)
        if with_tools == render_chat_prompt(self.tokenizer, messages, ()):
            return ids
        return encode_text(self.tokenizer, with_tools)

    # ------------------------------------------------------------------ the calls
    async def answer(self, call: ToolCall, counts: dict[str, int]) -> str:
        """The tool message for one parsed call: the server's reply, or "Error: ..."."""
        if call.error is not None:
            counts["mcp_tool_errors"] += 1
            return f"Error: {call.error}"
        tool = self.offered.get(call.name)
        if tool is None:
            counts["mcp_unknown_tool_calls"] += 1
            names = ", ".join(repr(t) for t in self.offered)
            return f"Error: unknown tool {call.name[:40]!r} (the tools are {names})"
        missing = tool.missing_arguments(call.arguments)
        if missing:
            counts["mcp_tool_errors"] += 1
            return f"Error: the tool {tool.name!r} needs the argument(s) {', '.join(repr(m) for m in missing)}"
        assert self._gate is not None
        async with self._gate:
            result = await self.server.call(tool.name, call.arguments)
        counts["mcp_calls"] += 1
        text = result.text
        if result.is_error:
            counts["mcp_tool_errors"] += 1
            if not text.startswith("Error"):
                text = f"Error: {text}"
        if len(text) > self.max_result_chars:
            text = text[: self.max_result_chars] + " ...(cut)"
        return text

    # ------------------------------------------------------------------ episodes
    async def _one_episode(
        self, client: Any, prompt_ids: list[int], sampling: SamplingParams, rid: str, j: int
    ) -> Trajectory:
        n = len(prompt_ids)
        traj = Trajectory(list(prompt_ids), [0] * n, [0.0] * n, [-1] * n, sample_id=j, info={"tool_calls": 0})
        counts = dict.fromkeys(METRICS, 0)
        finish = "length"
        for turn in range(self.max_turns):
            budget = min(sampling.max_new_tokens, self.max_total_tokens - len(traj.input_ids))
            if budget <= 0:
                finish = "length"
                break
            gen = await generate_interruptible(
                client=client,
                prompt_ids=traj.input_ids,
                sampling=dataclasses.replace(sampling.for_answer(j, turn), max_new_tokens=budget),
                rid=f"{rid}-t{turn}",
                max_interruptions=self.max_interruptions,
            )
            traj.append(gen.output_ids, generated=True, logprobs=gen.output_logprobs, versions=gen.output_versions)
            finish = gen.finish_reason
            if finish != "stop":
                break
            calls = parse_tool_calls(self.tokenizer.decode(gen.output_ids, skip_special_tokens=True))
            if not calls:
                break  # the final answer
            results = await asyncio.gather(*(self.answer(c, counts) for c in calls))
            traj.append(self.tokenizer.encode(tool_turn_text(list(results)), add_special_tokens=False), generated=False)
            traj.info["tool_calls"] += len(calls)
        traj.finish_reason = finish
        traj.info["metrics"] = counts
        return traj

    async def run(self, prompt: PromptLike, client: Any, group_size: int, sampling: SamplingParams) -> list[Trajectory]:
        await self._ensure_server()
        ids = self.prompt_ids(prompt)
        base = f"{getattr(prompt, 'id', 'p')}-{uuid.uuid4().hex[:8]}"
        trajs = await asyncio.gather(
            *(self._one_episode(client, ids, sampling, f"{base}-{j}", j) for j in range(group_size))
        )
        for t in trajs:
            t.answer = str(prompt.answer)
        return list(trajs)
