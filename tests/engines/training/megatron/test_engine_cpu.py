"""What of engines/training/megatron/engine.py runs without a GPU: its refusals, and (with
megatron-core installed) the weight paths around the forward: HF weights into a CPU-built
GPTModel, back out for a weight sync, into an exported directory `from_pretrained` loads,
and through a checkpoint. The forward itself needs CUDA: test_engine_cuda.py."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from areal_graph.engines.training.megatron import engine as E
from areal_graph.engines.training.megatron import layout
from support.tiny_models import build_random_qwen2


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without CUDA")
def test_without_cuda_it_says_so(tiny_model_dir):
    with pytest.raises(RuntimeError, match="backend megatron needs a CUDA device"):
        E.MegatronTrainEngine(tiny_model_dir, device="cuda")
    with pytest.raises(RuntimeError, match="backend megatron needs a CUDA device"):
        E.MegatronTrainEngine(tiny_model_dir, device="cpu")


def test_model_parallelism_is_refused_as_not_built(tiny_model_dir):
    with pytest.raises(ValueError, match="tensor_parallel=2.*not built yet"):
        E.MegatronTrainEngine(tiny_model_dir, device="cuda", tensor_parallel=2)
    with pytest.raises(ValueError, match="precision"):
        E.MegatronTrainEngine(tiny_model_dir, device="cuda", precision="fp16")


def test_the_engine_has_what_a_model_host_drives():
    from areal_graph.engines.training.protocol import TrainingEngine

    for name in (
        "compute_logprobs",
        "train_step",
        "state_dict_for_sync",
        "export_hf",
        "save_checkpoint",
        "load_checkpoint",
    ):
        assert callable(getattr(E.MegatronTrainEngine, name)), name
    assert E.MegatronTrainEngine.parallel == "none"
    assert {"version", "total_steps", "parallel"} <= set(TrainingEngine.__annotations__)


@pytest.fixture(scope="module")
def cpu_engine(tmp_path_factory):
    """A MegatronTrainEngine around a CPU-built GPTModel (its __init__ needs CUDA), with the
    weights of a saved tiny Qwen2 loaded the way __init__ loads them."""
    pytest.importorskip("megatron.core")
    import torch.distributed as dist
    from megatron.core import parallel_state

    src = tmp_path_factory.mktemp("src")
    hf = build_random_qwen2(seed=3)
    hf.save_pretrained(src)
    (src / "tokenizer_config.json").write_text("{}")
    owned = not dist.is_initialized()
    if owned:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{E._free_port()}", rank=0, world_size=1)
    fresh = not parallel_state.model_parallel_is_initialized()  # an engine in this process may have made them
    if fresh:
        parallel_state.initialize_model_parallel(1, 1, create_gloo_process_groups=False)
    eng = E.MegatronTrainEngine.__new__(E.MegatronTrainEngine)
    eng.model_path, eng.hf_config, eng.shape = Path(src), hf.config, layout.shape_of(hf.config)
    eng.model = E.build_gpt_model(hf.config, cpu_init=True)
    eng._load_hf_state(E.read_safetensors_dir(src), str(src))
    eng.version = 0
    eng.optimizer = torch.optim.AdamW(eng.model.parameters(), lr=1e-3)
    yield eng, hf
    if fresh:
        parallel_state.destroy_model_parallel()
    if owned:
        dist.destroy_process_group()


def test_sync_state_is_the_hf_state_dict(cpu_engine):
    eng, hf = cpu_engine
    sync = eng.state_dict_for_sync()
    assert set(sync) == set(hf.state_dict())
    for k, v in hf.state_dict().items():
        assert sync[k].device.type == "cpu" and torch.equal(sync[k], v), k
    assert sync["lm_head.weight"] is sync["model.embed_tokens.weight"]  # tied: one tensor, two names


def test_export_loads_with_from_pretrained(cpu_engine, tmp_path):
    from transformers import AutoModelForCausalLM

    eng, hf = cpu_engine
    out = eng.export_hf(tmp_path / "export")
    assert (out / "tokenizer_config.json").exists() and not list(tmp_path.glob("export.tmp*"))
    loaded = AutoModelForCausalLM.from_pretrained(out)
    assert loaded.dtype == torch.float32
    for k, v in hf.state_dict().items():
        assert torch.equal(loaded.state_dict()[k], v), k


def test_a_checkpoint_restores_weights_version_and_optimizer(cpu_engine, tmp_path):
    eng, hf = cpu_engine
    eng.version = 3
    eng.save_checkpoint(tmp_path / "ckpt")
    before = {k: v.clone() for k, v in eng.model.state_dict().items() if isinstance(v, torch.Tensor)}
    with torch.no_grad():
        for p in eng.model.parameters():
            p.add_(1.0)
    eng.version = 7
    eng.load_checkpoint(tmp_path / "ckpt")
    assert eng.version == 3
    for k, v in eng.model.state_dict().items():
        if isinstance(v, torch.Tensor):
            assert torch.equal(v, before[k]), k
    state = torch.load(tmp_path / "ckpt" / "trainer_state.pt", weights_only=True)
    del state["backend"]  # as the torch backend writes it: its optimizer numbers HF parameters
    torch.save(state, tmp_path / "ckpt" / "trainer_state.pt")
    with pytest.raises(ValueError, match="torch backend"):
        eng.load_checkpoint(tmp_path / "ckpt")
