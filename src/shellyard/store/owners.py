"""Sessions' default owner, agents and runners: who a record belongs to and where it runs."""

from __future__ import annotations

import time
from dataclasses import dataclass

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from shellyard.store.db import Database, Row, fetch_one, new_id, upsert
from shellyard.store.records import from_row, from_rows, maybe
from shellyard.store.schema import (
    agents,
    runners,
    sessions,
)


@dataclass(frozen=True, slots=True, kw_only=True)
class Session:
    """A ``sessions`` row (N8–N11; docs/architecture.md "Records at the store boundary"):
    ``state`` is ``active``, ``stopped`` or ``archived`` (the session's wake gate)."""

    id: str
    state: str
    #: set with the session, never changed
    main_agent_id: str
    is_default: bool = False
    created_at: float


@dataclass(frozen=True, slots=True, kw_only=True)
class Agent:
    """An ``agents`` row: ``state`` ``idle`` or ``busy`` (in a turn), ``gate`` ``open`` or
    ``closed`` (N8, N10); ``parent_id`` None for a session's main agent."""

    id: str
    session_id: str
    parent_id: str | None
    state: str
    gate: str
    created_at: float


@dataclass(frozen=True, slots=True, kw_only=True)
class RunnerRecord:
    """A ``runners`` row (docs/architecture.md "Records at the store boundary"): a registered
    runner, kept after its removal (kind ``removed``) because past executions name it."""

    id: str
    #: ``local``, ``direct``, ``ssh`` or ``removed``
    kind: str
    address: str | None
    #: a plain key (direct runners of old) or JSON of its secrets (control/runners.py)
    token: str | None
    state: str
    created_at: float


class OwnerRecords(Database):
    """The default session and agent, agents, runners."""

    async def default_owner(self) -> tuple[Session, Agent]:
        """The default session and its main agent, created on first use. Replicas creating it
        at once (docs/operations.md): the unique index on ``is_default`` lets one insert win; the
        others' transactions fail and read the winner's."""
        try:
            session, agent = await self.run(_default_owner)
        except sa.exc.IntegrityError:
            session, agent = await self.run(_default_owner)
        return from_row(Session, session), from_row(Agent, agent)

    async def create_agent(self, session_id: str, parent_id: str | None = None) -> Agent:
        """Another agent of a session (a child when ``parent_id`` is given), idle, gate open."""
        return from_row(Agent, await self.run(insert_agent, session_id, parent_id))

    async def get_agent(self, agent_id: str) -> Agent | None:
        return maybe(Agent, await self.one(sa.select(agents).where(agents.c.id == agent_id)))

    async def upsert_runner(
        self, runner_id: str, kind: str, address: str | None, token: str | None
    ) -> RunnerRecord:
        return from_row(
            RunnerRecord, await self.run(_upsert_runner, runner_id, kind, address, token)
        )

    async def get_runner(self, runner_id: str) -> RunnerRecord | None:
        """One runner's row (a removed one's too), by its primary key: not every row to find
        it (control/runners.py ``removed``)."""
        return maybe(
            RunnerRecord, await self.one(sa.select(runners).where(runners.c.id == runner_id))
        )

    async def list_runners(self) -> list[RunnerRecord]:
        return from_rows(
            RunnerRecord, await self.all(sa.select(runners).order_by(runners.c.created_at))
        )


# ---------------------------------------------------------------------- operations
# Each runs inside one transaction on ``conn``.


def _default_owner(conn: Connection) -> tuple[Row, Row]:
    session = fetch_one(conn, sa.select(sessions).where(sessions.c.is_default.is_(True)))
    if session is None:
        now = time.time()
        session_id, agent_id = new_id("ses"), new_id("agt")
        conn.execute(
            sessions.insert().values(
                id=session_id,
                state="active",
                main_agent_id=agent_id,
                is_default=True,
                created_at=now,
            )
        )
        conn.execute(
            agents.insert().values(
                id=agent_id,
                session_id=session_id,
                parent_id=None,
                state="idle",
                gate="open",
                created_at=now,
            )
        )
        session = fetch_one(conn, sa.select(sessions).where(sessions.c.id == session_id))
    assert session is not None
    agent = fetch_one(conn, sa.select(agents).where(agents.c.id == session["main_agent_id"]))
    assert agent is not None
    return session, agent


def insert_agent(conn: Connection, session_id: str, parent_id: str | None) -> Row:
    agent_id = new_id("agt")
    conn.execute(
        agents.insert().values(
            id=agent_id,
            session_id=session_id,
            parent_id=parent_id,
            state="idle",
            gate="open",
            created_at=time.time(),
        )
    )
    row = fetch_one(conn, sa.select(agents).where(agents.c.id == agent_id))
    assert row is not None
    return row


def _upsert_runner(
    conn: Connection, runner_id: str, kind: str, address: str | None, token: str | None
) -> Row:
    values = {"kind": kind, "address": address, "token": token, "state": "active"}
    # One statement (docs/operations.md): replicas registering the same runner at once never
    # collide.
    conn.execute(
        upsert(conn, runners)
        .values(id=runner_id, created_at=time.time(), **values)
        .on_conflict_do_update(index_elements=[runners.c.id], set_=values)
    )
    row = fetch_one(conn, sa.select(runners).where(runners.c.id == runner_id))
    assert row is not None
    return row
