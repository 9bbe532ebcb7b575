"""Wakes (N2–N4): claiming an idle agent's unread notices for one wake, and its webhooks'
deliveries."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from shellyard.store.db import Database, Row, fetch_all, fetch_one, insert_returning, new_id
from shellyard.store.notices import Notice
from shellyard.store.owners import Agent, Session
from shellyard.store.records import from_row, from_rows, maybe
from shellyard.store.schema import (
    agents,
    delivery_attempts,
    notices,
    sessions,
    wake_deliveries,
    wakes,
    webhooks,
)

#: Builds a wake's payload from (wake id, reason, session, agent, its notices, now).
PayloadBuilder = Callable[[str, str, Session, Agent, list[Notice], float], dict[str, Any]]


@dataclass(frozen=True, slots=True, kw_only=True)
class Wake:
    """A ``wakes`` row (N2): ``payload`` is the body every channel gets, without ``seq``."""

    seq: int
    id: str
    session_id: str
    agent_id: str
    reason: str
    payload: dict[str, Any]
    created_at: float


@dataclass(frozen=True, slots=True, kw_only=True)
class Delivery:
    """A ``wake_deliveries`` row: one wake to one webhook (N4), ``state`` ``pending``,
    ``delivered`` or ``failed``."""

    id: str
    wake_id: str
    webhook_id: str
    state: str
    attempts: int = 0
    next_attempt_at: float | None
    delivered_at: float | None
    last_error: str | None


@dataclass(frozen=True, slots=True, kw_only=True)
class DeliveryAttempt:
    """A ``delivery_attempts`` row: one POST of a delivery, recorded before it is sent."""

    number: int
    started_at: float
    finished_at: float | None
    status_code: int | None
    error: str | None


@dataclass(frozen=True, slots=True, kw_only=True)
class DeliveryJob:
    """What one attempt of a delivery needs: the delivery, its webhook's ``url`` and
    ``secret``, its wake's ``payload`` and ``seq`` (one joined read)."""

    id: str
    wake_id: str
    state: str
    next_attempt_at: float | None
    url: str
    secret: str
    payload: dict[str, Any]
    seq: int


@dataclass(frozen=True, slots=True, kw_only=True)
class Webhook:
    """A ``webhooks`` row (N2's channel; docs/architecture.md "Records at the store
    boundary"); ``session_id`` None: every session's wakes."""

    id: str
    session_id: str | None
    url: str
    #: the HMAC key of its deliveries: shown once, in the registration's answer
    secret: str
    active: bool = True
    created_at: float


class WakeRecords(Database):
    """Wakes, webhooks and their deliveries."""

    async def emit_wake(
        self,
        agent_id: str,
        reason: str,
        live_sessions: frozenset[str] | None,
        build_payload: PayloadBuilder,
    ) -> tuple[Wake, list[str]] | None:
        """Claim the agent's unread, not yet woken notices for one wake and mark the agent busy,
        if it is idle and both gates are open and a channel listens (a session in
        ``live_sessions``, None meaning all, or a webhook). Returns (wake, delivery ids)."""
        try:
            return await self.run(_emit_wake, agent_id, reason, live_sessions, build_payload)
        except _NoWake:
            return None

    async def agents_to_wake(self) -> list[str]:
        """Idle agents with open gates and notices no wake delivered yet."""
        return await self.run(_agents_to_wake)

    async def list_wakes(
        self, session_id: str, after_seq: int = 0, limit: int = 1000
    ) -> list[Wake]:
        rows = await self.all(
            sa.select(wakes)
            .where(
                wakes.c.session_id == session_id,
                wakes.c.seq > after_seq,
                wakes.c.reason != "summary",
            )
            .order_by(wakes.c.seq)
            .limit(limit)
        )
        return from_rows(Wake, rows)

    async def add_webhook(self, values: dict[str, Any]) -> Webhook:
        return from_row(Webhook, await self.run(insert_returning, webhooks, values))

    async def list_webhooks(self) -> list[Webhook]:
        """The active webhooks."""
        rows = await self.all(
            sa.select(webhooks).where(webhooks.c.active.is_(True)).order_by(webhooks.c.created_at)
        )
        return from_rows(Webhook, rows)

    async def deactivate_webhook(self, webhook_id: str) -> Webhook | None:
        return maybe(Webhook, await self.run(_deactivate_webhook, webhook_id))

    async def pending_deliveries(self) -> list[str]:
        """Deliveries to (re)start; attempts a dead process left open are closed as interrupted."""
        return await self.run(_pending_deliveries)

    async def delivery_job(self, delivery_id: str) -> DeliveryJob | None:
        """A delivery with its webhook's url and secret and the wake's payload."""
        row = await self.one(
            sa.select(
                wake_deliveries,
                webhooks.c.url,
                webhooks.c.secret,
                webhooks.c.active,
                wakes.c.payload,
                wakes.c.seq,
            )
            .join(webhooks, webhooks.c.id == wake_deliveries.c.webhook_id)
            .join(wakes, wakes.c.id == wake_deliveries.c.wake_id)
            .where(wake_deliveries.c.id == delivery_id)
        )
        return maybe(DeliveryJob, row)

    async def begin_attempt(self, delivery_id: str) -> int:
        """Record the start of the next attempt (before the request); returns its number."""
        return await self.run(_begin_attempt, delivery_id)

    async def end_attempt(
        self,
        delivery_id: str,
        number: int,
        status_code: int | None,
        error: str | None,
        state: str,
        next_attempt_at: float | None,
    ) -> None:
        await self.run(
            _end_attempt, delivery_id, number, status_code, error, state, next_attempt_at
        )

    async def wake_deliveries(self, wake_id: str) -> list[tuple[Delivery, list[DeliveryAttempt]]]:
        return await self.run(_wake_deliveries, wake_id)


# ---------------------------------------------------------------------- operations
# Each runs inside one transaction on ``conn``.


class _NoWake(Exception):
    """Rolls back the claim on an agent when another transaction took its notices first."""


def record_wake(
    conn: Connection,
    reason: str,
    session: Session,
    agent: Agent,
    pending: list[Notice],
    build_payload: PayloadBuilder,
) -> tuple[Wake, list[Notice]] | None:
    """Claim ``pending`` notices (those still unclaimed) for a new wake row; None if none."""
    now, wake_id = time.time(), new_id("wk")
    ids = [n.id for n in pending]
    conn.execute(
        notices.update()
        # read_at again: a notice marked read (N3: its owner saw the result) after ``pending``
        # was read wakes nobody; on PostgreSQL the UPDATE re-checks the row it waited for.
        .where(notices.c.id.in_(ids), notices.c.woke_at.is_(None), notices.c.read_at.is_(None))
        .values(woke_at=now, wake_id=wake_id)
    )
    claimed = from_rows(
        Notice,
        fetch_all(
            conn,
            sa.select(notices)
            .where(notices.c.wake_id == wake_id)
            .order_by(notices.c.created_at, notices.c.id),
        ),
    )
    if not claimed:
        return None
    payload = build_payload(wake_id, reason, session, agent, claimed, now)
    conn.execute(
        wakes.insert().values(
            id=wake_id,
            session_id=session.id,
            agent_id=agent.id,
            reason=reason,
            payload=payload,
            created_at=now,
        )
    )
    wake = fetch_one(conn, sa.select(wakes).where(wakes.c.id == wake_id))
    assert wake is not None
    return from_row(Wake, wake), claimed


def _emit_wake(
    conn: Connection,
    agent_id: str,
    reason: str,
    live_sessions: frozenset[str] | None,
    build_payload: PayloadBuilder,
) -> tuple[Wake, list[str]] | None:
    agent = maybe(Agent, fetch_one(conn, sa.select(agents).where(agents.c.id == agent_id)))
    if agent is None or agent.state != "idle" or agent.gate != "open":
        return None
    session = maybe(
        Session, fetch_one(conn, sa.select(sessions).where(sessions.c.id == agent.session_id))
    )
    if session is None or session.state != "active":
        return None
    hooks = fetch_all(
        conn,
        sa.select(webhooks.c.id).where(
            webhooks.c.active.is_(True),
            sa.or_(webhooks.c.session_id.is_(None), webhooks.c.session_id == session.id),
        ),
    )
    if not hooks and live_sessions is not None and session.id not in live_sessions:
        return None  # nobody listens: the notices wait, unwoken, for a channel
    pending = from_rows(
        Notice,
        fetch_all(
            conn,
            sa.select(notices)
            .where(
                notices.c.agent_id == agent_id,
                notices.c.read_at.is_(None),
                notices.c.woke_at.is_(None),
            )
            .order_by(notices.c.created_at, notices.c.id),
        ),
    )
    if not pending:
        return None
    # The claim on the agent serialises concurrent wakes of one agent (PostgreSQL row lock).
    claimed = conn.execute(
        agents.update()
        .where(agents.c.id == agent_id, agents.c.state == "idle", agents.c.gate == "open")
        .values(state="busy")
    )
    if not claimed.rowcount:
        return None
    recorded = record_wake(conn, reason, session, agent, pending, build_payload)
    if recorded is None:
        raise _NoWake  # rolls back the claim on the agent
    wake = recorded[0]
    delivery_ids = []
    for hook in hooks:
        delivery_id = new_id("dlv")
        conn.execute(
            wake_deliveries.insert().values(
                id=delivery_id,
                wake_id=wake.id,
                webhook_id=hook["id"],
                state="pending",
                attempts=0,
                next_attempt_at=wake.created_at,
            )
        )
        delivery_ids.append(delivery_id)
    return wake, delivery_ids


def _agents_to_wake(conn: Connection) -> list[str]:
    rows = conn.execute(
        sa.select(notices.c.agent_id)
        .distinct()
        .join(agents, agents.c.id == notices.c.agent_id)
        .join(sessions, sessions.c.id == agents.c.session_id)
        .where(
            notices.c.read_at.is_(None),
            notices.c.woke_at.is_(None),
            agents.c.state == "idle",
            agents.c.gate == "open",
            sessions.c.state == "active",
        )
    ).all()
    return [str(r[0]) for r in rows]


def _deactivate_webhook(conn: Connection, webhook_id: str) -> Row | None:
    conn.execute(webhooks.update().where(webhooks.c.id == webhook_id).values(active=False))
    conn.execute(
        wake_deliveries.update()
        .where(wake_deliveries.c.webhook_id == webhook_id, wake_deliveries.c.state == "pending")
        .values(state="failed", last_error="the webhook was removed")
    )
    return fetch_one(conn, sa.select(webhooks).where(webhooks.c.id == webhook_id))


def _pending_deliveries(conn: Connection) -> list[str]:
    conn.execute(
        delivery_attempts.update()
        .where(delivery_attempts.c.finished_at.is_(None))
        .values(error="interrupted: the control plane stopped during the attempt")
    )
    rows = conn.execute(
        sa.select(wake_deliveries.c.id)
        .where(wake_deliveries.c.state == "pending")
        .order_by(wake_deliveries.c.next_attempt_at)
    ).all()
    return [str(r[0]) for r in rows]


def _begin_attempt(conn: Connection, delivery_id: str) -> int:
    conn.execute(
        wake_deliveries.update()
        .where(wake_deliveries.c.id == delivery_id)
        .values(attempts=wake_deliveries.c.attempts + 1)
    )
    number = int(
        conn.execute(
            sa.select(wake_deliveries.c.attempts).where(wake_deliveries.c.id == delivery_id)
        ).scalar_one()
    )
    conn.execute(
        delivery_attempts.insert().values(
            delivery_id=delivery_id, number=number, started_at=time.time()
        )
    )
    return number


def _end_attempt(
    conn: Connection,
    delivery_id: str,
    number: int,
    status_code: int | None,
    error: str | None,
    state: str,
    next_attempt_at: float | None,
) -> None:
    now = time.time()
    conn.execute(
        delivery_attempts.update()
        .where(delivery_attempts.c.delivery_id == delivery_id, delivery_attempts.c.number == number)
        .values(finished_at=now, status_code=status_code, error=error)
    )
    conn.execute(
        wake_deliveries.update()
        .where(wake_deliveries.c.id == delivery_id, wake_deliveries.c.state == "pending")
        .values(
            state=state,
            last_error=error,
            next_attempt_at=next_attempt_at,
            delivered_at=now if state == "delivered" else None,
        )
    )


def _wake_deliveries(
    conn: Connection, wake_id: str
) -> list[tuple[Delivery, list[DeliveryAttempt]]]:
    found = []
    for delivery in fetch_all(
        conn, sa.select(wake_deliveries).where(wake_deliveries.c.wake_id == wake_id)
    ):
        attempts = fetch_all(
            conn,
            sa.select(delivery_attempts)
            .where(delivery_attempts.c.delivery_id == delivery["id"])
            .order_by(delivery_attempts.c.number),
        )
        found.append((from_row(Delivery, delivery), from_rows(DeliveryAttempt, attempts)))
    return found
