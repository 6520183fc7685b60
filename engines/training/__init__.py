"""The training engine: packed micro-batches, the dynamic-batching planner, data parallelism, the critic."""
