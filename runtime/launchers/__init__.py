"""Start, watch and stop the processes of a run (local processes today)."""
