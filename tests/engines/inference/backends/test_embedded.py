"""The embedded backend: the launch line of our own server and where its wire format departs from SGLang's.

The embedded server speaks SGLang's API plus what RL needs (backends/embedded.py), so this
checks the differences: its command line must be one `http_server.py`'s own parser accepts
(a flag it does not know would kill the server at start), the key travels in the
environment and never in argv, weights come in through shared memory, pausing keeps requests
in place, and per-token versions from `meta_info.output_token_versions` are used.
"""

from __future__ import annotations

import sys

from areal_graph.api.process import RUN_TOKEN_ENV
from areal_graph.engines.inference.backends import get_backend
from areal_graph.engines.inference.backends.base import HttpCall, ServerLaunch
from areal_graph.engines.inference.backends.embedded import EmbeddedBackend
from areal_graph.engines.inference.backends.sglang import SGLangBackend
from areal_graph.engines.inference.sampling import SamplingParams
from areal_graph.engines.inference.server.args import build_arg_parser, speculative_settings
from areal_graph.engines.inference.speculation.speculator import SpeculativeSettings
from areal_graph.graph.spec import InferenceSpec, SpeculativeSpec

EMBEDDED = EmbeddedBackend()


def test_registered_with_its_traits():
    assert isinstance(get_backend("embedded"), EmbeddedBackend) and isinstance(EMBEDDED, SGLangBackend)
    assert EMBEDDED.name == "embedded" and EMBEDDED.shared_memory_weights and EMBEDDED.server_spans
    assert EMBEDDED.startup_timeout_s == 180.0 and not EMBEDDED.pause_around_update
    assert EMBEDDED.unavailable(None) is None  # it needs nothing beyond this package


def test_command_is_one_the_servers_own_parser_accepts():
    spec = InferenceSpec(
        kv_on_update="recompute", max_running_requests=24, args={"device": "cuda:1", "max_queue": 8, "max_context": 256}
    )
    cmd = EMBEDDED.command(
        ServerLaunch(
            spec, "/runs/x/model", 31000, threads=3, seed=7, name="inference-2", api_key=None, host="127.0.0.1"
        )
    )
    assert cmd[:3] == [sys.executable, "-m", "areal_graph.engines.inference.server.http_server"]
    args = build_arg_parser().parse_args(cmd[3:])
    assert (args.model, args.host, args.port, args.max_running) == ("/runs/x/model", "127.0.0.1", 31000, 24)
    assert (args.threads, args.seed, args.name, args.api_key_env) == (3, 7, "inference-2", None)
    assert (args.device, args.max_queue, args.max_context) == ("cuda:1", 8, 256)
    assert args.kv_on_update == "recompute" and "--kv-on-update" not in cmd
    for mode in ("keep", "wait"):
        cmd = EMBEDDED.command(
            ServerLaunch(InferenceSpec(kv_on_update=mode), "/m", 1, 1, 0, "inference", None, "127.0.0.1")
        )
        assert build_arg_parser().parse_args(cmd[3:]).kv_on_update == mode


def test_inference_speculative_becomes_flags_the_server_reads_back():
    """Off (the default): no flag. On: `--speculative on` and the settings that differ from the
    server's defaults, which its parser turns back into the section's values."""
    cmd = EMBEDDED.command(
        ServerLaunch(InferenceSpec(kv_on_update="recompute"), "/m", 1, 1, 0, "inference", None, "127.0.0.1")
    )
    assert not any(part.startswith("--speculative") for part in cmd)
    assert speculative_settings(build_arg_parser().parse_args(cmd[3:])).enabled is False
    section = SpeculativeSpec(enabled=True, max_draft=6, max_rows=16, min_match=3, max_match=5, history_answers=0)
    cmd = EMBEDDED.command(
        ServerLaunch(
            InferenceSpec(kv_on_update="recompute", speculative=section), "/m", 1, 1, 0, "inference", None, "127.0.0.1"
        )
    )
    assert cmd[-12:] == [
        "--speculative",
        "on",
        "--speculative-max-draft",
        "6",
        "--speculative-max-rows",
        "16",
        "--speculative-min-match",
        "3",
        "--speculative-max-match",
        "5",
        "--speculative-history-answers",
        "0",
    ]
    settings = speculative_settings(build_arg_parser().parse_args(cmd[3:]))
    assert settings == SpeculativeSettings(
        enabled=True, max_draft=6, max_rows=16, min_match=3, max_match=5, history_prompts=128, history_answers=0
    )


def test_the_api_key_travels_in_the_environment_never_in_argv():
    cmd = EMBEDDED.command(
        ServerLaunch(
            InferenceSpec(kv_on_update="recompute"), "/m", 1, 1, 0, "inference", api_key="s3cret-key", host="127.0.0.1"
        )
    )
    assert not any("s3cret" in part for part in cmd)
    assert build_arg_parser().parse_args(cmd[3:]).api_key_env == RUN_TOKEN_ENV
    assert RUN_TOKEN_ENV == "AREAL_RUN_TOKEN"


def test_resources_one_gpu_only_on_cuda_and_its_generation_threads():
    assert EMBEDDED.gpus(InferenceSpec(kv_on_update="recompute")) == 0
    assert EMBEDDED.gpus(InferenceSpec(args={"device": "cpu"})) == 0
    assert EMBEDDED.gpus(InferenceSpec(args={"device": "cuda"})) == 1
    assert EMBEDDED.gpus(InferenceSpec(args={"device": "cuda:3", "tp_size": 4})) == 1  # no tensor parallelism
    assert EMBEDDED.cpus(6) == 6 and EMBEDDED.thread_cap(6) == 6


def test_weight_updates_shared_memory_or_disk_in_one_call_each():
    [shm] = EMBEDDED.shared_memory_update_calls("/dev/shm/areal-w", [{"name": "a", "offset": 0}], 9)
    assert shm == HttpCall(
        "POST",
        "/update_weights_from_shared_memory",
        {"path": "/dev/shm/areal-w", "manifest": [{"name": "a", "offset": 0}], "weight_version": 9},
    )
    assert type(shm.payload["weight_version"]) is int
    [disk] = EMBEDDED.disk_update_calls("/ckpt/v9", 9)
    assert disk == HttpCall("POST", "/update_weights_from_disk", {"model_path": "/ckpt/v9", "weight_version": "9"})


def test_pause_keeps_requests_in_place():
    assert EMBEDDED.pause_call() == HttpCall("POST", "/pause_generation", {"mode": "in_place"})
    assert EMBEDDED.resume_call() == HttpCall("POST", "/continue_generation", {})


def test_generate_payload_is_sglangs_and_per_token_versions_are_read():
    call = EMBEDDED.generate_call([1, 2], SamplingParams(max_new_tokens=3, greedy=True), "q")
    assert call.path == "/generate" and call.payload["sampling_params"]["temperature"] == 0.0
    body = {
        "output_ids": [5, 6, 7],
        "meta_info": {
            "finish_reason": {"type": "length", "length": 3},
            "prompt_tokens": 2,
            "weight_version": "2",
            "output_token_logprobs": [[-0.1, 5, None], [-0.2, 6, None], [-0.3, 7, None]],
            "output_token_versions": [1, 1, 2],
        },
    }
    parsed = EMBEDDED.parse_generate(body)
    assert parsed.output_ids == [5, 6, 7] and parsed.versions == [1, 1, 2] and parsed.response_version == 2
    assert parsed.output_logprobs == [-0.1, -0.2, -0.3] and parsed.prompt_len == 2
