"""MegatronTrainEngine against the torch backend on one GPU: the same random tiny model and
packed batch give the same log-probs (TrainEngine's HF path), loss and gradients (one
backward through the HF model, scored by packed_scoring's `rows_logprobs`), and weights that,
synced into the HF model, give the Megatron model's log-probs.

fp32 with TF32 off: log-probs within 1e-4, the loss within 1e-5 relative, gradients within
1e-4 relative norm (all of them together; 1e-3 per tensor). bf16 (autocast, fp32 master
weights) against the fp32 torch engine, with bf16's rounding: log-probs within 3e-2, the loss
within 2e-2 relative, gradients within 5e-2 relative norm. Random weights, no downloads.
"""

from __future__ import annotations

import pytest
import torch

from areal_graph.data.packed import PackedBatch
from areal_graph.engines.training.packed_scoring import rows_logprobs
from areal_graph.engines.training.train_engine import TrainEngine
from support.tiny_models import build_random_qwen2

pytestmark = [pytest.mark.gpu]
pytest.importorskip("megatron.core")

from areal_graph.engines.training.megatron.engine import MegatronTrainEngine  # noqa: E402

MB_TOKENS = 48  # a few micro-batches per step: the loss shares must add up across them


@pytest.fixture(autouse=True, scope="module")
def no_tf32():
    old = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = old


def _qwen3():
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(1)
    return Qwen3ForCausalLM(
        Qwen3Config(
            vocab_size=96,
            hidden_size=64,
            intermediate_size=96,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=32,
            max_position_embeddings=256,
            tie_word_embeddings=False,
        )
    )


@pytest.fixture(scope="module", params=["qwen2", "qwen3"])
def model_dir(request, tmp_path_factory):
    """qwen2: tied, q/k/v biases; qwen3: untied, q/k norms, heads * head_dim != hidden."""
    path = tmp_path_factory.mktemp(request.param)
    model = build_random_qwen2(seed=2) if request.param == "qwen2" else _qwen3()
    with torch.no_grad():  # make norms and biases matter
        for name, p in model.named_parameters():
            if "norm" in name or name.endswith("bias"):
                p.add_(torch.randn_like(p) * 0.1)
    model.save_pretrained(path)
    return path


def make_batch(vocab: int) -> PackedBatch:
    g = torch.Generator().manual_seed(0)
    lens, prompts = [7, 23, 1, 15, 40, 9, 31, 4], [3, 5, 1, 6, 10, 4, 8, 2]
    ids = [torch.randint(3, vocab, (n,), generator=g).tolist() for n in lens]
    mask = [[0] * p + [1] * (n - p) for n, p in zip(lens, prompts)]
    return PackedBatch.from_sequences({"input_ids": ids, "loss_mask": mask})


def make_loss(batch: PackedBatch):
    """A policy-gradient-like loss with an entropy term, normalised by batch totals."""
    total = float((batch["loss_mask"] != 0).sum())

    def loss_fn(lp, ent, mb):
        m = (mb["loss_mask"] != 0).float()
        loss = -(lp * m).sum() / total - 0.01 * (ent * m).sum() / total
        return loss, {"scored": float(m.sum())}

    return loss_fn


def vocab_of(path) -> int:
    from transformers import AutoConfig

    return AutoConfig.from_pretrained(path).vocab_size


STEP_STATS = {"scored", "loss", "grad_norm", "lr", "tokens", "tokens_per_s", "n_microbatches", "n_forwards", "time_s"}


def reference_step(path, batch: PackedBatch) -> tuple[float, float, dict[str, torch.Tensor]]:
    """Loss, gradient norm and gradients (HF names) of one backward through the HF model, every
    sequence in its own padded row, scored as the torch backend scores them (packed_scoring's
    `rows_logprobs`): one backward over the whole batch, independent of how either engine
    splits it into micro-batches."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32).cuda().eval()
    lp, ent = rows_logprobs(
        model, batch, [[i] for i in range(batch.num_seqs)], with_entropy=True, score=batch["loss_mask"] != 0
    )
    loss, _ = make_loss(batch)(lp, ent, batch.to("cuda"))
    loss.backward()
    grads = {k: p.grad.detach().cpu() for k, p in model.named_parameters() if p.grad is not None}
    norm = float(torch.cat([g.flatten() for g in grads.values()]).norm())
    return float(loss), norm, grads


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm().clamp_min(1e-12))


def all_rel(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> float:
    names = sorted(want)
    return rel(torch.cat([got[k].flatten() for k in names]), torch.cat([want[k].flatten() for k in names]))


def test_matches_the_torch_backend_in_fp32(model_dir):
    batch = make_batch(vocab_of(model_dir))
    ref = TrainEngine(str(model_dir), device="cuda", lean=False, trainable=False)
    meg = MegatronTrainEngine(str(model_dir), device="cuda", lr=1e-3, grad_clip=0.0)  # 0: no clipping
    before = torch.zeros(0)
    for temperature in (1.0, 0.7):
        want = ref.compute_logprobs(batch, MB_TOKENS, temperature)
        got = meg.compute_logprobs(batch, MB_TOKENS, temperature)
        assert got.shape == want.shape and got.dtype == torch.float32
        assert torch.equal(got[batch.cu_seqlens[:-1].long()], torch.zeros(batch.num_seqs))
        assert (got - want).abs().max() < 1e-4, (got - want).abs().max()
        before = got if temperature == 1.0 else before

    loss, norm, want_g = reference_step(model_dir, batch)
    stats = meg.train_step(batch, make_loss(batch), MB_TOKENS)
    assert set(stats) == STEP_STATS and meg.version == 1 and stats["n_microbatches"] > 1
    assert stats["scored"] == float((batch["loss_mask"] != 0).sum())
    assert abs(stats["loss"] - loss) <= 1e-5 * abs(loss), (stats["loss"], loss)
    assert abs(stats["grad_norm"] - norm) <= 1e-4 * norm, (stats["grad_norm"], norm)
    got_g = meg.hf_grads()
    for k, g in want_g.items():
        assert rel(got_g[k], g) < 1e-3, (k, rel(got_g[k], g))
    assert all_rel(got_g, want_g) < 1e-4, all_rel(got_g, want_g)

    # the weights a sync moves, loaded into the HF model, give the Megatron model's log-probs
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    hf.load_state_dict(meg.state_dict_for_sync(), strict=True)
    synced = TrainEngine(hf, device="cuda", lean=False, trainable=False)
    got, want = meg.compute_logprobs(batch, MB_TOKENS), synced.compute_logprobs(batch, MB_TOKENS)
    assert (got - want).abs().max() < 1e-4, (got - want).abs().max()
    assert (got - before).abs().max() > 1e-4  # the step changed the weights


def test_checkpoint_resumes_exactly(model_dir, tmp_path):
    batch = make_batch(vocab_of(model_dir))
    meg = MegatronTrainEngine(str(model_dir), device="cuda", lr=1e-3, warmup_steps=2)
    meg.train_step(batch, make_loss(batch), MB_TOKENS)
    meg.save_checkpoint(tmp_path / "ckpt")
    saved = meg.compute_logprobs(batch, MB_TOKENS)
    after_one = meg.train_step(batch, make_loss(batch), MB_TOKENS)
    meg.train_step(batch, make_loss(batch), MB_TOKENS)
    meg.load_checkpoint(tmp_path / "ckpt")
    assert meg.version == 1 and torch.equal(meg.compute_logprobs(batch, MB_TOKENS), saved)
    again = meg.train_step(batch, make_loss(batch), MB_TOKENS)
    assert again["lr"] == after_one["lr"] and abs(again["loss"] - after_one["loss"]) < 1e-6


def test_bf16_is_close_to_fp32(model_dir):
    batch = make_batch(vocab_of(model_dir))
    ref = TrainEngine(str(model_dir), device="cuda", lean=False, trainable=False)
    meg = MegatronTrainEngine(str(model_dir), device="cuda", lr=1e-3, grad_clip=0.0, precision="bf16")
    got, want = meg.compute_logprobs(batch, MB_TOKENS), ref.compute_logprobs(batch, MB_TOKENS)
    assert (got - want).abs().max() < 3e-2, (got - want).abs().max()
    loss, _, want_g = reference_step(model_dir, batch)
    stats = meg.train_step(batch, make_loss(batch), MB_TOKENS)
    assert abs(stats["loss"] - loss) <= 2e-2 * abs(loss), (stats["loss"], loss)
    assert all_rel(meg.hf_grads(), want_g) < 5e-2, all_rel(meg.hf_grads(), want_g)
    assert all(p.dtype == torch.float32 for p in meg.model.parameters())  # fp32 master weights
