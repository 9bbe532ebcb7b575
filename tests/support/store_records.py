"""Records made straight in a store, for the tests that exercise the store's own
transactions (a transfer's end, its lease) on SQLite and PostgreSQL alike."""

from __future__ import annotations

from shellyard.store import Store


async def running_transfer(store: Store, transfer_id: str) -> None:
    """A running transfer of one pending file, in the store's default workspace."""
    _session, agent = await store.default_owner()
    await store.upsert_runner("local", "local", None, None)
    workspace, _ = await store.workspace_for(str(agent.id), "local")
    await store.create_transfer(
        {
            "id": transfer_id,
            "agent_id": agent.id,
            "source_workspace_id": workspace.id,
            "target_workspace_id": workspace.id,
            "target_folder": "in",
            "paths": ["a"],
            "options": {},
            "files_total": 1,
            "bytes_total": 1,
            "state": "running",
            "created_at": 1.0,
        },
        [
            {
                "idx": 0,
                "source_path": "a",
                "target_path": "in/a",
                "kind": "file",
                "size": 1,
                "outcome": "pending",
            }
        ],
    )
