"""What an agent's completions leave behind for training: records, rewards, trajectories.

The recording client (`openai_agent.RecordingOpenAI`) adds one `RecordedCompletion` per
choice it returns: the exact prompt token ids, the generated ids with their behaviour
log-probs and policy versions. `CompletionLog` holds them and turns them into training data.

Trajectories (`export_trajectories`). A conversation in which each call's prompt extends an
earlier call's prompt + output, token for token, is ONE trajectory: the earlier call's
tokens, then the new prompt's extra tokens (tool results, the next user message, the chat
template's turn markers: loss_mask 0, behaviour log-prob 0, version -1), then the new
output (loss_mask 1). Under a schema or grammar (`response_format`, forced or strict tool
calls) a token the grammar left as the only choice (`forced`) is context (loss_mask 0), never
trained as the policy's choice; the others are trained with the masked distribution's log-prob
as their behaviour log-prob, which the decoupled-PPO weight corrects for. The recording client builds such prompts itself when an agent sends
back the conversation with its answer appended (see `continuation_ids`), so an ordinary
agent loop produces one trajectory per episode. A prompt that extends nothing (a new
conversation, or history the agent rewrote) starts a trajectory of its own; so does a second
continuation of the same call (a branch), so that no generated token is trained twice.

Rewards follow AReaL's `ArealOpenAI`: `set_reward(id, r)` on one completion,
`set_last_reward(r)` on the latest, and `apply_reward_discount(gamma)` propagating backwards
over the calls in the order they were made: reward[t] = own[t] + gamma * reward[t + 1]
(own rewards default to 0; the choices of one call share the turn, and the turn before sees
their mean). A trajectory's reward is that of its last completion (`info["reward"]`), the
reward of each of its turns is in `info["turn_rewards"]`.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from areal_graph.api.rollout import Trajectory
from areal_graph.engines.openai.chat_format import arguments_object, encode_text, render_chat_prompt

log = logging.getLogger(__name__)

__all__ = ["RecordedCompletion", "CompletionLog", "continuation_ids"]


@dataclass
class RecordedCompletion:
    """One returned choice and exactly what produced it."""

    completion_id: str
    choice: int
    turn: int  # the index of the create() call in this client (calls are the turns of the discount)
    prompt_ids: list[int]
    output_ids: list[int]
    output_logprobs: list[float]
    output_versions: list[int]
    finish_reason: str  # the engine's: stop | length | abort
    messages: list[dict] | None = None  # chat: the normalized input messages
    tools: list[dict] = field(default_factory=list)
    message: dict | None = None  # chat: the normalized assistant message returned
    prompt_text: str | None = None  # text completions: the prompt as sent
    text: str = ""  # the text returned
    tool_calls: int = 0
    interruptions: int = 0
    # per output token, whether a schema or grammar (response_format, a forced or strict tool
    # call) left it the only choice: not the policy's choice, so context in the trajectory
    forced: list[bool] = field(default_factory=list)
    reward: float | None = None  # as set by the workflow
    discounted_reward: float | None = None  # after apply_reward_discount

    @property
    def full_ids(self) -> list[int]:
        return self.prompt_ids + self.output_ids

    @property
    def key(self) -> str:
        return self.completion_id if self.choice == 0 else f"{self.completion_id}:{self.choice}"

    @property
    def final_reward(self) -> float | None:
        return self.discounted_reward if self.discounted_reward is not None else self.reward


def _canonical(message: dict) -> tuple:
    """What must agree for a message sent back to be the one returned (tool-call ids may be regenerated,
    arguments re-serialized)."""
    calls = tuple(
        (c["function"]["name"], json.dumps(arguments_object(c["function"]["arguments"]), sort_keys=True))
        for c in message.get("tool_calls") or []
    )
    return message["role"], message.get("content") or "", calls, message.get("name")


def continuation_ids(
    tokenizer: Any, messages: Sequence[dict], tools: Sequence[dict], parent: RecordedCompletion, stop_ids: set[int]
) -> list[int] | None:
    """The prompt for `messages` as parent's exact tokens + the chat template's text for what follows.

    `messages` extends the parent's messages with the parent's answer and more. The template
    would re-tokenize the answer, which need not give the tokens the policy sampled (BPE has
    many tokenizations of one text; tool-call JSON may be re-serialized); training needs the
    sampled ones. So: parent prompt + output, then the end of the assistant turn as the
    template writes it (what follows the end-of-turn token the policy emitted, or the whole
    end-of-turn marker when it was cut off), then the rendering of the new messages.
    None when the template does not render the conversation as a growing prefix."""
    k = len(parent.messages or []) + 1
    before = render_chat_prompt(tokenizer, parent.messages or [], tools, add_generation_prompt=True)
    upto = render_chat_prompt(tokenizer, messages[:k], tools, add_generation_prompt=False)
    full = render_chat_prompt(tokenizer, messages, tools, add_generation_prompt=True)
    if not (upto.startswith(before) and full.startswith(upto)):
        return None
    turn = upto[len(before) :]  # the assistant turn, as the template writes it
    last = parent.output_ids[-1] if parent.output_ids else None
    if last is not None and last in stop_ids:  # the policy ended its turn itself
        marker = tokenizer.decode([last], skip_special_tokens=False)
        cut = turn.rfind(marker) if marker else -1
        closing = turn[cut + len(marker) :] if cut >= 0 else None
    else:  # cut off (length, a stop string): the environment closes the turn
        marker = getattr(tokenizer, "eos_token", None) or ""
        cut = turn.rfind(marker) if marker else -1
        closing = turn[cut:] if cut >= 0 else None
    if closing is None:
        return None
    return parent.full_ids + encode_text(tokenizer, closing + full[len(upto) :])


class CompletionLog:
    """The completions of one episode, their rewards, and their export as trajectories."""

    def __init__(self) -> None:
        self.records: list[RecordedCompletion] = []

    def __len__(self) -> int:
        return len(self.records)

    def add(self, record: RecordedCompletion) -> None:
        self.records.append(record)

    def ordered(self) -> list[RecordedCompletion]:
        """In the order the calls were made (concurrent calls may finish in another order)."""
        return sorted(self.records, key=lambda r: (r.turn, r.choice))

    def find(self, completion_id: str, choice: int | None = None) -> list[RecordedCompletion]:
        found = [r for r in self.records if r.completion_id == completion_id and (choice is None or r.choice == choice)]
        if not found:
            raise KeyError(f"no recorded completion {completion_id!r}" + (f" choice {choice}" if choice else ""))
        return found

    def chat_parent(self, messages: Sequence[dict], tools: Sequence[dict]) -> RecordedCompletion | None:
        """The latest chat completion whose messages + answer the given messages extend (with more after)."""
        wanted = [_canonical(m) for m in messages]
        for r in reversed(self.ordered()):
            if r.messages is None or r.message is None or list(r.tools) != list(tools):
                continue
            k = len(r.messages) + 1
            if len(wanted) > k and wanted[:k] == [_canonical(m) for m in r.messages] + [_canonical(r.message)]:
                return r
        return None

    def text_parent(self, prompt: str, tokenizer: Any) -> RecordedCompletion | None:
        """The latest text completion whose prompt + returned text the prompt extends, when that text
        is exactly what its tokens decode to (no special tokens, nothing cut)."""
        for r in reversed(self.ordered()):
            if (
                r.prompt_text is None
                or not prompt.startswith(r.prompt_text + r.text)
                or len(prompt) == len(r.prompt_text + r.text)
            ):
                continue
            if tokenizer.decode(r.output_ids, skip_special_tokens=False) == r.text:
                return r
        return None

    # ------------------------------------------------------------------ rewards
    def set_reward(self, completion_id: str, reward: float, choice: int | None = None) -> None:
        for r in self.find(completion_id, choice):
            r.reward = float(reward)

    def set_last_reward(self, reward: float) -> None:
        if not self.records:
            raise RuntimeError("no completion recorded yet: nothing to reward")
        last = max(r.turn for r in self.records)
        for r in self.records:
            if r.turn == last:
                r.reward = float(reward)

    def apply_reward_discount(self, turn_discount: float = 1.0) -> None:
        """reward[t] = own[t] + gamma * mean(reward[t + 1]) over the calls, latest first (recomputed from
        the own rewards each time, so calling it twice does not discount twice)."""
        if not 0.0 <= turn_discount <= 1.0:
            raise ValueError(f"turn_discount must be in [0, 1], got {turn_discount}")
        turns = sorted({r.turn for r in self.records}, reverse=True)
        if turns and all(r.reward is None for r in self.records if r.turn == turns[0]):
            log.warning("the last completion has no reward: it counts as 0 in the discounted rewards")
        later: float | None = None
        for t in turns:
            recs = [r for r in self.records if r.turn == t]
            for r in recs:
                r.discounted_reward = (r.reward or 0.0) + (turn_discount * later if later is not None else 0.0)
            later = sum(r.discounted_reward or 0.0 for r in recs) / len(recs)  # all set just above

    # ------------------------------------------------------------------ export
    def chains(self) -> list[list[RecordedCompletion]]:
        """Completions grouped into trajectories (see the module docstring)."""
        chains: list[list[RecordedCompletion]] = []
        tail_of: dict[int, int] = {}  # id(record) -> the chain it ends
        done: list[RecordedCompletion] = []
        for r in self.ordered():
            parent = None
            for p in done:  # the longest earlier prompt + output that r's prompt extends
                n = len(p.prompt_ids) + len(p.output_ids)
                if (
                    n < len(r.prompt_ids)
                    and r.prompt_ids[:n] == p.full_ids
                    and (parent is None or n > len(parent.full_ids))
                ):
                    parent = p
            if parent is not None and id(parent) in tail_of:
                index = tail_of.pop(id(parent))
                chains[index].append(r)
            else:
                index = len(chains)
                chains.append([r])
            tail_of[id(r)] = index
            done.append(r)
        return chains

    def export_trajectories(self) -> list[Trajectory]:
        """One Trajectory per chain, in the order the chains started."""
        return [_trajectory(chain) for chain in self.chains()]


def _trajectory(chain: list[RecordedCompletion]) -> Trajectory:
    first = chain[0]
    traj = Trajectory.from_generation(first.prompt_ids, [], [], [], first.finish_reason)
    for r in chain:
        traj.append(r.prompt_ids[len(traj.input_ids) :], generated=False)
        traj.append_output(r.output_ids, r.output_logprobs, r.output_versions, r.forced)
    traj.finish_reason = chain[-1].finish_reason
    traj.info = {
        "turns": len(chain),
        "tool_calls": sum(r.tool_calls for r in chain),
        "reward": chain[-1].final_reward,
        "turn_rewards": [r.final_reward for r in chain],
        "completion_ids": [r.key for r in chain],
        "interruptions": sum(r.interruptions for r in chain),
    }
    return traj
