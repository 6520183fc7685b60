"""areal-graph: asynchronous RL for language models, declared as a dataflow graph.

The repository root is this package; see README.md for the two commands that matter.
"""

__version__ = "0.1.0"
