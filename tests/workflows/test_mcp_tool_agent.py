"""MCP tools: the shipped calculator MCP server, the stdio client a rollout worker holds
(tools/mcp_client.py: start, list, concurrent calls, shutdown, and its errors: a server that
fails to start with its stderr, one that hangs, one that dies mid-call, a tool it does not
list), and McpToolAgent against a real engine: the episode recorded token for token, calls
through MCP counted, bad calls answered as tool errors. The whole run is tests/e2e/test_mcp_agent_run.py."""

from __future__ import annotations

import asyncio
import sys
import time

import pytest

from areal_graph.api.sampling import SamplingParams
from areal_graph.api.tool_calls import ToolCall, parse_tool_calls, render_tool_call, tool_turn_text
from areal_graph.tools.mcp_client import McpServerError, McpServerParams, McpToolInfo, McpToolServer, probe_server
from areal_graph.workflows.mcp_servers.calculator import DESCRIPTION, TOOL_NAME, build_server, calculator
from areal_graph.workflows.rollout.base import pack_trajectories
from areal_graph.workflows.rollout.calculator_agent import CalculatorAgent
from areal_graph.workflows.rollout.mcp_tool_agent import METRICS, McpToolAgent, select_tools, server_params
from support.paths import REPO, TESTS

CALCULATOR = McpServerParams("python", ("-m", "areal_graph.workflows.mcp_servers.calculator"))
FLAKY = McpServerParams(sys.executable, (str(TESTS / "support" / "mcp_flaky_server.py"),), call_timeout_s=1.0)
WORKFLOW = REPO / "workflows" / "agent_calculator_mcp.yaml"


def calc_args(**extra):
    return {"command": "python", "args": ["-m", "areal_graph.workflows.mcp_servers.calculator"], **extra}


# ------------------------------------------------------------------------------ the calculator server
def test_calculator_server_offers_the_kits_tool_with_the_builtin_answers():
    assert calculator("347 * 58") == "20126" and calculator("9**9**9") == "Error: number too large"
    [tool] = asyncio.run(build_server().list_tools())
    assert (
        (tool.name, tool.description)
        == (TOOL_NAME, DESCRIPTION)
        == ("calculator", "Evaluate an arithmetic expression.")
    )
    assert tool.input_schema["required"] == ["expression"]  # the argument tiny-calc learnt
    assert tool.input_schema["properties"]["expression"]["type"] == "string"


# ------------------------------------------------------------------------------ the client
def test_client_starts_lists_calls_concurrently_and_stops_the_server():
    async def go():
        server = McpToolServer(CALCULATOR)
        tools = await server.start()
        assert await server.start() == tools  # once: a second start reuses the session
        results = await asyncio.gather(*(server.call("calculator", {"expression": f"{i} * 58"}) for i in range(16)))
        unknown = await server.call("search", {"q": "x"})  # the server refuses it: a tool error, not an exception
        await server.aclose()
        return tools, results, unknown, server.running

    tools, results, unknown, running = asyncio.run(go())
    assert list(tools) == ["calculator"]
    assert tools["calculator"].openai_schema()["function"]["name"] == "calculator"
    assert [r.text for r in results] == [str(i * 58) for i in range(16)] and not any(r.is_error for r in results)
    assert unknown.is_error and "search" in unknown.text
    assert not running


def test_server_that_fails_to_start_says_its_command_and_stderr():
    params = McpServerParams(
        "python", ("-c", "import sys; sys.stderr.write('config.toml: no such file\\n'); sys.exit(2)")
    )
    with pytest.raises(McpServerError) as err:
        probe_server(params)
    text = str(err.value)
    assert "MCP server `python -c " in text and "before it answered initialize" in text
    assert text.endswith("its stderr ends:\nconfig.toml: no such file")


def test_server_that_does_not_answer_within_the_startup_timeout():
    params = McpServerParams("python", ("-c", "import time; time.sleep(60)"), startup_timeout_s=1.0)
    t0 = time.monotonic()
    with pytest.raises(McpServerError, match=r"did not answer initialize and tools/list within startup_timeout_s=1 s"):
        probe_server(params)
    assert time.monotonic() - t0 < 15  # stopped, not waited out


def test_missing_command_is_caught_before_anything_starts():
    assert McpServerParams("no-such-mcp-server").problem() == "command 'no-such-mcp-server' is not on PATH"
    assert McpServerParams("./nope.py").problem() == "command './nope.py' does not exist"
    assert McpServerParams("python", cwd="/no/such/dir").problem() == "cwd '/no/such/dir' is not a folder"
    assert CALCULATOR.problem() is None and CALCULATOR.executable == sys.executable
    with pytest.raises(McpServerError, match="could not be started"):
        probe_server(McpServerParams("no-such-mcp-server"))


def test_tool_errors_timeouts_and_a_dead_server():
    async def go():
        server = McpToolServer(FLAKY)
        tools = await server.start()
        echo = await server.call("echo", {"text": "hi"})
        failed = await server.call("fail", {})
        late = await server.call("slow", {"seconds": 3})
        with pytest.raises(McpServerError) as died:
            await server.call("crash", {})
        with pytest.raises(McpServerError, match="is not running"):
            await server.call("echo", {"text": "hi"})
        again = await server.start()  # a dead server is started afresh
        back = await server.call("echo", {"text": "back"})
        await server.aclose()
        return tools, echo, failed, late, str(died.value), again, back

    tools, echo, failed, late, died, again, back = asyncio.run(go())
    assert sorted(tools) == ["crash", "echo", "fail", "slow"] and sorted(again) == sorted(tools)
    assert (echo.text, echo.is_error) == ("hi", False)
    assert failed.is_error and "the database is down" in failed.text
    assert late.is_error and late.text == "Error: the tool 'slow' did not answer within 1 s"
    assert "closed the connection during a call" in died and "flaky: crashing on purpose" in died
    assert back.text == "back"


# ------------------------------------------------------------------------------ the agent's checks
def test_check_args_names_what_is_wrong_without_starting_anything():
    assert McpToolAgent.check_args(calc_args()) is None
    assert "command must be" in McpToolAgent.check_args({"args": []})
    assert "args must be a list" in McpToolAgent.check_args(calc_args(args="-m x"))
    assert "tools must be a non-empty list" in McpToolAgent.check_args(calc_args(tools="calculator"))
    assert "is not on PATH" in McpToolAgent.check_args(calc_args(command="no-such-mcp-server"))
    assert "startup_timeout_s must be > 0" in McpToolAgent.check_args(calc_args(startup_timeout_s=0))
    assert server_params(calc_args(env={"A": 1})).environment()["A"] == "1"


def test_check_data_starts_the_server_and_names_a_tool_it_does_not_list():
    assert McpToolAgent.check_data(calc_args(tools=["calculator"]), "builtin:calc/train") is None
    problem = McpToolAgent.check_data(calc_args(tools=["calculator", "search"]), "builtin:calc/train")
    assert problem == (
        "MCP server `python -m areal_graph.workflows.mcp_servers.calculator` does not list the tool(s) 'search' "
        "named in rollout_args.tools; it lists: 'calculator'"
    )
    failing = McpToolAgent.check_data(
        {"command": "python", "args": ["-c", "import sys; sys.stderr.write('bad token\\n'); sys.exit(1)"]}, "x"
    )
    assert failing is not None and failing.endswith("its stderr ends:\nbad token")


def test_select_tools_offers_all_or_those_asked_for():
    listed = {n: McpToolInfo(n, "", {}) for n in ("a", "b")}
    assert list(select_tools(listed, None, "srv")) == ["a", "b"] and list(select_tools(listed, ("b",), "srv")) == ["b"]
    with pytest.raises(McpServerError, match="lists no tools"):
        select_tools({}, None, "srv")


def test_workflow_validates_with_the_server_started(tmp_path):
    from areal_graph.graph.loader import load_workflow

    spec = load_workflow(WORKFLOW)
    rollout = spec.nodes["rollout"].params
    assert rollout.rollout_class.endswith("mcp_tool_agent:McpToolAgent")
    assert spec.models["actor"].path == "builtin:tiny-calc" and spec.data.train == "builtin:calc/train"
    assert McpToolAgent.check_data(dict(rollout.rollout_args), spec.data.train) is None


# ------------------------------------------------------------------------------ against a real engine
def _episodes(agent, model_dir, prompt, group: int, sampling: SamplingParams):
    from areal_graph.engines.inference.engine import EmbeddedEngine
    from areal_graph.engines.inference.rollout_eval import LocalEngineClient

    engine = EmbeddedEngine(str(model_dir), max_running=8, seed=0)

    async def go():
        try:
            return await agent.run(prompt, LocalEngineClient(engine), group, sampling)
        finally:
            await agent.aclose()

    with engine:
        return asyncio.run(go())


class _Prompt:
    id, text = "q0", ""

    def __init__(self, input_ids, answer):
        self.input_ids, self.answer = input_ids, answer


def test_agent_records_the_episode_token_for_token(memorised_calc):
    """The memorised model calls the calculator; the MCP server answers; the trajectory is the
    SFT episode exactly (the builtin agent's too), the tool's tokens masked."""
    from areal_graph.data.calc import IGNORE

    root, row, (ids, labels) = memorised_calc
    prompt_len = next(i for i, label in enumerate(labels) if label != IGNORE)
    prompt = _Prompt(ids[:prompt_len], row["answer"])
    greedy = SamplingParams(max_new_tokens=48, temperature=0.0)
    agent = McpToolAgent(str(root / "model"), **calc_args(tools=["calculator"]))
    assert agent.prompt_ids(prompt) == prompt.input_ids  # tiny-calc's template renders no tool schemas
    [traj] = _episodes(agent, root / "model", prompt, 1, greedy)
    [builtin] = _episodes(CalculatorAgent(str(root / "model")), root / "model", prompt, 1, greedy)
    tok = agent.tokenizer
    assert traj.input_ids == ids == builtin.input_ids
    assert traj.loss_mask == [int(label != IGNORE) for label in labels] == builtin.loss_mask
    assert traj.info["tool_calls"] == 1 and traj.finish_reason == "stop"
    assert traj.info["metrics"] == {"mcp_calls": 1, "mcp_tool_errors": 0, "mcp_unknown_tool_calls": 0}
    masked = [t for t, m in zip(traj.input_ids[prompt_len:], traj.loss_mask[prompt_len:]) if not m]
    assert tok.decode(masked) == tool_turn_text([row["answer"]])  # the MCP server's answer, masked
    assert all(v == -1 and lp == 0.0 for v, lp, m in zip(traj.versions, traj.behav_logprobs, traj.loss_mask) if not m)
    assert all(v == 0 and lp <= 0.0 for v, lp, m in zip(traj.versions, traj.behav_logprobs, traj.loss_mask) if m)
    # the tokens decode to the conversation: the prompt, the call, the tool's reply, the answer
    call = render_tool_call("calculator", {"expression": row["expression"]})
    conversation = (
        tok.decode(prompt.input_ids)
        + call
        + "<|im_end|>"
        + tool_turn_text([row["answer"]])
        + f"The answer is \\boxed{{{row['answer']}}}.<|im_end|>"
    )
    assert tok.decode(traj.input_ids) == conversation
    batch = pack_trajectories([traj])
    assert batch["tool_calls"].tolist() == [1] and int(batch["loss_mask"].sum()) == traj.num_generated


def test_agent_answers_bad_calls_as_tool_errors_and_counts_them(memorised_calc):
    root, _, _ = memorised_calc
    agent = McpToolAgent(str(root / "model"), **calc_args())

    async def go():
        await agent._ensure_server()
        counts = dict.fromkeys(METRICS, 0)
        calls = parse_tool_calls(
            render_tool_call("search", {"q": "x"})
            + render_tool_call("calculator", {"expr": "1"})
            + "<tool_call>{not json</tool_call>"
            + render_tool_call("calculator", {"expression": "6 * 7"})
        )
        replies = [await agent.answer(c, counts) for c in calls]
        replies.append(await agent.answer(ToolCall("calculator", {"expression": "1 / 0"}), counts))
        await agent.aclose()
        return replies, counts

    replies, counts = asyncio.run(go())
    assert replies == [
        "Error: unknown tool 'search' (the tools are 'calculator')",
        "Error: the tool 'calculator' needs the argument(s) 'expression'",
        "Error: the tool call is not valid JSON",
        "42",
        "Error: division by zero",  # the calculator's own error text, as the builtin tool says it
    ]
    assert counts == {"mcp_calls": 2, "mcp_tool_errors": 2, "mcp_unknown_tool_calls": 1}


def test_agent_group_shares_one_server_and_stays_within_budget(memorised_calc):
    from areal_graph.data.calc import IGNORE

    root, row, (ids, labels) = memorised_calc
    prompt_len = next(i for i, label in enumerate(labels) if label != IGNORE)
    agent = McpToolAgent(str(root / "model"), **calc_args())
    starts = []
    original = agent.server.start

    async def counted_start():
        starts.append(1)
        return await original()

    agent.server.start = counted_start  # type: ignore[method-assign]
    group = _episodes(
        agent,
        root / "model",
        _Prompt(ids[:prompt_len], row["answer"]),
        6,
        SamplingParams(max_new_tokens=16, temperature=1.0, seed=3),
    )
    assert len(starts) == 1 and len(group) == 6
    for traj in group:
        assert traj.input_ids[:prompt_len] == ids[:prompt_len] and len(traj.input_ids) <= 256
        assert traj.info["metrics"]["mcp_calls"] <= traj.info["tool_calls"] <= 3 * 4
        assert traj.finish_reason in ("stop", "length")


def test_the_docs_example_server_lists_its_tool():
    """docs/agents.md's own MCP server, executed as written."""
    import re
    import types

    [code] = [
        b
        for b in re.findall(r"```python\n(.*?)```", (REPO / "docs" / "agents.md").read_text(), re.S)
        if "MCPServer(" in b
    ]
    module = types.ModuleType("lookup_server")
    exec(compile(code, "docs/agents.md", "exec"), module.__dict__)
    [tool] = asyncio.run(module.server.list_tools())
    assert tool.name == "lookup" and tool.input_schema["required"] == ["key"]
    assert module.lookup("pi") == "3.14159" and module.lookup("x").startswith("Error: ")


def test_tool_schemas_enter_the_prompt_where_the_template_renders_them(memorised_calc):
    """tiny-calc's template renders no schemas (the prompt stays as given, checked above); a
    template without tool support gets them as a Hermes system preamble, as the server does."""
    root, row, (ids, labels) = memorised_calc
    from areal_graph.data.calc import IGNORE

    prompt = _Prompt(ids[: next(i for i, label in enumerate(labels) if label != IGNORE)], row["answer"])
    agent = McpToolAgent(str(root / "model"), **calc_args())
    agent.offered = {
        "calculator": McpToolInfo("calculator", DESCRIPTION, {"type": "object", "required": ["expression"]})
    }
    agent.tokenizer.chat_template = (
        "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    with_tools = agent.tokenizer.decode(agent.prompt_ids(prompt))
    assert with_tools.startswith("<|im_start|>system\n# Tools") and '"name": "calculator"' in with_tools
    assert with_tools.endswith(agent.tokenizer.decode(prompt.input_ids).split("<|im_start|>user", 1)[1])
    agent.tools_in_prompt = False
    assert agent.prompt_ids(prompt) == prompt.input_ids
