"""`areal-graph eval`: pass@k against brute-force enumeration, accuracy against a plain loop."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys

import pytest

from areal_graph.engines.inference.offline_eval import evaluate_model, pass_at_k


@pytest.mark.parametrize("n,c,k", [(n, c, k) for n in range(1, 7) for c in range(n + 1) for k in range(1, n + 1)])
def test_pass_at_k_equals_enumerating_every_k_subset(n, c, k):
    samples = [True] * c + [False] * (n - c)
    subsets = list(itertools.combinations(range(n), k))
    expected = sum(any(samples[i] for i in s) for s in subsets) / len(subsets)
    assert pass_at_k(n, c, k) == pytest.approx(expected, abs=1e-12)


def test_pass_at_k_rejects_impossible_counts():
    with pytest.raises(ValueError):
        pass_at_k(4, 5, 1)
    with pytest.raises(ValueError):
        pass_at_k(4, 1, 5)


@pytest.fixture(scope="module")
def trained_kit(tmp_path_factory):
    """A mini kit whose model has memorised a few answers, so accuracy is neither 0 nor 1."""
    from areal_graph.modelkit.builtin import KitConfig, ensure_kit
    from areal_graph.modelkit.tiny_model import TinyModelConfig
    from areal_graph.modelkit.warm_start import SFTConfig

    cfg = KitConfig(
        name="evalkit",
        n_train=200,
        n_test=16,
        vocab_size=300,
        difficulty="digits",
        hasty_rate=0.6,
        habit_sft=None,
        model=TinyModelConfig(hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=128),
        sft=SFTConfig(steps=60, batch_size=32, lr=3e-3, warmup_steps=5),
        eval_prompts=16,
    )
    return ensure_kit(cfg, root=tmp_path_factory.mktemp("kits"))


def test_greedy_accuracy_matches_hf_generate_and_math_verify(trained_kit):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from areal_graph.data.datasets import load_prompts
    from areal_graph.nodes.math_reward import math_reward

    result = evaluate_model(trained_kit.model_dir, trained_kit.data_path("test"), k=2, n_samples=3, max_new_tokens=40)
    # an independent loop: transformers generate, one prompt at a time, scored in-process
    tok = AutoTokenizer.from_pretrained(trained_kit.model_dir)
    model = AutoModelForCausalLM.from_pretrained(trained_kit.model_dir).eval()
    prompts, _ = load_prompts(trained_kit.data_path("test"), tok)
    correct = []
    for p in prompts:
        with torch.no_grad():
            out = model.generate(
                torch.tensor([p.input_ids]),
                max_new_tokens=40,
                do_sample=False,
                eos_token_id=tok.eos_token_id,
                pad_token_id=tok.pad_token_id,
            )
        text = tok.decode(out[0, len(p.input_ids) :], skip_special_tokens=True)
        correct.append(math_reward(text, p.answer) > 0.5)
    assert result["prompts"] == 16
    assert [p["greedy_correct"] for p in result["per_prompt"]] == correct
    assert result["greedy_accuracy"] == pytest.approx(sum(correct) / 16)
    expected = sum(pass_at_k(3, p["samples_correct"], 2) for p in result["per_prompt"]) / 16
    assert result["pass@2"] == pytest.approx(expected)
    assert 0 <= result["sample_accuracy"] <= 1 and result["n_samples"] == 3
    # the kit recorded the same greedy accuracy when it was built
    assert trained_kit.info["warm_start_greedy_accuracy"] == pytest.approx(result["greedy_accuracy"])


def test_eval_cli_prints_a_table_and_writes_json(trained_kit, tmp_path):
    out = tmp_path / "r.json"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "areal_graph.cli.main",
            "eval",
            str(trained_kit.model_dir),
            "--data",
            str(trained_kit.data_path("test")),
            "--limit",
            "4",
            "--json",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env={"COLUMNS": "120", "PATH": ""},
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "greedy accuracy" in proc.stdout
    data = json.loads(out.read_text())
    assert data["prompts"] == 4 and len(data["per_prompt"]) == 4


def test_eval_cli_bad_input_is_a_clear_error(trained_kit, tmp_path):
    def run(*args):
        return subprocess.run(
            [sys.executable, "-m", "areal_graph.cli.main", "eval", *args], capture_output=True, text=True, timeout=120
        )

    proc = run(str(tmp_path), "--data", str(trained_kit.data_path("test")))
    assert proc.returncode == 1 and "no config.json" in proc.stderr and "Traceback" not in proc.stderr
    proc = run(str(trained_kit.model_dir), "--data", str(tmp_path / "nope.jsonl"))
    assert proc.returncode == 1 and "does not exist" in proc.stderr and "Traceback" not in proc.stderr
    proc = run(str(trained_kit.model_dir), "--data", "builtin:nope")
    assert proc.returncode == 2 and "unknown builtin dataset" in proc.stderr
    proc = run(str(trained_kit.model_dir), "--data", "x.jsonl", "-k", "4", "--samples", "2")
    assert proc.returncode == 2
