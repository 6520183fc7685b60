"""Runs a planned graph: the controller (DAG scheduler), staleness gate, sample buffer, executors (local processes, in-process)."""
