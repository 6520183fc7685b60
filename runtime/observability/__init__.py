"""What a run leaves behind to look at: the trace, the run directory with metrics and checkpoints."""
