"""Writer operations on a workspace's live tree; ``editor.Editor`` is the entry point."""
