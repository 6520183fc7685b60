"""builtin:tiny-arith-rm (modelkit/reward_model.py): labelled answers built as described, a
classifier that learns from them, cached and found by its builtin name."""

from __future__ import annotations

import dataclasses
import json

from areal_graph.modelkit import builtin
from areal_graph.modelkit.reward_model import TINY_ARITH_RM, ensure_reward_model, labelled_answers

ROWS = [
    {
        "question": f"What is {a} + 1?",
        "answer": str(a + 1),
        "solution": f"{a} + 1 = {a + 1}\nThe answer is \\boxed{{{a + 1}}}.",
    }
    for a in range(20)
]


def test_labelled_answers_are_a_quarter_of_each_kind():
    out = labelled_answers(ROWS, 400, seed=0)
    assert len(out) == 400 and sum(y for *_, y in out) == 200
    by_kind = [out[k::4] for k in range(4)]
    row = {r["question"]: r for r in ROWS}
    for q, text, y in by_kind[0]:  # worked, right
        assert y == 1.0 and text == row[q]["solution"]
    for q, text, y in by_kind[1]:  # worked, wrong final answer: the steps stay, the box changes
        assert y == 0.0 and text.split("\n")[0] == row[q]["solution"].split("\n")[0] and text != row[q]["solution"]
    for q, text, y in by_kind[2]:  # hasty, right
        assert y == 1.0 and text == f"The answer is \\boxed{{{row[q]['answer']}}}."
    for q, text, y in by_kind[3]:  # hasty, wrong: the warm start's own mistake, one operation short
        assert y == 0.0 and text == f"The answer is \\boxed{{{q.split()[2]}}}."
    assert labelled_answers(ROWS, 40, seed=1) == labelled_answers(ROWS, 40, seed=1) != labelled_answers(ROWS, 40, 2)


def test_a_small_recipe_learns_is_cached_and_resolves_by_name(tmp_path, monkeypatch):
    """A shortened recipe (the shipped one trains 300 steps: ~60 s; `areal-graph run` builds it on
    first use): its loss falls, the folder loads as a sequence classifier, a second call reuses it."""
    monkeypatch.setenv("AREAL_GRAPH_CACHE", str(tmp_path))
    # 60 steps at 3e-3: the loss falls from ~0.71 to ~0.65 (40 steps at 1e-3 did not move it: the
    # wrong answers are the warm start's own, one operation short, hard to tell apart quickly)
    small = dataclasses.replace(TINY_ARITH_RM, n_train=400, n_test=200, steps=60, lr=3e-3)
    path = ensure_reward_model(small)
    info = json.loads((path / "reward_model.json").read_text())
    assert info["fingerprint"] == small.fingerprint() != TINY_ARITH_RM.fingerprint()
    assert info["loss_last_tenth"] < info["loss_first_tenth"] and 0.0 <= info["heldout_accuracy"] <= 1.0
    from transformers import AutoModelForSequenceClassification

    model = AutoModelForSequenceClassification.from_pretrained(path)
    assert model.config.num_labels == 1 and model.config.pad_token_id is not None
    mtime = (path / "reward_model.json").stat().st_mtime_ns
    assert ensure_reward_model(small) == path and (path / "reward_model.json").stat().st_mtime_ns == mtime
    # the builtin name resolves to the shipped recipe's folder (built on demand: here it is made to exist)
    shipped = tmp_path / f"tiny-arith-rm-{TINY_ARITH_RM.fingerprint()}"
    shipped.mkdir()
    (shipped / "reward_model.json").write_text("{}")
    assert builtin.resolve_model_path("builtin:tiny-arith-rm") == shipped
