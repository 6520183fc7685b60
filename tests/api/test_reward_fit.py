"""api/reward_fit.py: which builtin rewards score which data, and the table kept in step with the
data sources and the builtin rewards it names."""

from __future__ import annotations

import pytest

from areal_graph.api.reward_fit import FILE, KINDS, data_kind, misfits
from areal_graph.api.reward_fns import BUILTIN_REWARD_FNS

RG = "reasoning_gym:basic_arithmetic?size=50&seed=1"


@pytest.mark.parametrize(
    "data, fn, refused",
    [
        ("builtin:guess/train", "math_verify", True),  # a game: its own reward, fn: agent
        ("textarena:GuessTheNumber-v0?size=8", "agent", False),
        ("verifiers:vf_arith?size=8", "math_verify", True),
        ("builtin:arith/train", "reasoning_gym", True),
        ("builtin:calc/test", "math_verify", False),
        ("builtin:code-demo", "math_verify", True),
        ("builtin:code-demo", "code_fraction", False),
        ("my/rows.jsonl", "code", False),  # a file's rows are not read: any builtin but reasoning_gym
        ("my/rows.jsonl", "reasoning_gym", True),
        (RG, "reasoning_gym", False),
        (RG, "agent", True),
        (RG, "mypkg.rewards:score", False),  # an import path is the user's own: never checked
    ],
)
def test_which_builtin_scores_which_data(data, fn, refused):
    found = misfits(fn, [("data.train", data)])
    assert bool(found) is refused, found


def test_one_sentence_per_kind_naming_every_field_of_it():
    found = misfits("math_verify", [("data.train", RG), ("data.eval", "builtin:guess/test")])
    assert found == [
        f"fn: math_verify cannot score data.train ({RG}): a reasoning-gym row's answer is the task's "
        "entry as JSON, which only the task's own scorer reads; use fn: reasoning_gym",
        "fn: math_verify cannot score data.eval (builtin:guess/test): a game row's answer names the game "
        "and its seed; the game's own reward reaches the reward node as the episode's; use fn: agent",
    ]


def test_the_table_names_every_builtin_reward_and_every_generated_source():
    from areal_graph.data.generated import SCHEMES
    from areal_graph.modelkit.recipes import BUILTIN_DATASETS, SHIPPED_DATASETS

    named = {r for k in (*KINDS, FILE) for r in k.rewards}
    assert named == set(BUILTIN_REWARD_FNS)
    for scheme in SCHEMES:  # a new generated source needs its row in the table
        assert data_kind(scheme + "x") is not FILE, scheme
    builtin = [f"builtin:{n}" for n in (*BUILTIN_DATASETS, *SHIPPED_DATASETS)]
    assert all(data_kind(name) is not FILE for name in builtin), [n for n in builtin if data_kind(n) is FILE]
    for kind in KINDS:  # a builtin prefix names a builtin dataset
        for prefix in kind.prefixes:
            if prefix.startswith("builtin:"):
                assert any(name.startswith(prefix) for name in builtin), prefix
