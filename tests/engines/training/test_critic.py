"""The critic (engines/training/value_model.py): packed values, a value-loss step, checkpoints, the worker."""

from __future__ import annotations

import copy
import random

import pytest
import torch

from areal_graph.data.packed import PackedBatch
from areal_graph.engines.training.value_model import VALUE_HEAD_FILE, ValueEngine, ValueModel
from areal_graph.graph.kinds.losses import TrainParams
from areal_graph.nodes.advantages import gae
from areal_graph.nodes.ppo_loss import aggregate, loss_normalizer, value_loss
from areal_graph.nodes.train_loss import build_loss_fn
from areal_graph.runtime.hosts.model_host import ModelHost
from support.batches import random_batch
from support.tiny_models import build_random_qwen2

PARAMS = TrainParams(loss="value", value_clip=0.2)


def critic_batch(n: int = 9, seed: int = 0, vocab: int = 128) -> PackedBatch:
    """Prompts + responses (as in the engine tests) with an outcome reward per sequence."""
    batch = random_batch(n=n, seed=seed, vocab=vocab)
    rng = random.Random(seed)
    batch.update(
        PackedBatch(
            batch.cu_seqlens.clone(), seqs={"rewards": torch.tensor([float(rng.random() < 0.5) for _ in range(n)])}
        )
    )
    return batch


def with_returns(batch: PackedBatch, values: torch.Tensor) -> PackedBatch:
    mask = batch["loss_mask"].float()
    token_r = torch.zeros(batch.num_tokens)
    last = batch.cu_seqlens[1:].long() - 1  # every sequence ends with a generated token here
    token_r[last] = batch["rewards"].float()
    _, returns = gae(token_r, values, mask, batch.cu_seqlens, 1.0, 1.0)
    out = copy.deepcopy(batch)
    out.update(PackedBatch(batch.cu_seqlens.clone(), {"values": values.float(), "returns": returns.float()}))
    return out


def random_head(model: ValueModel, std: float, seed: int = 5) -> ValueModel:
    """The head starts at zero (all values 0): give it weights so the values say something."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        model.value_head.weight.copy_(torch.randn(model.value_head.weight.shape, generator=g) * std)
        model.value_head.bias.fill_(0.1)
    return model


def critic(seed: int = 0, head_std: float = 0.3) -> ValueModel:
    return random_head(ValueModel(build_random_qwen2(seed=seed).base_model), head_std)


def naive_values(model: ValueModel, batch: PackedBatch) -> torch.Tensor:
    """Each sequence alone, unpacked, in float64: position t holds the output after tokens < t."""
    m = copy.deepcopy(model).double()
    out = []
    with torch.no_grad():
        for i in range(batch.num_seqs):
            ids = batch.sequence(i, "input_ids").unsqueeze(0)
            v = m(input_ids=ids, use_cache=False).logits[0, :, 0]
            out.extend([0.0] + v[:-1].tolist())
    return torch.tensor(out, dtype=torch.float64)


def value_loss_of(engine: ValueEngine, batch: PackedBatch) -> float:
    """The batch's clipped value loss under the engine's current weights."""
    values = engine.compute_values(batch)
    mask = batch["loss_mask"].float()
    per_tok = value_loss(values, batch["values"], batch["returns"], mask, PARAMS.value_clip)
    return float(
        aggregate(per_tok, mask, batch.cu_seqlens, PARAMS.agg, loss_normalizer(mask, batch.cu_seqlens, PARAMS.agg))
    )


# ----------------------------------------------------------------------------- values
@pytest.mark.parametrize("row_tokens,budget", [(16, 40), (64, 8192), (4096, 8192)])
def test_packed_values_equal_each_sequence_alone(row_tokens, budget):
    model = critic()
    batch = critic_batch()
    engine = ValueEngine(model, trainable=False, row_tokens=row_tokens)
    values = engine.compute_values(batch, max_tokens_per_mb=budget)
    ref = naive_values(model, batch)
    assert values.dtype == torch.float32 and values.shape == (batch.num_tokens,)
    assert torch.allclose(values.double(), ref, atol=1e-5), (values.double() - ref).abs().max()
    assert torch.all(values[batch.cu_seqlens[:-1].long()] == 0)
    assert float(values.abs().max()) > 0.05  # the check is not vacuous


def test_value_at_t_reads_only_tokens_before_t():
    """V at position t is V(s_t) = V(tokens < t): changing token t leaves it unchanged, and
    changes the value at t + 1 (the state after token t), as `gae` expects."""
    engine = ValueEngine(critic(), trainable=False)
    ids = list(range(3, 15))
    other = ids[:6] + [99] + ids[7:]
    batch = PackedBatch.from_sequences({"input_ids": [ids, other]})
    v = engine.compute_values(batch).view(2, -1)
    assert torch.allclose(v[0, :7], v[1, :7], atol=1e-6)  # (float rounding of the packed row aside)
    assert torch.all((v[0, 7:] - v[1, 7:]).abs() > 1e-4)


def test_fresh_critic_from_a_causal_lm_dir_has_a_zero_head(tiny_model_dir):
    model = ValueModel.from_pretrained(tiny_model_dir)
    assert not hasattr(model, "lm_head") and not model.value_head.weight.detach().any()
    lm = build_random_qwen2()  # the same weights tiny_model_dir holds
    ref = lm.state_dict()
    for name, tensor in model.model.state_dict().items():
        assert torch.equal(tensor, ref["model." + name]), name
    values = ValueEngine(model, trainable=False).compute_values(critic_batch(n=3))
    assert torch.all(values == 0)


# ----------------------------------------------------------------------------- training
def test_one_critic_step_reduces_the_value_loss_and_is_split_invariant():
    batch = critic_batch(n=12, seed=3)
    engines = [ValueEngine(critic(head_std=0.05), lr=3e-4, row_tokens=rt) for rt in (4096, 16)]
    batch = with_returns(batch, engines[0].compute_values(batch))
    before = value_loss_of(engines[0], batch)
    stats = [
        e.train_step(batch, build_loss_fn(PARAMS, batch), max_tokens_per_mb=mb) for e, mb in zip(engines, (8192, 50))
    ]
    assert stats[1]["n_microbatches"] > 1 and stats[1]["n_forwards"] > stats[0]["n_forwards"]
    assert stats[0]["value_loss"] == pytest.approx(before, rel=1e-5)  # the loss the step saw
    after = value_loss_of(engines[0], batch)
    assert after < before * 0.9, (before, after)
    # however the batch was split, the step saw the same gradient (compared before Adam, whose
    # first update is ~lr * sign(g) and so turns rounding-level differences of a ~0 grad into lr)
    for (name, a), (_, b) in zip(engines[0].model.named_parameters(), engines[1].model.named_parameters()):
        assert torch.allclose(a.grad, b.grad, rtol=1e-4, atol=1e-8), name
    # every part trained: the head and (through the now non-zero head) the backbone
    fresh = critic(head_std=0.05)
    changed = {
        n
        for (n, a), (_, b) in zip(engines[0].model.named_parameters(), fresh.named_parameters())
        if not torch.equal(a, b)
    }
    assert "value_head.weight" in changed and any(n.startswith("model.layers.") for n in changed)


def test_critic_checkpoint_round_trip_gives_identical_values_and_resumes(tmp_path, tiny_model_dir):
    batch = critic_batch(n=6, seed=4)
    engine = ValueEngine(tiny_model_dir, lr=1e-3)
    for _ in range(2):  # the first step moves only the zero head; the second the backbone too
        b = with_returns(batch, engine.compute_values(batch))
        engine.train_step(b, build_loss_fn(PARAMS, b))
    ckpt = engine.save_checkpoint(tmp_path / "ckpt")
    assert (ckpt / "model" / VALUE_HEAD_FILE).exists() and (ckpt / "model" / "model.safetensors").exists()

    resumed = ValueEngine(tiny_model_dir, lr=1e-3)
    assert not torch.equal(resumed.compute_values(batch), engine.compute_values(batch))
    resumed.load_checkpoint(ckpt)
    assert resumed.version == engine.version == 2
    assert torch.equal(resumed.compute_values(batch), engine.compute_values(batch))
    # the directory warm-starts a critic by itself, too
    warm = ValueEngine(ckpt / "model", trainable=False)
    assert torch.equal(warm.compute_values(batch), engine.compute_values(batch))
    # optimizer state came back: the next step is the same on both
    b = with_returns(batch, engine.compute_values(batch))
    for e in (engine, resumed):
        e.train_step(b, build_loss_fn(PARAMS, b))
    assert torch.equal(resumed.compute_values(batch), engine.compute_values(batch))


# ----------------------------------------------------------------------------- the worker
def test_a_critic_worker_serves_values_trains_and_resumes(tmp_path, tiny_model_dir):
    worker = ModelHost(str(tiny_model_dir), optim={"lr": 1e-3}, total_steps=4, role="critic")
    batch = critic_batch(n=4, seed=6)
    out = worker.values(batch, out_key="values", max_tokens_per_mb=512)
    assert isinstance(worker.engine, ValueEngine) and worker.role == "critic"
    assert torch.all(out["values"] == 0) and out.cu_seqlens.tolist() == batch.cu_seqlens.tolist()
    b = with_returns(batch, out["values"])
    _, stats = worker.train(b, params={"loss": "value", "value_clip": 0.2}, max_tokens_per_mb=512)
    assert stats["value_loss"] > 0
    assert float(worker.values(batch, "values", 512)["values"].abs().max()) > 0
    with pytest.raises(RuntimeError, match="critic"):
        worker.logprob(batch, out_key="prox_logprobs", max_tokens_per_mb=512)
    worker.save_checkpoint(str(tmp_path / "critic"))

    # resume: a new critic worker takes the critic checkpoint; a policy worker refuses it
    resumed = ModelHost(str(tiny_model_dir), optim={"lr": 1e-3}, total_steps=4, role="critic")
    resumed.load_checkpoint(str(tmp_path / "critic"))
    assert torch.equal(resumed.values(batch, "values", 512)["values"], worker.values(batch, "values", 512)["values"])
    with pytest.raises(ValueError, match="a critic's checkpoint .* but this model is a policy"):
        ModelHost(str(tiny_model_dir), optim={"lr": 1e-3}, total_steps=4).load_checkpoint(str(tmp_path / "critic"))


def test_a_policy_worker_refuses_value_calls(tiny_model_dir):
    worker = ModelHost(str(tiny_model_dir), optim=None)
    batch = critic_batch(n=2, seed=7)
    worker.logprob(batch, out_key="ref_logprobs", max_tokens_per_mb=512)
    with pytest.raises(RuntimeError, match="policy"):
        worker.values(batch, out_key="values", max_tokens_per_mb=512)
