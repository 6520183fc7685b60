"""Workflow spec: YAML -> typed, validated spec -> networkx DAG. Knows nothing of torch or gRPC."""
