"""The controller <-> worker transport: gRPC server and client, the no-pickle tensor codec."""
