"""Records of managed environments, their revisions and changes (V1–V8), over the same
``Store``: each operation is a synchronous function of a ``Connection`` run as one transaction
by ``Database.run``.

The waiting rule (V5) is decided here, in the database, so that it holds across processes
(two control planes on one PostgreSQL, or a restart): every transaction that records a
change, claims one, finishes one, or lets an execution resolve its revision first locks the
environment's row (``SELECT … FOR UPDATE`` on PostgreSQL; SQLite runs one write transaction
at a time anyway), so the gate and the claim never interleave."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection
from sqlalchemy.exc import IntegrityError

from shellyard.errors import Conflict
from shellyard.store.db import Database, Row, fetch_one
from shellyard.store.executions import Execution
from shellyard.store.records import from_row, from_rows, maybe
from shellyard.store.schema import (
    environment_changes,
    environment_revisions,
    environments,
    executions,
)

PENDING_CHANGE_STATES = ("waiting", "running")


@dataclass(frozen=True, slots=True, kw_only=True)
class Environment:
    """An ``environments`` row (V1; docs/architecture.md "Records at the store boundary"):
    ``state`` ``creating``, ``ready`` or ``failed`` (its ``create`` failed, ``error`` says
    why); ``revision`` the latest, 0 until ``create`` succeeded."""

    id: str
    session_id: str
    created_by: str
    runner_id: str
    name: str
    language: str
    revision: int = 0
    state: str
    error: str | None
    created_at: float


@dataclass(frozen=True, slots=True, kw_only=True)
class Change:
    """An ``environment_changes`` row (V2, V5, V8): a create, install or uninstall, ``waiting``
    (``waiting_for`` names what holds the environment), ``running``, ``succeeded`` (with the
    ``revision`` it recorded) or ``failed`` (``error``, ``error_kind``)."""

    id: str
    environment_id: str
    seq: int
    agent_id: str
    action: str
    manager: str | None
    specs: list[str]
    options: dict[str, Any]
    state: str
    waiting_for: list[str]
    error: str | None
    error_kind: str | None
    revision: int | None
    progress: str | None
    created_at: float
    started_at: float | None
    finished_at: float | None


@dataclass(frozen=True, slots=True, kw_only=True)
class Revision:
    """An ``environment_revisions`` row (V2): the packages after a change, and its request."""

    environment_id: str
    revision: int
    packages: list[dict[str, Any]]
    request: dict[str, Any]
    change_id: str
    created_at: float


class EnvironmentRecords(Database):
    """The control plane's records of environments."""

    # ------------------------------------------------------------------ environments

    async def create_environment(
        self, environment: dict[str, Any], change: dict[str, Any]
    ) -> tuple[Environment, Change]:
        """Record a new environment (``creating``) and its ``create`` change (``waiting``).
        A name already used by the session on that runner is a Conflict."""
        try:
            env, first = await self.run(_create, environment, change)
        except IntegrityError:
            raise _name_taken(environment) from None
        return from_row(Environment, env), from_row(Change, first)

    async def get_environment(self, environment_id: str) -> Environment | None:
        row = await self.one(sa.select(environments).where(environments.c.id == environment_id))
        return maybe(Environment, row)

    async def environments_of_session(
        self, session_id: str, runner_id: str | None = None
    ) -> list[Environment]:
        stmt = sa.select(environments).where(environments.c.session_id == session_id)
        if runner_id is not None:
            stmt = stmt.where(environments.c.runner_id == runner_id)
        return from_rows(Environment, await self.all(stmt.order_by(environments.c.created_at)))

    # ------------------------------------------------------------------ revisions

    async def environment_revisions(self, environment_id: str) -> list[Revision]:
        rows = await self.all(
            sa.select(environment_revisions)
            .where(environment_revisions.c.environment_id == environment_id)
            .order_by(environment_revisions.c.revision)
        )
        return from_rows(Revision, rows)

    async def environment_revision(self, environment_id: str, number: int) -> Revision | None:
        row = await self.one(
            sa.select(environment_revisions).where(
                environment_revisions.c.environment_id == environment_id,
                environment_revisions.c.revision == number,
            )
        )
        return maybe(Revision, row)

    # ------------------------------------------------------------------ changes

    async def add_environment_change(self, change: dict[str, Any]) -> Change:
        """Record an install or uninstall as ``waiting`` (it is claimed separately)."""
        return from_row(Change, await self.run(_add_change, change))

    async def get_environment_change(self, change_id: str) -> Change | None:
        row = await self.one(
            sa.select(environment_changes).where(environment_changes.c.id == change_id)
        )
        return maybe(Change, row)

    async def environment_changes(
        self, environment_id: str, states: tuple[str, ...] | None = None
    ) -> list[Change]:
        stmt = sa.select(environment_changes).where(
            environment_changes.c.environment_id == environment_id
        )
        if states is not None:
            stmt = stmt.where(environment_changes.c.state.in_(states))
        return from_rows(Change, await self.all(stmt.order_by(environment_changes.c.seq)))

    async def pending_environment_changes(self) -> list[Change]:
        """Every change not yet ended, of every environment (start-up re-attaches to them)."""
        rows = await self.all(
            sa.select(environment_changes)
            .where(environment_changes.c.state.in_(PENDING_CHANGE_STATES))
            .order_by(environment_changes.c.created_at, environment_changes.c.seq)
        )
        return from_rows(Change, rows)

    async def claim_environment_change(self, change_id: str) -> Change:
        """V5: move a waiting change to ``running`` when nothing holds its environment (no
        earlier change pending, no execution using it); else record what it waits for."""
        return from_row(Change, await self.run(_claim, change_id))

    async def unclaim_environment_change(self, change_id: str, reason: str) -> Change:
        """The runner refused to start the change (an execution still runs there): wait again."""
        return from_row(Change, await self.run(_unclaim, change_id, reason))

    async def set_change_progress(self, change_id: str, progress: str | None) -> None:
        await self.run(_set_progress, change_id, progress)

    async def finish_environment_change(
        self,
        change_id: str,
        *,
        packages: list[dict[str, Any]] | None,
        error: str | None = None,
        error_kind: str | None = None,
        finished_at: float | None = None,
    ) -> Change:
        """End a running change: with ``packages`` it succeeded and revision N+1 is recorded
        with the environment's new revision (one transaction); without, it failed and no
        revision is recorded. A change already ended is returned unchanged."""
        row = await self.run(
            _finish, change_id, packages, error, error_kind, finished_at or time.time()
        )
        return from_row(Change, row)

    # ------------------------------------------------------------------ executions (V5, V6)

    async def gate_on_environment(
        self, execution_id: str, environment_id: str
    ) -> tuple[str, Execution]:
        """Decide whether an execution may start on its environment now (V5, V6).

        ``("go", record)``: it recorded the environment's current revision and holds the
        environment until it ends. ``("wait", record)``: a change is pending; the record names
        it in ``waiting_for`` and stays queued. ``("failed", record)``: the environment cannot
        be used (its creation failed); ``waiting_for`` is cleared and the caller fails it."""
        verdict, row = await self.run(_gate, execution_id, environment_id)
        return verdict, from_row(Execution, row)

    async def gated_workspaces(self, environment_id: str) -> list[str]:
        """Workspaces with a queued execution on the environment that has not resolved its
        revision yet: dispatch them when a change ends."""
        rows = await self.all(
            sa.select(executions.c.workspace_id)
            .where(
                executions.c.environment_id == environment_id,
                executions.c.state == "queued",
                executions.c.environment_revision.is_(None),
            )
            .distinct()
        )
        return [str(r["workspace_id"]) for r in rows]


# ---------------------------------------------------------------------- operations


def _name_taken(environment: dict[str, Any]) -> Conflict:
    return Conflict(
        f"an environment named {environment['name']!r} already exists in this session on "
        f"runner {environment['runner_id']!r}; use it (environment_list shows its id) or "
        "pick another name"
    )


def _lock(conn: Connection, environment_id: str) -> Row | None:
    # FOR UPDATE serialises every V5 decision on one environment across processes
    # (PostgreSQL); SQLite ignores it and runs write transactions one at a time.
    return fetch_one(
        conn,
        sa.select(environments).where(environments.c.id == environment_id).with_for_update(),
    )


def _next_seq(conn: Connection, environment_id: str) -> int:
    current = conn.execute(
        sa.select(sa.func.coalesce(sa.func.max(environment_changes.c.seq), 0)).where(
            environment_changes.c.environment_id == environment_id
        )
    ).scalar_one()
    return int(current) + 1


def _create(
    conn: Connection, environment: dict[str, Any], change: dict[str, Any]
) -> tuple[Row, Row]:
    taken = conn.execute(
        sa.select(environments.c.id).where(
            environments.c.session_id == environment["session_id"],
            environments.c.runner_id == environment["runner_id"],
            environments.c.name == environment["name"],
        )
    ).first()
    if taken is not None:
        raise _name_taken(environment)
    now = time.time()
    conn.execute(
        environments.insert().values(**environment, revision=0, state="creating", created_at=now)
    )
    env = fetch_one(conn, sa.select(environments).where(environments.c.id == environment["id"]))
    assert env is not None
    return env, _insert_change(conn, change, now)


def _insert_change(conn: Connection, change: dict[str, Any], now: float) -> Row:
    values = {
        "specs": [],
        "options": {},
        **change,
        "seq": _next_seq(conn, change["environment_id"]),
        "state": "waiting",
        "waiting_for": [],
        "created_at": now,
    }
    conn.execute(environment_changes.insert().values(**values))
    row = fetch_one(
        conn, sa.select(environment_changes).where(environment_changes.c.id == change["id"])
    )
    assert row is not None
    return row


def _add_change(conn: Connection, change: dict[str, Any]) -> Row:
    env = _lock(conn, change["environment_id"])
    assert env is not None
    return _insert_change(conn, change, time.time())


def _holders(conn: Connection, environment_id: str) -> list[str]:
    """Executions that use the environment's current prefix: running ones; those whose
    outcome is unknown because the runner cannot be asked right now (their watcher keeps
    asking, E9) or because their start's answer never came (it may run: unstarted.py); and
    queued ones that already resolved their revision but have not started."""
    rows = conn.execute(
        sa.select(executions.c.id)
        .where(
            executions.c.environment_id == environment_id,
            sa.or_(
                executions.c.state == "running",
                sa.and_(
                    executions.c.state == "unknown",
                    executions.c.finished_at.is_(None),
                    sa.or_(executions.c.query_failures > 0, executions.c.started_at.is_(None)),
                ),
                sa.and_(
                    executions.c.state == "queued",
                    executions.c.environment_revision.is_not(None),
                ),
            ),
        )
        .order_by(executions.c.seq)
    ).all()
    return [str(r[0]) for r in rows]


def _get_change(conn: Connection, change_id: str) -> Row:
    row = fetch_one(
        conn, sa.select(environment_changes).where(environment_changes.c.id == change_id)
    )
    assert row is not None, change_id
    return row


def _claim(conn: Connection, change_id: str) -> Row:
    change = _get_change(conn, change_id)
    environment_id = str(change["environment_id"])
    _lock(conn, environment_id)
    change = _get_change(conn, change_id)  # re-read under the lock
    if change["state"] != "waiting":
        return change
    earlier = conn.execute(
        sa.select(environment_changes.c.id)
        .where(
            environment_changes.c.environment_id == environment_id,
            environment_changes.c.state.in_(PENDING_CHANGE_STATES),
            environment_changes.c.seq < change["seq"],
        )
        .order_by(environment_changes.c.seq)
    ).all()
    waiting_for = [str(r[0]) for r in earlier] + _holders(conn, environment_id)
    values: dict[str, Any] = {"waiting_for": waiting_for}
    if not waiting_for:
        values.update(state="running", started_at=time.time(), progress="starting")
    conn.execute(
        environment_changes.update().where(environment_changes.c.id == change_id).values(**values)
    )
    return _get_change(conn, change_id)


def _unclaim(conn: Connection, change_id: str, reason: str) -> Row:
    conn.execute(
        environment_changes.update()
        .where(environment_changes.c.id == change_id, environment_changes.c.state == "running")
        .values(state="waiting", started_at=None, progress=reason)
    )
    return _get_change(conn, change_id)


def _set_progress(conn: Connection, change_id: str, progress: str | None) -> None:
    conn.execute(
        environment_changes.update()
        .where(environment_changes.c.id == change_id, environment_changes.c.state == "running")
        .values(progress=progress)
    )


def _request_of(change: Row) -> dict[str, Any]:
    request: dict[str, Any] = {"action": change["action"]}
    if change["manager"] is not None:
        request["manager"] = change["manager"]
    if change["specs"]:
        request["specs"] = list(change["specs"])
    request.update({k: v for k, v in dict(change["options"] or {}).items() if v})
    return request


def _finish(
    conn: Connection,
    change_id: str,
    packages: list[dict[str, Any]] | None,
    error: str | None,
    error_kind: str | None,
    finished_at: float,
) -> Row:
    change = _get_change(conn, change_id)
    environment_id = str(change["environment_id"])
    env = _lock(conn, environment_id)
    assert env is not None
    change = _get_change(conn, change_id)
    if change["state"] not in PENDING_CHANGE_STATES:
        return change
    values: dict[str, Any] = {"finished_at": finished_at, "waiting_for": [], "progress": None}
    if packages is not None:
        number = int(env["revision"]) + 1
        conn.execute(
            environment_revisions.insert().values(
                environment_id=environment_id,
                revision=number,
                packages=packages,
                request=_request_of(change),
                change_id=change_id,
                created_at=finished_at,
            )
        )
        env_values: dict[str, Any] = {"revision": number}
        if env["state"] == "creating":
            env_values["state"] = "ready"
        conn.execute(
            environments.update().where(environments.c.id == environment_id).values(**env_values)
        )
        values.update(state="succeeded", revision=number)
    else:
        values.update(state="failed", error=error, error_kind=error_kind)
        if change["action"] == "create":
            conn.execute(
                environments.update()
                .where(environments.c.id == environment_id)
                .values(state="failed", error=error)
            )
    conn.execute(
        environment_changes.update().where(environment_changes.c.id == change_id).values(**values)
    )
    return _get_change(conn, change_id)


def _gate(conn: Connection, execution_id: str, environment_id: str) -> tuple[str, Row]:
    env = _lock(conn, environment_id)
    pending = conn.execute(
        sa.select(environment_changes.c.id)
        .where(
            environment_changes.c.environment_id == environment_id,
            environment_changes.c.state.in_(PENDING_CHANGE_STATES),
        )
        .order_by(environment_changes.c.seq)
        .limit(1)
    ).first()
    values: dict[str, Any] = {"waiting_for": None}
    if env is None or env["state"] == "failed":
        verdict = "failed"
    elif pending is not None:
        verdict, values["waiting_for"] = "wait", str(pending[0])
    else:
        # V6: the latest revision, resolved when it starts; from now on it holds the prefix.
        verdict, values["environment_revision"] = "go", int(env["revision"])
    conn.execute(
        executions.update()
        .where(executions.c.id == execution_id, executions.c.state == "queued")
        .values(**values)
    )
    row = fetch_one(conn, sa.select(executions).where(executions.c.id == execution_id))
    assert row is not None
    return verdict, row


__all__ = ["PENDING_CHANGE_STATES", "Change", "Environment", "EnvironmentRecords", "Revision"]
