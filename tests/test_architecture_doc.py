"""docs/architecture.md (and docs/design.md) stay true: every file, folder and symbol they name exists,
the page's node-kind table has a row for every kind the registry holds, and its transports table
a row for every weight-sync transport.

The page is the newcomer's map, and a map is only worth reading while it names real code:
rename a file or a function it points at and this test says where the page went stale.

Convention of the page: a repository-relative path in backticks, `runtime/rpc/worker_server.py`
(a folder ends with "/": `runtime/launchers/`); a symbol follows its file after a colon in
the same backticks, `runtime/orchestration/controller.py:Controller._main`. Paths need a "/"
(`README.md` or `areal-graph run` are not checked). Symbols are looked up by parsing the file
with ast (classes, functions, methods, assigned names): nothing is imported.
"""

from __future__ import annotations

import ast
import re
import subprocess

from areal_graph.graph.kinds.registry import BUILTIN_KINDS, kind_of
from areal_graph.graph.loader import load_workflow
from support.paths import REPO, WORKFLOWS

DOC = REPO / "docs" / "architecture.md"
SPAN = re.compile(r"`([^`\n]+)`")
NAME = r"[A-Za-z_]\w*"
REF = re.compile(rf"(?P<path>[\w-]+(?:/[\w.-]+)*(?:/|\.\w+))(?::(?P<symbol>{NAME}(?:\.{NAME})*))?")


def names(node: ast.stmt) -> set[str]:
    if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
        return {node.name}
    if isinstance(node, ast.Assign):
        return {t.id for t in node.targets if isinstance(t, ast.Name)}
    if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
        return {node.target.id}
    return set()


def defines(tree: ast.Module, dotted: str) -> bool:
    """Whether `dotted` (Name, or Class.method, ...) is defined at that nesting in the module."""
    body: list[ast.stmt] = tree.body
    for part in dotted.split("."):
        node = next((n for n in body if part in names(n)), None)
        if node is None:
            return False
        body = getattr(node, "body", [])
    return True


def references(text: str) -> list[tuple[str, str | None]]:
    """(path, symbol or None) for every backticked repository path of `text`."""
    out = []
    for span in SPAN.findall(text):
        m = REF.fullmatch(span)
        if m is None:
            assert ".py:" not in span, f"`{span}`: write a symbol as `path/file.py:Name` or `path/file.py:Class.method`"
            continue
        if "/" in m["path"]:
            out.append((m["path"], m["symbol"]))
    return out


def problems(text: str) -> list[str]:
    found = []
    for path, symbol in references(text):
        target = REPO / path
        if not (target.is_dir() if path.endswith("/") else target.is_file()):
            found.append(f"`{path}` does not exist")
        elif symbol is not None and not (path.endswith(".py") and defines(ast.parse(target.read_text()), symbol)):
            found.append(f"`{path}:{symbol}`: {path} defines no {symbol}")
    return found


def test_the_architecture_page_names_only_files_and_symbols_that_exist():
    text = DOC.read_text(encoding="utf-8")
    refs = references(text)
    # the page is built on these references: a convention change that finds none must fail here
    assert len(refs) >= 100 and sum(s is not None for _, s in refs) >= 80, len(refs)
    assert not problems(text), "docs/architecture.md is stale:\n" + "\n".join(problems(text))


KIND_TABLE = "| node kind | process | hosted object | method called |"


def kind_rows(text: str) -> dict[str, str]:
    """The node-kind table of the page: kind -> its row (a row may name several kinds)."""
    lines = text.splitlines()
    start = lines.index(KIND_TABLE) + 2  # past the header and the |---| line
    rows = {}
    for line in lines[start:]:
        if not line.startswith("|"):
            break
        for kind in line.split("|")[1].split(","):
            rows[kind.strip()] = line
    return rows


def test_the_architecture_page_has_a_row_for_every_node_kind():
    """The kinds come from the registry: a kind added to graph/kinds/ without its row fails here,
    and so does a row whose hosted object is not the class the kind's entry names."""
    rows = kind_rows(DOC.read_text(encoding="utf-8"))
    assert sorted(rows) == sorted(BUILTIN_KINDS), (
        "docs/architecture.md: node kinds without a row: "
        f"{sorted(set(BUILTIN_KINDS) - set(rows))}; rows of no kind: {sorted(set(rows) - set(BUILTIN_KINDS))}"
    )
    checked = set()
    for path in sorted(WORKFLOWS.glob("*.yaml")):
        spec = load_workflow(path)
        for node in spec.nodes.values():
            if node.kind in BUILTIN_KINDS and node.kind not in checked:
                impl = kind_of(node).hosting(node, spec).impl.rpartition(":")[2]
                assert f":{impl}`" in rows[node.kind], (node.kind, impl, rows[node.kind])
                checked.add(node.kind)
    assert len(checked) >= 8, checked  # the shipped workflows use (nearly) every kind


def sync_transports() -> dict[str, str]:
    """{class name: mode} of every transport in weight_sync.py: the classes that set `mode`."""
    tree = ast.parse((REPO / "runtime" / "orchestration" / "weight_sync.py").read_text(encoding="utf-8"))
    out = {}
    for cls in tree.body:
        if isinstance(cls, ast.ClassDef):
            for stmt in cls.body:
                if isinstance(stmt, ast.Assign) and [getattr(t, "id", None) for t in stmt.targets] == ["mode"]:
                    out[cls.name] = ast.literal_eval(stmt.value)
    return out


def test_the_architecture_page_has_a_row_for_every_weight_sync_transport():
    """A transport added to weight_sync.py without its row in the transports table fails here."""
    transports = sync_transports()
    assert set(transports.values()) == {"memory", "disk", "adapter", "in-process"}, transports
    rows = [
        line
        for line in DOC.read_text(encoding="utf-8").splitlines()
        if line.startswith("| `runtime/orchestration/weight_sync.py:")
    ]
    named = {SPAN.search(line).group(1).rpartition(":")[2] for line in rows}
    assert named == set(transports), (
        f"docs/architecture.md transports table: missing {set(transports) - named}, "
        f"not transports {named - set(transports)}"
    )


def test_the_design_page_names_only_files_that_exist():
    """docs/design.md is what modules cite for the algorithm facts: its pointers stay true too."""
    text = (REPO / "docs" / "design.md").read_text(encoding="utf-8")
    assert len(references(text)) >= 8
    assert not problems(text), "docs/design.md is stale:\n" + "\n".join(problems(text))


TEST_PATH = re.compile(r"\btests/[\w/.-]*[\w/]")


def test_every_test_file_the_repository_names_exists():
    """Code comments, docs, the README, the Makefile and CI point readers at tests by path
    (`tests/runtime/orchestration/test_controller.py`); moving a test must move the pointer."""
    tracked = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True).stdout.split()
    stale, checked = [], 0
    for name in tracked:
        path = REPO / name
        if (
            path.suffix not in {".py", ".md", ".yaml", ".toml", ""}
            or not path.is_file()
            or name.startswith("tests/fixtures/broken/")
        ):
            continue
        for ref in set(TEST_PATH.findall(path.read_text(encoding="utf-8", errors="replace"))):
            checked += 1
            if not (REPO / ref).exists():
                stale.append(f"{name}: {ref}")
    assert checked >= 30, checked  # the pattern still finds the pointers
    assert not stale, "pointers to tests that moved:\n" + "\n".join(sorted(stale))
