"""What users and backends program against, free of torch and of the graph: typed config fields, sampling parameters, import paths."""
