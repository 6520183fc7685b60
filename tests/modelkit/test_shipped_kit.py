"""The shipped warm starts (tiny-arith, tiny-arith-long, tiny-arith-ladder, tiny-games, tiny-tictactoe; modelkit/shipped.py): it is the current recipe's, it
installs byte for byte, and damage or a changed recipe never goes unnoticed."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import pytest

from areal_graph.modelkit import shipped
from areal_graph.modelkit.kit_cache import ensure_kit
from areal_graph.modelkit.recipes import BUILTIN_KITS, KitConfig
from areal_graph.modelkit.shipped import ShippedKitError, install_shipped, sha256, shipped_info

TINY = BUILTIN_KITS["tiny-arith"]


@pytest.mark.parametrize("name", ["tiny-arith", "tiny-arith-long", "tiny-arith-ladder", "tiny-games", "tiny-tictactoe"])
def test_the_shipped_warm_start_is_the_current_recipes(name):
    kit = BUILTIN_KITS[name]
    info = shipped_info(name)
    assert info is not None, f"no shipped {name} kit: python -m areal_graph.modelkit.shipped {name}"
    assert info["fingerprint"] == kit.fingerprint(), (
        f"the {name} recipe changed since its warm start was shipped; ship it again with "
        f"`python -m areal_graph.modelkit.shipped {name}` (and re-measure the README's numbers)"
    )
    assert info["recipe"] == json.loads(json.dumps(kit.recipe()))
    assert info["source"] == "recipe" and info["torch_threads"] == shipped.SHIP_THREADS
    assert set(info["model_sha256"]) >= {"model.safetensors", "config.json", "tokenizer.json"}
    size = sum(p.stat().st_size for p in (shipped.SHIPPED_ROOT / name / "model").iterdir())
    assert size < 8 << 20, f"{size} bytes shipped"


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("cache")
    kit = ensure_kit(TINY, root=root)
    assert kit.info["source"] == "shipped"
    return kit.path


def test_install_copies_the_model_and_regenerates_the_data_it_was_built_on(installed):
    """Every model file equals the shipped one and the data generated here hashes to what the
    kit was built on; the kit loads with the Auto classes and greedy decoding gives the
    accuracy the build measured (on the same 500 problems; a near-tie may flip on another CPU)."""
    from areal_graph.engines.inference.offline_eval import evaluate_model

    info = json.loads((installed / "kit.json").read_text())
    for name, digest in info["model_sha256"].items():
        assert sha256(installed / "model" / name) == digest
    for name, digest in info["data_sha256"].items():
        assert sha256(installed / "data" / name) == digest
    result = evaluate_model(
        installed / "model",
        installed / "data" / "test.jsonl",
        limit=info["eval_prompts"],
        max_new_tokens=info["eval_max_new_tokens"],
    )
    assert abs(result["greedy_accuracy"] - info["warm_start_greedy_accuracy"]) <= 0.01


def test_a_damaged_shipped_file_is_an_error_naming_it(tmp_path):
    root = tmp_path / "shipped"
    shutil.copytree(shipped.SHIPPED_ROOT / "tiny-arith", root / "tiny-arith")
    weights = root / "tiny-arith" / "model" / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 1
    weights.write_bytes(bytes(data))
    with pytest.raises(ShippedKitError, match="model.safetensors.*damaged"):
        install_shipped(TINY, tmp_path / "out", lambda msg: None, root=root)


def test_another_recipe_or_other_data_builds_from_the_recipe(tmp_path, caplog):
    """A recipe that is not the shipped one's gets nothing shipped; data generated differently
    from the shipped kit's (another Python's `random`, say) falls back to the recipe, with a warning."""
    assert install_shipped(dataclasses.replace(TINY, sft_seed=1), tmp_path / "a", lambda m: None) is None
    assert install_shipped(KitConfig(name="mini"), tmp_path / "b", lambda m: None) is None
    root = tmp_path / "shipped"
    shutil.copytree(shipped.SHIPPED_ROOT / "tiny-arith", root / "tiny-arith")
    info_path = root / "tiny-arith" / "kit.json"
    info = json.loads(info_path.read_text())
    info["data_sha256"]["test.jsonl"] = "0" * 64
    info_path.write_text(json.dumps(info))
    assert install_shipped(TINY, tmp_path / "c", lambda m: None, root=root) is None
    assert "building the kit from its recipe instead" in caplog.text
