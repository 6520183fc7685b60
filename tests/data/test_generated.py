"""Generated datasets in one place (data/generated.py): a name goes to its source, is checked by
it, and resolves to an ordinary JSONL file in the kit cache, as `run` and `eval` resolve data."""

from __future__ import annotations

import json

from areal_graph.data import generated, reasoning_gym, textarena_games
from support.ci import optional


def test_names_go_to_their_source_and_files_to_none():
    assert generated.SCHEMES == ("reasoning_gym:", "textarena:", "verifiers:")
    assert generated.source_of("reasoning_gym:leg_counting?size=3") is reasoning_gym
    assert generated.source_of("textarena:GuessTheNumber-v0") is textarena_games
    assert generated.source_of("builtin:arith/train") is None and generated.source_of("data/train.jsonl") is None


def test_each_source_checks_its_names_and_resolving_writes_its_rows(tmp_path, monkeypatch):
    optional("reasoning_gym", "pip install 'reasoning-gym>=0.1.25,<0.2' (in the dev extra)")
    optional("textarena", "pip install 'textarena==0.7.4' (in the dev extra)")
    from areal_graph.modelkit.builtin import resolve_dataset_path

    assert "did you mean 'leg_counting'" in generated.check("reasoning_gym:leg_countin")
    assert "did you mean 'GuessTheNumber-v0'" in generated.check("textarena:GuessTheNumbr-v0")
    monkeypatch.setenv("AREAL_GRAPH_CACHE", str(tmp_path))
    for spec, folder in (
        ("reasoning_gym:leg_counting?size=3&seed=1", "reasoning_gym"),
        ("textarena:GuessTheNumber-v0?size=2&seed=1", "textarena"),
    ):
        path = resolve_dataset_path(spec)
        assert path.parent == tmp_path / folder
        rows = [json.loads(line) for line in path.read_text().splitlines()]
        assert len(rows) == int(spec.split("size=")[1].split("&")[0]) and all(
            r["question"] and r["answer"] for r in rows
        )
