"""Platform: connection, embedded engine, unit of work, outbox, workers, CLI."""
