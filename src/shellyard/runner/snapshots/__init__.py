"""Content-addressed snapshots of workspaces; ``store.SnapshotStore`` is the entry point."""
