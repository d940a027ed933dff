"""The profiling server: gRPC ingest -> call-tree assembly -> storage -> metrics and API."""
