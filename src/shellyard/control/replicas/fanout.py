"""Cross-replica fan-out (docs/operations.md): PostgreSQL LISTEN/NOTIFY behind the in-process
signals.

Every replica on one PostgreSQL database listens on one channel (named after the schema, so
test runs in schemas of their own never hear each other). What one replica does that another
replica's callers wait for is published there as a small JSON message; the others act on it
through their own, in-process, mechanisms:

- ``execution_ended`` (``execution_id``): an execution ended or became unknown: its
  ``execution wait`` / foreground waiters read the record again (``ExecutionService.signal``);
- ``agent_may_wake`` (``agent_id``, ``reason``): a notice, a turn's end or an opened gate: a
  replica that serves a channel of the agent's session (an SSE stream, a callback) tries to
  emit the wake. Emitting claims the notices in one transaction, so exactly one replica emits;
- ``wake_emitted`` (``session_id``, ``seq``): replicas with streams or callbacks of that session
  hand it to them (each replica delivers to its own channels only: nothing twice);
- ``webhooks_changed``: replicas re-read whether any is active;
- ``runners_changed``: a runner was added or removed: replicas reload the registry;
- ``transfer_changed`` (``transfer_id``): a transfer ended or was asked to cancel: its waiters
  and its copier read the record again;
- ``timers_changed``: a timer was created (sent by its insert's transaction) or cancelled: every
  scheduler reads the next due time again, so a timer fires on time even if its replica died.

A message is one JSON object: ``kind``, ``replica`` (the sender, which ignores its own) and the
fields above. Every replica of one database runs one release (docs/operations.md, "Upgrades"):
a kind a replica does not know is ignored, and its resync catches up.

NOTIFY is not durable: a replica that was away (its listening connection dropped) resyncs by
re-reading (``on_resync``). SQLite is one replica: nothing is published.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Awaitable, Callable
from enum import StrEnum
from typing import Any

log = logging.getLogger(__name__)

#: NOTIFY payloads must stay under 8000 bytes; ours are a few ids.
MAX_PAYLOAD = 7900
RECONNECT_MAX_S = 5.0

NOTIFY = "SELECT pg_notify(%s, %s)"

Handler = Callable[[dict[str, Any]], Awaitable[None]]


class Kind(StrEnum):
    """What a fan-out message tells the other replicas (each kind is described above)."""

    EXECUTION_ENDED = "execution_ended"
    AGENT_MAY_WAKE = "agent_may_wake"
    WAKE_EMITTED = "wake_emitted"
    WEBHOOKS_CHANGED = "webhooks_changed"
    RUNNERS_CHANGED = "runners_changed"
    TRANSFER_CHANGED = "transfer_changed"
    TIMERS_CHANGED = "timers_changed"


def channel_name(schema_name: str | None) -> str:
    return f"shellyard_{schema_name or 'public'}"[:63]


def libpq_url(database_url: str) -> str:
    """What psycopg connects to, from the store's URL (``postgresql+psycopg://`` too)."""
    for prefix in ("postgresql+psycopg://", "postgres://"):
        if database_url.startswith(prefix):
            return "postgresql://" + database_url[len(prefix) :]
    return database_url


class Fanout:
    """One listening and one publishing connection per replica (PostgreSQL only)."""

    def __init__(self, database_url: str | None, schema_name: str | None, replica_id: str) -> None:
        self.url = libpq_url(database_url) if database_url else None
        self.channel = channel_name(schema_name)
        self.replica_id = replica_id
        self.handlers: dict[Kind, Handler] = {}
        #: Called after the listening connection came back (messages may have been missed).
        self.on_resync: list[Callable[[], Awaitable[None]]] = []
        self._outbox: asyncio.Queue[str] = asyncio.Queue()
        self._tasks: list[asyncio.Task[None]] = []
        self._listening = asyncio.Event()
        self.published = 0
        self.received = 0

    @property
    def enabled(self) -> bool:
        return self.url is not None

    async def start(self) -> None:
        if self.url is None:
            return
        self._tasks = [
            asyncio.create_task(self._listen(), name="fanout-listen"),
            asyncio.create_task(self._send(), name="fanout-send"),
        ]
        # Listening before the replica serves: nothing published after start is missed.
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._listening.wait(), 10.0)

    async def aclose(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._tasks = []

    def publish(self, kind: Kind, **fields: Any) -> None:
        """Queue a message for the other replicas; never blocks (a sender task sends it)."""
        message = self.message(kind, **fields)
        if message is not None:
            self._outbox.put_nowait(message[1])

    def message(self, kind: Kind, **fields: Any) -> tuple[str, str] | None:
        """(channel, payload) of a message for a store transaction to send with
        ``pg_notify``: it leaves at that commit, and only then (None: SQLite, or too large)."""
        if self.url is None:
            return None
        payload = json.dumps(
            {"kind": kind.value, "replica": self.replica_id, **fields}, separators=(",", ":")
        )
        if len(payload) > MAX_PAYLOAD:
            log.warning("fan-out message too large, dropped: %s…", payload[:200])
            return None
        return self.channel, payload

    async def _send(self) -> None:
        import psycopg

        assert self.url is not None
        delay = 0.2
        while True:
            try:
                async with await psycopg.AsyncConnection.connect(self.url, autocommit=True) as conn:
                    delay = 0.2
                    while True:
                        payload = await self._outbox.get()
                        batch = [payload]
                        while not self._outbox.empty() and len(batch) < 100:
                            batch.append(self._outbox.get_nowait())
                        if len(batch) == 1:  # autocommit: one round trip, no BEGIN/COMMIT
                            await conn.execute(NOTIFY, (self.channel, batch[0]))
                        else:
                            async with conn.transaction():  # one commit for the batch
                                for item in batch:
                                    await conn.execute(NOTIFY, (self.channel, item))
                        self.published += len(batch)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # the database restarted, the network blinked
                log.warning("fan-out publisher reconnecting: %s", exc)
                await asyncio.sleep(delay)
                delay = min(RECONNECT_MAX_S, delay * 2)

    async def _listen(self) -> None:
        import psycopg
        from psycopg import sql

        assert self.url is not None
        delay, first = 0.2, True
        while True:
            try:
                async with await psycopg.AsyncConnection.connect(self.url, autocommit=True) as conn:
                    await conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(self.channel)))
                    self._listening.set()
                    if not first:
                        for resync in self.on_resync:
                            await resync()
                    first, delay = False, 0.2
                    async for note in conn.notifies():
                        await self._dispatch(note.payload)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("fan-out listener reconnecting: %s", exc)
                await asyncio.sleep(delay)
                delay = min(RECONNECT_MAX_S, delay * 2)

    async def _dispatch(self, payload: str) -> None:
        try:
            message = json.loads(payload)
        except ValueError:
            return
        if not isinstance(message, dict) or message.get("replica") == self.replica_id:
            return  # our own: already acted on in-process
        try:
            kind = Kind(str(message.get("kind")))
        except ValueError:
            return  # not a kind of this release
        handler = self.handlers.get(kind)
        if handler is None:
            return
        self.received += 1
        try:
            await handler(message)
        except Exception:
            log.exception("fan-out handler failed for %s", payload[:200])
