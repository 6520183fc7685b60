"""A generative judge's prompt and verdict: the pure half of `kind: judge`.

The judge is a served language model asked, with a template, whether an answer is right (or
how good it is); what it writes back is parsed by a declared rule into a reward. The rules:
- `yes_no`: the first match of `pattern` (default: the first standalone yes or no) is the
  verdict, 1.0 for yes and 0.0 for no;
- `score`: the first match of `pattern` (default: the first number) read as a score out of
  `score_max`, so the reward is score / score_max in [0, 1]; a score outside [0, score_max] is
  unparsable, not clipped.
A reply the rule cannot read is *unparsable*: the host counts it and writes `on_failure` for it,
never a silent 0. The template's placeholders: {prompt} (the prompt as the policy saw it, chat
markup removed), {response} (what the policy generated) and {answer} (the reference answer).
"""

from __future__ import annotations

import re
import string

PLACEHOLDERS = ("prompt", "response", "answer")
VERDICTS = ("yes_no", "score")
DEFAULT_PATTERNS = {"yes_no": r"(?i)\b(yes|no)\b", "score": r"(-?\d+(?:\.\d+)?)"}
DEFAULT_TEMPLATE = (
    "Question:\n{prompt}\n\nReference answer: {answer}\n\nStudent's answer:\n{response}\n\n"
    "Is the student's final answer correct? Reply with yes or no."
)


def template_problem(template: str) -> str | None:
    """Why `template` cannot be filled (unknown or positional fields, bad braces), or None."""
    try:
        fields = [f for _, f, _, _ in string.Formatter().parse(template) if f is not None]
    except ValueError as err:
        return f"is not a format string: {err}"
    bad = [f for f in fields if f not in PLACEHOLDERS]
    if bad:
        return f"has field(s) {bad}; the placeholders are {{prompt}}, {{response}} and {{answer}}"
    if "response" not in fields:
        return "never shows the judge the {response}"
    return None


def pattern_problem(pattern: str) -> str | None:
    try:
        groups = re.compile(pattern).groups
    except re.error as err:
        return f"is not a regular expression: {err}"
    return None if groups == 1 else f"must have exactly one group (the verdict), has {groups}"


def choose_model(served: list[str], adapter_prefix: str, own_server: bool) -> str:
    """The model a judge with no `model_name` asks, from the endpoint's /v1/models ids.

    Why: the run's own server answers to its served name only (vLLM 404s any other), and under
    LoRA adapter sync the policy is base + its newest adapter, listed as `<prefix><version>`. So:
    the newest adapter when one is listed, else the one model served. An outside endpoint with
    several models is ambiguous: the judge must be named.
    """
    adapters = [
        (int(m[len(adapter_prefix) :]), m)
        for m in served
        if m.startswith(adapter_prefix) and m[len(adapter_prefix) :].isdigit()
    ]
    if adapters:
        return max(adapters)[1]
    if len(served) == 1 or (served and own_server):
        return served[0]
    if not served:
        raise ValueError("the endpoint's /v1/models lists no model: set the judge's model_name")
    raise ValueError(
        f"the endpoint serves {len(served)} models ({', '.join(served[:8])}"
        f"{', ...' if len(served) > 8 else ''}): set the judge's model_name to one of them"
    )


def render(template: str, prompt: str, response: str, answer: str) -> str:
    return template.format(prompt=prompt, response=response, answer=answer)


def parse_verdict(reply: str, verdict: str, pattern: str | None = None, score_max: float = 10.0) -> float | None:
    """The reward a judge's `reply` gives under the rule (see module docstring); None: unparsable."""
    match = re.search(pattern or DEFAULT_PATTERNS[verdict], reply or "")
    if match is None:
        return None
    text = match.group(1).strip().lower()
    if verdict == "yes_no":
        return {"yes": 1.0, "no": 0.0}.get(text)
    try:
        value = float(text)
    except ValueError:
        return None
    return value / score_max if 0.0 <= value <= score_max else None
