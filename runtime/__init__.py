"""Execution: controller, workers, staleness control, dynamic batching, engines, weight sync, tracing."""
