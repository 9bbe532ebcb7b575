"""Leases (docs/operations.md): which control-plane replica watches each piece of ongoing work.

A lease row names its holder (a replica id, one per ``serve`` process) and an expiry the holder
keeps pushing forward. Another replica takes a lease only once it has expired: on PostgreSQL
the claim reads the expired rows ``FOR UPDATE SKIP LOCKED``, so two replicas claiming at the
same moment split them and never both take one. SQLite has one replica; its claims are
trivially its own."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from shellyard.store.db import Database, Row, execute_prepared, fetch_all, upsert
from shellyard.store.records import from_rows
from shellyard.store.schema import (
    environment_changes,
    environments,
    executions,
    leases,
    transfers,
    wake_deliveries,
    wakes,
    workspaces,
)


@dataclass(frozen=True, slots=True, kw_only=True)
class Lease:
    """A ``leases`` row (docs/architecture.md "Records at the store boundary"): ``kind`` and
    ``subject_id`` name the work, ``holder`` the replica, ``scope`` the home whose local
    runner the work needs (None: any replica may take it)."""

    kind: str
    subject_id: str
    holder: str
    scope: str | None
    expires_at: float
    acquired_at: float
    takeovers: int = 0


#: The kinds of work a lease can name.
EXECUTION = "execution"
DELIVERY = "delivery"
TRANSFER = "transfer"
CHANGE = "change"  # an environment change (V1–V8)
KINDS = (EXECUTION, DELIVERY, TRANSFER, CHANGE)

# The unfinished states of those (store/files.py and store/environments.py name them too; both
# build on the Store this module is part of, so they cannot be imported here).
_ACTIVE_TRANSFER = ("queued", "running")
_PENDING_CHANGE = ("waiting", "running")


@dataclass(frozen=True)
class LeaseTerms:
    """Who takes a lease and for how long: written with the record it guards, in that
    record's own transaction (one transaction fewer per execution, docs/benchmarks.md)."""

    holder: str
    scope: str | None
    ttl_s: float


class LeaseHolder(Protocol):
    """What every service that watches leased work needs of the control plane's lease keeper
    (control/replicas/leases.py), given when the service is built: executions, transfers and
    environment changes (``WatchLeases``) and webhook deliveries (``DeliveryLeases``) each
    extend it with the rest they use."""

    #: How long a lease lives unrenewed: a dead replica's work waits this long.
    ttl_s: float

    def register(
        self,
        kind: str,
        adopt: Callable[[str], Awaitable[None]],
        lost: Callable[[str], None],
        *,
        sweep: Callable[[], Awaitable[None]] | None = None,
        dispatch: Callable[[str], Awaitable[None]] | None = None,
    ) -> None:
        """``adopt``: a subject of ``kind`` this replica claimed (its holder died); ``lost``: one
        another replica took over; ``sweep``: every few rounds, work of ``kind`` a dead replica
        recorded but never leased; ``dispatch``: a workspace whose queue nobody hands on."""
        ...

    async def acquire(self, kind: str, subject_id: str, runner_id: str) -> bool:
        """True when this replica holds the lease now (it then watches and finalizes)."""
        ...

    async def release(self, kind: str, subject_id: str) -> None: ...


# Built once with bind parameters (docs/benchmarks.md §29): an execution's submit and finish
# run these, and building a Core statement with literal values costs more than running it on
# SQLite (coercion of each value, a fresh cache key).
_INSERT = leases.insert().values(
    kind=sa.bindparam("b_kind"), subject_id=sa.bindparam("b_subject"),
    holder=sa.bindparam("b_holder"), scope=sa.bindparam("b_scope"),
    expires_at=sa.bindparam("b_expires"), acquired_at=sa.bindparam("b_now"), takeovers=0,
)  # fmt: skip
_DELETE = leases.delete().where(
    leases.c.kind == sa.bindparam("b_kind"),
    leases.c.subject_id == sa.bindparam("b_subject"),
    leases.c.holder == sa.bindparam("b_holder"),
)


def insert_lease(conn: Connection, kind: str, subject_id: str, terms: LeaseTerms) -> None:
    """The lease of a subject made in this transaction (so nobody else can hold one yet)."""
    now = time.time()
    execute_prepared(  # compiled once (store/db.py): every execution's submit sends it
        conn,
        _INSERT,
        {
            "b_kind": kind, "b_subject": subject_id, "b_holder": terms.holder,
            "b_scope": terms.scope, "b_expires": now + terms.ttl_s, "b_now": now,
        },
    )  # fmt: skip


class LeaseRecords(Database):
    """Lease rows: acquire, renew, release, claim the expired ones."""

    async def acquire_lease(
        self, kind: str, subject_id: str, holder: str, scope: str | None, ttl_s: float
    ) -> bool:
        """Take the lease unless another holder's is still alive; True when it is ours."""
        return await self.run(_acquire, kind, subject_id, holder, scope, ttl_s)

    async def renew_leases(self, holder: str, ttl_s: float) -> set[tuple[str, str]]:
        """Push every lease of ``holder`` forward; returns the (kind, subject) it still holds."""
        return await self.run(_renew, holder, ttl_s)

    async def release_lease(self, kind: str, subject_id: str, holder: str) -> None:
        await self.run(delete_lease, kind, subject_id, holder)

    async def hand_over_leases(self, holder: str) -> None:
        """A replica stopping cleanly: its leases expire now, so another takes them at once."""
        await self.run(_hand_over, holder)

    async def claim_leases(
        self, holder: str, scope: str | None, ttl_s: float, limit: int, *, mode: str
    ) -> list[Lease]:
        """Take up to ``limit`` leases of shared work or of ``scope``. ``mode``: ``expired``
        (their holder stopped renewing), ``start`` (also the live ones of ``scope``: only one
        process serves a home, so another id holding them is a previous, dead, process of
        this home), ``all`` (SQLite's start-up: there is no other replica). Each lease is
        returned as it was before the claim (its previous holder and expiry)."""
        return from_rows(Lease, await self.run(_claim, holder, scope, ttl_s, limit, mode))

    async def claim_orphans(
        self,
        holder: str,
        scope: str | None,
        ttl_s: float,
        grace_s: float,
        local_runner: str,
        *,
        gated: bool,
    ) -> list[str]:
        """Executions that run, are unknown and still asked about (E9), or hold their
        workspace's writer while queued, with no lease at all, older than ``grace_s``: left by
        a release before leases, by a crash between taking the writer and the lease, or by a
        SQLite home's previous process (its leases have no rows). Shared-runner ones always;
        ``local_runner`` ones only with ``scope`` (a home's start-up, as before leases).
        ``gated``: also those that hold the writer while they wait for an environment change
        (V5)."""
        return await self.run(_orphans, holder, scope, ttl_s, grace_s, local_runner, gated)

    async def stalled_workspaces(self, grace_s: float, local_runner: str | None) -> list[str]:
        """Workspaces with queued writers and no writer for ``grace_s`` (the replica that was
        to hand it on died in between): someone has to dispatch them. ``local_runner``: its
        workspaces are left out (only their own home can run them)."""
        return await self.run(_stalled, grace_s, local_runner)

    async def unleased_deliveries(self, grace_s: float) -> list[str]:
        """Pending webhook deliveries no replica holds, older than ``grace_s``: their replica
        died between recording the wake and taking the delivery's lease."""
        unleased = _unleased(DELIVERY, wake_deliveries.c.id)
        rows = await self.all(
            sa.select(wake_deliveries.c.id)
            .join(wakes, wakes.c.id == wake_deliveries.c.wake_id)
            .where(
                wake_deliveries.c.state == "pending",
                wakes.c.created_at < time.time() - grace_s,
                unleased,
            )
            .limit(1000)
        )
        return [str(r["id"]) for r in rows]

    async def unleased_transfers(self, grace_s: float, local_runner: str) -> list[str]:
        """Queued or running transfers no replica holds, older than ``grace_s``, between
        shared runners (a transfer touching ``local_runner`` is only its home's)."""
        source = workspaces.alias("source")
        target = workspaces.alias("target")
        rows = await self.all(
            sa.select(transfers.c.id)
            .join(source, source.c.id == transfers.c.source_workspace_id)
            .join(target, target.c.id == transfers.c.target_workspace_id)
            .where(
                transfers.c.state.in_(_ACTIVE_TRANSFER),
                transfers.c.created_at < time.time() - grace_s,
                source.c.runner_id != local_runner,
                target.c.runner_id != local_runner,
                _unleased(TRANSFER, transfers.c.id),
            )
            .limit(1000)
        )
        return [str(r["id"]) for r in rows]

    async def unleased_changes(self, grace_s: float, local_runner: str) -> list[str]:
        """Waiting or running environment changes no replica holds, older than ``grace_s``,
        on shared runners."""
        rows = await self.all(
            sa.select(environment_changes.c.id)
            .join(environments, environments.c.id == environment_changes.c.environment_id)
            .where(
                environment_changes.c.state.in_(_PENDING_CHANGE),
                environment_changes.c.created_at < time.time() - grace_s,
                environments.c.runner_id != local_runner,
                _unleased(CHANGE, environment_changes.c.id),
            )
            .limit(1000)
        )
        return [str(r["id"]) for r in rows]

    async def lease_counts(self, holder: str) -> dict[str, int]:
        rows = await self.all(
            sa.select(leases.c.kind, sa.func.count().label("n"))
            .where(leases.c.holder == holder)
            .group_by(leases.c.kind)
        )
        return {str(r["kind"]): int(r["n"]) for r in rows}


def _unleased(kind: str, subject: sa.ColumnElement[str]) -> sa.ColumnElement[bool]:
    return ~sa.exists(
        sa.select(leases.c.subject_id).where(leases.c.kind == kind, leases.c.subject_id == subject)
    )


# ---------------------------------------------------------------------- operations
# Each runs inside one transaction on ``conn``.


def _acquire(
    conn: Connection, kind: str, subject_id: str, holder: str, scope: str | None, ttl_s: float
) -> bool:
    now = time.time()
    values = {
        "holder": holder,
        "scope": scope,
        "expires_at": now + ttl_s,
        "acquired_at": now,
    }
    stmt = upsert(conn, leases).values(kind=kind, subject_id=subject_id, takeovers=0, **values)
    stmt = stmt.on_conflict_do_update(
        index_elements=[leases.c.kind, leases.c.subject_id],
        set_={
            **values,
            "takeovers": leases.c.takeovers + sa.case((leases.c.holder == holder, 0), else_=1),
        },
        where=sa.or_(leases.c.holder == holder, leases.c.expires_at < now),
    )
    conn.execute(stmt)
    got = conn.execute(
        sa.select(leases.c.holder).where(leases.c.kind == kind, leases.c.subject_id == subject_id)
    ).scalar_one_or_none()
    return got == holder


def _renew(conn: Connection, holder: str, ttl_s: float) -> set[tuple[str, str]]:
    conn.execute(
        leases.update().where(leases.c.holder == holder).values(expires_at=time.time() + ttl_s)
    )
    rows = conn.execute(
        sa.select(leases.c.kind, leases.c.subject_id).where(leases.c.holder == holder)
    ).all()
    return {(str(r[0]), str(r[1])) for r in rows}


def delete_lease(conn: Connection, kind: str, subject_id: str, holder: str) -> None:
    execute_prepared(conn, _DELETE, {"b_kind": kind, "b_subject": subject_id, "b_holder": holder})


def _hand_over(conn: Connection, holder: str) -> None:
    conn.execute(leases.update().where(leases.c.holder == holder).values(expires_at=0.0))


def _claim(
    conn: Connection, holder: str, scope: str | None, ttl_s: float, limit: int, mode: str
) -> list[Row]:
    now = time.time()
    takeable: sa.ColumnElement[bool] = leases.c.expires_at < now
    if mode == "start" and scope is not None:
        takeable = sa.or_(takeable, leases.c.scope == scope)
    reachable: sa.ColumnElement[bool] = leases.c.scope.is_(None)
    if scope is not None:
        reachable = sa.or_(reachable, leases.c.scope == scope)
    if mode == "all":
        takeable = reachable = sa.true()
    stmt = (
        sa.select(leases)
        .where(takeable, reachable, leases.c.holder != holder)
        .order_by(leases.c.expires_at)
        .limit(limit)
    )
    if conn.dialect.name != "sqlite":
        # Rows another replica is claiming right now are skipped, not waited for: each
        # expired lease goes to exactly one of the replicas claiming at once.
        stmt = stmt.with_for_update(skip_locked=True)
    rows = fetch_all(conn, stmt)
    for row in rows:
        conn.execute(
            leases.update()
            .where(leases.c.kind == row["kind"], leases.c.subject_id == row["subject_id"])
            .values(
                holder=holder,
                expires_at=now + ttl_s,
                acquired_at=now,
                takeovers=leases.c.takeovers + 1,
            )
        )
    return rows


def _orphans(
    conn: Connection,
    holder: str,
    scope: str | None,
    ttl_s: float,
    grace_s: float,
    local_runner: str,
    gated: bool,
) -> list[str]:
    now = time.time()
    unleased = _unleased(EXECUTION, executions.c.id)
    running = sa.and_(
        sa.or_(
            executions.c.state == "running",
            # E9, R3: unknown and still asked about (a final unknown has its end): on SQLite
            # no lease row says so since session 49, so it is taken here as running is
            sa.and_(executions.c.state == "unknown", executions.c.finished_at.is_(None)),
        ),
        sa.func.coalesce(executions.c.started_at, executions.c.created_at) < now - grace_s,
    )
    writer_queued = sa.and_(
        executions.c.state == "queued",
        sa.true() if gated else executions.c.waiting_for.is_(None),
        executions.c.created_at < now - grace_s,
        sa.exists(
            sa.select(workspaces.c.id).where(
                workspaces.c.id == executions.c.workspace_id,
                workspaces.c.writer_id == executions.c.id,
            )
        ),
    )
    stmt = sa.select(executions.c.id, executions.c.runner_id).where(
        unleased, sa.or_(running, writer_queued)
    )
    if scope is None:
        stmt = stmt.where(executions.c.runner_id != local_runner)
    claimed = []
    for row in conn.execute(stmt.order_by(executions.c.seq).limit(1000)).all():
        execution_id, runner_id = str(row[0]), str(row[1])
        lease_scope = scope if runner_id == local_runner else None
        conn.execute(
            upsert(conn, leases)
            .values(
                kind=EXECUTION,
                subject_id=execution_id,
                holder=holder,
                scope=lease_scope,
                expires_at=now + ttl_s,
                acquired_at=now,
                takeovers=1,
            )
            .on_conflict_do_nothing(index_elements=[leases.c.kind, leases.c.subject_id])
        )
        got = conn.execute(
            sa.select(leases.c.holder).where(
                leases.c.kind == EXECUTION, leases.c.subject_id == execution_id
            )
        ).scalar_one_or_none()
        if got == holder:
            claimed.append(execution_id)
    return claimed


def _stalled(conn: Connection, grace_s: float, local_runner: str | None) -> list[str]:
    unleased = _unleased(EXECUTION, executions.c.id)
    stmt = (
        sa.select(executions.c.workspace_id)
        .distinct()
        .join(workspaces, workspaces.c.id == executions.c.workspace_id)
        .where(
            executions.c.state == "queued",
            executions.c.created_at < time.time() - grace_s,
            sa.or_(
                sa.and_(sa.not_(executions.c.read_only), workspaces.c.writer_id.is_(None)),
                # a reader not started yet waits for nobody (W2)
                sa.and_(executions.c.read_only, executions.c.waiting_for.is_(None), unleased),
            ),
        )
    )
    if local_runner is not None:
        stmt = stmt.where(executions.c.runner_id != local_runner)
    return [str(r[0]) for r in conn.execute(stmt).all()]
