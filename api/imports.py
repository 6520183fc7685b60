"""Resolve "package.module:attr" import paths: the one way user code is named in a workflow.

Used at the edge (`areal-graph validate` imports every path a workflow names, before any
process starts) and in workers (which build what they host from such a path). One resolver,
so a path that validates is a path that runs.
"""

from __future__ import annotations

import difflib
import importlib
import os
import pkgutil
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any


class ImportPathError(ValueError):
    """An import path that is malformed, names a missing module, or a missing attribute."""


def import_object(path: str, what: str = "import path") -> Any:
    """The object `path` ("package.module:attr", attr may be dotted) names; ImportPathError if none."""
    module_name, sep, attr = str(path).partition(":")
    if not sep or not module_name or not attr:
        raise ImportPathError(f"{what} {path!r} must look like 'package.module:Name'")
    try:
        obj: Any = importlib.import_module(module_name)
    except ModuleNotFoundError as err:
        if err.name and module_name.startswith(err.name):
            raise ImportPathError(
                f"{what} {path!r}: no module named {err.name!r}{_near_module(err.name)} ({searched_roots()})"
            ) from None
        raise ImportPathError(f"{what} {path!r}: importing {module_name!r} failed: {err}") from None
    except Exception as err:  # noqa: BLE001 - the user's module raised while importing
        raise ImportPathError(
            f"{what} {path!r}: importing {module_name!r} raised {type(err).__name__}: {err}"
        ) from None
    parts = attr.split(".")
    for i, part in enumerate(parts):
        if not hasattr(obj, part):
            near = difflib.get_close_matches(part, [n for n in dir(obj) if not n.startswith("_")], n=1)
            hint = f" (did you mean '{module_name}:{'.'.join(parts[:i] + near)}'?)" if near else ""
            raise ImportPathError(f"{what} {path!r}: {module_name!r} has no attribute {attr!r}{hint}")
        obj = getattr(obj, part)
    return obj


def _near_module(name: str) -> str:
    """' (did you mean 'pkg.other'?)' for a misspelled module whose parent package exists."""
    parent, _, leaf = name.rpartition(".")
    if parent:
        try:
            where = list(getattr(importlib.import_module(parent), "__path__", []))
        except Exception:  # noqa: BLE001 - the parent itself is missing or broken: no suggestion
            return ""
    else:
        where = list(_ROOTS)  # a top-level name: only the user's own folders (site-packages is large)
    near = difflib.get_close_matches(leaf, [m.name for m in pkgutil.iter_modules(where)], n=1) if where else []
    return f" (did you mean {(parent + '.' if parent else '') + near[0]!r}?)" if near else ""


# ============================================================================ where user code is found
# The rule (as pytest's rootdir): a workflow's own folder is importable, in the process that loads
# the workflow and in every process it starts, so `mypkg.rewards:score` next to `my.yaml` resolves
# in `validate`, `run`, the workers, `trace`, `eval` and `--resume` alike. A folder that is itself a
# package (has __init__.py) contributes the first folder above it that is not, so the package
# imports under its own name. A workflow's `python_path` adds folders; a run's config.yaml records
# them all, absolute, so a run directory imports what its run imported.
_ROOTS: list[str] = []  # the folders added this way, in order (for error messages)


def import_root_of(folder: str | os.PathLike) -> Path | None:
    """The folder to put on the import path for user code next to a workflow in `folder`; None
    for a folder inside areal_graph itself (the shipped workflows import as areal_graph.*) and for
    one with no Python code in it or one level down (nothing to import: keep sys.path short)."""
    folder = Path(folder).resolve()
    if not (any(folder.glob("*.py")) or any(folder.glob("*/*.py"))):
        return None
    while (folder / "__init__.py").is_file() and folder.parent != folder:
        folder = folder.parent
    package = Path(__file__).resolve().parent.parent  # the areal_graph package
    if folder == package.parent or folder in package.parents:
        return None  # areal_graph's own packages (workflows/): importable as areal_graph.*
    return folder


def add_import_roots(folders: Iterable[str | os.PathLike]) -> None:
    """Put `folders` first on this process's import path and on PYTHONPATH (which every process
    it starts inherits: the local, Ray and SLURM launchers all forward it). Idempotent."""
    entries = [str(Path(f).resolve()) for f in folders]
    env = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    for entry in reversed(entries):
        if entry not in sys.path:
            sys.path.insert(0, entry)
        if entry not in env:
            env.insert(0, entry)
        if entry not in _ROOTS:
            _ROOTS.append(entry)
    if env:
        os.environ["PYTHONPATH"] = os.pathsep.join(env)
    importlib.invalidate_caches()


def searched_roots() -> str:
    """Where a user module was looked for, in words (for 'no module named' errors)."""
    env = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and p not in _ROOTS]
    parts = []
    if _ROOTS:
        parts.append("the workflow's folder and python_path (" + ", ".join(_ROOTS) + ")")
    else:
        parts.append(
            "no workflow folder (put the module next to the workflow file, or list its folder in "
            "the workflow's `python_path`)"
        )
    if env:
        parts.append("PYTHONPATH (" + ", ".join(env) + ")")
    parts.append("the installed packages")
    return "looked in " + "; ".join(parts)
