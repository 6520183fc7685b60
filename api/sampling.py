"""How an answer is sampled (`SamplingParams`) and what a generation returns (`GenerationResult`).

One class for every layer: the workflow YAML's `sampling:` mapping (validated by the loader
from these fields), the rollout classes, the HTTP client and the embedded engine. Fields and
defaults follow SGLang's `sampling_params` (the RL subset), so a request means the same
thing whichever backend serves it.

Which log-prob an engine reports for a sampled token (the *behaviour* log-prob): see
`engines/inference/sampling.py`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from areal_graph.api.fields import (
    cfg,
    field_problems,
    non_empty_strings,
    non_negative,
    non_negative_ints,
    open_unit_interval_upper,
    top_k_check,
)


def _finite(v: float) -> str | None:
    return None if v == v and v != float("inf") else "must be finite"


def _temperature(v: float) -> str | None:
    return non_negative(v) or _finite(v)


def _penalty(v: float) -> str | None:
    """OpenAI's, SGLang's and vLLM's range for frequency and presence penalties."""
    return _finite(v) or (None if -2.0 <= v <= 2.0 else "must be in [-2, 2]")


def _repetition(v: float) -> str | None:
    return _finite(v) or (None if v > 0 else "must be > 0 (1 is off)")


@dataclass
class SamplingParams:
    """Per-request decoding settings (SGLang's `sampling_params`, the RL subset)."""

    max_new_tokens: int = cfg(128, non_negative, "tokens to generate at most (SGLang's default 128)")
    temperature: float = cfg(1.0, _temperature, "0 means greedy")
    top_p: float = cfg(1.0, open_unit_interval_upper, "nucleus sampling mass")
    top_k: int = cfg(-1, top_k_check, "-1 disables top-k")
    greedy: bool = cfg(False, None, "argmax decoding (temperature 0 means greedy too)")
    stop_token_ids: list[int] = cfg([], non_negative_ints, "token ids that end an answer besides EOS")
    stop: list[str] = cfg([], non_empty_strings, "strings that end an answer besides EOS")
    seed: int | None = cfg(None, None, "per-request seed: same seed + same weights -> same tokens")
    ignore_eos: bool = cfg(False, None, "keep generating past EOS (benchmarks)")
    json_schema: str | None = cfg(
        None,
        None,
        "served requests only (SGLang's field): the answer is JSON valid "
        "against this JSON Schema (a string), by constrained decoding",
    )
    grammar: str | None = cfg(
        None,
        None,
        "served requests only: the answer matches this Lark grammar (llguidance's dialect; may embed %json {...})",
    )
    # penalties, as vLLM and SGLang define them (engines/inference/penalties.py); the behaviour
    # log-prob is then that of the penalised distribution the token was drawn from
    frequency_penalty: float = cfg(
        0.0, _penalty, "subtracted from a token's logit once per time it was generated already in this answer; 0 is off"
    )
    presence_penalty: float = cfg(
        0.0, _penalty, "subtracted from the logit of every token generated already in this answer; 0 is off"
    )
    repetition_penalty: float = cfg(
        1.0,
        _repetition,
        "a token of the prompt or of the answer so far has its "
        "logit divided by this when positive, multiplied when "
        "negative; 1 is off",
    )

    @property
    def is_greedy(self) -> bool:
        return self.greedy or self.temperature == 0

    @property
    def has_penalties(self) -> bool:
        return self.frequency_penalty != 0 or self.presence_penalty != 0 or self.repetition_penalty != 1

    @property
    def is_constrained(self) -> bool:
        """Whether the answer is held to a schema or grammar: its tokens are then drawn from a
        masked distribution, not the policy's, and must not be trained as sampled."""
        return self.json_schema is not None or self.grammar is not None

    def for_answer(self, answer: int, turn: int = 0) -> SamplingParams:
        """These settings for answer `answer` of a group (and turn `turn` of a multi-turn
        episode): with a seed, each gets its own (seed + 1000 answer + turn), or the G seeded
        answers of a group would be G copies of one. Without a seed, unchanged."""
        if self.seed is None:
            return self
        if not 0 <= turn < 1000:
            raise ValueError(f"for_answer: turn must be in [0, 1000), got {turn}")
        return dataclasses.replace(self, seed=self.seed + 1000 * answer + turn)

    def problems(self) -> list[str]:
        """What is wrong with these values (empty when they are fine)."""
        out = []
        if not isinstance(self.max_new_tokens, int) or isinstance(self.max_new_tokens, bool):
            out.append(f"max_new_tokens must be an integer, got {self.max_new_tokens!r}")
        if not isinstance(self.temperature, (int, float)) or isinstance(self.temperature, bool):
            out.append(f"temperature must be a number, got {self.temperature!r}")
        if not isinstance(self.top_p, (int, float)) or isinstance(self.top_p, bool):
            out.append(f"top_p must be a number, got {self.top_p!r}")
        if not isinstance(self.top_k, int) or isinstance(self.top_k, bool):
            out.append(f"top_k must be an integer, got {self.top_k!r}")
        if self.seed is not None and (not isinstance(self.seed, int) or isinstance(self.seed, bool)):
            out.append(f"seed must be an integer or None, got {self.seed!r}")
        for name in ("frequency_penalty", "presence_penalty", "repetition_penalty"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or isinstance(value, bool):
                out.append(f"{name} must be a number, got {value!r}")
        for name in ("json_schema", "grammar"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, str):
                out.append(f"{name} must be a string or None, got {type(value).__name__}")
        if self.json_schema is not None and self.grammar is not None:
            out.append("give json_schema or grammar, not both")
        if self.is_constrained and self.ignore_eos:
            out.append("ignore_eos cannot be combined with json_schema or grammar (a complete answer ends with EOS)")
        if out:  # the range checks below assume the right types
            return out
        return field_problems(self)


@dataclass
class GenerationResult:
    """One finished request. Per-token lists are aligned with `output_ids`."""

    rid: str
    output_ids: list[int]
    output_logprobs: list[float]
    output_versions: list[int]
    finish_reason: str  # "stop" | "length" | "abort"
    prompt_len: int
    # per output token, its `top_logprobs` most likely (token id, log-prob) pairs under the same
    # distribution as `output_logprobs`; None unless the request asked (OpenAI `top_logprobs`)
    output_top_logprobs: list[list[tuple[int, float]]] | None = None
    # per output token, whether a schema or grammar left it the only choice (constrained decoding):
    # not a choice of the policy, so never trained as one; None for an unconstrained request
    output_forced: list[bool] | None = None
