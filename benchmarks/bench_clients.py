"""Third-party clients against `areal-graph serve`, as a user would point them at it.

The OpenAI Agents SDK (its chat completions model, and its default model on the Responses API
with nothing configured but the client), LangChain's ChatOpenAI (chat and `use_responses_api`),
LiteLLM and the `openai` package (chat and responses) each talk to a real server (a subprocess
with an API key) serving a tiny local model; each check passes when the client's own parser
accepts what came back (valid JSON for the schema, tool calls it can run), not when the tiny
model writes sense. Nothing is downloaded: the model is built here
(tests/support/openai_tool_model.py, a 2-layer Qwen2 that knows a tool-call conversation by
heart; 512-token context). A check refused with
`context_length_exceeded` is rerun on a random-weight Qwen2 with an 8192-token context.

The clients live in their own venv so their dependencies never touch ours:

    python3.11 -m venv /tmp/clients-venv
    /tmp/clients-venv/bin/pip install openai-agents==0.24.0 langchain-openai==1.7.4 \
        langchain-core==1.8.3 litellm==1.110.2 openai==3.57.0   # the versions checked (Python 3.11.7)
    .venv/bin/python benchmarks/bench_clients.py --clients-python /tmp/clients-venv/bin/python

Each check runs as a Python snippet in that interpreter and prints `BENCH_RESULT {json}` lines.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

ROOT = Path(__file__).resolve().parent
REPO = ROOT.parent
CLIENT_PACKAGES = ["openai-agents", "langchain-openai", "langchain-core", "litellm", "openai", "pydantic", "httpx"]

# Shared by every snippet: connection settings from the environment, and `check`, which times
# one client call, catches its error and prints one result line.
PRELUDE = """
import json, os, sys, time, traceback
BASE, KEY, MODEL = os.environ["BENCH_BASE_URL"], os.environ["BENCH_API_KEY"], os.environ["BENCH_MODEL"]
ONLY = os.environ.get("BENCH_ONLY")

def check(name, exercised, fn):
    if ONLY and ONLY != name:
        return
    t0 = time.perf_counter()
    try:
        ok, excerpt, *extra = fn()
        extra = extra[0] if extra else {}
    except Exception as err:
        ok, excerpt, extra = False, f"{type(err).__name__}: {err}", {"traceback": traceback.format_exc()[-3000:]}
    row = {"check": name, "exercised": exercised, "ok": bool(ok), "excerpt": str(excerpt),
           "wall_s": round(time.perf_counter() - t0, 3), **extra}
    print("BENCH_RESULT " + json.dumps(row, default=str), flush=True)
"""

AGENTS = '''
from agents import Agent, ModelSettings, OpenAIChatCompletionsModel, Runner, function_tool, set_tracing_disabled
from agents.exceptions import MaxTurnsExceeded
from openai import AsyncOpenAI
from pydantic import BaseModel

set_tracing_disabled(True)
model = OpenAIChatCompletionsModel(model=MODEL, openai_client=AsyncOpenAI(base_url=BASE + "/v1", api_key=KEY,
                                                                          max_retries=0))
calls = []

def add(a: int, b: int) -> int:
    """Add two integers."""
    calls.append((a, b))
    return a + b

class Answer(BaseModel):
    answer: int
    sure: bool

def store():
    agent = Agent(name="greeter", model=model, model_settings=ModelSettings(store=True, temperature=0))
    out = Runner.run_sync(agent, "Say hello.").final_output
    return isinstance(out, str) and bool(out), repr(out)

def required(strict):
    calls.clear()
    agent = Agent(name="adder", model=model, tools=[function_tool(add, strict_mode=strict)],
                  model_settings=ModelSettings(tool_choice="required", temperature=0))
    ok = True
    try:
        outcome = f"final_output={Runner.run_sync(agent, 'What is 2 plus 3? Use the add tool.', max_turns=3).final_output!r}"
    except MaxTurnsExceeded:
        outcome = "MaxTurnsExceeded (fine: the tool ran)"
    except Exception as err:  # the tool may have run before the error: say both
        ok, outcome = False, f"then {type(err).__name__}: {err}"
    return ok and len(calls) >= 1, f"tool ran {len(calls)}x {calls}; {outcome}", {"tool_runs": len(calls)}

def structured():
    agent = Agent(name="json", model=model, output_type=Answer, model_settings=ModelSettings(temperature=0))
    out = Runner.run_sync(agent, "What is 2 plus 3?").final_output
    return isinstance(out, Answer), repr(out)

check("agents: store=True", "Runner.run_sync, ModelSettings(store=True)", store)
check("agents: tool_choice=required", "function tool (strict by default), tool_choice='required', max_turns=3",
      lambda: required(True))
check("agents: required, strict_mode=False", "the same with function_tool(strict_mode=False)", lambda: required(False))
check("agents: output_type", "output_type=pydantic -> response_format json_schema (strict)", structured)
'''

# The Agents SDK with nothing configured but the client: its default model (a GPT-5 name) talks to
# /v1/responses with reasoning effort "none" and verbosity "low"; its function tools are strict.
AGENTS_DEFAULT = '''
import asyncio
from agents import Agent, Runner, function_tool, set_default_openai_client, set_tracing_disabled
from agents.models import get_default_model
from openai import AsyncOpenAI

set_tracing_disabled(True)
calls = []

def use_server():  # a client per event loop (run_sync and asyncio.run each make their own)
    set_default_openai_client(AsyncOpenAI(base_url=BASE + "/v1", api_key=KEY, max_retries=0))

@function_tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    calls.append((a, b))
    return a + b

def agent():
    return Agent(name="adder", tools=[add])  # default model and settings

def described(result):
    return f"tool ran {len(calls)}x {calls}; final_output={result.final_output!r}; model {get_default_model()!r}"

def plain():
    calls.clear()
    use_server()
    result = Runner.run_sync(agent(), "What is 2 plus 3? Use the add tool.")
    return calls == [(2, 3)] and result.final_output == "The answer is 5.", described(result), {"tool_runs": len(calls)}

def streamed():
    calls.clear()
    async def go():
        use_server()
        result = Runner.run_streamed(agent(), "What is 2 plus 3? Use the add tool.")
        kinds = [event.type async for event in result.stream_events()]
        return result, kinds
    result, kinds = asyncio.run(go())
    ok = calls == [(2, 3)] and result.final_output == "The answer is 5."
    return ok, described(result) + f"; {len(kinds)} stream events", {"tool_runs": len(calls), "events": len(kinds)}

def previous_id():
    calls.clear()
    use_server()
    result = Runner.run_sync(agent(), "What is 2 plus 3? Use the add tool.", auto_previous_response_id=True)
    return calls == [(2, 3)] and result.final_output == "The answer is 5.", described(result) + " (previous_response_id)"

check("agents default: tool agent", "Agent(tools=[add]) with the default model: /v1/responses, run_sync", plain)
check("agents default: streamed", "Runner.run_streamed(...).stream_events(), default model", streamed)
check("agents default: previous_response_id", "run_sync(..., auto_previous_response_id=True)", previous_id)
'''

LANGCHAIN = '''
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from pydantic import BaseModel

llm = ChatOpenAI(base_url=BASE + "/v1", api_key=KEY, model=MODEL, temperature=0, max_retries=0)

class Answer(BaseModel):
    answer: int
    sure: bool

@tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b

def invoke():
    msg = llm.invoke("Say hello.")
    return isinstance(msg.content, str) and bool(msg.content), repr(msg.content)

def stream():
    chunks = [c.content for c in llm.stream("Say hello.")]
    text = "".join(chunks)
    return bool(text), f"{len(chunks)} chunks: {text!r}"

def batch():
    msgs = llm.batch(["Say hello.", "What is 2 plus 3? Use the add tool."])
    return len(msgs) == 2 and all(isinstance(m.content, str) for m in msgs), repr([m.content for m in msgs])

def bind_tools():
    msg = llm.bind_tools([add]).invoke("What is 2 plus 3? Use the add tool.")
    ran = [add.invoke(c["args"]) for c in msg.tool_calls]
    return bool(ran) and not msg.invalid_tool_calls, f"tool_calls={msg.tool_calls} -> {ran}"

def structured(method):
    out = llm.with_structured_output(Answer, method=method).invoke("What is 2 plus 3?")
    return isinstance(out, Answer), repr(out)

responses_llm = ChatOpenAI(base_url=BASE + "/v1", api_key=KEY, model=MODEL, temperature=0, max_retries=0,
                           use_responses_api=True)

def responses_invoke():
    msg = responses_llm.invoke("Say hello.")
    return bool(msg.text) and msg.response_metadata.get("id", "").startswith("resp_"), repr(msg.text)

def responses_stream():
    text = "".join(c.text for c in responses_llm.stream("Say hello."))
    return bool(text), repr(text)

def responses_tools():
    msg = responses_llm.bind_tools([add]).invoke("What is 2 plus 3? Use the add tool.")
    ran = [add.invoke(c["args"]) for c in msg.tool_calls]
    return ran == [5] and not msg.invalid_tool_calls, f"tool_calls={msg.tool_calls} -> {ran}"

check("langchain: invoke", "ChatOpenAI.invoke", invoke)
check("langchain: stream", "ChatOpenAI.stream", stream)
check("langchain: batch", "ChatOpenAI.batch (2 prompts)", batch)
check("langchain: bind_tools", "bind_tools([add]).invoke, tool_choice auto; runs the parsed call", bind_tools)
check("langchain: structured json_schema", "with_structured_output(method='json_schema')",
      lambda: structured("json_schema"))
check("langchain: structured function_calling", "with_structured_output(method='function_calling')",
      lambda: structured("function_calling"))
check("langchain: responses invoke", "ChatOpenAI(use_responses_api=True).invoke", responses_invoke)
check("langchain: responses stream", "ChatOpenAI(use_responses_api=True).stream", responses_stream)
check("langchain: responses bind_tools", "use_responses_api=True, bind_tools([add]).invoke", responses_tools)
'''

LITELLM = """
import litellm

def ask(question, **kw):
    return litellm.completion(model="openai/" + MODEL, api_base=BASE + "/v1", api_key=KEY, temperature=0,
                              messages=[{"role": "user", "content": question}], **kw).choices[0]

def plain():
    text = ask("Say hello.").message.content
    return isinstance(text, str) and bool(text), repr(text)

def json_object():
    # the question the tool model knows: its JSON closes; on others it rambles to the context's end
    # (finish_reason 'length', truncated JSON, as any server would return)
    choice = ask("What is 2 plus 3? Use the add tool.", response_format={"type": "json_object"})
    text = choice.message.content
    return choice.finish_reason == "stop" and isinstance(json.loads(text), dict), f"{choice.finish_reason}: {text}"

check("litellm: completion", "litellm.completion(model='openai/...')", plain)
check("litellm: json_object", "completion(response_format={'type': 'json_object'})", json_object)
"""

OPENAI = """
import statistics, threading, urllib.request
import openai

client = openai.OpenAI(base_url=BASE + "/v1", api_key=KEY, max_retries=0)

def stream():
    t0 = time.perf_counter()
    first, pieces, usage = None, [], None
    for chunk in client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "Say hello."}], max_tokens=300, stream=True,
            stream_options={"include_usage": True}, extra_body={"ignore_eos": True}):
        usage = chunk.usage or usage
        if chunk.choices and chunk.choices[0].delta.content:
            first = first or time.perf_counter() - t0
            pieces.append(chunk.choices[0].delta.content)
    total = time.perf_counter() - t0
    tokens = usage.completion_tokens if usage else None
    ok = first is not None and first < total / 4 and tokens == 300
    return ok, f"first content {first:.3f}s of {total:.3f}s, {len(pieces)} chunks, {tokens} tokens", {
        "first_content_s": first, "total_s": total, "content_chunks": len(pieces), "completion_tokens": tokens}

def health():
    result, big = {"statuses": []}, "x" * 2_000_000
    def send():  # the same 2 MB request 5 times over, for more /health samples
        t0 = time.perf_counter()
        for _ in range(5):
            try:
                client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": big}], max_tokens=1)
                result["statuses"].append(200)
            except openai.APIStatusError as err:
                result["statuses"].append(err.status_code)
                result.update(status=err.status_code, code=err.code, message=str(err.message)[:120])
        result["big_request_s"] = (time.perf_counter() - t0) / 5
    sender = threading.Thread(target=send)
    latencies = []
    sender.start()
    while sender.is_alive() or not latencies:
        t0 = time.perf_counter()
        urllib.request.urlopen(BASE + "/health", timeout=5).read()
        latencies.append(time.perf_counter() - t0)
        time.sleep(0.01)
    sender.join()
    worst, median = max(latencies), statistics.median(latencies)
    ok = set(result["statuses"]) == {400} and result.get("code") == "context_length_exceeded" and worst < 0.1
    return ok, (f"HTTP {result.get('status')} {result.get('code')} in {result['big_request_s']:.3f}s (x5); /health "
                f"max {worst * 1e3:.1f} ms, median {median * 1e3:.1f} ms over {len(latencies)} polls"), {
        "health_max_ms": worst * 1e3, "health_median_ms": median * 1e3, "health_polls": len(latencies), **result}

def responses():
    r = client.responses.create(model=MODEL, input="Say hello.", temperature=0)
    events = list(client.responses.create(model=MODEL, input="Say hello.", temperature=0, stream=True))
    streamed = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    again = client.responses.create(model=MODEL, input="And again?", previous_response_id=r.id, max_output_tokens=8)
    ok = bool(r.output_text) and streamed == r.output_text and events[-1].type == "response.completed"
    return ok, f"{r.output_text!r}; {len(events)} events; continued: {again.status}"

check("openai: streamed long answer", "chat stream, max_tokens=300, ignore_eos (extra_body)", stream)
check("openai: responses", "responses.create, stream=True, previous_response_id", responses)
check("openai: /health under a 2 MB prompt", "2,000,000-char message (x5) in a thread, GET /health every 10 ms", health)
"""

SNIPPETS = {
    "openai-agents": AGENTS,
    "openai-agents-default": AGENTS_DEFAULT,
    "langchain-openai": LANGCHAIN,
    "litellm": LITELLM,
    "openai": OPENAI,
}


class Server:
    """`areal-graph serve MODEL --api-key-env` in a subprocess on a free port."""

    def __init__(self, model_dir: Path, log: Path) -> None:
        self.key = secrets.token_hex(16)
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        exe = Path(sys.executable).with_name("areal-graph")
        self.cmd = [
            str(exe),
            "serve",
            str(model_dir),
            "--port",
            str(self.port),
            "--threads",
            "1",
            "--max-running",
            "8",
            "--api-key-env",
            "BENCH_SERVER_KEY",
        ]
        self.log = open(log, "ab")
        self.proc = subprocess.Popen(
            self.cmd, stdout=self.log, stderr=subprocess.STDOUT, env=dict(os.environ, BENCH_SERVER_KEY=self.key)
        )
        deadline = time.monotonic() + 180
        while not self._healthy():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"server did not come up (see {log}): {' '.join(self.cmd)}")
            time.sleep(0.2)
        req = urllib.request.Request(self.url + "/v1/models", headers={"Authorization": f"Bearer {self.key}"})
        with urllib.request.urlopen(req, timeout=10) as resp:
            self.model = json.load(resp)["data"][0]["id"]

    def _healthy(self) -> bool:
        try:
            with urllib.request.urlopen(self.url + "/health", timeout=2) as resp:
                return resp.status == 200
        except OSError:
            return False

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


def build_long_model(root: Path) -> Path:
    """A random-weight Qwen2 (hidden 64, 2 layers) with an 8192-token context and the kit's tokenizer."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from areal_graph.modelkit.tokenizer import save_tokenizer, train_tokenizer
    from support.openai_tool_model import CONVERSATIONS

    tokenizer = train_tokenizer([p for pair in CONVERSATIONS for p in pair] * 20, vocab_size=420, tools=True)
    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=8192,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    out = root / "long_model"
    Qwen2ForCausalLM(config).save_pretrained(out)
    save_tokenizer(tokenizer, out)
    return out


def run_snippet(python: str, client: str, server: Server, only: str | None = None) -> list[dict[str, Any]]:
    """Run one client's snippet in the clients' interpreter; its result lines, or one failed row."""
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME")}
    env.update(
        BENCH_BASE_URL=server.url,
        BENCH_API_KEY=server.key,
        BENCH_MODEL=server.model,
        PYTHONNOUSERSITE="1",
        NO_PROXY="127.0.0.1,localhost",
        LITELLM_LOCAL_MODEL_COST_MAP="True",
        BENCH_ONLY=only or "",
    )
    proc = subprocess.run(
        [python, "-c", PRELUDE + SNIPPETS[client]],
        capture_output=True,
        text=True,
        env=env,
        timeout=900,
        cwd=tempfile.gettempdir(),
    )
    rows = [json.loads(line.split(" ", 1)[1]) for line in proc.stdout.splitlines() if line.startswith("BENCH_RESULT ")]
    if not rows:
        rows = [
            {
                "check": only or client,
                "exercised": "snippet",
                "ok": False,
                "wall_s": 0.0,
                "excerpt": (proc.stderr.strip().splitlines() or ["no output"])[-1],
                "stderr": proc.stderr[-3000:],
            }
        ]
    for row in rows:
        row["client"] = client
    return rows


def client_versions(python: str) -> dict[str, str]:
    code = (
        "import importlib.metadata as m, json, sys; print(json.dumps({**{p: m.version(p) for p in sys.argv[1:]}, "
        "'python': sys.version.split()[0]}))"
    )
    return json.loads(
        subprocess.run(
            [python, "-c", code, *CLIENT_PACKAGES],
            capture_output=True,
            text=True,
            check=True,
            env=dict(os.environ, PYTHONNOUSERSITE="1"),
        ).stdout
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--clients-python",
        default="/tmp/clients-venv/bin/python",
        help="interpreter of the venv holding the clients (see the setup above)",
    )
    ap.add_argument("--model", type=Path, default=None, help="serve this model dir instead of building the tool model")
    ap.add_argument("--only", choices=sorted(SNIPPETS), action="append", help="run only these clients")
    ap.add_argument("--out", type=Path, default=ROOT / "results" / "clients.json")
    args = ap.parse_args()
    sys.path.insert(0, str(REPO / "tests"))  # support.openai_tool_model, as the tests import it
    console = Console(width=200)  # the log keeps whole lines
    versions = client_versions(args.clients_python)
    console.print("client versions: " + ", ".join(f"{k}=={v}" for k, v in versions.items()))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    log = args.out.with_suffix(".server.log")
    log.unlink(missing_ok=True)
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        if args.model is not None:
            model_dir, model_name = args.model, args.model.name
        else:
            from support.openai_tool_model import build_tool_model

            t0 = time.perf_counter()
            model_dir, model_name = build_tool_model(tmp)[0], "tool model (512 ctx)"
            console.print(f"built the tool model in {time.perf_counter() - t0:.1f}s")
        servers = {model_name: Server(model_dir, log)}
        try:
            for client in args.only or SNIPPETS:
                for row in run_snippet(args.clients_python, client, servers[model_name]):
                    row["model"] = model_name
                    if (
                        not row["ok"]
                        and "context_length_exceeded" in json.dumps(row)
                        and args.model is None
                        and "2 MB" not in row["check"]
                    ):
                        fallback = "random Qwen2 (8192 ctx)"
                        if fallback not in servers:
                            servers[fallback] = Server(build_long_model(Path(tmp)), log)
                        row = {
                            **run_snippet(args.clients_python, client, servers[fallback], row["check"])[0],
                            "model": fallback,
                            "first_try": row["excerpt"],
                        }
                    rows.append(row)
                    mark = "[green]pass[/]" if row["ok"] else "[red]FAIL[/]"
                    console.print(
                        f"{mark} {escape(row['check'])} ({row['wall_s']:.2f}s): {escape(row['excerpt'][:200])}"
                    )
        finally:
            for server in servers.values():
                server.stop()
    table = Table(title=f"third-party clients vs areal-graph serve ({sum(r['ok'] for r in rows)}/{len(rows)} pass)")
    for col in ("check", "exercised", "model", "ok", "wall s", "result"):
        table.add_column(col, overflow="fold", justify="right" if col == "wall s" else "left")
    for r in rows:
        table.add_row(
            escape(r["check"]),
            escape(r["exercised"]),
            r["model"],
            "pass" if r["ok"] else "[red]FAIL[/]",
            f"{r['wall_s']:.2f}",
            escape(r["excerpt"][:160]),
        )
    console.print(table)
    args.out.write_text(json.dumps({"versions": versions, "rows": rows}, indent=2))
    console.print(f"wrote {args.out} (server log: {log})")
    return 0 if all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
