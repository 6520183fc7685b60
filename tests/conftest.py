"""Shared fixtures. Tests never download anything: models are built from a config here."""

from __future__ import annotations

import os

import pytest
import torch


def missing(what: str, how: str) -> None:
    """A test that needs an optional tool which is not here: skipped on a developer's machine,
    failed in CI (`.ci/run` sets AREAL_GRAPH_CI=1 after installing the tools), where a skip
    would hide that CI no longer runs what it is meant to."""
    if os.environ.get("AREAL_GRAPH_CI"):
        pytest.fail(f"{what} is missing in CI ({how})")
    pytest.skip(f"{what} is missing ({how})")


def build_random_qwen2(vocab_size: int = 128, hidden: int = 64, layers: int = 2, seed: int = 0):
    """A tiny randomly initialised Qwen2 CausalLM (fp32), the architecture of the real kit."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    config = Qwen2Config(
        vocab_size=vocab_size,
        hidden_size=hidden,
        intermediate_size=hidden * 2,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        tie_word_embeddings=True,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
    )
    model = Qwen2ForCausalLM(config).eval()
    return model


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    """A directory holding a random tiny Qwen2 saved with save_pretrained (loads with Auto*)."""
    path = tmp_path_factory.mktemp("tiny_qwen2")
    build_random_qwen2().save_pretrained(path)
    return path
