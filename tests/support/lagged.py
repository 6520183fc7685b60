"""The shipped self-play workflow with a lagged copy of the policy as the opponent
(`models.opponent.lagged`, `opponent: model:opponent`): what the rules, the executor and the
end-to-end run tests start from. Overrides cannot add a model, so the text gains one."""

from __future__ import annotations

from support.paths import WORKFLOWS

OPPONENT = "nodes.rollout.rollout_args.opponent=model:opponent"


def lagged_selfplay_text(refresh_every: int = 2, servers: int = 1) -> str:
    """workflows/textarena_selfplay.yaml with model `opponent`, a lagged copy of the actor
    (the rollout still plays `self` until OPPONENT is applied)."""
    text = (WORKFLOWS / "textarena_selfplay.yaml").read_text(encoding="utf-8")
    model = (
        "\n  opponent:\n    path: builtin:tiny-tictactoe\n"
        f"    lagged: {{refresh_every: {refresh_every}, servers: {servers}}}\n\ndata:\n"
    )
    assert "\ndata:\n" in text
    return text.replace("\ndata:\n", model, 1)
