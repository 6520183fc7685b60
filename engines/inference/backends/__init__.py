"""Inference backends, by the name `inference.backend` gives them.

Adding a backend is one file here (a subclass of `InferenceBackend`, see base.py), one line
in `BACKENDS` and its name in `graph/spec.py`'s `InferenceSpec.backend` (tests/engines/inference/backends/test_backends.py
checks they agree; a backend without shared-memory weights also goes in
graph/workflow_rules.py's `check_runtime`, since the graph layer does not import backends). The client, the executor
and the launchers read everything else off the backend object.
"""

from __future__ import annotations

from areal_graph.engines.inference.backends.base import HttpCall, InferenceBackend, ParsedGeneration, ServerLaunch
from areal_graph.engines.inference.backends.embedded import EmbeddedBackend
from areal_graph.engines.inference.backends.sglang import SGLangBackend, sampling_to_json
from areal_graph.engines.inference.backends.vllm import VLLMBackend

BACKENDS: dict[str, InferenceBackend] = {b.name: b for b in (EmbeddedBackend(), SGLangBackend(), VLLMBackend())}
BACKEND_NAMES = tuple(BACKENDS)


def get_backend(name: str) -> InferenceBackend:
    try:
        return BACKENDS[name]
    except KeyError:
        raise ValueError(f"unknown inference backend {name!r}; choose one of {BACKEND_NAMES}") from None


__all__ = [
    "BACKENDS",
    "BACKEND_NAMES",
    "HttpCall",
    "InferenceBackend",
    "ParsedGeneration",
    "ServerLaunch",
    "get_backend",
    "sampling_to_json",
]
