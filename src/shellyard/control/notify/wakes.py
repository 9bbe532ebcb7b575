"""Wakes (N2–N4): when a notice arrives for an idle agent whose gates are open, shellyard
emits one wake (the agent and its new notices) through every channel the host registered:
webhooks (signed, retried with backoff, every attempt recorded), a server-sent events stream per
session, and Python callbacks for in-process hosts.

A wake starts a turn: the agent is busy until the host calls ``turn_end``; notices that arrive
meanwhile wait and wake it when the turn ends. Each notice is claimed by at most one wake in the
same transaction that records the wake, so no restart or second control plane emits it twice.
Notices wait, unwoken, while no channel listens to their session.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import inspect
import json
import logging
import secrets
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, Protocol

import httpx

from shellyard.config import NotificationSettings
from shellyard.contract.sessions import (
    DeliveryAttemptView,
    DeliveryView,
    NoticeView,
    WakeView,
    WebhookRequest,
    WebhookView,
)
from shellyard.control.notify.webhook_policy import PolicyRefusal, WebhookPolicy
from shellyard.errors import NotFound
from shellyard.store import Store
from shellyard.store.db import new_id
from shellyard.store.executions import Execution
from shellyard.store.leases import LeaseHolder
from shellyard.store.notices import Notice
from shellyard.store.owners import Agent, Session
from shellyard.store.records import field_names, values_of
from shellyard.store.wakes import Delivery, DeliveryAttempt, Wake, Webhook

log = logging.getLogger(__name__)

#: A Python callback of an in-process host; may be sync or async.
WakeCallback = Callable[[WakeView], Awaitable[None] | None]

SIGNATURE_HEADER = "X-Shellyard-Signature"
TIMESTAMP_HEADER = "X-Shellyard-Timestamp"


def sign(secret: str, timestamp: str, body: bytes) -> str:
    """The webhook signature: ``sha256=`` + hex HMAC-SHA256 of ``timestamp + "." + body``."""
    mac = hmac.new(secret.encode(), timestamp.encode() + b"." + body, hashlib.sha256)
    return "sha256=" + mac.hexdigest()


def verify_signature(
    secret: str, timestamp: str, body: bytes, signature: str, tolerance_s: float = 300.0
) -> bool:
    """For webhook receivers: the body is authentic and the timestamp recent (no replay)."""
    try:
        fresh = abs(time.time() - float(timestamp)) <= tolerance_s
    except ValueError:
        return False
    return fresh and hmac.compare_digest(sign(secret, timestamp, body), signature)


#: D3: the fields a notice's record and its view share, listed once (``notice_id`` is ``id``).
_NOTICE_VIEW_FIELDS = field_names(Notice, NoticeView.model_fields)


def notice_view(row: Notice) -> NoticeView:
    return NoticeView.model_validate({**values_of(row, _NOTICE_VIEW_FIELDS), "notice_id": row.id})


def wake_payload(
    wake_id: str,
    reason: str,
    session: Session,
    agent: Agent,
    claimed: list[Notice],
    now: float,
) -> dict[str, Any]:
    """The body every channel gets (without ``seq``, which the database assigns)."""
    view = WakeView(
        wake_id=wake_id,
        seq=0,
        session_id=session.id,
        agent_id=agent.id,
        parent_agent_id=agent.parent_id,
        is_main=agent.id == session.main_agent_id,
        reason=reason,
        created_at=now,
        notices=[notice_view(n) for n in claimed],
    )
    return view.model_dump(mode="json", exclude={"seq"})


def wake_view(row: Wake) -> WakeView:
    return WakeView.model_validate({**row.payload, "seq": row.seq})


class DeliveryLeases(LeaseHolder, Protocol):
    """One replica delivers each webhook delivery (docs/operations.md): the control plane's
    lease keeper, given when the service is built."""

    def subjects(self, kind: str) -> list[str]: ...


#: The lease kind of a webhook delivery.
DELIVERY_LEASE = "delivery"


class WakeService:
    """Emits wakes and delivers them. ``notify(agent_id)`` is safe to call any time: it emits
    only when the rules allow and there is something new."""

    def __init__(
        self,
        store: Store,
        settings: NotificationSettings,
        *,
        leases: DeliveryLeases,
        on_emitted: Callable[[WakeView], None],
        on_notify: Callable[[str, str], None],
        on_webhooks: Callable[[], None],
    ) -> None:
        self.store = store
        self.settings = settings
        #: Where webhooks may point (R6): the egress address rules, checked at registration
        #: and pinned at every attempt (control/notify/webhook_policy.py).
        self.policy = WebhookPolicy(settings.webhook_exceptions)
        self._callbacks: list[tuple[str | None, WakeCallback]] = []
        self._subscribers: dict[str, set[asyncio.Queue[WakeView | None]]] = {}
        self._webhooks = False  # any active webhook (spares the hot path a query)
        self._tasks: set[asyncio.Task[None]] = set()
        self._deliveries: dict[str, asyncio.Task[None]] = {}
        self._http: httpx.AsyncClient | None = None
        self._closing = False
        #: Replicas (docs/operations.md, control/replicas/fanout.py): told of each wake emitted
        #: here, of each agent this replica was asked to wake (so the replicas serving its
        #: channels try too) and of a webhook added or removed; no-ops with one replica.
        self.on_emitted, self.on_notify, self.on_webhooks = on_emitted, on_notify, on_webhooks
        #: One replica delivers each delivery; it hands this one those of dead replicas.
        self.leases = leases
        leases.register(
            DELIVERY_LEASE, self.adopt_delivery, self.forget_delivery, sweep=self._sweep
        )
        store.notice_listeners.append(self.notify)  # a notice posted may wake its agent (N2)
        self.emitted = 0

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        """Resume the webhook deliveries a previous process left pending (each keeps its wake:
        nothing is emitted again), then wake agents whose notices arrived unwoken."""
        # No proxy from the environment (it would dial instead of the pinned address), no
        # redirect followed (it could lead anywhere), no connection kept for another name.
        self._http = httpx.AsyncClient(
            timeout=self.settings.webhook_timeout_s,
            trust_env=False,
            follow_redirects=False,
            limits=httpx.Limits(max_keepalive_connections=0),
        )
        self._webhooks = bool(await self.store.list_webhooks())
        for delivery_id in await self.store.pending_deliveries():
            self._deliver_later(delivery_id)
        await self.kick_all("start")

    async def aclose(self) -> None:
        self._closing = True
        tasks = [*self._tasks, *self._deliveries.values()]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        for queues in self._subscribers.values():
            for queue in queues:
                queue.put_nowait(None)
        if self._http is not None:
            await self._http.aclose()

    # ------------------------------------------------------------------ emitting

    async def notify(
        self, agent_id: str, reason: str = "notice", *, relayed: bool = False, publish: bool = True
    ) -> WakeView | None:
        """Emit a wake for the agent if it is idle, its gates are open, a channel listens and
        it has notices no wake delivered yet. ``relayed``: another replica asked (for the
        streams and callbacks here; it emitted for webhooks itself). ``publish``: tell the
        other replicas (not when only a channel of this replica is new)."""
        if publish and not relayed and not self._closing:
            self.on_notify(agent_id, reason)
        if relayed and not (self._callbacks or self._subscribers):
            return None  # webhooks were the asking replica's to emit for
        if self._closing or not (self._webhooks or self._callbacks or self._subscribers):
            return None  # nobody could hear it: the notices wait, unwoken
        live: frozenset[str] | None = frozenset(self._subscribers) | {
            session for session, _cb in self._callbacks if session is not None
        }
        if any(session is None for session, _cb in self._callbacks):
            live = None
        emitted = await self.store.emit_wake(agent_id, reason, live, wake_payload)
        if emitted is None:
            return None
        row, delivery_ids = emitted
        wake = wake_view(row)
        self.emitted += 1
        self.on_emitted(wake)
        log.info(
            "wake %s for agent %s (%d notices)",
            wake.wake_id,
            agent_id,
            len(wake.notices),
            extra={
                "action": "wake",
                "wake_id": wake.wake_id,
                "agent_id": agent_id,
                "session_id": wake.session_id,
            },
        )
        for queue in self._subscribers.get(wake.session_id, ()):
            queue.put_nowait(wake)
        for session_id, callback in list(self._callbacks):
            if session_id in (None, wake.session_id):
                self._spawn(self._call(callback, wake))
        for delivery_id in delivery_ids:
            self._deliver_later(delivery_id)
        return wake

    async def kick_session(self, session_id: str, reason: str) -> None:
        # A channel of this replica appeared: only it can be newly heard, so no fan-out.
        for agent in await self.store.list_agents(session_id):
            await self.notify(agent.id, reason, publish=False)

    async def kick_all(self, reason: str) -> None:
        for agent_id in await self.store.agents_to_wake():
            await self.notify(agent_id, reason, publish=False)

    async def relay(self, session_id: str, seq: int) -> None:
        """A wake another replica emitted: hand it to this replica's streams and callbacks
        of its session (webhooks were the emitter's to deliver)."""
        if session_id not in self._subscribers and not any(
            sid in (None, session_id) for sid, _cb in self._callbacks
        ):
            return
        rows = await self.store.list_wakes(session_id, seq - 1, limit=1)
        if not rows or rows[0].seq != seq:
            return
        wake = wake_view(rows[0])
        for queue in self._subscribers.get(session_id, ()):
            queue.put_nowait(wake)
        for sid, callback in list(self._callbacks):
            if sid in (None, session_id):
                self._spawn(self._call(callback, wake))

    async def refresh_webhooks(self) -> None:
        """Another replica added or removed a webhook."""
        self._webhooks = bool(await self.store.list_webhooks())

    async def execution_finished(self, row: Execution, notice_read: bool) -> None:
        """ExecutionService observer: an unread completion notice may wake its owner (N3)."""
        if not notice_read:
            await self.notify(row.agent_id)

    # ------------------------------------------------------------------ channels

    async def add_callback(
        self, callback: WakeCallback, session_id: str | None = None
    ) -> Callable[[], None]:
        """Register a Python callback (every session's wakes, or one session's). Notices that
        waited for a channel wake their agents now. Returns a function that unregisters it."""
        entry = (session_id, callback)
        self._callbacks.append(entry)
        if session_id is None:
            await self.kick_all("channel")
        else:
            await self.kick_session(session_id, "channel")

        def remove() -> None:
            with contextlib.suppress(ValueError):
                self._callbacks.remove(entry)

        return remove

    async def stream(
        self, session_id: str, after_seq: int | None = None
    ) -> AsyncIterator[WakeView]:
        """The session's wakes for a server-sent events stream: those after ``after_seq`` (the
        client's Last-Event-ID; None: none) from the record, then live ones, each once, in
        order. While a stream is open the session has a channel, so its notices wake."""
        queue: asyncio.Queue[WakeView | None] = asyncio.Queue()
        self._subscribers.setdefault(session_id, set()).add(queue)
        try:
            last = after_seq or 0
            if after_seq is not None:
                for row in await self.store.list_wakes(session_id, after_seq):
                    wake = wake_view(row)
                    last = wake.seq
                    yield wake
            await self.kick_session(session_id, "channel")
            while True:
                item = await queue.get()
                if item is None:
                    return
                if item.seq > last:
                    last = item.seq
                    yield item
        finally:
            queues = self._subscribers.get(session_id)
            if queues is not None:
                queues.discard(queue)
                if not queues:
                    del self._subscribers[session_id]

    async def list_wakes(self, session_id: str, after_seq: int = 0) -> list[WakeView]:
        return [wake_view(r) for r in await self.store.list_wakes(session_id, after_seq)]

    async def add_webhook(self, request: WebhookRequest) -> WebhookView:
        session_id = request.session_id
        if session_id is not None and await self.store.get_session(session_id) is None:
            raise NotFound(f"no session {session_id!r}; list them with 'shellyard session list'")
        await self.policy.check_registration(request.url)
        secret = request.secret or secrets.token_urlsafe(32)
        row = await self.store.add_webhook(
            {
                "id": new_id("whk"),
                "session_id": request.session_id,
                "url": request.url,
                "secret": secret,
                "active": True,
                "created_at": time.time(),
            }
        )
        self._webhooks = True
        self.on_webhooks()  # other replicas: there is a channel now
        if request.session_id is None:
            await self.kick_all("channel")
        else:
            await self.kick_session(request.session_id, "channel")
        return _webhook_view(row).model_copy(update={"secret": secret})

    async def list_webhooks(self) -> list[WebhookView]:
        return [_webhook_view(r) for r in await self.store.list_webhooks()]

    async def remove_webhook(self, webhook_id: str) -> WebhookView:
        row = await self.store.deactivate_webhook(webhook_id)
        if row is None:
            raise NotFound(f"no webhook {webhook_id!r}; list them with GET /v1/webhooks")
        self._webhooks = bool(await self.store.list_webhooks())
        self.on_webhooks()
        return _webhook_view(row)

    async def deliveries(self, wake_id: str) -> list[DeliveryView]:
        return [
            _delivery_view(d, attempts) for d, attempts in await self.store.wake_deliveries(wake_id)
        ]

    # ------------------------------------------------------------------ delivery

    def _spawn(self, coro: Awaitable[None]) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _call(self, callback: WakeCallback, wake: WakeView) -> None:
        try:
            result = callback(wake)
            if inspect.isawaitable(result):
                await result
        except Exception:
            log.exception("a wake callback raised for %s", wake.wake_id)

    async def adopt_delivery(self, delivery_id: str) -> None:
        """This replica took over the delivery's lease (its replica died): resume it (or,
        before ``start``, leave it to ``start``, which resumes every pending delivery)."""
        if self._http is not None:
            self._deliver_later(delivery_id)

    async def _sweep(self) -> None:
        """The lease keeper's sweep (PostgreSQL): notices a dead replica recorded but did not
        get to wake for (N2), and deliveries it recorded but did not get to lease: a restart
        would have resumed them (``start``); with replicas the survivors do. Deliveries this
        replica holds with no task running (adopted while it was starting) are resumed too."""
        await self.kick_all("channel")
        for delivery_id in self.leases.subjects(DELIVERY_LEASE):
            await self.adopt_delivery(delivery_id)
        for delivery_id in await self.store.unleased_deliveries(self.leases.ttl_s):
            await self.adopt_delivery(delivery_id)

    def forget_delivery(self, delivery_id: str) -> None:
        """Another replica took the delivery's lease over: it delivers, this one stops."""
        task = self._deliveries.pop(delivery_id, None)
        if task is not None:
            task.cancel()

    def _deliver_later(self, delivery_id: str) -> None:
        if self._closing or delivery_id in self._deliveries:
            return
        task = asyncio.create_task(self._deliver(delivery_id), name=f"deliver-{delivery_id}")
        self._deliveries[delivery_id] = task
        task.add_done_callback(lambda _t: self._deliveries.pop(delivery_id, None))

    async def _deliver(self, delivery_id: str) -> None:
        """POST the wake until a 2xx answer or the attempts run out; the same body and wake id
        every time, so a receiver that saw an attempt whose answer was lost can drop the copy."""
        if not await self.leases.acquire(DELIVERY_LEASE, delivery_id, ""):
            return  # another live replica delivers it
        try:
            await self._attempts(delivery_id)
        except asyncio.CancelledError:
            raise  # stopping: the lease is handed over, not released
        except BaseException:
            await self.leases.release(DELIVERY_LEASE, delivery_id)
            raise
        await self.leases.release(DELIVERY_LEASE, delivery_id)

    async def _attempts(self, delivery_id: str) -> None:
        settings = self.settings
        assert self._http is not None
        while True:
            job = await self.store.delivery_job(delivery_id)
            if job is None or job.state != "pending":
                return
            delay = (job.next_attempt_at or 0.0) - time.time()
            if delay > 0:
                await asyncio.sleep(delay)
            body = json.dumps({**job.payload, "seq": job.seq}, sort_keys=True).encode()
            number = await self.store.begin_attempt(delivery_id)
            timestamp = str(int(time.time()))
            headers = {
                "Content-Type": "application/json",
                "User-Agent": "shellyard-webhook",
                "X-Shellyard-Event": "wake",
                "X-Shellyard-Wake-Id": job.wake_id,
                "X-Shellyard-Delivery-Id": delivery_id,
                "X-Shellyard-Attempt": str(number),
                TIMESTAMP_HEADER: timestamp,
                SIGNATURE_HEADER: sign(job.secret, timestamp, body),
            }
            status: int | None = None
            error: str | None = None
            refused = False
            try:
                # Resolved once, checked, and only that address dialled (no rebinding).
                target = await self.policy.pin(job.url)
                headers["Host"] = target.host
                extensions = {"sni_hostname": target.server_name} if target.server_name else {}
                response = await self._http.post(
                    target.url, content=body, headers=headers, extensions=extensions
                )
                status = response.status_code
            except PolicyRefusal as exc:
                # Decided before any connection: the record is the same whatever listens.
                error, refused = str(exc), True
            except OSError as exc:  # the name does not resolve (now)
                error = str(exc)
            except httpx.HTTPError as exc:
                error = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
            ok = status is not None and 200 <= status < 300
            if not ok and error is None:
                error = f"HTTP {status}"
            if ok:
                state, next_at = "delivered", None
            elif refused or number >= settings.webhook_max_attempts:
                state, next_at = "failed", None
            else:
                backoff = settings.webhook_retry_base_s * 2 ** (number - 1)
                state = "pending"
                next_at = time.time() + min(settings.webhook_retry_max_s, backoff)
            # Shielded: cancelling the service never loses the record of an answer it got.
            await asyncio.shield(
                self.store.end_attempt(delivery_id, number, status, error, state, next_at)
            )
            log.info(
                "wake %s delivery %s attempt %d: %s",
                job.wake_id,
                delivery_id,
                number,
                status or error,
                extra={"action": "deliver_wake", "delivery_id": delivery_id, "state": state},
            )
            if state != "pending":
                return


#: D3: the fields a webhook's record and its view share, listed once; never its secret,
#: which only the registration's answer carries.
_WEBHOOK_VIEW_FIELDS = tuple(
    name for name in field_names(Webhook, WebhookView.model_fields) if name != "secret"
)


def _webhook_view(row: Webhook) -> WebhookView:
    return WebhookView.model_validate(
        {**values_of(row, _WEBHOOK_VIEW_FIELDS), "webhook_id": row.id}
    )


#: D3: a delivery's and an attempt's fields shared with their views, listed once.
_DELIVERY_VIEW_FIELDS = field_names(Delivery, DeliveryView.model_fields)
_ATTEMPT_VIEW_FIELDS = field_names(DeliveryAttempt, DeliveryAttemptView.model_fields)


def _delivery_view(row: Delivery, attempts: list[DeliveryAttempt]) -> DeliveryView:
    return DeliveryView.model_validate(
        {
            **values_of(row, _DELIVERY_VIEW_FIELDS),
            "delivery_id": row.id,
            "attempt_log": [
                DeliveryAttemptView.model_validate(values_of(a, _ATTEMPT_VIEW_FIELDS))
                for a in attempts
            ],
        }
    )
