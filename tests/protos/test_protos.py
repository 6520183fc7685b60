"""The committed stubs are exactly what protos/generate.py produces, and they import package-relatively."""

from __future__ import annotations

from pathlib import Path

import pytest

from areal_graph.protos import generate

pytest.importorskip("grpc_tools")


def test_committed_stubs_match_a_fresh_generation(tmp_path: Path) -> None:
    written = generate.generate(out_dir=tmp_path)
    assert {p.name for p in written} == {"worker_pb2.py", "worker_pb2_grpc.py"}
    for fresh in written:
        committed = generate.PROTO_DIR / fresh.name
        assert committed.exists(), f"{committed} is not committed; run `make protos`"
        assert fresh.read_text() == committed.read_text(), f"{fresh.name} is stale; run `make protos`"


def test_generated_grpc_stub_imports_package_relative() -> None:
    text = (generate.PROTO_DIR / "worker_pb2_grpc.py").read_text()
    assert "from . import worker_pb2 as worker__pb2" in text
    assert "\nimport worker_pb2" not in text


def test_service_has_the_contracted_methods() -> None:
    from areal_graph.protos import worker_pb2 as pb

    service = pb.DESCRIPTOR.services_by_name["Worker"]
    methods = {m.name: m for m in service.methods}
    assert set(methods) == {"Configure", "Execute", "ExecuteOne", "Call", "Health", "Stats", "Shutdown"}
    assert methods["Execute"].client_streaming and methods["Execute"].server_streaming
    assert not methods["ExecuteOne"].client_streaming and not methods["ExecuteOne"].server_streaming
    assert not methods["Call"].client_streaming and not methods["Call"].server_streaming
    assert pb.DESCRIPTOR.package == "areal_graph.v1"


def test_no_pickle_anywhere_on_the_wire_path() -> None:
    root = generate.PROTO_DIR.parent
    for rel in ["runtime/rpc/tensor_codec.py", "runtime/rpc/worker_server.py", "runtime/rpc/worker_client.py"]:
        text = (root / rel).read_text()
        assert "import pickle" not in text and "pickle." not in text and "cloudpickle" not in text, rel


def test_generate_refuses_an_empty_proto_dir(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="no .proto"):
        generate.generate(out_dir=tmp_path / "out", proto_dir=tmp_path)
