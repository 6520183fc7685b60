"""The `areal-graph` command: thin argument parsing that calls into graph/ and runtime/."""
