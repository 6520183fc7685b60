"""Runs a planned graph: the controller (DAG scheduler), staleness gate, sample buffer, placement, executors."""
