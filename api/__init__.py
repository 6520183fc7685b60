"""What users and backends program against, free of the graph, torch and gRPC: typed config fields, sampling parameters, the rollout interface, import paths, span recording, process helpers."""
