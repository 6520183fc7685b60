"""Regenerate the committed gRPC stubs from protos/*.proto.

    python -m areal_graph.protos.generate            # rewrite the stubs next to the .proto
    python -m areal_graph.protos.generate --out DIR  # write them elsewhere (the test compares)

The stubs are committed so that users need only grpcio and protobuf, not grpcio-tools.
grpcio-tools writes `import worker_pb2 as worker__pb2` (a top-level import that only works
when protos/ is on sys.path); we rewrite it to a package-relative import.
"""

from __future__ import annotations

import argparse
import logging
import re
import sys
from pathlib import Path

log = logging.getLogger(__name__)

PROTO_DIR = Path(__file__).resolve().parent
_TOPLEVEL_IMPORT = re.compile(r"^import (\w+_pb2) as (\w+)$", re.MULTILINE)


def generate(out_dir: Path = PROTO_DIR, proto_dir: Path = PROTO_DIR) -> list[Path]:
    """Compile every .proto in `proto_dir` into `out_dir`; return the files written."""
    try:
        from grpc_tools import protoc
    except ImportError as e:  # grpcio-tools is a dev dependency only
        raise RuntimeError("regenerating stubs needs grpcio-tools: pip install 'grpcio-tools>=1.85.1'") from e
    import grpc_tools

    out_dir.mkdir(parents=True, exist_ok=True)
    protos = sorted(proto_dir.glob("*.proto"))
    if not protos:
        raise FileNotFoundError(f"no .proto files in {proto_dir}")
    include = Path(grpc_tools.__file__).parent / "_proto"
    written: list[Path] = []
    for proto in protos:
        args = [
            "grpc_tools.protoc",
            f"-I{proto_dir}",
            f"-I{include}",
            f"--python_out={out_dir}",
            f"--grpc_python_out={out_dir}",
            str(proto),
        ]
        rc = protoc.main(args)
        if rc != 0:
            raise RuntimeError(f"protoc failed on {proto} (exit {rc})")
        grpc_file = out_dir / f"{proto.stem}_pb2_grpc.py"
        grpc_file.write_text(_TOPLEVEL_IMPORT.sub(r"from . import \1 as \2", grpc_file.read_text()))
        written += [out_dir / f"{proto.stem}_pb2.py", grpc_file]
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=PROTO_DIR, help="where to write the stubs (default: protos/)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    for path in generate(args.out):
        log.info("wrote %s", path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
