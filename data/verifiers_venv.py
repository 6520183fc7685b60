"""Which python runs verifiers environments: verifiers' own virtualenv, found the same way whether
areal-graph is a checkout (editable install) or a package in site-packages.

Why a separate venv: verifiers 0.4 pins `openai<3` and this project uses openai 3. Why a search:
`make install-verifiers` makes `.venv-verifiers` in the checkout it runs in, and an installed
package does not live in that checkout, so "next to the package" alone misses the venv of a user
who installed areal-graph with pip and made the venv in their clone (or in their project). The
order, first found wins:

1. AREAL_VERIFIERS_PYTHON, a python that has verifiers (an error if it names no file);
2. `.venv-verifiers` in the package's own folder (an editable install: the checkout);
3. `.venv-verifiers` in the current directory or one of its parents (the checkout or project the
   user runs from);
4. `.venv-verifiers` in a folder the workflow put on the import path (its own folder, python_path:
   api/imports.py) or one of their parents.

When none is found, the message lists every place looked at and how to make one, from a checkout
and without one (the pins are read from requirements-verifiers.txt, which ships in the package).
"""

from __future__ import annotations

import os
from pathlib import Path

PYTHON_ENV = "AREAL_VERIFIERS_PYTHON"
VENV_NAME = ".venv-verifiers"
INSTALL = "make install-verifiers"
PACKAGE = Path(__file__).resolve().parent.parent  # the areal_graph package (a checkout's root when editable)
REQUIREMENTS = PACKAGE / "requirements-verifiers.txt"
FALLBACK_PINS = ("verifiers==0.4.0",)  # what requirements-verifiers.txt says, if a packager dropped it


class VerifiersVenvError(ValueError):
    """No python with verifiers: where it was looked for and how to make one."""


def _workflow_roots() -> list[Path]:
    """The folders workflows put on the import path (their own folders and python_path), which every
    process of a run inherits through PYTHONPATH; the user's own PYTHONPATH entries come with them."""
    return [Path(p) for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]


def _with_parents(folders: list[Path]) -> list[Path]:
    out: list[Path] = []
    for folder in folders:
        for f in (folder, *folder.parents):
            if f not in out:
                out.append(f)
    return out


def candidates(cwd: Path | None = None) -> list[Path]:
    """Every `.venv-verifiers` folder looked at, in order (see the module docstring)."""
    here = (cwd or Path.cwd()).resolve()
    folders = [PACKAGE, *_with_parents([here]), *_with_parents([r.resolve() for r in _workflow_roots()])]
    out: list[Path] = []
    for folder in folders:
        venv = folder / VENV_NAME
        if venv not in out:
            out.append(venv)
    return out


def _venv_python(venv: Path) -> Path:
    return venv / ("Scripts/python.exe" if os.name == "nt" else "bin/python")


def pins() -> list[str]:
    """The requirement lines of verifiers' venv (requirements-verifiers.txt, comments dropped)."""
    try:
        lines = REQUIREMENTS.read_text().splitlines()
    except OSError:
        return list(FALLBACK_PINS)
    found = [line.split("#", 1)[0].strip() for line in lines]
    return [line for line in found if line] or list(FALLBACK_PINS)


def how_to_make_one() -> str:
    """How to make verifiers' venv, from a checkout and from anywhere, and how to name it."""
    quoted = " ".join(f"'{p}'" if any(c in p for c in "<>=!~ ") else p for p in pins())
    return (
        f"make one: in a checkout of areal-graph, `{INSTALL}` (makes {VENV_NAME} there); anywhere else, "
        f"`python3.11 -m venv {VENV_NAME} && {VENV_NAME}/bin/pip install {quoted}` in the folder you run "
        f"from or the workflow's folder; or point {PYTHON_ENV} at any python that has {' '.join(pins())}"
    )


def _where_looked(cwd: Path | None) -> str:
    here = (cwd or Path.cwd()).resolve()
    roots = [str(r) for r in _workflow_roots()]
    return f"no {VENV_NAME} in the package's folder ({PACKAGE}), in {here} or its parents" + (
        f", or in the workflow's import folders ({', '.join(roots)}) or their parents" if roots else ""
    )


def find_python(cwd: Path | None = None) -> str:
    """The python of verifiers' virtualenv (see the module docstring); VerifiersVenvError if none."""
    named = os.environ.get(PYTHON_ENV)
    if named:
        if not Path(named).is_file():
            raise VerifiersVenvError(f"{PYTHON_ENV}={named}: no such file (it names verifiers' python)")
        return named
    looked = candidates(cwd)
    for venv in looked:
        python = _venv_python(venv)
        if python.is_file():
            return str(python)
    raise VerifiersVenvError(
        "verifiers environments run in verifiers' own virtualenv (verifiers 0.4 pins openai<3, this project "
        f"uses openai 3), and none was found: {PYTHON_ENV} is not set, and {_where_looked(cwd)}. " + how_to_make_one()
    )
