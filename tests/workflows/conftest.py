"""Fixtures of the agent tests: the tiny tool-conversation model (support/openai_tool_model.py),
its tokenizer, and one inference server subprocess serving it for the whole module; textarena
(skipped where it is not installed) and the tiny-arith kit for the game rollouts' tests."""

from __future__ import annotations

import pytest

from support.ci import optional
from support.openai_tool_model import build_tool_model


@pytest.fixture(scope="module")
def ta():
    return optional("textarena", "pip install 'textarena==0.7.4' (in the dev extra)")


@pytest.fixture(scope="module")
def tiny_arith_dir():
    """The shipped tiny-arith kit's model: a ChatML tokenizer the game tests tokenise with."""
    from areal_graph.modelkit.builtin import resolve_model_path

    return resolve_model_path("builtin:tiny-arith")


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory):
    return build_tool_model(str(tmp_path_factory.getbasetemp() / "openai_tool_model"))


@pytest.fixture(scope="module")
def tokenizer(model_dirs):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_dirs[0])


@pytest.fixture(scope="module")
def server(model_dirs):
    from areal_graph.engines.inference.server.process import ServerProcess

    proc = ServerProcess(str(model_dirs[0]), extra_args=["--threads", "1", "--max-running", "8"])
    proc.start()
    yield proc.url
    proc.stop()
