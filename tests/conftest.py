"""Fixtures every part of the tree uses. Tests never download anything: models are built from
a config, tokenizers trained on the spot. Helpers that are not fixtures live in support/."""

from __future__ import annotations

import pytest

from support.calc_memorised import build_memorised_calc
from support.e2e import build_kit
from support.tiny_models import build_random_qwen2


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    """A directory holding a random tiny Qwen2 saved with save_pretrained (loads with Auto*)."""
    path = tmp_path_factory.mktemp("tiny_qwen2")
    build_random_qwen2().save_pretrained(path)
    return path


@pytest.fixture(scope="session")
def kit(tmp_path_factory):
    """The e2e kit (support/e2e.py:build_kit): a random tiny Qwen2 with a trained tokenizer
    and train/test JSONL, built once for every whole-run test."""
    return build_kit(tmp_path_factory.mktemp("kit"))


@pytest.fixture(scope="session")
def memorised_calc(tmp_path_factory):
    """A tiny model that replays one calculator episode (support/calc_memorised.py), built once
    for the MCP tool agent's tests: (root, row, (episode ids, SFT labels))."""
    return build_memorised_calc(tmp_path_factory.mktemp("memorised_calc"))


@pytest.fixture(scope="module")
def one_torch_thread():
    """Tiny matmuls: one thread is faster than two fighting over a shared machine's cores.
    Use per module: `pytestmark = pytest.mark.usefixtures("one_torch_thread")`."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def pytest_collection_modifyitems(config, items):
    """`gpu` tests need CUDA: on a machine without it (CI, a laptop) they are skipped, with the
    reason in the summary, rather than failing on the first `.cuda()` (`make test-gpu`)."""
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device (torch.cuda.is_available() is False)")
    for item in items:
        if item.get_closest_marker("gpu") is not None:  # the marker, not a keyword (a parameter id "gpu")
            item.add_marker(skip)
