"""gRPC service definitions for workers and their generated Python stubs."""
