"""The recorder: what a run leaves behind to look at, written while it runs (the trace, the run
directory with metrics and checkpoints, the sample ledger). trace_analysis/ reads it back offline."""
