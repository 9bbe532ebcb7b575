"""Workspaces: one per (agent, runner), its writer (W1) and its recorded snapshots (W3)."""

from __future__ import annotations

import time
from dataclasses import dataclass

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from shellyard.store.db import Database, execute_prepared, fetch_one, new_id, upsert
from shellyard.store.records import from_row
from shellyard.store.schema import (
    snapshots,
    workspaces,
)


@dataclass(frozen=True, slots=True, kw_only=True)
class Workspace:
    """A ``workspaces`` row as the control plane reads it, typed once here
    (docs/architecture.md "Records at the store boundary")."""

    id: str
    agent_id: str
    runner_id: str
    head_seq: int = 0
    #: W1: who holds the writer (``writer_id`` names the operation); both None when free.
    writer_kind: str | None
    writer_id: str | None
    created_at: float


@dataclass(frozen=True, slots=True)
class Snapshot:
    """A ``snapshots`` row (W3, W5): what made the commit, and when its manifest was pruned."""

    workspace_id: str
    seq: int
    root_hash: str
    made_by_kind: str
    made_by_id: str | None
    files: int
    bytes: int
    created_at: float
    pruned_at: float | None


class WorkspaceRecords(Database):
    """Workspaces, their writer, their snapshots."""

    async def workspace_for(self, agent_id: str, runner_id: str) -> tuple[Workspace, bool]:
        """The (agent, runner) workspace, created on first use. Returns (row, created)."""
        return await self.run(_workspace_for, agent_id, runner_id)

    async def get_workspace(self, workspace_id: str) -> Workspace | None:
        row = await self.one(sa.select(workspaces).where(workspaces.c.id == workspace_id))
        return None if row is None else from_row(Workspace, row)

    async def all_workspaces(self) -> list[Workspace]:
        """Every workspace, oldest first (retention walks them all)."""
        rows = await self.all(sa.select(workspaces).order_by(workspaces.c.created_at))
        return [from_row(Workspace, r) for r in rows]

    async def release_writer(self, workspace_id: str, holder_id: str) -> bool:
        return await self.run(release_writer, workspace_id, holder_id)

    async def take_writer(self, workspace_id: str, kind: str, holder_id: str) -> bool:
        return await self.run(take_writer, workspace_id, kind, holder_id)

    async def record_snapshot(
        self,
        workspace_id: str,
        seq: int,
        root_hash: str,
        files: int,
        size: int,
        made_by_kind: str,
        made_by_id: str | None,
    ) -> None:
        """W3: the head only moves forward; a late update never moves it back."""
        await self.run(
            record_snapshot, workspace_id, seq, root_hash, files, size, made_by_kind, made_by_id
        )

    async def list_snapshots(self, workspace_id: str) -> list[Snapshot]:
        rows = await self.all(
            sa.select(snapshots)
            .where(snapshots.c.workspace_id == workspace_id)
            .order_by(snapshots.c.seq)
        )
        return [from_row(Snapshot, r) for r in rows]


# ---------------------------------------------------------------------- operations
# Each runs inside one transaction on ``conn``.


def _workspace_for(conn: Connection, agent_id: str, runner_id: str) -> tuple[Workspace, bool]:
    stmt = sa.select(workspaces).where(
        workspaces.c.agent_id == agent_id, workspaces.c.runner_id == runner_id
    )
    row = fetch_one(conn, stmt)
    if row is not None:
        return from_row(Workspace, row), False
    workspace_id = new_id("ws")
    # ON CONFLICT (docs/operations.md): two replicas making the same workspace at once get one row.
    conn.execute(
        upsert(conn, workspaces)
        .values(
            id=workspace_id,
            agent_id=agent_id,
            runner_id=runner_id,
            head_seq=0,
            created_at=time.time(),
        )
        .on_conflict_do_nothing(index_elements=[workspaces.c.agent_id, workspaces.c.runner_id])
    )
    row = fetch_one(conn, stmt)
    assert row is not None
    found = from_row(Workspace, row)
    return found, found.id == workspace_id


def take_writer(conn: Connection, workspace_id: str, kind: str, holder: str) -> bool:
    result = conn.execute(
        workspaces.update()
        .where(workspaces.c.id == workspace_id, workspaces.c.writer_id.is_(None))
        .values(writer_kind=kind, writer_id=holder)
    )
    return bool(result.rowcount)


# Built once (docs/benchmarks.md §29): every execution's finish runs it.
_RELEASE_WRITER = (
    workspaces.update()
    .where(
        workspaces.c.id == sa.bindparam("b_workspace"),
        workspaces.c.writer_id == sa.bindparam("b_holder"),
    )
    .values(writer_kind=None, writer_id=None)
)


def release_writer(conn: Connection, workspace_id: str, holder_id: str) -> bool:
    # compiled once (store/db.py): the finish of every execution sends it
    result = execute_prepared(
        conn, _RELEASE_WRITER, {"b_workspace": workspace_id, "b_holder": holder_id}
    )
    return bool(result.rowcount)


def record_snapshot(
    conn: Connection,
    workspace_id: str,
    seq: int,
    root_hash: str,
    files: int,
    size: int,
    made_by_kind: str,
    made_by_id: str | None,
) -> None:
    # ON CONFLICT: the same commit recorded twice at once (two replicas finalizing one
    # execution after a lease takeover, docs/operations.md) is one row.
    conn.execute(
        upsert(conn, snapshots)
        .values(
            workspace_id=workspace_id,
            seq=seq,
            root_hash=root_hash,
            made_by_kind=made_by_kind,
            made_by_id=made_by_id,
            files=files,
            bytes=size,
            created_at=time.time(),
        )
        .on_conflict_do_nothing(index_elements=[snapshots.c.workspace_id, snapshots.c.seq])
    )
    conn.execute(
        workspaces.update()
        .where(workspaces.c.id == workspace_id, workspaces.c.head_seq < seq)
        .values(head_seq=seq)
    )
