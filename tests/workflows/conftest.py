"""Fixtures of the agent tests: the tiny tool-conversation model (support/openai_tool_model.py),
its tokenizer, and one inference server subprocess serving it for the whole module."""

from __future__ import annotations

import pytest

from support.openai_tool_model import build_tool_model


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
