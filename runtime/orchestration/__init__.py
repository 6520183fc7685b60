"""Runs a planned graph: the controller (its generation and training loops), the phase runner
(one phase's DAG on one batch), the staleness gate, the sample buffer, and the executors that
place node calls (worker processes, or in the controller)."""
