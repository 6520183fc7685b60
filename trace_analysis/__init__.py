"""The offline trace analyser (`areal-graph trace`, and the cost fits of perfmodel/): a finished
run's folder read back and summarised. It reads what the recorder in runtime/observability/ wrote
(the trace and its segments, metrics.jsonl, config.yaml, end_state.json) through that recorder's
own names and readers; the runtime never imports it (tests/test_layout.py)."""
