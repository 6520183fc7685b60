"""User turns appended as tokens after the policy's reply, in ChatML (Qwen, the builtin kits).

Why: a multi-turn rollout trains on exactly the tokens the policy sampled, so what the environment
says next is tokenised on its own and appended, never re-rendered with the conversation. Shared by
TextArenaGame and OpenEnvEpisode; the layout itself is data/chatml.py.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from areal_graph.data.chatml import END, START, user_turn_text


class ChatMLTurns:
    """A tokenizer checked for ChatML, and the token ids of the user turns that follow a reply."""

    def __init__(self, tokenizer: Any, who: str) -> None:
        """`who` names the rollout class in the error a tokenizer without ChatML gets."""
        if START not in str(getattr(tokenizer, "chat_template", "") or ""):
            raise ValueError(
                f"{who} appends user turns in ChatML (<|im_start|>user ...): this tokenizer's chat template is not ChatML"
            )
        self.tok = tokenizer
        self.end_id: int = tokenizer.convert_tokens_to_ids(END)

    def closed(self, reply_ids: Sequence[int]) -> bool:
        """Whether the reply already ended its turn (its last token is <|im_end|>)."""
        return bool(reply_ids) and reply_ids[-1] == self.end_id

    def user_turn(self, text: str, closed: bool) -> list[int]:
        """The ids of `text` as the next user turn and the assistant header after it."""
        return self.tok.encode(user_turn_text(text, closed), add_special_tokens=False)
