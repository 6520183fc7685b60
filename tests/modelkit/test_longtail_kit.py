"""The long-tailed kit builtin:tiny-arith-long: its task level, packed SFT, registration and
shipped workflow. No test here builds the real kit (minutes); one builds a miniature of it."""

from __future__ import annotations

import dataclasses
import json
import os
import random
import statistics
import subprocess
import sys
from collections import Counter

import pytest

from areal_graph.data.arith import LEVELS, Difficulty, apply_op, generate, hasty_answer, split, teacher_mixture
from areal_graph.modelkit import builtin
from areal_graph.modelkit.builtin import (
    BUILTIN_DATASETS,
    BUILTIN_KITS,
    KitConfig,
    ensure_kit,
    kit_dir,
    resolve_dataset_path,
    resolve_model_path,
)
from areal_graph.modelkit.tiny_model import TinyModelConfig
from areal_graph.modelkit.warm_start import IGNORE, SFTConfig, collate, encode_pair, pack, sft
from support.paths import REPO

WORKFLOW = REPO / "workflows" / "ppo_async_longtail.yaml"
LONG = BUILTIN_KITS["tiny-arith-long"]


def _steps(row: dict) -> int:
    return sum("=" in line for line in row["solution"].splitlines())


@pytest.fixture(scope="module")
def rows():
    return generate(seed=0, n=4000, difficulty="longtail")


@pytest.fixture(scope="module")
def tokenizer(rows):
    from areal_graph.modelkit.tokenizer import train_tokenizer

    return train_tokenizer((r["question"] + "\n" + r["solution"] for r in rows), vocab_size=512)


# ------------------------------------------------------------------------------ the task level
def test_longtail_problems_are_right(rows):
    from areal_graph.nodes.math_reward import math_reward

    assert len({r["question"] for r in rows}) == len(rows)
    for r in rows:
        tokens = r["question"].removeprefix("What is ").removesuffix("?").split()
        value = int(tokens[0])
        assert 0 <= value <= 9
        for op, b in zip(tokens[1::2], tokens[2::2]):  # left to right, as the solution spells out
            assert 0 <= int(b) <= 9
            value = apply_op(value, op, int(b))
        assert str(value) == r["answer"]
        lines = [ln for ln in r["solution"].splitlines() if "=" in ln]
        assert len(lines) == len(tokens) // 2
        for line in lines:
            a, op, b, _, c = line.split()
            assert apply_op(int(a), op, int(b)) == int(c) and 0 <= int(c) <= 999
    sample = random.Random(0).sample(rows, 150)
    assert all(math_reward(r["solution"], r["answer"]) == 1.0 for r in sample)
    # a hasty answer (one operation short) is wrong unless the last operation changes nothing
    for r in sample:
        last = r["solution"].splitlines()[-2].split()
        assert math_reward(hasty_answer(r), r["answer"]) == float(last[2] == "0")


def test_longtail_steps_are_long_tailed(rows):
    steps = Counter(_steps(r) for r in rows)
    assert sorted(steps) == list(range(1, 21))  # every length from 1 to 20 steps occurs
    n = len(rows)
    values = sorted(_steps(r) for r in rows)
    assert statistics.median(values) <= 5  # most problems are short ...
    assert 0.05 <= sum(c for s, c in steps.items() if s >= 12) / n <= 0.25  # ... a sizeable tail is long
    assert steps[20] / n > 0.003


def test_longtail_answers_vary_tenfold_in_tokens(rows, tokenizer):
    def n_tokens(text: str) -> int:
        return len(tokenizer(text, add_special_tokens=False).input_ids) + 1  # + eos, as generated

    worked = sorted(n_tokens(r["solution"]) for r in rows)
    assert worked[-1] >= 9 * worked[0]  # worked solutions alone: 1 step vs 20 steps (~17 vs ~170 tokens)
    assert worked[-1] >= 150 and worked[len(worked) // 2] <= 60
    hasty = [n_tokens(m["solution"]) for m in teacher_mixture(rows[:200], 1.0, seed=0)]
    assert max(hasty) <= 12 and worked[-1] >= 15 * min(hasty)  # what the warm start samples: ~10 to ~170
    # the kit's context holds the longest prompt plus the workflow's generation limit
    prompts = [len(encode_pair(tokenizer, r["question"], "")[0]) - 1 for r in rows]
    assert max(prompts) + LONG.eval_max_new_tokens <= LONG.model.max_position_embeddings
    assert worked[-1] <= LONG.eval_max_new_tokens


def test_existing_levels_draw_the_same_problems():
    """Difficulty grew step_weights; levels without them draw the old stream
    (the cached tiny-arith kit's data: its first test problem and first training problem)."""
    train, test = split(0, 20200, 500, "digits")
    assert test[0]["question"] == "What is 9 + 8 + 4 + 1?"
    assert train[200] == {
        "question": "What is 5 + 3 - 5 + 9?",
        "answer": "12",
        "solution": "5 + 3 = 8\n8 - 5 = 3\n3 + 9 = 12\nThe answer is \\boxed{12}.",
    }
    assert LEVELS["digits"] == Difficulty(2, 3, 0, 9)


def test_difficulty_rejects_bad_weights():
    with pytest.raises(ValueError, match="step_weights"):
        Difficulty(1, 3, 0, 9, step_weights=(1, 2))
    with pytest.raises(ValueError, match="step_weights"):
        Difficulty(1, 2, 0, 9, step_weights=(0, 0))
    only_three = Difficulty(1, 3, 0, 9, step_weights=(0, 0, 1))
    assert {_steps(r) for r in generate(1, 50, only_three)} == {3}


# ------------------------------------------------------------------------------ packed SFT
def test_pack_places_every_token_once_without_crossing_sequences(rows, tokenizer):
    examples = [encode_pair(tokenizer, r["question"], r["solution"]) for r in rows[:64]]
    ids, labels, positions = pack(examples, tokenizer.pad_token_id)
    width = max(len(x) for x, _ in examples)
    assert ids.shape[1] == width and ids.shape[0] < len(examples) // 2  # long tail: many short rows share
    # every sequence appears once, contiguous, with positions restarting at 0
    found = []
    for r in range(ids.shape[0]):
        starts = [i for i in range(width) if positions[r, i] == 0] + [width]
        for a, b in zip(starts, starts[1:]):
            found.append((ids[r, a:b].tolist(), labels[r, a:b].tolist()))
    for x, y in examples:
        assert (x, y) in found
    assert int((labels != IGNORE).sum()) == sum(sum(t != IGNORE for t in y) for _, y in examples)


def test_packed_loss_equals_padded_loss(rows, tokenizer):
    """Same batch, same weights: the packed forward's loss is the padded forward's (position
    ids restarting per sequence keep attention within it)."""
    import torch

    from areal_graph.modelkit.tiny_model import build_tiny_model

    cfg = TinyModelConfig(
        hidden_size=32, num_layers=2, num_heads=2, num_kv_heads=1, intermediate_size=64, max_position_embeddings=512
    )
    model = build_tiny_model(tokenizer, cfg, seed=0)
    examples = [encode_pair(tokenizer, r["question"], r["solution"]) for r in rows[:24]]
    with torch.no_grad():
        ids, labels, mask = collate(examples, tokenizer.pad_token_id)
        padded = model(input_ids=ids, attention_mask=mask, labels=labels, use_cache=False).loss
        ids, labels, positions = pack(examples, tokenizer.pad_token_id)
        packed = model(input_ids=ids, position_ids=positions, labels=labels, use_cache=False).loss
    assert abs(float(padded) - float(packed)) < 1e-5


def test_packed_sft_is_deterministic_and_learns(rows, tokenizer):
    from areal_graph.modelkit.tiny_model import build_tiny_model

    cfg = TinyModelConfig(
        hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1, intermediate_size=64, max_position_embeddings=512
    )
    sft_cfg = SFTConfig(steps=16, batch_size=8, lr=1e-2, warmup_steps=2, packed=True)
    runs = [sft(build_tiny_model(tokenizer, cfg, seed=0), tokenizer, rows[:96], sft_cfg) for _ in range(2)]
    assert runs[0] == runs[1]
    assert sum(runs[0][-3:]) / 3 < 0.8 * sum(runs[0][:3]) / 3


# ------------------------------------------------------------------------------ the kit
def test_every_recipe_field_changes_the_fingerprint():
    """A changed recipe is a different kit: a cache never hands out a stale build."""
    assert BUILTIN_KITS["tiny-arith"] == KitConfig()
    assert KitConfig().fingerprint() == KitConfig().fingerprint()
    assert dataclasses.replace(KitConfig(), sft_seed=1).fingerprint() != KitConfig().fingerprint()
    assert dataclasses.replace(KitConfig(), habit_sft=None).fingerprint() != KitConfig().fingerprint()
    changed = dataclasses.replace(KitConfig(), eval_max_new_tokens=65)
    assert changed.fingerprint() != KitConfig().fingerprint()
    packed = dataclasses.replace(KitConfig(), sft=dataclasses.replace(KitConfig().sft, packed=True))
    assert packed.fingerprint() != KitConfig().fingerprint()


def test_long_kit_is_registered_and_resolves_by_name_without_building(monkeypatch, tmp_path):
    assert LONG.name == "tiny-arith-long" and LONG.difficulty == "longtail"
    assert LONG.fingerprint() != KitConfig().fingerprint()
    assert BUILTIN_DATASETS["arith-long/train"] == ("tiny-arith-long", "train")
    assert BUILTIN_DATASETS["arith-long/test"] == ("tiny-arith-long", "test")
    assert LONG.sft.packed and LONG.model.max_position_embeddings >= 512
    assert LONG.habit_sft is not None and LONG.habit_sft.packed  # method, then habit: as tiny-arith
    monkeypatch.setenv("AREAL_GRAPH_CACHE", str(tmp_path))
    assert kit_dir(LONG).parent == tmp_path and kit_dir(LONG).name.startswith("tiny-arith-long-")

    built: list[KitConfig] = []

    def fake_ensure(cfg, root=None, progress=None, rebuild=False, from_recipe=False):
        built.append(cfg)
        return builtin.Kit(kit_dir(cfg, root), {})

    monkeypatch.setattr(builtin, "ensure_kit", fake_ensure)
    assert resolve_model_path("builtin:tiny-arith-long") == kit_dir(LONG) / "model"
    assert resolve_dataset_path("builtin:arith-long/test") == kit_dir(LONG) / "data" / "test.jsonl"
    assert resolve_dataset_path("builtin:arith-long/train") == kit_dir(LONG) / "data" / "train.jsonl"
    assert built == [LONG, LONG, LONG]
    with pytest.raises(ValueError, match="builtin:tiny-arith-long"):
        resolve_model_path("builtin:tiny-arith-longer")


def test_cli_knows_the_long_kit(monkeypatch):
    """`areal-graph init-model tiny-arith-long` names it (here: asked for its cached metadata
    only when built; an unknown name is refused before anything is built)."""
    from areal_graph.cli.main import main

    assert main(["init-model", "no-such-kit"]) == 2
    assert "tiny-arith-long" in BUILTIN_KITS


def test_mini_longtail_kit_builds(tmp_path):
    """A miniature of the long kit (tiny model, 4 + 2 SFT steps) builds end to end with its
    packed SFT in two lessons and long evaluation limit."""
    mini = dataclasses.replace(
        LONG,
        name="mini-long",
        n_train=300,
        n_test=16,
        n_dev=20,
        vocab_size=300,
        eval_prompts=6,
        eval_max_new_tokens=48,
        model=TinyModelConfig(
            hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1, intermediate_size=64, max_position_embeddings=512
        ),
        sft=SFTConfig(steps=4, batch_size=8, packed=True),
        habit_sft=SFTConfig(steps=2, batch_size=8, lr=3e-4, warmup_steps=1, packed=True),
    )
    kit = ensure_kit(mini, root=tmp_path)
    info = json.loads((kit.path / "kit.json").read_text())
    assert info["recipe"]["difficulty"] == "longtail" and info["eval_max_new_tokens"] == 48
    assert info["recipe"]["sft"]["packed"] is True and info["sft_steps"] == 6
    assert [x["name"] for x in info["sft_lessons"]] == ["method", "habit"]
    train = [json.loads(line) for line in kit.data_path("train").read_text().splitlines()]
    assert len(train) == 300 and max(_steps(r) for r in train) >= 12


# ------------------------------------------------------------------------------ the workflow
def test_longtail_workflow_validates():
    env = {**os.environ, "COLUMNS": "200", "NO_COLOR": "1"}
    out = subprocess.run(
        [sys.executable, "-m", "areal_graph.cli.main", "validate", str(WORKFLOW)],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "OK" in out.stdout and "ppo_async_longtail" in out.stdout


def test_longtail_workflow_settings():
    from areal_graph.graph.loader import load_workflow

    spec = load_workflow(WORKFLOW)
    assert spec.models["actor"].path == "builtin:tiny-arith-long"
    assert spec.data.train == "builtin:arith-long/train" and spec.data.eval == "builtin:arith-long/test"
    assert spec.runtime.max_staleness >= 1
    assert spec.nodes["train"].params.loss == "decoupled_ppo"
    sampling = spec.nodes["rollout"].params.sampling
    assert sampling.temperature == 1.0
    assert sampling.max_new_tokens >= LONG.eval_max_new_tokens  # the longest worked answers finish
    assert sampling.max_new_tokens + 80 <= LONG.model.max_position_embeddings
    sync = load_workflow(WORKFLOW, ["runtime.max_staleness=0"])  # the baseline the header names
    assert sync.runtime.max_staleness == 0
    assert "runtime.max_staleness=0" in WORKFLOW.read_text()
