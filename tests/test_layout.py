"""The package layout stays a layered graph: no package imports one that imports it back.

Reads every module's imports (statically, with ast) and folds them to the top-level
packages of areal_graph (api, data, graph, nodes, engines, runtime, ...).
"""

from __future__ import annotations

import ast

import networkx as nx
import pytest

from support.paths import REPO

PACKAGES = [
    "api",
    "cli",
    "data",
    "engines",
    "graph",
    "modelkit",
    "nodes",
    "perfmodel",
    "protos",
    "runtime",
    "tools",
    "trace_analysis",
    "workflows",
]


def package_graph() -> nx.DiGraph:
    graph = nx.DiGraph()
    graph.add_nodes_from(PACKAGES)
    for pkg in PACKAGES:
        for path in (REPO / pkg).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                names = (
                    [node.module]
                    if isinstance(node, ast.ImportFrom) and node.module
                    else ([a.name for a in node.names] if isinstance(node, ast.Import) else [])
                )
                for name in names:
                    parts = name.split(".")
                    if parts[0] == "areal_graph" and len(parts) > 1 and parts[1] in PACKAGES and parts[1] != pkg:
                        graph.add_edge(pkg, parts[1], file=str(path.relative_to(REPO)))
    return graph


def test_no_import_cycles_between_packages():
    graph = package_graph()
    cycles = list(nx.simple_cycles(graph))
    assert not cycles, [[(u, graph.edges[u, v]["file"]) for u, v in zip(c, c[1:] + c[:1])] for c in cycles]


def test_the_layers_point_the_right_way():
    graph = package_graph()
    assert not graph.has_edge("graph", "runtime") and not graph.has_edge("graph", "engines")
    assert not graph.has_edge("nodes", "runtime") and not graph.has_edge("engines", "runtime")
    assert not graph.has_edge("engines", "graph") and not any(graph.has_edge("api", p) for p in PACKAGES)
    # graph/ and api/ import no torch and no grpc (validate runs without them)
    for pkg in ("graph", "api"):
        for path in (REPO / pkg).rglob("*.py"):
            text = path.read_text()
            assert "import torch" not in text and "import grpc" not in text, path


def imported_modules(path) -> list[str]:
    """The dotted names `path` imports, as written (`from a.b import c` gives a.b)."""
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            out.append(node.module)
        elif isinstance(node, ast.Import):
            out += [a.name for a in node.names]
    return out


def test_the_runtime_records_and_the_trace_analyser_reads_back():
    """trace_analysis/ reads a finished run offline (`areal-graph trace`, perfmodel's cost fits);
    runtime/ only records. The analyser may use the recorder's formats and readers
    (runtime/observability/: file names, the segment index, metrics.jsonl), nothing else of the
    runtime; nothing a run imports may import the analyser, only the CLI and perfmodel/ do."""
    graph = package_graph()
    assert set(graph.predecessors("trace_analysis")) <= {"cli", "perfmodel"}, list(graph.predecessors("trace_analysis"))
    assert graph.has_edge("trace_analysis", "runtime")  # the check below still looks at something
    reaching = [
        f"{path.relative_to(REPO)}: {name}"
        for path in (REPO / "trace_analysis").rglob("*.py")
        for name in imported_modules(path)
        if name.startswith("areal_graph.runtime.") and not name.startswith("areal_graph.runtime.observability.")
    ]
    assert not reaching, reaching


# Packages whose modules import no module that imports them back, counting imports inside
# functions and under TYPE_CHECKING: such an import hides a cycle, it does not remove it.
ACYCLIC_PACKAGES = ["graph", "modelkit", "runtime/launchers"]


def module_graph(pkg: str) -> nx.DiGraph:
    """The modules of `pkg` (a package's `__init__` named after the package) and which of them
    each imports, at any level of its file."""
    modules = {}
    for path in (REPO / pkg).rglob("*.py"):
        parts = path.relative_to(REPO).with_suffix("").parts
        modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    graph = nx.DiGraph()
    graph.add_nodes_from(modules)
    for module, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:  # `from a.b import c`: a.b, and a.b.c if a module
                names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            else:
                continue
            for name in names:
                target = name.removeprefix("areal_graph.")
                if target in modules and target != module:
                    graph.add_edge(module, target, line=node.lineno)
    return graph


@pytest.mark.parametrize("pkg", ACYCLIC_PACKAGES)
def test_no_module_imports_one_that_imports_it_back(pkg):
    graph = module_graph(pkg)
    assert graph.number_of_edges() > 5
    cycles = [
        [f"{u} (line {graph.edges[u, v]['line']})" for u, v in zip(c, c[1:] + c[:1])] for c in nx.simple_cycles(graph)
    ]
    assert not cycles, cycles


def test_the_cycle_check_sees_imports_inside_functions(tmp_path, monkeypatch):
    """A function-level import back is a cycle to the check (as `graph/node_kinds.py` importing
    `graph/registry.py` inside `model_role` once was)."""
    (tmp_path / "toy").mkdir()
    (tmp_path / "toy" / "a.py").write_text("from areal_graph.toy.b import f\n")
    (tmp_path / "toy" / "b.py").write_text("def f():\n    from areal_graph.toy import a\n")
    monkeypatch.setitem(module_graph.__globals__, "REPO", tmp_path)
    assert sorted(map(sorted, nx.simple_cycles(module_graph("toy")))) == [["toy.a", "toy.b"]]


TESTS = REPO / "tests"
NOT_MIRRORS = {"support", "fixtures", "e2e", "__pycache__"}  # shared helpers, data files, whole runs


def test_the_tests_mirror_the_package():
    """A test of `runtime/orchestration/staleness.py` lives in `tests/runtime/orchestration/`:
    every test folder (but the shared ones) is a folder of the package, and no test sits
    loose at the top except the repository-wide checks."""
    folders = [
        p.relative_to(TESTS)
        for p in TESTS.rglob("*")
        if p.is_dir() and not NOT_MIRRORS & set(p.relative_to(TESTS).parts)
    ]
    assert len(folders) >= 10
    strays = [str(f) for f in folders if not (REPO / f / "__init__.py").is_file()]
    assert not strays, f"test folders with no package folder of that name: {strays}"
    loose = sorted(p.name for p in TESTS.glob("test_*.py"))
    assert loose == ["test_architecture_doc.py", "test_layout.py", "test_types.py"], loose


def test_tests_import_support_never_one_another():
    """Shared fakes and helpers live in tests/support/; a test importing another test module
    (or conftest) makes the second one's fixtures and helpers a hidden dependency."""
    offenders = []
    for path in TESTS.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = (
                [node.module]
                if isinstance(node, ast.ImportFrom) and node.module
                else ([a.name for a in node.names] if isinstance(node, ast.Import) else [])
            )
            offenders += [
                f"{path.relative_to(TESTS)}: {n}"
                for n in names
                if n.split(".")[0].startswith("test_") or n.split(".")[0] == "conftest"
            ]
    assert not offenders, offenders


# Modules that run only where the tests cannot import them, each with the test that runs it.
NOT_IMPORTABLE_HERE = {
    # runs inside vLLM's worker process (needs vllm): tests/engines/inference/backends/test_vllm_backend.py
    "engines.inference.backends.vllm_worker.areal_vllm_worker",
}


def package_modules() -> set[str]:
    """Every module of the package, dotted from its root ('runtime.orchestration.controller')."""
    out = set()
    for pkg in PACKAGES:
        for path in (REPO / pkg).rglob("*.py"):
            if (
                path.name != "__init__.py"
                and not path.name.endswith("_pb2.py")
                and not path.name.endswith("_pb2_grpc.py")
            ):
                out.add(".".join(path.relative_to(REPO).with_suffix("").parts))
    return out


def imported_by_tests() -> set[str]:
    """Modules of the package a test file imports by name (`from areal_graph.x import y` counts
    x, and x.y when y is a module)."""
    out = set()
    for path in TESTS.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("areal_graph."):
                base = node.module.removeprefix("areal_graph.")
                out |= {base} | {f"{base}.{a.name}" for a in node.names}
            elif isinstance(node, ast.Import):
                out |= {a.name.removeprefix("areal_graph.") for a in node.names if a.name.startswith("areal_graph.")}
    return out


def test_every_module_is_imported_by_a_test():
    """A module no test imports is checked, at best, through a subprocess or the CLI: its own
    contract has no test to fail. New modules come with one (or an entry above, saying why not)."""
    modules = package_modules()
    assert len(modules) > 100
    untested = sorted(modules - imported_by_tests() - NOT_IMPORTABLE_HERE)
    assert not untested, f"modules no test imports: {untested}"
    assert NOT_IMPORTABLE_HERE <= modules, NOT_IMPORTABLE_HERE - modules


def test_no_assertion_is_about_constants_alone():
    """`assert sum([5, 4, 3]) <= 12` checks the test's own arithmetic, not the code: every assert
    must read something the test computed (a name, an attribute, a call on one)."""
    import builtins

    known = set(dir(builtins))

    def constant(expr: ast.expr) -> bool:
        return not any(
            isinstance(n, (ast.Attribute, ast.Subscript, ast.Await, ast.Lambda, ast.NamedExpr))
            or (isinstance(n, ast.Name) and n.id not in known)
            for n in ast.walk(expr)
        )

    found = [
        f"{path.relative_to(TESTS)}:{node.lineno}: assert {ast.unparse(node.test)}"
        for path in TESTS.rglob("*.py")
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Assert) and constant(node.test)
    ]
    assert not found, found
    assert constant(ast.parse("sum([5, 4, 3]) <= 12", mode="eval").body)  # the check itself can fire


def test_every_package_folder_ships_in_the_wheel():
    """pyproject.toml lists the packages by hand (the repository root is the package): a folder with
    an __init__.py missing from the list is absent from a non-editable install, where `areal-graph`
    itself then fails to start (engines.inference.server was missing once). Folders of example code
    that another interpreter imports (workflows/verifiers_envs/) ship as package data instead."""
    import tomllib

    setup = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(setup["packages"])
    folders = {
        ".".join(("areal_graph", *p.parent.relative_to(REPO).parts))
        for p in REPO.rglob("__init__.py")
        if not {"tests", "benchmarks", "build"} & set(p.relative_to(REPO).parts)
        and not any(part.startswith(".") for part in p.relative_to(REPO).parts)
        and "verifiers_envs" not in p.parts
    }
    assert folders - listed == set(), f"package folders pyproject.toml does not list: {sorted(folders - listed)}"
    shipped_as_data = setup["package-data"]["areal_graph.workflows"]
    assert "verifiers_envs/*/*.py" in shipped_as_data
