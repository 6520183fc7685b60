"""CalculatorAgent: a multi-turn rollout where the policy may call a calculator before answering.

The tool protocol is Hermes / Qwen2.5 (api/tool_calls.py), the one the kit's chat template
renders and an OpenAI-compatible server parses: the policy writes
`<tool_call>{"name": "calculator", "arguments": {"expression": "347 * 58"}}</tool_call>` and
ends its turn with EOS; every call of the turn is evaluated by the safe arithmetic evaluator
(tools/calculator.py: no `eval`, sizes bounded, an error is an observation, never an
exception) and the results come back as `tool` messages followed by the assistant header of
the next turn. Those tokens are appended with `generated=False`: loss_mask 0, behaviour
log-prob 0, version -1, so training, advantages and the decoupled objective skip them. A turn
without a call is the final answer, and the episode ends.

`info["tool_calls"]` counts the calls of each trajectory (bad ones included: a call is the
policy's decision, whatever it wrote).
`pack_trajectories` carries `tool_calls` into the packed batch, so the controller logs the
tool-call rate of every trained batch and of every evaluation. The episode loop itself is
PythonToolAgent's; this class supplies the tool.
"""

from __future__ import annotations

from areal_graph.api.tool_calls import ToolCall, parse_tool_calls, tool_turn_text
from areal_graph.tools.calculator import CalculatorLimits, calculate
from areal_graph.workflows.rollout.python_tool_agent import PythonToolAgent

TOOL_NAME = "calculator"


def answer_call(call: ToolCall, limits: CalculatorLimits = CalculatorLimits()) -> str:
    """The calculator's reply to one parsed call: a number, or "Error: ..."."""
    if call.error is not None:
        return f"Error: {call.error}"
    if call.name != TOOL_NAME:
        return f"Error: unknown tool {call.name[:40]!r} (the tool is {TOOL_NAME!r})"
    expression = call.arguments.get("expression")
    if not isinstance(expression, str):
        return 'Error: the calculator needs {"expression": "<arithmetic>"}'
    return calculate(expression, limits)


class CalculatorAgent(PythonToolAgent):
    """Episodes of up to `max_turns` policy turns; each turn's tool calls are answered."""

    turn_stop: tuple[str, ...] = ()  # a turn ends with EOS, calls or not

    def __init__(
        self,
        tokenizer_path: str,
        max_turns: int = 3,
        max_total_tokens: int = 256,
        max_interruptions: int = 100,
        max_expression_chars: int = 200,
    ) -> None:
        super().__init__(
            tokenizer_path, max_turns=max_turns, max_total_tokens=max_total_tokens, max_interruptions=max_interruptions
        )
        self.calculator_limits = CalculatorLimits(max_chars=max_expression_chars)

    async def observe(self, generated_text: str) -> str | None:
        """The tool messages answering this turn's calls, or None when it made none."""
        calls = parse_tool_calls(generated_text)
        if not calls:
            return None
        return tool_turn_text([answer_call(c, self.calculator_limits) for c in calls])

    def count_calls(self, generated_text: str) -> int:
        return len(parse_tool_calls(generated_text))
