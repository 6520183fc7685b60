"""The tiny-model kit: task data, tokenizer, model, warm start, and the cached builtin kit."""

from __future__ import annotations

import dataclasses
import json
import re
import threading
from pathlib import Path

import pytest
import torch

from areal_graph.data.arith import Difficulty, apply_op, generate, hasty_answer, split, teacher_mixture
from areal_graph.modelkit import builtin, kit_cache
from areal_graph.modelkit.builtin import resolve_dataset_path, resolve_model_path
from areal_graph.modelkit.kit_cache import ensure_kit, load_kit
from areal_graph.modelkit.recipes import KitConfig
from areal_graph.modelkit.tiny_model import (
    TinyModelConfig,
    build_tiny_model,
    count_parameters,
    load_model_and_tokenizer,
    save_model_and_tokenizer,
)
from areal_graph.modelkit.tokenizer import train_tokenizer
from areal_graph.modelkit.warm_start import IGNORE, SFTConfig, encode_pair, sft

MINI = KitConfig(
    name="mini",
    n_train=300,
    n_test=24,
    vocab_size=300,
    model=TinyModelConfig(hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1, intermediate_size=64),
    sft=SFTConfig(steps=4, batch_size=8),
    habit_sft=SFTConfig(steps=3, batch_size=8),
    eval_prompts=8,
)


def test_problems_are_right_distinct_and_deterministic():
    rows = generate(seed=5, n=300)
    assert rows == generate(seed=5, n=300) and rows != generate(seed=6, n=300)
    assert len({r["question"] for r in rows}) == 300
    for r in rows:
        tokens = r["question"].removeprefix("What is ").removesuffix("?").split()
        value = int(tokens[0])
        for op, b in zip(tokens[1::2], tokens[2::2]):  # left to right, as the solution spells out
            value = apply_op(value, op, int(b))
        assert str(value) == r["answer"]
        assert r["solution"].endswith(f"\\boxed{{{value}}}.")
        steps = [ln for ln in r["solution"].splitlines() if "=" in ln]
        assert 2 <= len(steps) <= 3  # "medium"
        for line in steps:
            a, op, b, _, c = line.split()
            assert apply_op(int(a), op, int(b)) == int(c)


def test_split_is_disjoint_and_bad_difficulty_is_clear():
    train, test = split(0, 200, 50)
    assert not {r["question"] for r in train} & {r["question"] for r in test}
    with pytest.raises(ValueError, match="unknown difficulty"):
        generate(0, 1, "impossible")
    with pytest.raises(ValueError, match="min_steps"):
        Difficulty(3, 2, 0, 9)


def test_teacher_mixture_answers_a_share_hastily_one_step_short():
    rows = generate(seed=2, n=2000, difficulty="digits")
    before = [dict(r) for r in rows]
    mixed = teacher_mixture(rows, hasty_rate=0.6, seed=7)
    assert rows == before  # inputs are not modified
    assert mixed == teacher_mixture(rows, hasty_rate=0.6, seed=7) != teacher_mixture(rows, 0.6, seed=8)
    hasty = [(m, r) for m, r in zip(mixed, rows) if m["solution"] != r["solution"]]
    assert abs(len(hasty) / len(rows) - 0.6) < 0.04  # binomial sd ~0.011
    for m, r in zip(mixed, rows):
        assert {k: v for k, v in m.items() if k != "solution"} == {k: v for k, v in r.items() if k != "solution"}
    for m, r in hasty:
        # independent recomputation: evaluate the question left to right, dropping the last operation
        tokens = r["question"].removeprefix("What is ").removesuffix("?").split()
        value = int(tokens[0])
        for op, b in zip(tokens[1:-2:2], tokens[2:-2:2]):
            value = apply_op(value, op, int(b))
        assert m["solution"] == f"The answer is \\boxed{{{value}}}." == hasty_answer(r)
    assert hasty_answer({"solution": "5 + 4 = 9\n9 - 3 = 6\nThe answer is \\boxed{6}."}) == "The answer is \\boxed{9}."
    assert teacher_mixture(rows, 0.0, seed=1) == rows
    with pytest.raises(ValueError, match="hasty_rate"):
        teacher_mixture(rows, 1.5, seed=0)


def test_one_digit_level_keeps_every_value_a_single_digit():
    """The builtin task: 3-4 steps, operands and every intermediate result in 0..9 (so each
    solution line has one shape), answers spread over all ten digits."""
    rows = generate(seed=0, n=3000, difficulty="one-digit")
    answers = {str(d): 0 for d in range(10)}
    for r in rows:
        steps = [ln.split() for ln in r["solution"].splitlines() if "=" in ln]
        assert 3 <= len(steps) <= 4
        for a, op, b, _, c in steps:
            assert all(0 <= int(x) <= 9 for x in (a, b, c)) and apply_op(int(a), op, int(b)) == int(c)
        answers[r["answer"]] += 1
    assert min(answers.values()) > 0.07 * len(rows)
    with pytest.raises(ValueError, match="fewer than"):  # only 55 one-step sums stay within 0..9
        generate(0, 200, Difficulty(1, 1, 0, 9, ops="+", max_value=9))


def test_arith_lessons_teach_the_method_then_the_habit():
    from areal_graph.modelkit.kit_tasks import kit_task

    cfg = KitConfig(n_train=400, n_test=20, n_dev=10)
    train, test, lessons = kit_task("arith").rows(cfg)
    assert [x.name for x in lessons] == ["method", "habit"] and [x.sft for x in lessons] == [cfg.sft, cfg.habit_sft]
    assert lessons[0].rows == train  # every solution worked out
    assert lessons[1].rows == teacher_mixture(train, cfg.hasty_rate, cfg.seed)
    one = KitConfig(n_train=400, n_test=20, n_dev=10, habit_sft=None)
    assert [(x.name, x.rows) for x in kit_task("arith").rows(one)[2]] == [("mixture", lessons[1].rows)]


def test_lean_sft_loss_and_gradients_equal_the_hf_forwards(tokenizer):
    """The SFT's lean stream loss (no padding, shared prefixes computed once) against the HF
    forward over right-padded rows and over packed rows, and a float64 HF reference."""
    from areal_graph.modelkit.warm_start import _batch_loss_fn

    rows = generate(seed=4, n=24)
    batch = [encode_pair(tokenizer, r["question"], r["solution"]) for r in rows]
    cfg = TinyModelConfig(hidden_size=48, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=96)

    def loss_and_grads(forward: str, packed: bool = False, dtype=torch.float32):
        model = build_tiny_model(tokenizer, cfg, seed=5).to(dtype)
        loss = _batch_loss_fn(model, tokenizer.pad_token_id, SFTConfig(forward=forward, packed=packed))(batch)
        loss.backward()
        return loss.detach().double(), {n: p.grad.double() for n, p in model.named_parameters()}

    ref_loss, ref_grads = loss_and_grads("hf", dtype=torch.float64)
    for forward, packed in (("auto", False), ("hf", False), ("hf", True)):
        loss, grads = loss_and_grads(forward, packed)
        assert abs(loss - ref_loss) < 1e-5, (forward, packed)
        for name, g in grads.items():
            assert torch.allclose(g, ref_grads[name], rtol=1e-3, atol=1e-6), (forward, packed, name)


@pytest.fixture(scope="module")
def tokenizer():
    rows = generate(seed=1, n=400)
    return train_tokenizer([r["question"] + "\n" + r["solution"] for r in rows], vocab_size=300)


def test_tokenizer_round_trips_through_save_pretrained(tokenizer, tmp_path):
    from transformers import AutoTokenizer

    tokenizer.save_pretrained(tmp_path)
    loaded = AutoTokenizer.from_pretrained(tmp_path)
    texts = [
        "What is 12 + 7 - 3?",
        "12 + 7 = 19\n19 - 3 = 16\nThe answer is \\boxed{16}.",
        "ünïcode ✓ and spaces  ",
        "-45",
        "",
    ]
    for text in texts:
        ids = tokenizer(text, add_special_tokens=False).input_ids
        assert loaded(text, add_special_tokens=False).input_ids == ids
        assert loaded.decode(ids) == text
    # digits are single tokens: a number's tokens are its digits
    pieces = [tokenizer.decode([i]) for i in tokenizer("9876", add_special_tokens=False).input_ids]
    assert pieces == ["9", "8", "7", "6"]
    prompt = loaded.apply_chat_template(
        [{"role": "user", "content": "What is 1 + 1?"}], tokenize=False, add_generation_prompt=True
    )
    assert prompt == "<|bos|><|im_start|>user\nWhat is 1 + 1?<|im_end|>\n<|im_start|>assistant\n"
    assert loaded.eos_token == "<|im_end|>" and loaded.pad_token_id != loaded.eos_token_id


def test_model_save_load_gives_identical_logits(tokenizer, tmp_path):
    cfg = TinyModelConfig(hidden_size=48, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=96)
    model = build_tiny_model(tokenizer, cfg, seed=3).eval()
    assert count_parameters(model) == sum(p.numel() for n, p in model.named_parameters())  # tied head counted once
    save_model_and_tokenizer(model, tokenizer, tmp_path)
    loaded, tok = load_model_and_tokenizer(tmp_path)
    assert type(loaded).__name__ == "Qwen2ForCausalLM"
    ids = torch.tensor([tok("What is 3 + 4?").input_ids])
    with torch.no_grad():
        assert torch.equal(model(ids).logits, loaded(ids).logits)
    assert (
        build_tiny_model(tokenizer, cfg, seed=3)
        .state_dict()["model.embed_tokens.weight"]
        .equal(model.state_dict()["model.embed_tokens.weight"])
    )


def test_encode_pair_masks_the_prompt(tokenizer):
    ids, labels = encode_pair(tokenizer, "What is 1 + 2?", "1 + 2 = 3\nThe answer is \\boxed{3}.")
    n_prompt = labels.count(IGNORE)
    assert labels[:n_prompt] == [IGNORE] * n_prompt and IGNORE not in labels[n_prompt:]
    assert labels[n_prompt:] == ids[n_prompt:] and ids[-1] == tokenizer.eos_token_id
    assert tokenizer.decode(ids[n_prompt:-1]) == "1 + 2 = 3\nThe answer is \\boxed{3}."


def test_sft_lowers_the_loss_deterministically(tokenizer):
    rows = generate(seed=2, n=64)
    cfg = TinyModelConfig(hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1, intermediate_size=64)
    runs = []
    for _ in range(2):
        model = build_tiny_model(tokenizer, cfg, seed=0)
        runs.append(sft(model, tokenizer, rows, SFTConfig(steps=30, batch_size=16, lr=3e-3, warmup_steps=5)))
    assert runs[0] == runs[1]
    assert sum(runs[0][-5:]) / 5 < 0.75 * sum(runs[0][:5]) / 5


def test_kit_builds_once_loads_with_auto_classes_and_is_deterministic(tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    kit = ensure_kit(MINI, root=tmp_path / "a")
    assert kit.path.name == f"mini-{MINI.fingerprint()}"
    info = json.loads((kit.path / "kit.json").read_text())
    assert info["parameters"] > 0 and 0.0 <= info["warm_start_greedy_accuracy"] <= 1.0
    assert info["eval_prompts"] == 8 and info["source"] == "recipe" and "thread" in info["built_on"]
    assert [(x["name"], x["steps"]) for x in info["sft_lessons"]] == [("method", 4), ("habit", 3)]
    assert info["sft_steps"] == 7
    train = [json.loads(line) for line in kit.data_path("train").read_text().splitlines()]
    test = [json.loads(line) for line in kit.data_path("test").read_text().splitlines()]
    assert (len(train), len(test)) == (300, 24) and {"question", "answer", "solution"} <= set(train[0])
    tok = AutoTokenizer.from_pretrained(kit.model_dir)
    model = AutoModelForCausalLM.from_pretrained(kit.model_dir)
    # every token id the tokenizer can produce has an embedding row (Qwen2Tokenizer used to
    # add <|endoftext|> as its unknown token, one id past the embedding)
    assert len(tok) == model.config.vocab_size and tok.unk_token is None
    assert max(tok.get_vocab().values()) < model.get_input_embeddings().weight.shape[0]
    # second call: no rebuild (the same files, untouched)
    stamp = (kit.model_dir / "model.safetensors").stat().st_mtime_ns
    assert ensure_kit(MINI, root=tmp_path / "a").info == info
    assert (kit.model_dir / "model.safetensors").stat().st_mtime_ns == stamp
    # deterministic: another cache root gives bit-identical weights and data
    other = ensure_kit(MINI, root=tmp_path / "b")
    again = AutoModelForCausalLM.from_pretrained(other.model_dir)
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), again.state_dict().values()))
    assert other.data_path("train").read_bytes() == kit.data_path("train").read_bytes()
    # no leftovers from the build
    assert sorted(p.name for p in (tmp_path / "a").iterdir()) == [kit.path.name, kit.path.name + ".lock"]


def test_a_changed_recipe_is_a_different_kit():
    assert MINI.fingerprint() != KitConfig(name="mini", n_train=301).fingerprint()
    assert MINI.fingerprint() == KitConfig(**{**MINI.__dict__}).fingerprint()
    # a field added later changes nothing while at its no-op default, and a kit apart once set
    assert "habit" not in MINI.recipe() and "worked_rates" not in MINI.recipe()
    assert dataclasses.replace(MINI, habit="last_free").fingerprint() != MINI.fingerprint()


def test_the_tictactoe_task_names_a_habit_it_does_not_know():
    from areal_graph.modelkit.kit_tasks import kit_task
    from areal_graph.modelkit.recipes import TINY_TICTACTOE

    for habit in ("", "middle_free"):
        with pytest.raises(ValueError, match=rf"habit is one of \['first_free', 'last_free'\], got '{habit}'"):
            kit_task("tictactoe").rows(dataclasses.replace(TINY_TICTACTOE, habit=habit, n_train=2))


def test_concurrent_resolves_build_once(tmp_path, monkeypatch):
    calls = []
    real = kit_cache.build_kit

    def counting(cfg, out, progress):
        calls.append(out)
        return real(cfg, out, progress)

    monkeypatch.setattr(kit_cache, "build_kit", counting)
    results = []
    threads = [threading.Thread(target=lambda: results.append(ensure_kit(MINI, root=tmp_path))) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(calls) == 1 and len(results) == 3 and len({r.path for r in results}) == 1


def test_builtin_names_resolve_and_unknown_names_are_clear(tmp_path, monkeypatch):
    monkeypatch.setenv("AREAL_GRAPH_CACHE", str(tmp_path))
    monkeypatch.setitem(builtin.BUILTIN_KITS, "tiny-arith", MINI)
    assert resolve_model_path("/some/dir") == Path("/some/dir")
    assert resolve_dataset_path("data/x.jsonl") == Path("data/x.jsonl")
    model_dir = resolve_model_path("builtin:tiny-arith")
    assert model_dir == load_kit(MINI, tmp_path).model_dir and (model_dir / "config.json").exists()
    assert resolve_dataset_path("builtin:arith/test").name == "test.jsonl"
    with pytest.raises(ValueError, match=re.escape("builtin:tiny-arith")):
        resolve_model_path("builtin:tiny-arithmetic")
    with pytest.raises(ValueError, match="builtin:arith/train"):
        resolve_dataset_path("builtin:gsm8k")
