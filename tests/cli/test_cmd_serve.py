"""`areal-graph serve` (cli/cmd_serve.py) without serving: `http_server.main` is replaced by a
recorder, so these tests check the argument checks that run first (port range, device, CUDA
on a machine without it, loopback-only without a key, unknown builtin model) and the exact
argv the command hands to the server process, which the server's own parser must read back
as the same settings. A real server is started in tests/engines/inference/server/test_http_server.py,
which also covers a missing MODEL_DIR, --max-running 0, 0.0.0.0 without a key and an unset key."""

from __future__ import annotations

import pytest
import torch

import areal_graph.modelkit.builtin as builtin
from areal_graph.cli import cmd_serve
from areal_graph.engines.inference.server import http_server
from areal_graph.engines.inference.server.args import build_arg_parser
from support.cli import parser_of

KEY_VAR = "AREAL_TEST_SERVE_KEY"


parse = parser_of(cmd_serve, "serve")


@pytest.fixture
def server_main(monkeypatch, tmp_path):
    """Records the argv `serve` would start the server with; answers 7 (passed through)."""
    calls: list[list[str]] = []
    monkeypatch.setattr(http_server, "main", lambda argv: calls.append(argv) or 7)
    monkeypatch.setenv("COLUMNS", "400")
    monkeypatch.setenv("AREAL_GRAPH_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv(KEY_VAR, raising=False)
    return calls


def test_parser_defaults():
    args = parse("m")
    assert (args.model, args.host, args.port, args.max_running, args.max_queue) == ("m", "127.0.0.1", 30000, 64, 1024)
    assert (args.threads, args.seed, args.device, args.max_context, args.api_key_env) == (None, 0, "cpu", None, None)
    assert args.func is cmd_serve.run


def test_defaults_become_the_server_argv(server_main, tmp_path, capsys):
    assert cmd_serve.run(parse(str(tmp_path))) == 7  # the server's exit code is the command's
    assert server_main == [
        [
            "--model",
            str(tmp_path),
            "--host",
            "127.0.0.1",
            "--port",
            "30000",
            "--max-running",
            "64",
            "--max-queue",
            "1024",
            "--seed",
            "0",
            "--device",
            "cpu",
            "--dtype",
            "float32",
        ]
    ]
    err = capsys.readouterr().err
    assert f"areal-graph serve {tmp_path} on http://127.0.0.1:30000 (max running 64); Ctrl-C stops" in err


def test_every_option_reaches_the_server_and_reads_back_the_same(server_main, tmp_path, monkeypatch):
    monkeypatch.setenv(KEY_VAR, "s3cret")
    args = parse(
        str(tmp_path),
        "--host",
        "0.0.0.0",
        "--port",
        "0",
        "--max-running",
        "8",
        "--max-queue",
        "5",
        "--threads",
        "2",
        "--seed",
        "3",
        "--max-context",
        "256",
        "--api-key-env",
        KEY_VAR,
        "--dtype",
        "bfloat16",
        "--served-model-name",
        "policy",
        "--max-prompt-chars",
        "999",
    )
    assert cmd_serve.run(args) == 7
    [argv] = server_main
    assert argv[-2:] == ["--api-key-env", KEY_VAR] and "s3cret" not in argv  # the key's name, never the key
    got = build_arg_parser().parse_args(argv)
    assert (got.model, got.host, got.port, got.max_running, got.max_queue) == (str(tmp_path), "0.0.0.0", 0, 8, 5)
    assert (got.threads, got.seed, got.max_context, got.device, got.api_key_env) == (2, 3, 256, "cpu", KEY_VAR)
    assert (got.dtype, got.served_model_name, got.max_prompt_chars) == ("bfloat16", "policy", 999)


def test_speculative_on_reaches_the_server_off_adds_nothing(server_main, tmp_path, capsys):
    from areal_graph.engines.inference.server.args import speculative_settings
    from areal_graph.engines.inference.speculation.speculator import SpeculativeSettings

    assert parse("m").speculative == "off"
    assert cmd_serve.run(parse(str(tmp_path), "--speculative", "off")) == 7
    assert not any(part.startswith("--speculative") for part in server_main[-1])
    assert cmd_serve.run(parse(str(tmp_path), "--speculative", "on")) == 7
    assert server_main[-1][-2:] == ["--speculative", "on"]
    got = speculative_settings(build_arg_parser().parse_args(server_main[-1]))
    assert got == SpeculativeSettings(enabled=True)  # the engine's defaults for the rest
    with pytest.raises(SystemExit):
        parse("m", "--speculative", "maybe")
    assert "argument --speculative: invalid choice: 'maybe'" in capsys.readouterr().err


@pytest.mark.parametrize("host", ["localhost", "::1"])
def test_other_loopback_names_need_no_key(server_main, tmp_path, host):
    assert cmd_serve.run(parse(str(tmp_path), "--host", host)) == 7
    assert server_main[0][server_main[0].index("--host") + 1] == host


@pytest.mark.parametrize("port", ["-1", "65536"])
def test_port_out_of_range_is_a_usage_error(server_main, tmp_path, capsys, port):
    assert cmd_serve.run(parse(str(tmp_path), "--port", port)) == 2
    assert f"--port must be in 0..65535, got {port}" in capsys.readouterr().err
    assert server_main == []


@pytest.mark.parametrize(
    "flag, value, least",
    [
        ("--max-running", "0", 1),
        ("--max-queue", "-1", 0),
        ("--threads", "0", 1),
        ("--threads", "-1", 1),
        ("--max-context", "1", 2),
        ("--max-prompt-chars", "0", 1),
    ],
)
def test_counts_out_of_range_are_usage_errors_before_loading(server_main, tmp_path, capsys, flag, value, least):
    assert cmd_serve.run(parse(str(tmp_path), flag, value)) == 2
    assert f"{flag} must be >= {least}, got {value}" in capsys.readouterr().err
    assert server_main == []


@pytest.mark.parametrize("device", ["gpu", "cuda:x", "CPU"])
def test_bad_device_is_a_usage_error(server_main, tmp_path, capsys, device):
    assert cmd_serve.run(parse(str(tmp_path), "--device", device)) == 2
    assert f"--device must be cpu, cuda or cuda:N, got {device!r}" in capsys.readouterr().err
    assert server_main == []


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without CUDA")
def test_cuda_without_a_cuda_device_is_a_usage_error(server_main, tmp_path, capsys):
    assert cmd_serve.run(parse(str(tmp_path), "--device", "cuda:0")) == 2
    assert "--device cuda:0: this machine has no CUDA device" in capsys.readouterr().err
    assert server_main == []


def test_unknown_builtin_model_is_exit_1_naming_the_builtins(server_main, capsys):
    assert cmd_serve.run(parse("builtin:nope")) == 1
    err = capsys.readouterr().err
    assert "unknown builtin model 'builtin:nope'" in err and "builtin:tiny-arith" in err
    assert server_main == []


def test_builtin_model_is_served_from_its_kit_dir(server_main, tmp_path, monkeypatch):
    kit_model = tmp_path / "kit" / "model"
    kit_model.mkdir(parents=True)
    monkeypatch.setattr(builtin, "resolve_model_path", lambda path, progress=None: kit_model)
    assert cmd_serve.run(parse("builtin:tiny-arith", "--device", "cpu")) == 7
    assert server_main[0][:2] == ["--model", str(kit_model)]
    assert server_main[0][-2:] == ["--served-model-name", "tiny-arith"]  # not the cache folder's "model"


def test_a_file_is_not_a_model_dir(server_main, tmp_path, capsys):
    path = tmp_path / "model.safetensors"
    path.write_bytes(b"")
    assert cmd_serve.run(parse(str(path))) == 1
    assert f"MODEL_DIR {str(path)!r}: no such directory" in capsys.readouterr().err
    assert server_main == []
