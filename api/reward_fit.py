"""Which builtin reward functions can score which data: the table `validate` and `eval` read.

Why a table: a row's `answer` means different things by where the row comes from. A
`reasoning_gym:` row's answer is the task's whole entry as JSON, which only the task's own scorer
reads: `fn: math_verify` parses a number out of that JSON and pays it, so a copied math workflow
pointed at reasoning-gym data trains on a plausible, wrong reward. A game's or a verifiers task's
answer says where the episode is; its reward is the environment's, which reaches the reward node
as the episode's (`fn: agent`). Naming which builtins fit each kind of data lets validation refuse
the pairing before the run, with the fix, and lets `eval` pick the right scorer by itself.

What it knows is the dataset's name (a `reasoning_gym:` / `textarena:` / `verifiers:` spec, a
builtin dataset); a file's rows are not read here, so a file accepts every builtin but
`reasoning_gym` (whose rows a `reasoning_gym:` dataset makes). An import-path reward is the user's
own, written for their data: it is never checked. A deliberate pairing the table refuses is opted
into on the reward node (`check_data_fit: false`). The schemes mirror data/generated.py's sources
(api/ imports nothing of the package; tests/api/test_reward_fit.py keeps the two in step).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class DataKind:
    """A kind of prompt data: the dataset names that hold it, and the builtin rewards that score it
    (the first is the one `eval` picks when told none)."""

    name: str
    prefixes: tuple[str, ...]
    rewards: tuple[str, ...]
    answer: str  # what a row's answer is, which says why only `rewards` read it


KINDS: tuple[DataKind, ...] = (
    DataKind(
        "reasoning-gym task",
        ("reasoning_gym:",),
        ("reasoning_gym",),
        "a reasoning-gym row's answer is the task's entry as JSON, which only the task's own scorer reads",
    ),
    DataKind(
        "TextArena game",
        ("textarena:", "builtin:guess/", "builtin:games/", "builtin:tictactoe/"),
        ("agent",),
        "a game row's answer names the game and its seed; the game's own reward reaches the reward node "
        "as the episode's",
    ),
    DataKind(
        "verifiers task",
        ("verifiers:",),
        ("agent",),
        "a verifiers row's answer says where the task is; its rubric's reward reaches the reward node as the episode's",
    ),
    DataKind(
        "code problem",
        ("builtin:code-demo",),
        ("code", "code_fraction", "agent"),
        "a code row's answer holds the tests the program is run against",
    ),
    DataKind(
        "math problem",
        ("builtin:arith", "builtin:calc"),
        ("math_verify", "agent"),
        "a math row's answer is the final value, which math-verify compares with the model's",
    ),
)

# A file (or any other name): its rows are not read at validation. Every builtin but the one that
# needs a reasoning_gym: dataset's rows may fit it.
FILE = DataKind(
    "file",
    (),
    ("math_verify", "code", "code_fraction", "agent"),
    "a file's answer is whatever it holds (a reasoning-gym task's entry only comes from a "
    "reasoning_gym:<task> dataset)",
)


def data_kind(dataset: str) -> DataKind:
    """The kind of data `dataset` (a workflow's data.train or data.eval, as written) holds."""
    return next((k for k in KINDS if str(dataset).startswith(k.prefixes)), FILE)


def misfits(fn: str, datasets: Sequence[tuple[str, str]]) -> list[str]:
    """Why builtin reward `fn` cannot score each kind of data among `datasets` ((field, name)
    pairs such as ("data.train", "reasoning_gym:...")), one sentence per kind naming the fields,
    the reason and the fix; empty when it can, or when `fn` is not a builtin this table knows (an
    import path is the user's own)."""
    known = {r for k in (*KINDS, FILE) for r in k.rewards}
    if fn not in known:
        return []
    unfit: dict[DataKind, list[str]] = {}
    for field, dataset in datasets:
        kind = data_kind(dataset)
        if fn not in kind.rewards:
            unfit.setdefault(kind, []).append(f"{field} ({dataset})")
    return [
        f"fn: {fn} cannot score {' and '.join(fields)}: {kind.answer}; use "
        + " or ".join(f"fn: {r}" for r in kind.rewards)
        for kind, fields in unfit.items()
    ]
