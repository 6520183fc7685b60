"""The offline HTML timeline of one run or several (`areal-graph trace RUN [RUN_B] --html OUT.html`).

`payload.py` turns a run's timeline into compact JSON, `page.py` assembles one self-contained
page from it with `page.html`, `viewer.js` and `viewer.css` (package data beside this file).
"""

from areal_graph.trace_analysis.trace_view.page import build_page, write_page
from areal_graph.trace_analysis.trace_view.payload import PageOptions

__all__ = ["PageOptions", "build_page", "write_page"]
