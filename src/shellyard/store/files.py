"""Records of files, history, transfers and artifacts (W5, T1–T5), over the same ``Store``:
each operation is a synchronous function of a ``Connection`` run as one transaction by
``Database.run``, like the store's own."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from shellyard.store.db import Row, fetch_one
from shellyard.store.leases import TRANSFER, delete_lease
from shellyard.store.owners import Agent
from shellyard.store.records import from_row, from_rows
from shellyard.store.schema import (
    agents,
    artifacts,
    executions,
    leases,
    snapshots,
    transfer_files,
    transfers,
    workspaces,
)
from shellyard.store.workspaces import (
    Snapshot,
    Workspace,
    WorkspaceRecords,
    record_snapshot,
    release_writer,
)

#: What a transfer's entry is (the snapshots' kinds, contract/snapshots.py).
EntryKind = Literal["file", "dir", "symlink"]
ACTIVE_TRANSFER_STATES = ("queued", "running")
TERMINAL_TRANSFER_STATES = ("completed", "partial", "failed", "cancelled")
#: What a copier's fence finds (``hold_transfer``): it holds the lease of the active transfer;
#: the transfer is final; another replica holds its lease (or nobody does).
HELD, ENDED, LOST = "held", "ended", "lost"


@dataclass(frozen=True, slots=True, kw_only=True)
class Transfer:
    """A ``transfers`` row (T2-T4), typed once here (docs/architecture.md "Records at the
    store boundary")."""

    id: str
    agent_id: str
    source_workspace_id: str
    source_seq: int | None
    target_workspace_id: str
    target_folder: str
    paths: list[str]
    #: What the request asked of the copy: queue, batch_files, batch_bytes, max_bytes_per_s.
    options: dict[str, Any]
    state: str
    error: str | None
    files_total: int
    bytes_total: int
    files_copied: int
    files_unchanged: int
    files_skipped: int
    files_failed: int
    bytes_done: int
    bytes_sent: int = 0
    batches: int
    target_seq: int | None
    cancel_requested: bool
    created_at: float
    started_at: float | None
    finished_at: float | None


@dataclass(frozen=True, slots=True)
class TransferFile:
    """A ``transfer_files`` row: one planned entry of a transfer and its outcome (T3)."""

    transfer_id: str
    idx: int
    source_path: str
    target_path: str
    kind: EntryKind
    mode: int
    size: int
    sha256: str | None
    link_target: str | None
    #: pending, copied, unchanged, skipped or failed
    outcome: str
    reason: str | None
    target_seq: int | None


@dataclass(frozen=True, slots=True)
class Artifact:
    """An ``artifacts`` row (T5): a file of a snapshot declared under a name."""

    id: str
    agent_id: str
    workspace_id: str
    runner_id: str
    seq: int
    path: str
    name: str
    sha256: str
    size: int
    created_at: float
    #: None for an artifact declared before content ids were recorded (its ``sha256`` is it).
    content_id: str | None = None


def _transfer(row: Row | None) -> Transfer | None:
    return None if row is None else from_row(Transfer, row)


def _artifact(row: Row | None) -> Artifact | None:
    return None if row is None else from_row(Artifact, row)


class FileRecords(WorkspaceRecords):
    """The control plane's records for files, transfers and artifacts."""

    # ------------------------------------------------------------------ workspaces, agents

    async def workspaces_of(self, agent_ids: Sequence[str]) -> list[Workspace]:
        rows = await self.all(
            sa.select(workspaces)
            .where(workspaces.c.agent_id.in_(list(agent_ids)))
            .order_by(workspaces.c.created_at)
        )
        return [from_row(Workspace, r) for r in rows]

    async def child_agents(self, agent_id: str) -> list[Agent]:
        rows = await self.all(
            sa.select(agents).where(agents.c.parent_id == agent_id).order_by(agents.c.created_at)
        )
        return from_rows(Agent, rows)

    async def writer_of(self, workspace_id: str) -> tuple[str | None, str | None]:
        row = await self.get_workspace(workspace_id)
        if row is None:
            return None, None
        return row.writer_kind, row.writer_id

    # ------------------------------------------------------------------ history

    async def snapshot_rows(self, workspace_id: str) -> list[Snapshot]:
        return await self.list_snapshots(workspace_id)

    async def referenced_seqs(self, workspace_id: str) -> set[int]:
        """Snapshots of the workspace that a record names: an execution's commit, a
        transfer's source or last target snapshot, an artifact (retention keeps them)."""
        return await self.run(_referenced_seqs, workspace_id)

    async def mark_snapshots_pruned(self, workspace_id: str, seqs: Sequence[int]) -> None:
        await self.run(_mark_pruned, workspace_id, list(seqs))

    # ------------------------------------------------------------------ transfers

    async def create_transfer(
        self, values: dict[str, Any], files: list[dict[str, Any]]
    ) -> Transfer:
        return from_row(Transfer, await self.run(_create_transfer, values, files))

    async def get_transfer(self, transfer_id: str) -> Transfer | None:
        return _transfer(await self.one(sa.select(transfers).where(transfers.c.id == transfer_id)))

    async def list_transfers(self, agent_id: str, limit: int = 100) -> list[Transfer]:
        rows = await self.all(
            sa.select(transfers)
            .where(transfers.c.agent_id == agent_id)
            .order_by(transfers.c.created_at.desc())
            .limit(limit)
        )
        return [from_row(Transfer, r) for r in rows]

    async def active_transfers(self) -> list[Transfer]:
        rows = await self.all(
            sa.select(transfers)
            .where(transfers.c.state.in_(ACTIVE_TRANSFER_STATES))
            .order_by(transfers.c.created_at)
        )
        return [from_row(Transfer, r) for r in rows]

    async def update_transfer(
        self,
        transfer_id: str,
        *,
        from_states: Sequence[str] = ACTIVE_TRANSFER_STATES,
        **values: Any,
    ) -> bool:
        return await self.run(_update_transfer, transfer_id, tuple(from_states), values)

    async def pending_files(
        self, transfer_id: str, after_idx: int, limit: int
    ) -> list[TransferFile]:
        rows = await self.all(
            sa.select(transfer_files)
            .where(
                transfer_files.c.transfer_id == transfer_id,
                transfer_files.c.outcome == "pending",
                transfer_files.c.idx > after_idx,
            )
            .order_by(transfer_files.c.idx)
            .limit(limit)
        )
        return [from_row(TransferFile, r) for r in rows]

    async def transfer_files(
        self, transfer_id: str, outcome: str | None, offset: int, limit: int
    ) -> list[TransferFile]:
        stmt = sa.select(transfer_files).where(transfer_files.c.transfer_id == transfer_id)
        if outcome is not None:
            stmt = stmt.where(transfer_files.c.outcome == outcome)
        rows = await self.all(stmt.order_by(transfer_files.c.idx).offset(offset).limit(limit))
        return [from_row(TransferFile, r) for r in rows]

    async def record_outcomes(
        self,
        transfer_id: str,
        outcomes: list[tuple[int, str, str | None, int | None]],
        snapshot: dict[str, Any] | None,
        sent: int = 0,
        done_bytes: int = 0,
        holder: str | None = None,
    ) -> Transfer | None:
        """A batch is published: its files' outcomes (idx, outcome, reason, target seq), the
        transfer's counters, and the target snapshot that holds them, in one transaction.

        ``holder`` (replicas): fenced by the copier's lease, read locked in that transaction.
        None when the copier no longer holds it: the outcomes are not this copier's to
        record (the holder copies those files again and finds them ``unchanged``), or the
        transfer is final (ended elsewhere while the batch was applied): then the files the
        end had ``skipped`` that the batch committed get their outcome and the counters
        follow (T3: a file committed in the target counts). The target snapshot is recorded
        either way: it exists on the runner."""
        return _transfer(
            await self.run(
                _record_outcomes, transfer_id, outcomes, snapshot, sent, done_bytes, holder
            )
        )

    async def hold_transfer(self, transfer_id: str, holder: str, ttl_s: float) -> str:
        """The fence a copier passes right before it applies a batch to the target: ``HELD``
        when the transfer is active and ``holder``'s lease of it is in place (pushed forward
        here, so no replica claims it for ``ttl_s``), else ``ENDED`` or ``LOST``."""
        return await self.run(_hold_transfer, transfer_id, holder, ttl_s)

    async def finish_transfer(
        self,
        transfer_id: str,
        state: str,
        error: str | None,
        pending_reason: str,
        lease_holder: str | None = None,
    ) -> Transfer | None:
        """Make the transfer terminal (files never reached get ``skipped`` with
        ``pending_reason``) and release the target's writer; one transaction. None when it
        was terminal already. ``lease_holder``: that replica's lease of the transfer goes in
        the same transaction (also when it was terminal already), so nobody sees a finished
        transfer still leased."""
        return _transfer(
            await self.run(
                _finish_transfer, transfer_id, state, error, pending_reason, lease_holder
            )
        )

    # ------------------------------------------------------------------ artifacts

    async def create_artifact(self, values: dict[str, Any]) -> Artifact:
        return from_row(Artifact, await self.run(_create_artifact, values))

    async def get_artifact(self, artifact_id: str) -> Artifact | None:
        return _artifact(await self.one(sa.select(artifacts).where(artifacts.c.id == artifact_id)))

    async def find_artifact(self, agent_id: str, name: str) -> Artifact | None:
        return _artifact(
            await self.one(
                sa.select(artifacts).where(
                    artifacts.c.agent_id == agent_id, artifacts.c.name == name
                )
            )
        )

    async def list_artifacts(self, agent_id: str) -> list[Artifact]:
        rows = await self.all(
            sa.select(artifacts)
            .where(artifacts.c.agent_id == agent_id)
            .order_by(artifacts.c.created_at)
        )
        return [from_row(Artifact, r) for r in rows]


# ---------------------------------------------------------------------- operations


def _referenced_seqs(conn: Connection, workspace_id: str) -> set[int]:
    seqs: set[int] = set()
    for stmt in (
        sa.select(executions.c.snapshot_seq).where(executions.c.workspace_id == workspace_id),
        sa.select(transfers.c.source_seq).where(transfers.c.source_workspace_id == workspace_id),
        sa.select(transfers.c.target_seq).where(transfers.c.target_workspace_id == workspace_id),
        sa.select(artifacts.c.seq).where(artifacts.c.workspace_id == workspace_id),
    ):
        seqs.update(int(v) for v in conn.execute(stmt.distinct()).scalars() if v is not None)
    return seqs


def _mark_pruned(conn: Connection, workspace_id: str, seqs: list[int]) -> None:
    if seqs:
        conn.execute(
            snapshots.update()
            .where(
                snapshots.c.workspace_id == workspace_id,
                snapshots.c.seq.in_(seqs),
                snapshots.c.pruned_at.is_(None),
            )
            .values(pruned_at=time.time())
        )


def _create_transfer(conn: Connection, values: dict[str, Any], files: list[dict[str, Any]]) -> Row:
    conn.execute(transfers.insert().values(**values))
    if files:
        conn.execute(
            transfer_files.insert(),
            [{"transfer_id": values["id"], "outcome": "pending", **f} for f in files],
        )
    row = fetch_one(conn, sa.select(transfers).where(transfers.c.id == values["id"]))
    assert row is not None
    return row


def _update_transfer(
    conn: Connection, transfer_id: str, from_states: tuple[str, ...], values: dict[str, Any]
) -> bool:
    result = conn.execute(
        transfers.update()
        .where(transfers.c.id == transfer_id, transfers.c.state.in_(from_states))
        .values(**values)
    )
    return bool(result.rowcount)


_COUNTER = {
    "copied": "files_copied",
    "unchanged": "files_unchanged",
    "skipped": "files_skipped",
    "failed": "files_failed",
}


def _fence(conn: Connection, transfer_id: str, holder: str) -> str:
    """Whether ``holder`` still copies the transfer; its lease row locked first, the order a
    finish takes it in (``_finish_transfer``), so a batch's record and an end on another
    replica wait for each other instead of both going by what they read before."""
    lease = conn.execute(
        sa.select(leases.c.holder)
        .where(leases.c.kind == TRANSFER, leases.c.subject_id == transfer_id)
        .with_for_update()
    ).scalar_one_or_none()
    state = conn.execute(
        sa.select(transfers.c.state).where(transfers.c.id == transfer_id)
    ).scalar_one_or_none()
    if state is None or state in TERMINAL_TRANSFER_STATES:
        return ENDED
    return HELD if lease == holder else LOST


def _hold_transfer(conn: Connection, transfer_id: str, holder: str, ttl_s: float) -> str:
    conn.execute(
        leases.update()
        .where(
            leases.c.kind == TRANSFER,
            leases.c.subject_id == transfer_id,
            leases.c.holder == holder,
        )
        .values(expires_at=time.time() + ttl_s)
    )
    return _fence(conn, transfer_id, holder)


def _record_target_snapshot(
    conn: Connection, transfer_id: str, snapshot: dict[str, Any] | None
) -> None:
    if snapshot is not None and snapshot.get("new"):
        record_snapshot(
            conn,
            snapshot["workspace_id"],
            snapshot["seq"],
            snapshot["root_hash"],
            snapshot["files"],
            snapshot["bytes"],
            "transfer",
            transfer_id,
        )


def _account_late(
    conn: Connection,
    transfer_id: str,
    outcomes: list[tuple[int, str, str | None, int | None]],
    seq: int | None,
    sent: int,
) -> None:
    """A batch committed in the target after the transfer was made final: the files its end
    marked ``skipped`` that the batch committed take their outcome, so the final record
    says what the target holds (T3)."""
    committed = {i: (o, r, s) for i, o, r, s in outcomes if o in ("copied", "unchanged")}
    if not committed:
        return
    locked = sa.select(transfers).where(transfers.c.id == transfer_id).with_for_update()
    row = fetch_one(conn, locked)
    assert row is not None
    skipped = conn.execute(
        sa.select(transfer_files.c.idx, transfer_files.c.size, transfer_files.c.kind).where(
            transfer_files.c.transfer_id == transfer_id,
            transfer_files.c.idx.in_(list(committed)),
            transfer_files.c.outcome == "skipped",
        )
    ).all()
    if not skipped:
        return
    counts: dict[str, Any] = {"files_skipped": transfers.c.files_skipped - len(skipped)}
    done = 0
    for idx, size, kind in skipped:
        outcome, reason, at = committed[int(idx)]
        conn.execute(
            transfer_files.update()
            .where(transfer_files.c.transfer_id == transfer_id, transfer_files.c.idx == idx)
            .values(outcome=outcome, reason=reason, target_seq=at)
        )
        column = _COUNTER[outcome]
        counts[column] = counts.get(column, getattr(transfers.c, column)) + 1
        done += int(size) if kind == "file" else 0
    counts["bytes_done"] = transfers.c.bytes_done + done
    counts["bytes_sent"] = transfers.c.bytes_sent + sent
    if seq is not None:
        counts["target_seq"] = max(int(row["target_seq"] or 0), seq)
    if row["state"] == "failed":
        counts["state"] = "partial"  # something is in the target now (_finish's rule)
    conn.execute(transfers.update().where(transfers.c.id == transfer_id).values(**counts))


def _record_outcomes(
    conn: Connection,
    transfer_id: str,
    outcomes: list[tuple[int, str, str | None, int | None]],
    snapshot: dict[str, Any] | None,
    sent: int,
    done_bytes: int,
    holder: str | None,
) -> Row | None:
    if holder is not None:
        fence = _fence(conn, transfer_id, holder)
        if fence != HELD:
            _record_target_snapshot(conn, transfer_id, snapshot)
            if fence == ENDED:
                seq = None if snapshot is None else int(snapshot["seq"])
                _account_late(conn, transfer_id, outcomes, seq, sent)
            return None
    # one UPDATE per distinct (outcome, reason, seq): a batch is mostly "copied" at one seq
    groups: dict[tuple[str, str | None, int | None], list[int]] = {}
    for i, o, r, s in outcomes:
        groups.setdefault((o, r, s), []).append(i)
    for (outcome, reason, seq), idxs in groups.items():
        for start in range(0, len(idxs), 5000):
            conn.execute(
                transfer_files.update()
                .where(
                    transfer_files.c.transfer_id == transfer_id,
                    transfer_files.c.idx.in_(idxs[start : start + 5000]),
                )
                .values(outcome=outcome, reason=reason, target_seq=seq)
            )
    counts: dict[str, Any] = {}
    for _i, outcome, _r, _s in outcomes:
        column = _COUNTER[outcome]
        counts[column] = counts.get(column, 0) + 1
    values: dict[str, Any] = {
        column: getattr(transfers.c, column) + n for column, n in counts.items()
    }
    values["bytes_done"] = transfers.c.bytes_done + done_bytes
    values["bytes_sent"] = transfers.c.bytes_sent + sent
    values["batches"] = transfers.c.batches + 1
    if snapshot is not None:
        current = conn.execute(
            sa.select(transfers.c.target_seq).where(transfers.c.id == transfer_id)
        ).scalar_one_or_none()
        values["target_seq"] = max(int(current or 0), int(snapshot["seq"]))
        _record_target_snapshot(conn, transfer_id, snapshot)
    conn.execute(transfers.update().where(transfers.c.id == transfer_id).values(**values))
    row = fetch_one(conn, sa.select(transfers).where(transfers.c.id == transfer_id))
    assert row is not None
    return row


def _finish_transfer(
    conn: Connection,
    transfer_id: str,
    state: str,
    error: str | None,
    pending_reason: str,
    lease_holder: str | None,
) -> Row | None:
    if lease_holder is not None:
        delete_lease(conn, TRANSFER, transfer_id, lease_holder)
    # The files first, then the transfer's row locked while read (PostgreSQL; SQLite has one
    # writer), in the order a batch's commit takes them (``_record_outcomes``: no deadlock).
    # Read unlocked, two replicas ending it at once (a stalled copier, a cancel that took
    # its expired lease) both found it active under READ COMMITTED and both ended it, the
    # second's state and notice over the first's (docs/security.md "Attack pass (session
    # 51)"); now the second waits and finds it final. A final transfer has no pending file:
    # the first statement changes nothing then.
    left = conn.execute(
        transfer_files.update()
        .where(transfer_files.c.transfer_id == transfer_id, transfer_files.c.outcome == "pending")
        .values(outcome="skipped", reason=pending_reason)
    ).rowcount
    locked = sa.select(transfers).where(transfers.c.id == transfer_id).with_for_update()
    row = fetch_one(conn, locked)
    if row is None or row["state"] in TERMINAL_TRANSFER_STATES:
        return None
    conn.execute(
        transfers.update()
        .where(transfers.c.id == transfer_id)
        .values(
            state=state,
            error=error,
            finished_at=time.time(),
            files_skipped=transfers.c.files_skipped + (left or 0),
        )
    )
    release_writer(conn, str(row["target_workspace_id"]), transfer_id)
    return fetch_one(conn, sa.select(transfers).where(transfers.c.id == transfer_id))


def _create_artifact(conn: Connection, values: dict[str, Any]) -> Row:
    conn.execute(artifacts.insert().values(**values))
    row = fetch_one(conn, sa.select(artifacts).where(artifacts.c.id == values["id"]))
    assert row is not None
    return row


__all__ = [
    "ACTIVE_TRANSFER_STATES",
    "ENDED",
    "HELD",
    "LOST",
    "TERMINAL_TRANSFER_STATES",
    "Artifact",
    "FileRecords",
    "Transfer",
    "TransferFile",
]
