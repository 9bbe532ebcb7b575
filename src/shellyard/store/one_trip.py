"""PostgreSQL's submit and finish of an execution in fewer round trips (docs/benchmarks.md §26).

Each statement sent is a round trip the replica waits for, and psycopg sends BEGIN and COMMIT
as round trips of their own: these build the several writes of one step as a single statement
of data-modifying CTEs (``WITH a AS (UPDATE … RETURNING …), b AS (INSERT …) SELECT …``). All
of a statement's parts see the snapshot taken when it began, so only writes that need no later
snapshot are joined:

- the submit (insert, the writer's take, the lease) is one statement, sent without BEGIN and
  COMMIT (``Database.run_statement``: committed before the server answers, E11);
- the finish stays a transaction of two statements: the terminal update first, then the rest
  (N6's reminder cancel, N3's foreground waits, the notice, the writer's and the lease's
  release, the next queued writer) in one. The rest must begin after the update holds the
  record's row lock: a timer committed meanwhile is then either seen by the cancel, or its
  creation's ``FOR SHARE`` re-read waits for this commit and sees the end
  (``TimerRecords.execution_for_new_timer``); a single statement's snapshot would predate the
  lock and miss it.

SQLite keeps its plain statements (store/executions.py): one process, no round trips.
"""

from __future__ import annotations

import functools
import time
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql
from sqlalchemy.engine import Connection

from shellyard.store.db import Row, new_id
from shellyard.store.leases import EXECUTION, LeaseTerms
from shellyard.store.schema import executions, foreground_waits, leases, notices, timers, workspaces


def _flag(name: str) -> sa.BindParameter[bool]:
    return sa.bindparam(name, type_=sa.Boolean)


# ---------------------------------------------------------------------- submit


@functools.lru_cache(maxsize=16)
def _submit_statement(keys: tuple[str, ...]) -> sa.Select[Any]:
    """Built once per set of record fields (docs/benchmarks.md "CPU per execution")."""
    read_only = _flag("b_read_only")
    # The writer, unless a writer queued before this one waits for it (W1); a reader takes
    # nothing (W2). The new record is not in the snapshot: it never counts as one queued.
    take = (
        workspaces.update()
        .where(
            workspaces.c.id == sa.bindparam("b_workspace"),
            workspaces.c.writer_id.is_(None),
            sa.not_(read_only),
            ~sa.exists(
                sa.select(executions.c.id).where(
                    executions.c.workspace_id == sa.bindparam("b_workspace"),
                    executions.c.state == "queued",
                    sa.not_(executions.c.read_only),
                )
            ),
        )
        .values(writer_kind="execution", writer_id=sa.bindparam("b_id"))
        .returning(workspaces.c.id)
        .cte("took")
    )
    took = sa.exists(sa.select(take.c.id))
    fields = [sa.bindparam(f"v_{key}", type_=executions.c[key].type) for key in keys]
    seq = sa.select(sa.func.coalesce(sa.func.max(executions.c.seq), 0) + 1).scalar_subquery()
    inserted = (
        executions.insert()
        .from_select(
            [*keys, "seq"],
            # Refused (held, not queued): nothing is written at all.
            sa.select(*fields, seq).where(sa.or_(_flag("b_queue"), read_only, took)),
        )
        .returning(*executions.c)
        .cte("inserted")
    )
    # It starts now: whoever submits watches it.
    lease = (
        leases.insert()
        .from_select(
            ["kind", "subject_id", "holder", "scope", "expires_at", "acquired_at", "takeovers"],
            sa.select(
                sa.literal(EXECUTION),
                sa.bindparam("b_id"),
                sa.bindparam("l_holder", type_=sa.String),
                sa.bindparam("l_scope", type_=sa.String),
                sa.bindparam("l_expires", type_=sa.Float),
                sa.bindparam("l_now", type_=sa.Float),
                sa.literal(0),
            ).where(_flag("b_lease"), sa.or_(read_only, took)),
        )
        .returning(leases.c.kind)
        .cte("leased")
    )
    writer = (
        sa.select(workspaces.c.writer_id)
        .where(workspaces.c.id == sa.bindparam("b_workspace"))
        .scalar_subquery()
    )
    return sa.select(*inserted.c, took.label("b_took"), writer.label("b_writer")).add_cte(lease)


def submit(
    conn: Connection, values: dict[str, Any], queue: bool, lease: LeaseTerms | None
) -> tuple[Row | None, bool, str | None]:
    """One statement: (the record, or None when refused; whether it may start now; the
    writer's holder as the statement saw it)."""
    keys = tuple(sorted(values))
    now = time.time()
    params: dict[str, Any] = {f"v_{key}": values[key] for key in keys}
    params.update(
        b_id=values["id"], b_workspace=values["workspace_id"], b_queue=queue,
        b_read_only=bool(values.get("read_only")), b_lease=lease is not None,
        l_holder=lease.holder if lease else None, l_scope=lease.scope if lease else None,
        l_expires=now + lease.ttl_s if lease else None, l_now=now,
    )  # fmt: skip
    found = conn.execute(_submit_statement(keys), params).mappings().first()
    if found is None:
        return None, False, None
    row = {key: found[key] for key in executions.c.keys()}  # noqa: SIM118
    starts = bool(found["b_took"]) or bool(values.get("read_only"))
    return row, starts, found["b_writer"]


# ---------------------------------------------------------------------- finish


def _finish_rest_statement() -> sa.Select[Any]:
    final = _flag("b_final")  # the terminal update took effect (not already terminal)
    now = sa.bindparam("b_now", type_=sa.Float)
    execution_id = sa.bindparam("b_id", type_=sa.String)
    cancelled = (
        timers.update()
        .where(
            timers.c.execution_id == execution_id,
            timers.c.state == "pending",
            timers.c.fire_at > sa.bindparam("b_finished", type_=sa.Float),
            final,
            _flag("b_cancel"),
        )
        .values(state="cancelled", cancel_reason=sa.bindparam("b_reason"), cancelled_at=now)
        .returning(timers.c.id)
        .cte("cancelled")
    )
    # N3 across replicas: the DELETE locks the rows it takes until this commits, so a waiter
    # that removes its row meanwhile waits for the commit, and then reads the terminal
    # record: a notice posted read is always seen by its caller. Rows of a killed waiter
    # (expired) count for nothing but go too.
    waits = (
        foreground_waits.delete()
        .where(foreground_waits.c.execution_id == execution_id, final)
        .returning(foreground_waits.c.expires_at)
        .cte("waits")
    )
    read = sa.or_(
        _flag("b_read"), sa.exists(sa.select(waits.c.expires_at).where(waits.c.expires_at > now))
    )
    payload = sa.func.json_build_object(
        sa.literal_column("'state'"),
        sa.bindparam("b_state", type_=sa.String),
        sa.literal_column("'exit_code'"),
        sa.bindparam("b_exit", type_=sa.Integer),
    )
    notice = (
        postgresql.insert(notices)
        .from_select(
            ["id", "agent_id", "kind", "subject_id", "summary", "payload", "created_at", "read_at"],
            sa.select(
                sa.bindparam("b_notice"),
                sa.bindparam("b_agent"),
                sa.literal("execution"),
                execution_id,
                sa.bindparam("b_summary"),
                payload,
                now,
                sa.case((read, now), else_=sa.null()),
            ).where(final),
        )
        .on_conflict_do_nothing(index_elements=[notices.c.kind, notices.c.subject_id])
        .returning(notices.c.id)
        .cte("notice")
    )
    released = (
        workspaces.update()
        .where(
            workspaces.c.id == sa.bindparam("b_workspace"), workspaces.c.writer_id == execution_id
        )
        .values(writer_kind=None, writer_id=None)
        .returning(workspaces.c.id)
        .cte("released")
    )
    let_go = (
        leases.delete()
        .where(
            leases.c.kind == EXECUTION,
            leases.c.subject_id == execution_id,
            leases.c.holder == sa.bindparam("b_holder", type_=sa.String),
        )
        .returning(leases.c.kind)
        .cte("let_go")
    )
    # The snapshot predates this statement's own release: the finishing record itself may
    # still look queued (a queued writer cancelled), so it is left out by id.
    queued = (
        sa.select(executions)
        .where(
            executions.c.workspace_id == sa.bindparam("b_workspace"),
            executions.c.state == "queued",
            sa.not_(executions.c.read_only),
            executions.c.id != execution_id,
        )
        .order_by(executions.c.seq)
        .limit(1)
        .cte("queued")
    )
    one = sa.select(sa.literal(1).label("one")).subquery("one")
    count = sa.select(sa.func.count()).select_from(cancelled).scalar_subquery()
    return (
        sa.select(count.label("b_cancelled"), read.label("b_read"), *queued.c)
        .select_from(one.outerjoin(queued, sa.true()))
        .add_cte(notice, released, let_go)
    )


_FINISH_REST = _finish_rest_statement()


def finish_rest(
    conn: Connection,
    ids: tuple[str, str, str],
    final: Row | None,
    notice_summary: str,
    notice_read: bool,
    lease_holder: str | None,
    cancel_timers: bool,
) -> tuple[Row | None, Row | None, bool]:
    """Everything after the terminal update (``final``: its result), in one statement of
    the same transaction; returns what ``_finish_execution`` does. ``ids``: the execution's,
    its workspace's and its agent's."""
    execution_id, workspace_id, agent_id = ids
    now = time.time()
    params = {
        "b_id": execution_id,
        "b_workspace": workspace_id,
        "b_agent": agent_id,
        "b_final": final is not None,
        "b_cancel": cancel_timers,
        "b_finished": (final["finished_at"] if final else None) or now,
        "b_reason": f"execution {execution_id} finished before the reminder was due",
        "b_now": now,
        "b_read": notice_read,
        "b_notice": new_id("ntc"),
        "b_summary": notice_summary,
        "b_state": final["state"] if final else None,
        "b_exit": final["exit_code"] if final else None,
        "b_holder": lease_holder,
    }
    found = conn.execute(_FINISH_REST, params).mappings().one()
    queued = None
    if found["id"] is not None:
        queued = {key: found[key] for key in executions.c.keys()}  # noqa: SIM118
    if final is None:
        return None, queued, False
    if cancel_timers:
        final = {**final, "timers_cancelled": int(found["b_cancelled"])}
    return final, queued, bool(found["b_read"])
