"""What a reward function may see of an episode besides its final text: `Episode`.

Why: a multi-turn rollout's reward often depends on how the answer was reached (did the
agent call the tool, how many turns, did a test harness report something in `info`). A
reward function opts in by taking an `episode` parameter:

    def my_reward(completion: str, answer: str, episode: Episode) -> float: ...

and receives it built from the packed trajectory: its turns (the policy's generated text and
the environment's text in between, split where `loss_mask` changes), the tool-call count and
the rollout's `Trajectory.info` (JSON, carried as the packed meta key `info`). Functions
with the two-argument signature are called exactly as before. Torch-free and picklable: it
crosses into the reward pool's worker processes.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

MAX_INFO_BYTES = 64 * 1024  # Trajectory.info travels with every batch: keep it small

Role = Literal["prompt", "assistant", "environment"]


@dataclass(frozen=True)
class Turn:
    role: Role  # "prompt" (first), "assistant" (policy tokens), "environment" (tool output etc.)
    text: str


@dataclass(frozen=True)
class Episode:
    completion: str  # everything the policy generated, concatenated (what the 2-argument form gets)
    answer: str
    turns: tuple[Turn, ...] = ()
    info: dict[str, Any] = field(default_factory=dict)
    truncated: bool = False  # cut off (length) or aborted rather than finished

    @property
    def assistant_turns(self) -> int:
        return sum(t.role == "assistant" for t in self.turns)

    @property
    def tool_calls(self) -> int:
        """The rollout's count (`info["tool_calls"]`), else the environment turns that followed the policy."""
        if "tool_calls" in self.info:
            return int(self.info["tool_calls"])
        return sum(t.role == "environment" for t in self.turns)

    def as_dict(self) -> dict[str, Any]:
        return {
            "completion": self.completion,
            "answer": self.answer,
            "info": self.info,
            "truncated": self.truncated,
            "turns": [[t.role, t.text] for t in self.turns],
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Episode:
        return cls(
            d["completion"],
            d["answer"],
            tuple(Turn(r, t) for r, t in d.get("turns", ())),
            dict(d.get("info") or {}),
            bool(d.get("truncated", False)),
        )


def info_json(info: dict[str, Any], where: str = "Trajectory.info") -> str:
    """`info` as the JSON string that travels in the packed batch; a clear error if it cannot."""
    try:
        text = json.dumps(info, separators=(",", ":"), default=_plain)
    except (TypeError, ValueError) as err:
        raise ValueError(f"{where} must be JSON-serialisable (it travels to the reward): {err}") from None
    if len(text) > MAX_INFO_BYTES:
        raise ValueError(f"{where} is {len(text)} bytes as JSON; at most {MAX_INFO_BYTES} travel with a trajectory")
    return text


def _plain(x: Any) -> Any:
    if hasattr(x, "tolist"):  # numpy / torch scalars and arrays
        return x.tolist()
    raise TypeError(f"{type(x).__name__} is not JSON-serialisable")


def split_turns(token_ids: Sequence[int], loss_mask: Sequence[int]) -> list[tuple[Role, list[int]]]:
    """Runs of equal loss_mask: the prompt first, then policy ("assistant") and environment runs."""
    runs: list[tuple[Role, list[int]]] = []
    seen_policy = False
    for tok, m in zip(token_ids, loss_mask):
        seen_policy = seen_policy or bool(m)
        role: Role = "assistant" if m else ("environment" if seen_policy else "prompt")
        if runs and runs[-1][0] == role:
            runs[-1][1].append(int(tok))
        else:
            runs.append((role, [int(tok)]))
    return runs


def episode_from_tokens(
    decode: Callable[[list[list[int]]], list[str]],
    token_ids: Sequence[int],
    loss_mask: Sequence[int],
    completion: str,
    answer: str,
    info: dict[str, Any] | None = None,
    truncated: bool = False,
) -> Episode:
    """The Episode of one trajectory, its turns split where `loss_mask` changes and decoded with
    `decode` (a batch decode, special tokens skipped). One builder for the reward node and for
    `areal-graph eval`, so an episode reward sees the same episode in both."""
    runs = split_turns(token_ids, loss_mask)
    texts = decode([toks for _, toks in runs])
    return Episode(
        completion,
        answer,
        tuple(Turn(role, text) for (role, _), text in zip(runs, texts)),
        dict(info or {}),
        bool(truncated),
    )
