"""Loading a model's tokenizer, stop ids and checkpoints for the embedded engine, called directly.

The engine loads weights from what a trainer saved (a safetensors file, a save_pretrained
directory, sharded or not, or an old pytorch_model.bin), and a weight update must land
every tensor or fail naming the keys: a silently partial load would serve a model that is
half one version and half another. Tied embeddings are saved once, so their absence is fine.
The tokenizer is optional (a bare model dir serves token ids); the EOS ids decide when a
generation stops by default. All models are tiny and random; nothing is downloaded.
"""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import save_file

from areal_graph.engines.inference.model_io import eos_ids, load_state_dict_checked, read_checkpoint, try_load_tokenizer
from support.tiny_models import build_random_qwen2


def assert_same_weights(a: torch.nn.Module, b: torch.nn.Module) -> None:
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    for k in sa:
        assert torch.equal(sa[k], sb[k]), k


# --------------------------------------------------------------------------- tokenizer
def test_a_model_dir_without_tokenizer_files_has_no_tokenizer(tiny_model_dir):
    assert not any(tiny_model_dir.glob("tokenizer*"))
    assert try_load_tokenizer(tiny_model_dir) is None
    assert try_load_tokenizer(str(tiny_model_dir)) is None


def test_a_saved_tokenizer_loads_back(tmp_path):
    from areal_graph.modelkit.tokenizer import EOS, train_tokenizer

    tok = train_tokenizer(["one two three 123", "four five six 456"], vocab_size=300)
    tok.save_pretrained(tmp_path)
    loaded = try_load_tokenizer(tmp_path)
    assert loaded is not None
    ids = loaded("two five 42", add_special_tokens=False).input_ids
    assert ids == tok("two five 42", add_special_tokens=False).input_ids
    assert loaded.decode(ids) == "two five 42" and loaded.convert_ids_to_tokens(loaded.eos_token_id) == EOS


def test_unreadable_tokenizer_files_give_none(tmp_path):
    (tmp_path / "tokenizer_config.json").write_text("{not json")
    assert try_load_tokenizer(tmp_path) is None


# --------------------------------------------------------------------------- eos ids
def fake_model(generation_eos=None, config_eos=None, has_generation_config=True):
    gen = SimpleNamespace(eos_token_id=generation_eos) if has_generation_config else None
    return SimpleNamespace(generation_config=gen, config=SimpleNamespace(eos_token_id=config_eos))


def test_eos_ids_generation_config_first_then_config_then_tokenizer():
    tok = SimpleNamespace(eos_token_id=9)
    assert eos_ids(fake_model([2, 5], 3), tok) == [2, 5]
    assert eos_ids(fake_model((4,), 3), tok) == [4]
    assert eos_ids(fake_model(None, 3), tok) == [3]
    assert eos_ids(fake_model(None, [3, 7], has_generation_config=False), tok) == [3, 7]
    assert eos_ids(fake_model(None, None), tok) == [9]
    assert eos_ids(fake_model(None, None), SimpleNamespace(eos_token_id=None)) == []
    assert eos_ids(fake_model(None, None), None) == []
    assert eos_ids(fake_model(0, 3), None) == [0]  # id 0 is an id, not "unset"
    assert all(type(e) is int for e in eos_ids(fake_model([torch.tensor(2)], None), None))


def test_eos_ids_of_a_real_tiny_model():
    assert eos_ids(build_random_qwen2(), None) == [2]


# --------------------------------------------------------------------------- checkpoints
def test_read_a_save_pretrained_directory_and_load_it(tiny_model_dir):
    sd = read_checkpoint(tiny_model_dir, torch.float32)
    saved = build_random_qwen2(seed=0)  # what the fixture saved
    assert set(sd) <= set(saved.state_dict()) and "model.embed_tokens.weight" in sd
    fresh = build_random_qwen2(seed=5)
    assert not torch.equal(fresh.model.embed_tokens.weight, saved.model.embed_tokens.weight)
    load_state_dict_checked(fresh, sd)
    assert_same_weights(fresh, saved)
    assert fresh.lm_head.weight.data_ptr() == fresh.model.embed_tokens.weight.data_ptr()  # still tied


def test_read_a_single_safetensors_file(tmp_path):
    model = build_random_qwen2(seed=1)
    state = {k: v.contiguous() for k, v in model.state_dict().items() if k != "lm_head.weight"}
    save_file(state, str(tmp_path / "weights.safetensors"))
    sd = read_checkpoint(tmp_path / "weights.safetensors", torch.float32)
    assert sd.keys() == state.keys() and all(torch.equal(sd[k], state[k]) for k in state)


def test_read_a_sharded_directory_merges_every_shard(tmp_path):
    model = build_random_qwen2(seed=2)
    model.save_pretrained(tmp_path, max_shard_size="40KB")
    assert len(list(tmp_path.glob("*.safetensors"))) > 1
    sd = read_checkpoint(tmp_path, torch.float32)
    fresh = build_random_qwen2(seed=3)
    load_state_dict_checked(fresh, sd)
    assert_same_weights(fresh, model)


def test_read_a_pytorch_bin_directory_in_the_asked_dtype(tmp_path):
    model = build_random_qwen2(seed=4)
    model.config.save_pretrained(tmp_path)
    torch.save(model.state_dict(), tmp_path / "pytorch_model.bin")
    sd = read_checkpoint(tmp_path, torch.bfloat16)
    assert sd["model.norm.weight"].dtype == torch.bfloat16
    assert torch.equal(
        sd["model.layers.0.mlp.up_proj.weight"], model.model.layers[0].mlp.up_proj.weight.detach().to(torch.bfloat16)
    )


def test_read_a_missing_checkpoint_names_it(tmp_path):
    with pytest.raises(FileNotFoundError, match="no checkpoint at .*nowhere"):
        read_checkpoint(tmp_path / "nowhere", torch.float32)


def test_load_rejects_unexpected_and_missing_keys():
    model = build_random_qwen2(seed=0)
    good = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(ValueError, match=r"keys the model does not: \['model.extra.weight'\]"):
        load_state_dict_checked(model, {**good, "model.extra.weight": torch.zeros(1)})
    partial = {k: v for k, v in good.items() if k != "model.norm.weight"}
    with pytest.raises(ValueError, match=r"lack keys the model needs: \['model.norm.weight'\]"):
        load_state_dict_checked(model, partial)
    with pytest.raises(ValueError, match="lack keys"):
        load_state_dict_checked(model, {})


def test_an_untied_head_must_be_in_the_weights():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    llama = LlamaForCausalLM(
        LlamaConfig(
            vocab_size=32,
            hidden_size=16,
            intermediate_size=32,
            num_hidden_layers=1,
            num_attention_heads=2,
            num_key_value_heads=1,
            tie_word_embeddings=False,
        )
    )
    state = {k: v.clone() for k, v in llama.state_dict().items()}
    assert "lm_head.weight" in state
    load_state_dict_checked(llama, state)  # complete: fine
    without_head = {k: v for k, v in state.items() if k != "lm_head.weight"}
    with pytest.raises(ValueError, match=r"\['lm_head.weight'\]"):
        load_state_dict_checked(llama, without_head)


def test_tied_head_may_be_absent_but_the_embedding_may_not():
    model = build_random_qwen2(seed=0)
    donor = build_random_qwen2(seed=1)
    state = {k: v.clone() for k, v in donor.state_dict().items() if k != "lm_head.weight"}
    load_state_dict_checked(model, state)
    assert torch.equal(model.lm_head.weight, donor.model.embed_tokens.weight)
    no_embedding = {k: v for k, v in state.items() if k != "model.embed_tokens.weight"}
    with pytest.raises(ValueError, match="embed_tokens"):
        load_state_dict_checked(build_random_qwen2(seed=0), no_embedding)


def test_a_directory_without_weights_is_an_error(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "qwen2"}))
    with pytest.raises(OSError, match="no file named"):  # transformers refuses; nothing is invented
        read_checkpoint(tmp_path, torch.float32)
