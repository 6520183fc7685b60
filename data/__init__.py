"""Data that flows through the graph: the packed-batch contract, datasets and the synthetic tasks."""
