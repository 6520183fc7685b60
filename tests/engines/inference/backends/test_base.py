"""The backend base class's contract and the pure helpers every backend's wire format uses.

`InferenceBackend` is what a new backend inherits: its defaults (no GPUs, no extra
environment, the controller's own Python) must be the embedded server's, and every call a
backend must describe itself has to fail loudly instead of sending a half-made request. The
helpers (`parse_version`, `finish_type`, `logprob_or_nan`, `launch_flags`) turn server
answers and `inference.args` into the client's and the launcher's terms; a wrong mapping
there shows up as a wrong policy version, a resubmitted answer or a dropped launch option.
"""

from __future__ import annotations

import logging
import math
import os
import sys
from types import SimpleNamespace

import pytest

from areal_graph.engines.inference.backends.base import (
    HttpCall,
    InferenceBackend,
    ParsedGeneration,
    ServerLaunch,
    finish_type,
    launch_flags,
    logprob_or_nan,
    parse_version,
)
from areal_graph.engines.inference.sampling import SamplingParams


def test_defaults_of_a_backend_that_says_nothing():
    b = InferenceBackend()
    assert b.name == "" and b.shared_memory_weights is False and b.server_spans is False
    assert b.startup_timeout_s == 180.0 and b.pause_around_update is False
    assert b.unavailable(None) is None and b.unavailable("/some/python") is None
    assert b.environment("key") == {} and b.environment(None) == {}
    assert b.gpus(SimpleNamespace(args={"tp_size": 4})) == 0
    assert (b.cpus(3), b.thread_cap(3)) == (3, 3)


def test_every_wire_call_a_backend_must_describe_raises():
    b = InferenceBackend()
    calls = [
        lambda: b.command(ServerLaunch(SimpleNamespace(), "/m", 1, 1, 0, "n", None, "127.0.0.1")),
        lambda: b.generate_call([1], SamplingParams(), "r"),
        lambda: b.parse_generate({}),
        lambda: b.abort_call("r", False),
        lambda: b.pause_call(),
        lambda: b.resume_call(),
        lambda: b.disk_update_calls("/w", 1),
        lambda: b.model_info_call(),
    ]
    for call in calls:
        with pytest.raises(NotImplementedError):
            call()


def test_shared_memory_refusal_names_the_backend():
    class Plain(InferenceBackend):
        name = "plain"

    with pytest.raises(NotImplementedError, match="the plain backend cannot load weights from shared memory"):
        Plain().shared_memory_update_calls("/dev/shm/w", [], 3)


def test_interpreter_is_the_configured_python_made_absolute_else_this_one(tmp_path, monkeypatch):
    assert InferenceBackend.interpreter(SimpleNamespace(python=None)) == sys.executable
    assert InferenceBackend.interpreter(SimpleNamespace(python="")) == sys.executable
    monkeypatch.chdir(tmp_path)
    got = InferenceBackend.interpreter(SimpleNamespace(python="venv/bin/python"))
    assert got == os.path.join(str(tmp_path), "venv", "bin", "python") and os.path.isabs(got)
    assert InferenceBackend.interpreter(SimpleNamespace(python="/opt/py/bin/python")) == "/opt/py/bin/python"


def test_model_info_version_reads_weight_version_of_a_dict_only():
    b = InferenceBackend()
    assert b.parse_model_info_version({"weight_version": "7"}) == 7
    assert b.parse_model_info_version({"weight_version": 3}) == 3
    assert b.parse_model_info_version({"weight_version": "default"}) is None
    assert b.parse_model_info_version({}) is None
    assert b.parse_model_info_version(["weight_version"]) is None
    assert b.parse_model_info_version(None) is None


@pytest.mark.parametrize(
    "raw, want",
    [
        (5, 5),
        ("12", 12),
        ("-1", -1),
        ("default", None),
        (None, None),
        ("3.5", None),
        ([1], None),
        ("", None),
    ],
)
def test_parse_version(raw, want):
    assert parse_version(raw) == want


def test_finish_type_maps_strings_and_sglang_objects(caplog):
    for kind in ("stop", "length", "abort"):
        assert finish_type(kind) == kind
        assert finish_type({"type": kind, "matched": 2}) == kind
    with caplog.at_level(logging.WARNING, logger="areal_graph.engines.inference.backends.base"):
        assert finish_type(None) == "abort"  # SGLang's value while unfinished: no warning
        assert finish_type({"type": None}) == "abort"
        assert not caplog.records
        assert finish_type("eos") == "abort"
        assert finish_type({"type": "tool_calls"}) == "abort"
    assert [r.getMessage() for r in caplog.records] == [
        "unknown finish_reason 'eos'; treating it as abort",
        "unknown finish_reason 'tool_calls'; treating it as abort",
    ]


def test_logprob_or_nan():
    assert logprob_or_nan(-0.25) == -0.25 and logprob_or_nan(0) == 0.0 and logprob_or_nan("-1.5") == -1.5
    assert isinstance(logprob_or_nan(-1), float)
    assert math.isnan(logprob_or_nan(None))


def test_launch_flags_dash_names_bare_true_and_drop_false_or_none():
    args = {
        "mem_fraction_static": 0.8,
        "enable_torch_compile": True,
        "disable_cuda_graph": False,
        "chunked_prefill_size": None,
        "tp_size": 2,
        "dtype": "bfloat16",
    }
    assert launch_flags(args) == [
        "--mem-fraction-static",
        "0.8",
        "--enable-torch-compile",
        "--tp-size",
        "2",
        "--dtype",
        "bfloat16",
    ]
    assert launch_flags({}) == []
    assert launch_flags({"x": 1}) == ["--x", "1"]  # 1 == True, but only True itself is a bare flag


def test_launch_flags_keep_a_zero_value():
    assert launch_flags({"swap_space": 0, "min_p": 0.0}) == ["--swap-space", "0", "--min-p", "0.0"]


def test_calls_and_parsed_generations_are_frozen_plain_data():
    call = HttpCall("POST", "/generate", {"a": 1})
    assert call == HttpCall("POST", "/generate", {"a": 1}) and HttpCall("GET", "/x").payload is None
    with pytest.raises(AttributeError):
        call.path = "/other"  # type: ignore[misc]
    parsed = ParsedGeneration([1], [-0.5], None, 3, "stop", 2)
    with pytest.raises(AttributeError):
        parsed.finish_reason = "abort"  # type: ignore[misc]


@pytest.mark.parametrize(
    "backend, args, limit",
    [
        ("embedded", {"max_context": 300}, 300),
        ("embedded", {}, None),
        ("vllm", {"max-model-len": "2048"}, 2048),  # either spelling of the flag
        ("sglang", {"context_length": 4096, "max_context": 1}, 4096),  # only its own flag counts
    ],
)
def test_the_context_a_server_is_told_to_use(backend, args, limit):
    """What `validate` measures prompts against when inference.args caps the context (cli/prompt_fit.py)."""
    from areal_graph.engines.inference.backends import get_backend

    assert get_backend(backend).context_limit(SimpleNamespace(args=args)) == limit
