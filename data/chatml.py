"""ChatML turn layout shared by the multi-turn rollouts that append user turns as tokens.

Why a module of its own: a multi-turn episode is trained on the tokens the policy sampled, so the
environment's answer is appended *after* them as text in the chat template's layout, never by
re-rendering the whole conversation (which may re-tokenise the policy's reply differently). The
one layout lives here: TextArenaGame, OpenEnvEpisode and the game kits' teacher conversations
(data/guess_teacher.py) all write it.
"""

from __future__ import annotations

END, START = "<|im_end|>", "<|im_start|>"


def user_turn_text(text: str, closed: bool) -> str:
    """What follows a reply in a ChatML conversation: `text` as the next user turn and the next
    assistant header (`closed`: the reply already ended with <|im_end|>)."""
    return ("" if closed else END) + f"\n{START}user\n{text}{END}\n{START}assistant\n"
