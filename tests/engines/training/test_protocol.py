"""engines/training/protocol.py is the whole of what a model host uses of its engine.

A second training backend is written against the Protocol alone, so the hosts must not reach
past it: every `engine.<name>` the hosts touch is a member of the Protocol, and both engines
have every member (mypy checks the signatures, tests/test_types.py; this checks the names
without it, and the hosts' side, which mypy cannot see through `host.engine` chains)."""

from __future__ import annotations

import re

from areal_graph.engines.training.protocol import TrainingEngine, ValueTrainingEngine
from areal_graph.engines.training.train_engine import TrainEngine
from areal_graph.engines.training.value_model import ValueEngine
from support.paths import REPO

HOSTS = ["runtime/hosts/model_host.py", "runtime/hosts/dp_model_host.py"]


def members(protocol: type) -> set[str]:
    names = {n for n in vars(protocol) if not n.startswith("_")}
    names |= set(getattr(protocol, "__annotations__", {}))
    for base in protocol.__mro__[1:]:
        if base.__name__ in ("TrainingEngine",):
            names |= members(base)
    return names


def test_the_protocol_names_what_a_backend_must_have():
    assert {
        "compute_logprobs",
        "train_step",
        "state_dict_for_sync",
        "export_hf",
        "save_checkpoint",
        "load_checkpoint",
        "version",
        "total_steps",
        "parallel",
    } <= members(TrainingEngine)
    assert members(ValueTrainingEngine) == members(TrainingEngine) | {"compute_values"}


def test_the_engines_have_every_member():
    engine = TrainEngine.__new__(TrainEngine)  # class-level view; attributes come from __init__
    for name in members(TrainingEngine):
        assert hasattr(TrainEngine, name) or name in TrainingEngine.__annotations__, name
    assert all(callable(getattr(TrainEngine, n)) for n in vars(TrainingEngine) if not n.startswith("_"))
    assert callable(ValueEngine.compute_values) and issubclass(ValueEngine, TrainEngine)
    del engine


def test_the_hosts_use_nothing_past_the_protocol():
    used: set[str] = set()
    for path in HOSTS:
        text = (REPO / path).read_text()
        used |= set(re.findall(r"\bengine\.([A-Za-z_]\w*)", text))
        used |= set(re.findall(r"\bcritic\.([A-Za-z_]\w*)", text))
    assert {"train_step", "compute_logprobs", "state_dict_for_sync"} <= used  # the pattern finds the calls
    assert used <= members(ValueTrainingEngine), used - members(ValueTrainingEngine)
