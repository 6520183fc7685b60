"""The consoles the commands print through.

Why: rich lays tables out for 80 columns when output is not a terminal (a CI log, a pipe, a
file), which cuts node names and reads/writes lists to "generati…". Piped output gets a wide
page instead (COLUMNS, when set, still decides).
"""

from __future__ import annotations

import os
from typing import Any

from rich.console import Console

PIPED_WIDTH = 160


def output_console(**kwargs: Any) -> Console:
    console = Console(**kwargs)
    if not console.is_terminal and "COLUMNS" not in os.environ:
        console.width = PIPED_WIDTH
    return console
