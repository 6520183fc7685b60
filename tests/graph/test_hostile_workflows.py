"""Hostile workflow files get a clear error naming the file (and line), in bounded time and
memory, from the loader and from `areal-graph validate` (no traceback). Each file is written
here; tests/fixtures/broken/ holds the files that are wrong in ordinary ways."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from areal_graph.graph.loader import WorkflowError, load_workflow
from areal_graph.graph.yaml_lines import MAX_DEPTH, MAX_FILE_BYTES, MAX_VALUES
from support.paths import FIXTURES

MINIMAL = (FIXTURES / "minimal.yaml").read_text()


def _alias_bomb(levels: int = 9) -> str:
    """ "Billion laughs": 9 levels of 9 aliases expand to 9^9 = 387 million values."""
    text = "a0: &a0 [lol, lol, lol, lol, lol, lol, lol, lol, lol]\n"
    for i in range(1, levels + 1):
        text += f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 9) + "]\n"
    return text


# name -> (file bytes, words the message must contain, line it must name or None)
HOSTILE: dict[str, tuple[bytes, tuple[str, ...], int | None]] = {
    "not_utf8": (MINIMAL.encode().replace(b"name: minimal", b"name: min\xe9mal"), ("not UTF-8", "0xe9"), 3),
    "binary": (b"\x7fELF\x02\x01\x01\x00" + bytes(range(256)) * 4, ("binary",), None),
    "recursive_alias": (b"name: x\nloop: &loop [1, *loop]\n", ("recursive alias",), 2),
    "recursive_mapping_alias": (b"name: x\nloop: &m {a: *m}\n", ("recursive alias",), 2),
    "deep_flow": (("x: " + "[" * 100_000 + "]" * 100_000 + "\n").encode(), (f"more than {MAX_DEPTH} levels",), 1),
    "deep_block": (
        "".join("  " * i + f"k{i}:\n" for i in range(300)).encode(),
        (f"more than {MAX_DEPTH} levels",),
        MAX_DEPTH + 1,
    ),
    "alias_bomb": (_alias_bomb().encode(), (f"more than {MAX_VALUES:,} values", "alias"), None),
    "duplicate_key": (
        MINIMAL.replace("name: minimal\n", "name: minimal\nname: other\n").encode(),
        ("key 'name' is given twice", "first at line"),
        None,
    ),
    "huge": (b"# " + b"x" * (MAX_FILE_BYTES + 10) + b"\n" + MINIMAL.encode(), ("larger than the limit",), None),
    "python_tag": (
        b"name: x\nhook: !!python/object/apply:os.system [echo pwned]\n",
        ("tag", "python/object/apply", "not allowed"),
        2,
    ),
}


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_hostile_file_is_a_clear_error_quickly(name, tmp_path):
    data, words, line = HOSTILE[name]
    path = tmp_path / f"{name}.yaml"
    path.write_bytes(data)
    t0 = time.process_time()
    with pytest.raises(WorkflowError) as info:
        load_workflow(path)
    cpu = time.process_time() - t0
    problem = info.value.problems[0]
    assert problem.file == str(path)
    for word in words:
        assert word in problem.message, problem.message
    if line is not None:
        assert problem.line == line, problem
    assert cpu < 10.0  # a bound, not a benchmark: an alias bomb or a deep file used to run for minutes


def test_duplicate_keys_name_both_lines(tmp_path):
    path = tmp_path / "dup.yaml"
    path.write_text(MINIMAL.replace("  batch_size: 16\n", "  batch_size: 16\n  batch_size: 8\n"))
    with pytest.raises(WorkflowError) as info:
        load_workflow(path)
    (problem,) = info.value.problems
    first = MINIMAL.splitlines().index("  batch_size: 16") + 1
    assert problem.line == first + 1 and f"(first at line {first})" in problem.message


def test_merge_keys_still_work_and_an_explicit_key_overrides_a_merged_one(tmp_path):
    """`<<: *anchor` is ordinary YAML, not a duplicate key; explicit keys beside it win."""
    old = """  ref_logp:
    kind: logprob
    model: ref
    reads: [input_ids]
    writes: [ref_logprobs]
  prox_logp:
    kind: logprob
    model: actor
    reads: [input_ids]
    writes: [prox_logprobs]
"""
    new = """  prox_logp: &logp
    kind: logprob
    model: actor
    reads: [input_ids]
    writes: [prox_logprobs]
  ref_logp:
    <<: *logp
    model: ref
    writes: [ref_logprobs]
"""
    assert old in MINIMAL
    path = tmp_path / "merge.yaml"
    path.write_text(MINIMAL.replace(old, new))
    spec = load_workflow(path)
    ref = spec.nodes["ref_logp"]
    assert (ref.kind, ref.model, ref.reads, ref.writes) == ("logprob", "ref", ("input_ids",), ("ref_logprobs",))
    assert spec.nodes["prox_logp"].model == "actor"


def test_validate_cli_on_hostile_files_exits_1_without_traceback(tmp_path):
    """Through the CLI, in its own process under a 4 GiB address-space cap: bounded memory."""
    for name in ("alias_bomb", "not_utf8", "deep_flow"):
        path = tmp_path / f"{name}.yaml"
        path.write_bytes(HOSTILE[name][0])
        cap = "import resource; resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30)); "
        out = subprocess.run(
            [
                sys.executable,
                "-c",
                cap + "from areal_graph.cli.main import main; raise SystemExit(main())",
                "validate",
                str(path),
            ],
            capture_output=True,
            text=True,
            timeout=120,
        )
        text = out.stdout + out.stderr
        assert out.returncode == 1, text
        assert "Traceback" not in text and str(path) in text.replace("\n", "")
