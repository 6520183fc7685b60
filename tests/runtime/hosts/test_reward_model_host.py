"""The reward-model host: scores equal transformers' forward of each trajectory alone, whatever
the micro-batching; one- and two-label heads; a reward model with its own tokenizer."""

from __future__ import annotations

import random

import pytest
import torch

from areal_graph.data.packed import PackedBatch
from areal_graph.runtime.hosts.reward_model_host import RewardModelHost, length_groups
from support.tiny_models import save_random_classifier


@pytest.fixture(scope="module")
def policy_tokenizer(kit):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(kit / "model")


def trajectories(tokenizer, n=7, seed=0) -> PackedBatch:
    rng = random.Random(seed)
    texts = [
        f"What is {rng.randint(1, 99)} + {rng.randint(1, 99)}? " + "The answer is 7. " * rng.randint(0, 6)
        for _ in range(n)
    ]
    seqs = [tokenizer(t, add_special_tokens=False).input_ids for t in texts]
    return PackedBatch.from_sequences({"input_ids": seqs, "loss_mask": [[0] * len(s) for s in seqs]})


def alone(path, batch: PackedBatch) -> torch.Tensor:
    """transformers' own forward of each sequence by itself (no padding anywhere)."""
    from transformers import AutoModelForSequenceClassification

    model = AutoModelForSequenceClassification.from_pretrained(path).eval()
    with torch.no_grad():
        return torch.cat(
            [model(input_ids=batch.sequence(i, "input_ids").unsqueeze(0)).logits for i in range(batch.num_seqs)]
        )


@pytest.mark.parametrize("max_tokens", [1, 64, 100_000])
def test_scores_equal_each_sequence_alone_however_batched(kit, policy_tokenizer, tmp_path, max_tokens):
    path = save_random_classifier(tmp_path / "rm", policy_tokenizer, labels=1)
    host = RewardModelHost(str(path), str(kit / "model"))
    batch = trajectories(policy_tokenizer)
    out, stats = host.score(batch, "rm_reward", max_tokens_per_mb=max_tokens)
    ref = alone(path, batch)[:, 0]
    assert torch.allclose(out["rm_reward"], ref, atol=1e-5), (out["rm_reward"] - ref).abs().max()
    assert stats["forwards"] == len(length_groups([int(n) for n in batch.seqlens()], max_tokens))
    assert not host.retokenize  # the same vocabulary: ids go in as they are


def test_a_two_label_classifier_gives_the_probability_of_label_1(kit, policy_tokenizer, tmp_path):
    path = save_random_classifier(tmp_path / "rm2", policy_tokenizer, labels=2, seed=1)
    batch = trajectories(policy_tokenizer, seed=1)
    out, _ = RewardModelHost(str(path), str(kit / "model")).score(batch, "p")
    assert torch.allclose(out["p"], torch.softmax(alone(path, batch), -1)[:, 1], atol=1e-6)
    sig = RewardModelHost(
        str(save_random_classifier(tmp_path / "rm1", policy_tokenizer, labels=1)), str(kit / "model"), output="sigmoid"
    )
    logits = alone(tmp_path / "rm1", batch)[:, 0]
    assert torch.allclose(sig.score(batch, "s")[0]["s"], torch.sigmoid(logits), atol=1e-6)
    with pytest.raises(ValueError, match="needs a one-label head"):
        RewardModelHost(str(path), str(kit / "model"), output="logit")


def test_no_pad_token_means_one_sequence_a_forward(kit, policy_tokenizer, tmp_path):
    path = save_random_classifier(tmp_path / "rm", policy_tokenizer, labels=1, pad=False)
    batch = trajectories(policy_tokenizer, n=4)
    out, stats = RewardModelHost(str(path), str(kit / "model")).score(batch, "r", max_tokens_per_mb=100_000)
    assert stats["forwards"] == 4 and torch.allclose(out["r"], alone(path, batch)[:, 0], atol=1e-5)


def test_a_reward_model_with_its_own_tokenizer_reads_the_text(kit, policy_tokenizer, tmp_path):
    """Its vocabulary differs from the policy's: each trajectory is decoded and encoded again."""
    from areal_graph.modelkit.tokenizer import train_tokenizer

    own = train_tokenizer(["What is 12 + 30? The answer is 7."] * 30, vocab_size=280)
    path = save_random_classifier(tmp_path / "rm", own, labels=1)
    host = RewardModelHost(str(path), str(kit / "model"))
    assert host.retokenize
    batch = trajectories(policy_tokenizer, n=3)
    texts = policy_tokenizer.batch_decode([batch.sequence(i, "input_ids").tolist() for i in range(3)])
    mine = PackedBatch.from_sequences({"input_ids": [own(t, add_special_tokens=False).input_ids for t in texts]})
    assert torch.allclose(host.score(batch, "r")[0]["r"], alone(path, mine)[:, 0], atol=1e-5)


def test_length_groups_keep_the_padded_size_within_the_budget():
    lengths = [5, 1, 9, 9, 3, 20, 2]
    groups = length_groups(lengths, 18)
    assert sorted(i for g in groups for i in g) == list(range(7))
    assert all(len(g) * max(lengths[i] for i in g) <= 18 or len(g) == 1 for g in groups)
    assert groups == [[1, 6, 4], [0, 2], [3], [5]] and length_groups(lengths, 0) == [[i] for i in (1, 6, 4, 0, 2, 3, 5)]
