"""Resolve "package.module:attr" import paths: the one way user code is named in a workflow.

Used at the edge (`areal-graph validate` imports every path a workflow names, before any
process starts) and in workers (which build what they host from such a path). One resolver,
so a path that validates is a path that runs.
"""

from __future__ import annotations

import importlib
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
            raise ImportPathError(f"{what} {path!r}: no module named {err.name!r}") from None
        raise ImportPathError(f"{what} {path!r}: importing {module_name!r} failed: {err}") from None
    except Exception as err:  # noqa: BLE001 - the user's module raised while importing
        raise ImportPathError(f"{what} {path!r}: importing {module_name!r} raised "
                              f"{type(err).__name__}: {err}") from None
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise ImportPathError(f"{what} {path!r}: {module_name!r} has no attribute {attr!r}")
        obj = getattr(obj, part)
    return obj
