"""What the user reads when verifiers cannot import a taskset or environment package.

Why our own message: verifiers says "must already be installed", which sends the user to pip, while
the fix for a package of their own is the workflow's `python_path:` (the folders, relative to the
workflow file, that every process imports from, verifiers' runner included). So the runner
(workflows/rollout/verifiers_runner.py) reports which module was missing, and this says where it
was looked for (the runner's import path: the workflow's folder, python_path, PYTHONPATH, the
shipped examples, then verifiers' installed packages), whether a package of that name sits below
the current directory or those folders (and so which folder `python_path:` should name), and the
nearest names that do exist.
"""

from __future__ import annotations

import difflib
import os
from pathlib import Path
from typing import Any

SKIP = {"__pycache__", "node_modules", "site-packages", "dist-packages", "runs", "build", "dist"}
MAX_DEPTH = 4  # folders below a root that are searched for a package of the missing name
MAX_FOLDERS = 5000  # per root: a search that finds nothing must not take seconds


def _folders(pythonpath: str) -> list[Path]:
    return [Path(p) for p in pythonpath.split(os.pathsep) if p]


def packages_on_path(pythonpath: str) -> list[str]:
    """Top-level packages and modules in the folders of `pythonpath` (the candidates for a did-you-mean)."""
    found: list[str] = []
    for folder in _folders(pythonpath):
        try:
            for p in folder.iterdir():
                if (p / "__init__.py").is_file():
                    found.append(p.name)
                elif p.suffix == ".py" and p.stem != "__init__":
                    found.append(p.stem)
        except OSError:
            continue
    return found


def find_below(name: str, roots: list[Path]) -> list[Path]:
    """Folders below `roots` (at most MAX_DEPTH down, hidden folders and venvs skipped) that hold a
    package or module called `name`: the folders `python_path:` would have to name."""
    found: list[Path] = []
    for root in roots:
        seen = 0
        level = [root]
        for _depth in range(MAX_DEPTH + 1):
            below: list[Path] = []
            for folder in level:
                seen += 1
                if seen > MAX_FOLDERS:
                    break
                if ((folder / name / "__init__.py").is_file() or (folder / f"{name}.py").is_file()) and (
                    folder not in found
                ):
                    found.append(folder)
                try:
                    below += sorted(
                        p
                        for p in folder.iterdir()
                        if p.is_dir() and not p.name.startswith(".") and p.name not in SKIP and p.name != name
                    )
                except OSError:
                    continue
            level = below
    return found


def _quoted(folder: Path, cwd: Path) -> str:
    """`folder` as a python_path entry: absolute (python_path entries are relative to the workflow
    file, whose folder this process may not know), with the path from here when it is below it."""
    try:
        rel = folder.relative_to(cwd)
    except ValueError:
        return str(folder)
    return f"{folder} (./{rel} from here)" if str(rel) != "." else str(folder)


def explain_not_importable(detail: dict[str, Any], pythonpath: str, cwd: Path | None = None) -> str:
    """The message for a runner's `not_importable` report (see the module docstring)."""
    here = (cwd or Path.cwd()).resolve()
    kind, ident, module = detail.get("kind", "taskset"), detail.get("id", "?"), detail.get("module", "?")
    missing = detail.get("missing") or module
    top = module.split(".")[0]
    path = _folders(pythonpath)
    looked = ", ".join(map(str, path)) or "no folder"
    python = detail.get("python") or "verifiers' python"
    roots = [here, *(p for p in path if p.is_dir())]
    if missing == module or module.startswith(missing + "."):  # the package itself is not there
        what = f"the {kind} package {module!r} is not importable in verifiers' venv"
        wanted = top
    else:  # it is there, but something it imports is not
        what = f"{kind} {ident!r} imports {missing!r}, which verifiers' venv cannot import"
        wanted = missing.split(".")[0]
    said = [f"{what}: looked in {looked} and in the packages installed for {python}"]
    found = [f for f in find_below(wanted, roots) if f not in path]
    if found:
        entries = ", ".join(_quoted(f, here) for f in found[:3])
        said.append(
            f"a package {wanted!r} is in {entries}: add that folder to the workflow's `python_path:` "
            "(a list of folders, relative to the workflow file, that every process imports from)"
        )
    else:
        near = difflib.get_close_matches(wanted, packages_on_path(pythonpath), n=3)
        hint = f" (did you mean {', '.join(map(repr, near))}?)" if near else ""
        said.append(
            f"put the package {wanted!r} next to the workflow file, or add the folder that holds it to the "
            f"workflow's `python_path:`{hint}; a published package is installed with `{python} -m pip install ...`"
        )
    return "; ".join(said)
