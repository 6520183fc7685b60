"""Execution of a planned graph: orchestration, RPC, launchers, hosts for node kinds, observability."""
