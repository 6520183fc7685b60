"""The verifiers side of the bridge: runs in verifiers' own virtualenv, never imports areal_graph.

Why a separate process: verifiers 0.4 pins `openai<3` and this project uses openai 3, so the two
cannot share an environment (the same reason vLLM gets `make install-vllm`). This script is run
by that environment's python (`make install-verifiers`, or AREAL_VERIFIERS_PYTHON), with only
the standard library and verifiers imported, and talks to the rollout worker in JSON lines:

    python verifiers_runner.py list  SPEC   -> one JSON row per task on stdout, then exits
    python verifiers_runner.py serve SPEC   -> {"ready": ...}, then per request line
        {"id": 7, "task": 3, "base_url": "http://127.0.0.1:PORT/ep/KEY/v1"}
    answers {"id": 7, "reward": 1.0, "rewards": {...}, "metrics": {...}, "turns": 2,
             "ok": true, "errors": [], "stop": "agent_completed"}

SPEC is JSON: {"taskset": id, "env": id or "", "options": {taskset config fields},
"size": N, "env_args": {env config fields}, "train_agent": seat or "", "untrained_url": url}.
Every episode is an ordinary verifiers episode (`Env.run_episode`): the environment's own
control flow, harness and rubric; its model calls go to `base_url`, the recording proxy in the
rollout worker, which generates with the policy and records the exact tokens. Seats of a
multi-agent environment other than the trained one call `untrained_url` (the policy, not
recorded) unless env_args give them their own client. Each seat defaults to the tool-less `null`
harness in a local subprocess runtime (verifiers' default is a remote sandbox).

`areal_chat`, the default harness here: verifiers' `null` harness (its tool-less chat program:
system prompt, prompt or conversation, one streamed chat completion per model turn through
verifiers' interception server) run as a coroutine in this process instead of a new program per
turn. Same requests, same trace; what changes is a process start per turn (about a second of
CPU, which on a laptop costs more than the tiny model's answer). A seat given tools (MCP
servers) runs verifiers' own program; `env_args: {agent: {harness: {id: null}}}` asks for it
always.

The protocol channel is a private copy of stdout; the real stdout is pointed at stderr so that
nothing verifiers prints can corrupt it.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import threading
import traceback
import types
from typing import Any

HARNESS_ID = "areal_chat"


def register_in_process_harness() -> None:
    """Make `areal_chat` importable as a verifiers harness plugin (a module exporting a Harness)."""
    from verifiers.v1.harnesses.null.harness import NullHarness
    from verifiers.v1.harnesses.utils import core
    from verifiers.v1.harnesses.utils.compaction import is_context_overflow
    from verifiers.v1.runtimes import ProgramResult

    class AreaLChatHarness(NullHarness):
        """NullHarness's chat loop without a process: see the module docstring."""

        async def setup(self, runtime: Any) -> None:
            return None  # nothing to install: the loop runs here

        async def launch(
            self,
            ctx: Any,
            trace: Any,
            runtime: Any,
            endpoint: str,
            secret: str,
            mcp_urls: dict[str, str],
            data: Any,
            tool_interception_url: str | None = None,
        ) -> Any:
            if mcp_urls:  # tools: verifiers' own program, which speaks MCP
                await NullHarness.setup(self, runtime)
                return await NullHarness.launch(
                    self, ctx, trace, runtime, endpoint, secret, mcp_urls, data, tool_interception_url
                )
            from openai import APIStatusError, AsyncOpenAI
            from verifiers.v1.dialects.chat import message_to_wire

            system_prompt, prompt = self.resolve_prompt(data)
            messages: list[dict[str, Any]] = [{"role": "system", "content": system_prompt}] if system_prompt else []
            if isinstance(prompt, str):
                messages.append({"role": "user", "content": prompt})
            elif prompt is not None:
                messages.extend(message_to_wire(m) for m in prompt)
            client = AsyncOpenAI(base_url=endpoint, api_key=secret, max_retries=0)
            try:
                await core.chat(client, ctx.model, messages, [])
            except APIStatusError as err:
                if not is_context_overflow(err):  # a full context ends the run, as in the program
                    return ProgramResult(exit_code=1, stdout="", stderr=f"{type(err).__name__}: {err}")
            except Exception as err:  # noqa: BLE001 - reported as the program's exit would be
                return ProgramResult(exit_code=1, stdout="", stderr=traceback.format_exc() or str(err))
            finally:
                await client.close()
            return ProgramResult(exit_code=0, stdout="", stderr="")

    module = types.ModuleType(HARNESS_ID)
    module.AreaLChatHarness = AreaLChatHarness  # type: ignore[attr-defined]
    module.__all__ = ["AreaLChatHarness"]  # type: ignore[attr-defined]
    sys.modules[HARNESS_ID] = module


def _seat_defaults(env_args: dict[str, Any], seats: list[str], trained: str, untrained_url: str) -> dict[str, Any]:
    """env_args with every agent seat on the null harness and the subprocess runtime unless the
    user said otherwise; seats that are not trained call `untrained_url` unless given a client."""
    data = json.loads(json.dumps(env_args))  # a deep copy
    for seat in seats:
        cfg = data.setdefault(seat, {})
        cfg.setdefault("harness", {"id": HARNESS_ID})
        cfg.setdefault("runtime", {"type": "subprocess"})
        if seat != trained and untrained_url:
            cfg.setdefault("client", {"type": "eval", "base_url": untrained_url, "api_key_var": "AREAL_BRIDGE_KEY"})
            cfg.setdefault("model", "policy")
    return data


class NotImportable(Exception):
    """A taskset or environment package verifiers cannot import: which one, the module verifiers
    tried, and the module that was missing (itself, or one it imports). The worker turns this into
    the user's message (where it looked, `python_path:`): data/verifiers_failures.py."""

    def __init__(self, kind: str, ident: str, err: ModuleNotFoundError) -> None:
        cause = err.__cause__ if isinstance(err.__cause__, ModuleNotFoundError) else err
        name = ident.rsplit("/", 1)[-1].split("@", 1)[0]
        self.detail = {
            "kind": kind,
            "id": ident,
            "module": name.replace("-", "_").lower(),  # what verifiers imports for this id
            "missing": cause.name or "",
            "path": [p for p in sys.path if p],
            "python": sys.executable,
        }
        super().__init__(str(err))


class BadConfig(Exception):
    """env_args or a taskset option that verifiers' config model refuses, said per field."""


def _model_of(annotation: Any, default: Any) -> Any:
    """The pydantic model a config field holds (its default's class, else the one model in its type)."""
    from typing import get_args

    from pydantic import BaseModel

    if isinstance(default, BaseModel):
        return type(default)
    models = [a for a in (get_args(annotation) or (annotation,)) if isinstance(a, type) and issubclass(a, BaseModel)]
    return models[0] if len(models) == 1 else None


def _model_at(model: Any, path: tuple[Any, ...]) -> Any:
    for key in path:
        field = getattr(model, "model_fields", {}).get(key)
        if field is None:
            return None
        model = _model_of(field.annotation, field.default)
    return model


# set from the data spec (the taskset's id, the env's id), not by env_args or a taskset option
_SET_BY_US: dict[tuple[str, ...], set[str]] = {(): {"id", "taskset"}, ("taskset",): {"id"}}


def config_problems(err: Any, env_cls: Any, taskset_cls: Any, spec: dict[str, Any]) -> str:
    """A pydantic ValidationError of the env config as one clause per field: where it was given
    (rollout_args.env_args or the data spec's taskset option), and for an unknown field the valid ones."""
    said = []
    for e in err.errors():
        loc = tuple(e.get("loc", ()))
        in_taskset = loc[:1] == ("taskset",)
        model, inner = (taskset_cls, loc[1:]) if in_taskset else (env_cls, loc)
        parent = _model_at(model, inner[:-1])
        name = ".".join(map(str, inner))
        if e.get("type") == "extra_forbidden" and parent is not None:
            hidden = _SET_BY_US[("taskset",) if in_taskset else ()] if len(inner) == 1 else set()
            fields = ", ".join(k for k in parent.model_fields if k not in hidden) or "none"
            if in_taskset:
                said.append(
                    f"{name!r} is not an option of taskset {spec['taskset']!r} (the fields of {parent.__name__}: {fields})"
                )
            else:
                said.append(
                    f"rollout_args.env_args: {name!r} is not a field of {parent.__name__} (its fields: {fields})"
                )
        else:
            where = f"taskset option {name!r}" if in_taskset else f"rollout_args.env_args.{name}"
            said.append(f"{where}: {e.get('msg')} (got {e.get('input')!r})")
    return "; ".join(said)


def load(spec: dict[str, Any]) -> tuple[Any, list[Any], str]:
    """(env, the first `size` tasks, the trained seat) for `spec`."""
    from pydantic import ValidationError
    from verifiers.v1.configs.agent import AgentConfig
    from verifiers.v1.utils.loaders import (
        env_config_type,
        import_environment,
        import_taskset,
        load_environment,
        resolve_env_config,
        taskset_config_type,
    )

    register_in_process_harness()
    for kind, ident, importer in (
        ("taskset", spec["taskset"], import_taskset),
        ("environment", spec.get("env", ""), import_environment),
    ):
        if ident:
            try:
                importer(ident)
            except ModuleNotFoundError as err:
                raise NotImportable(kind, ident, err) from err
    taskset = {"id": spec["taskset"], **spec.get("options", {})}
    cls = env_config_type(spec["taskset"], spec.get("env", ""))
    seats = [
        name
        for name, field in cls.model_fields.items()
        if isinstance(field.default, AgentConfig) or field.annotation is AgentConfig
    ]
    trained = spec.get("train_agent") or ("agent" if "agent" in seats else (seats[0] if seats else ""))
    if seats and trained not in seats:
        raise ValueError(f"train_agent {trained!r} is not a seat of {cls.__name__} (its seats: {', '.join(seats)})")
    data = {
        "id": spec.get("env", ""),
        "taskset": taskset,
        **_seat_defaults(spec.get("env_args", {}), seats, trained, spec.get("untrained_url", "")),
    }
    try:
        config = resolve_env_config(data)
    except ValidationError as err:
        raise BadConfig(config_problems(err, cls, taskset_config_type(spec["taskset"]), spec)) from err
    env = load_environment(config)
    tasks = list(env.taskset.take(int(spec["size"])))
    return env, tasks, trained


def failure(err: Exception) -> dict[str, Any]:
    """The error line the worker reads: the message, and what a NotImportable knows."""
    line: dict[str, Any] = {"error": str(err) if isinstance(err, BadConfig) else f"{type(err).__name__}: {err}"}
    if isinstance(err, NotImportable):
        line["not_importable"] = err.detail
    return line


def task_row(spec: dict[str, Any], i: int, task: Any) -> dict[str, Any]:
    """One task as a prompt row: its conversation as the question, where to find it as the answer."""
    data = task.data
    messages: list[dict[str, str]] = []
    if data.system_prompt:
        messages.append({"role": "system", "content": data.system_prompt})
    if isinstance(data.prompt, str):
        messages.append({"role": "user", "content": data.prompt})
    elif data.prompt:
        from verifiers.v1.types import content_text

        messages.extend({"role": m.role, "content": content_text(m.content)} for m in data.prompt)
    if not any(m["role"] == "user" for m in messages):  # the environment opens the conversation
        messages.append({"role": "user", "content": data.prompt_text or "(the environment opens)"})
    where = {
        "verifiers": spec["taskset"],
        "env": spec.get("env", ""),
        "options": spec.get("options", {}),
        "size": spec["size"],
        "task": i,
    }
    return {
        "id": f"{spec['taskset']}-{i}",
        "question": messages,
        "answer": json.dumps(where),
        "data_source": f"verifiers/{spec['taskset']}",
    }


def _numbers(mapping: dict[str, Any]) -> dict[str, float]:
    out = {}
    for name, value in (mapping or {}).items():
        score = getattr(value, "score", value)
        if isinstance(score, (int, float)):  # bool included
            out[str(name)] = float(score)
    return out


def episode_result(job: dict[str, Any], episode: Any, trained: str) -> dict[str, Any]:
    """The trained seat's trace of `episode` as the answer line."""
    traces = list(episode.traces)
    mine = [t for t in traces if getattr(t.agent, "name", "agent") in (trained, "agent")] or traces
    errors = [f"{e.type}: {e.message}" for e in episode.errors]
    tracebacks = [e.traceback for e in episode.errors if getattr(e, "traceback", None)]
    if not mine:
        return {"id": job["id"], "ok": False, "errors": errors or ["the episode has no trace"], "traceback": ""}
    trace = mine[-1]
    errors += [f"{e.type}: {e.message}" for e in trace.errors]
    tracebacks += [e.traceback for e in trace.errors if getattr(e, "traceback", None)]
    return {
        "traceback": "\n".join(tracebacks),  # verifiers' own, for the worker's log (never the console)
        "id": job["id"],
        "ok": bool(trace.ok and not episode.errors),
        "reward": float(trace.reward),
        "rewards": _numbers(trace.rewards),
        "metrics": _numbers(trace.metrics),
        "turns": int(trace.num_turns),
        "stop": trace.stop_condition,
        "errors": errors,
    }


async def serve(spec: dict[str, Any], proto: Any) -> None:
    from verifiers.v1 import EvalClientConfig, ModelContext

    env, tasks, trained = load(spec)
    lock = threading.Lock()

    def say(obj: dict[str, Any]) -> None:
        with lock:
            proto.write(json.dumps(obj) + "\n")
            proto.flush()

    async def one(job: dict[str, Any]) -> None:
        try:
            task = tasks[int(job["task"])]
            ctx = ModelContext(
                model="policy", client=EvalClientConfig(base_url=job["base_url"], api_key_var="AREAL_BRIDGE_KEY")
            )
            say(episode_result(job, await env.run_episode(task, ctx), trained))
        except Exception as err:  # noqa: BLE001 - every failure goes back to the worker, by name
            say(
                {
                    "id": job.get("id"),
                    "ok": False,
                    "errors": [f"{type(err).__name__}: {err}"],
                    "traceback": traceback.format_exc(),
                }
            )

    loop = asyncio.get_running_loop()
    lines: asyncio.Queue[str | None] = asyncio.Queue()

    def read() -> None:
        for line in sys.stdin:
            loop.call_soon_threadsafe(lines.put_nowait, line)
        loop.call_soon_threadsafe(lines.put_nowait, None)

    threading.Thread(target=read, daemon=True).start()
    pending: set[asyncio.Task[None]] = set()
    async with env.serving():
        say({"ready": True, "tasks": len(tasks), "env": type(env).__name__, "train_agent": trained})
        while (line := await lines.get()) is not None:
            if line.strip():
                job = asyncio.create_task(one(json.loads(line)))
                pending.add(job)
                job.add_done_callback(pending.discard)
        # stdin closed: the rollout worker stopped us or is gone; nobody waits for these answers
        for job in pending:
            job.cancel()
        await asyncio.gather(*pending, return_exceptions=True)


def main(argv: list[str]) -> int:
    proto = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)  # whatever verifiers prints goes to stderr, never into the protocol
    sys.stdout = sys.stderr
    os.environ.setdefault("AREAL_BRIDGE_KEY", "areal-graph")
    if len(argv) != 3 or argv[1] not in ("list", "serve"):
        proto.write(json.dumps({"error": "usage: verifiers_runner.py list|serve SPEC_JSON"}) + "\n")
        return 2
    spec = json.loads(argv[2])
    try:
        if argv[1] == "list":
            _env, tasks, _trained = load(spec)
            for i, task in enumerate(tasks):
                proto.write(json.dumps(task_row(spec, i, task)) + "\n")
            proto.flush()
            return 0
        asyncio.run(serve(spec, proto))
        return 0
    except Exception as err:  # noqa: BLE001 - the worker shows this line to the user
        traceback.print_exc()
        proto.write(json.dumps(failure(err)) + "\n")
        proto.flush()
        return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
