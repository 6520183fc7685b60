"""The shipped self-play workflow with a lagged copy of the policy as the opponent
(`models.opponent.lagged`, `opponent: model:opponent`): what the rules, the executor and the
end-to-end run tests start from. Overrides cannot add a model, so the text's commented example
(workflows/textarena_selfplay.yaml) is uncommented, as its comment tells a user to."""

from __future__ import annotations

import re

from support.paths import WORKFLOWS

OPPONENT = "nodes.rollout.rollout_args.opponent=model:opponent"


def lagged_selfplay_text(refresh_every: int = 2, servers: int = 1) -> str:
    """workflows/textarena_selfplay.yaml with its model `opponent` uncommented: a lagged copy of
    the actor (the rollout still plays `self` until OPPONENT is applied)."""
    text = (WORKFLOWS / "textarena_selfplay.yaml").read_text(encoding="utf-8")
    example = re.search(r"  # opponent:.*\n  #   path: .*\n  #   lagged: \{refresh_every: 10, servers: 1\}\n", text)
    assert example is not None, "the workflow's commented example of a lagged opponent moved"
    model = (
        "  opponent:\n    path: builtin:tiny-tictactoe\n"
        f"    lagged: {{refresh_every: {refresh_every}, servers: {servers}}}\n"
    )
    return text[: example.start()] + model + text[example.end() :]
