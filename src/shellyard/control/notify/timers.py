"""One-time reminders (N5–N7). A timer is stored with the UTC instant it fires at and the spec
it came from; the control plane's scheduler (one task sleeping until the next due time) fires it
as a reminder notice. It runs nothing and takes no writer.

Exactly once, across restarts and control planes: firing claims the timer with a conditional
update (pending → fired) in the same transaction that inserts its notice. On start every timer
that came due while the service was down fires once, marked late.

Several replicas (docs/operations.md): every replica runs a scheduler. A timer's creation is
announced to the others (a fan-out message sent by its transaction, control/replicas/wiring.py), so
each one sleeps until its due time and the timer fires on time even when the replica that took it
died; the conditional update keeps it once. N6 cannot rely on a set of watched executions filled at
creation there (another replica may finalize the execution): on PostgreSQL every execution's end
asks the store (one indexed update), and a creation re-reads its execution after commit, so an end
racing the creation is seen by one of the two."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from shellyard.config import NotificationSettings
from shellyard.contract.sessions import (
    DEFAULT_LIST_PAGE,
    SessionState,
    TimerCreateRequest,
    TimerState,
    TimerView,
)
from shellyard.control.notify.sessions import SessionService
from shellyard.control.notify.wakes import WakeService
from shellyard.errors import Conflict, InvalidInput, NotFound
from shellyard.store.db import new_id
from shellyard.store.executions import FINISHED_STATES, Execution
from shellyard.store.timers import Timer

log = logging.getLogger(__name__)

#: The furthest a timer may lie ahead.
MAX_AHEAD_S = 10 * 366 * 86400

AT_FORMATS = (
    "an ISO-8601 time with an offset (2030-06-01T09:00:00+02:00 or ...Z), or a local time with "
    "an IANA zone (2030-06-01T09:00:00[Europe/Paris] or '2030-06-01T09:00:00 Europe/Paris')"
)
ONE_TIME = (
    "timers are one-time only: recurring schedules (cron strings, intervals, repeat rules) are "
    "not supported; create one timer, and a new one when it has fired"
)
_BRACKET_ZONE = re.compile(r"^(?P<time>.+?)\[!?(?P<zone>[^\]]+)\]$")
_SPACE_ZONE = re.compile(r"^(?P<time>.+?)\s+(?P<zone>[A-Za-z][A-Za-z0-9_+\-/]*)$")
_CRON_FIELD = r"[0-9*?LW#/,\-A-Za-z]+"
_CRON = re.compile(rf"^@\w+$|^{_CRON_FIELD}(\s+{_CRON_FIELD}){{4,6}}$")
_RECURRING_WORDS = re.compile(
    r"\b(every|each|daily|hourly|weekly|monthly|yearly|annually|cron|repeat\w*|recurr\w*)\b",
    re.IGNORECASE,
)


def parse_when(
    after_ms: int | None, at: str | None, now: float, grace_s: float
) -> tuple[float, dict[str, Any]]:
    """(fire_at as UNIX seconds, the spec to record) for exactly one of ``after_ms``/``at``."""
    if (after_ms is None) == (at is None):
        raise InvalidInput(
            "give exactly one of after_ms (milliseconds from now) or at (" + AT_FORMATS + ")"
        )
    if after_ms is not None:
        if isinstance(after_ms, bool) or not 0 <= after_ms <= MAX_AHEAD_S * 1000:
            raise InvalidInput(
                f"after_ms must be a whole number of milliseconds from 0 to {MAX_AHEAD_S * 1000} "
                f"(10 years), got {after_ms!r}"
            )
        return now + after_ms / 1000, {"after_ms": after_ms}
    assert at is not None
    fire_at, zone = parse_at(at)
    if fire_at < now - grace_s:
        raise InvalidInput(
            f"at {at!r} is {_ago(now - fire_at)} in the past; give a future time, or after_ms"
        )
    if fire_at > now + MAX_AHEAD_S:
        raise InvalidInput(f"at {at!r} is more than 10 years ahead")
    return fire_at, {"at": at, "zone": zone}


def parse_at(text: str) -> tuple[float, str | None]:
    """The UTC instant of ``at`` and its IANA zone, if it named one. Refuses naive times,
    recurring syntax, and local times a DST change makes missing or ambiguous (N5)."""
    raw = text.strip()
    if not raw:
        raise InvalidInput("at is empty; give " + AT_FORMATS)
    if (
        _CRON.match(raw)
        or _RECURRING_WORDS.search(raw)
        or re.match(r"^R\d*/", raw)
        or ("/" in raw and not _BRACKET_ZONE.match(raw) and not _SPACE_ZONE.match(raw))
    ):
        raise InvalidInput(f"at {text!r} looks recurring or like an interval; {ONE_TIME}")
    if re.match(r"^P(\d|T)", raw):
        raise InvalidInput(
            f"at {text!r} is a duration, not a time; for 'in N minutes' use after_ms"
        )
    zone_name = None
    for pattern in (_BRACKET_ZONE, _SPACE_ZONE):
        match = pattern.match(raw)
        if match:
            raw, zone_name = match["time"].strip(), match["zone"]
            break
    try:
        moment = datetime.fromisoformat(raw)
    except ValueError:
        raise InvalidInput(f"at {text!r} is not a time I can read; give {AT_FORMATS}") from None
    if zone_name is None:
        if moment.tzinfo is None:
            raise InvalidInput(
                f"at {text!r} has no offset or zone, so its instant is unknown; add an offset "
                f"({raw}+02:00, {raw}Z) or an IANA zone ({raw}[Europe/Paris])"
            )
        return moment.timestamp(), None
    try:
        zone = ZoneInfo(zone_name)
    except (ZoneInfoNotFoundError, ValueError):
        raise InvalidInput(
            f"at {text!r} names an unknown time zone {zone_name!r}; use an IANA name such as "
            "Europe/Paris, Asia/Tokyo or UTC"
        ) from None
    wall = moment.replace(tzinfo=None)
    if moment.tzinfo is not None:  # an offset and a zone (RFC 9557): they must agree
        if moment.astimezone(zone).replace(tzinfo=None) != wall:
            raise InvalidInput(
                f"at {text!r}: {zone_name} is not at offset {_offset(moment)} at that time "
                f"({raw[:19]} there is {_offsets(wall, zone)}); fix or drop the offset"
            )
        return moment.timestamp(), zone_name
    first, second = wall.replace(tzinfo=zone, fold=0), wall.replace(tzinfo=zone, fold=1)
    if first.utcoffset() != second.utcoffset():
        back = first.astimezone(UTC).astimezone(zone).replace(tzinfo=None)
        if back != wall:  # in the gap of a spring-forward change
            raise InvalidInput(
                f"at {text!r} does not exist: clocks in {zone_name} skip that hour "
                f"(daylight saving time starts). Give a time outside the gap, or an offset "
                f"({wall.isoformat()}{_offset(first)} is {_utc(first)})"
            )
        raise InvalidInput(
            f"at {text!r} happens twice in {zone_name} (daylight saving time ends); add the "
            f"offset to pick one: {wall.isoformat()}{_offset(first)}[{zone_name}] (the first, "
            f"{_utc(first)}) or {wall.isoformat()}{_offset(second)}[{zone_name}] (the second, "
            f"{_utc(second)})"
        )
    return first.timestamp(), zone_name


def _offset(moment: datetime) -> str:
    offset = moment.utcoffset() or timedelta(0)
    sign = "-" if offset < timedelta(0) else "+"
    minutes = abs(int(offset.total_seconds())) // 60
    return f"{sign}{minutes // 60:02d}:{minutes % 60:02d}"


def _offsets(wall: datetime, zone: ZoneInfo) -> str:
    found = sorted({_offset(wall.replace(tzinfo=zone, fold=f)) for f in (0, 1)})
    return " or ".join(found)


def _utc(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _ago(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def utc_text(timestamp: float) -> str:
    return datetime.fromtimestamp(timestamp, UTC).isoformat(timespec="milliseconds")[:-6] + "Z"


def timer_view(row: Timer) -> TimerView:
    return TimerView(
        timer_id=row.id,
        agent_id=row.agent_id,
        session_id=row.session_id,
        text=row.text,
        spec=row.spec,
        fire_at=row.fire_at,
        fire_at_utc=utc_text(row.fire_at),
        execution_id=row.execution_id,
        state=TimerState(row.state),
        late=row.late,
        cancel_reason=row.cancel_reason,
        created_at=row.created_at,
        fired_at=row.fired_at,
        cancelled_at=row.cancelled_at,
    )


class TimerService:
    def __init__(
        self,
        sessions: SessionService,
        wakes: WakeService,
        settings: NotificationSettings,
        *,
        announce: Callable[[], tuple[str, str] | None],
        on_change: Callable[[], None],
    ) -> None:
        self.sessions = sessions
        self.store = sessions.store
        self.wakes = wakes
        self.settings = settings
        self._changed = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        #: Executions some pending timer names (spares every other execution's end a query).
        #: SQLite only, where this process creates every timer; PostgreSQL replicas ask the
        #: store at each end instead (``execution_finished``).
        self._watched: set[str] = set()
        self.shared = not self.store.is_sqlite
        #: Fan-out (control/replicas/wiring.py ``Publish``): ``announce`` gives the (channel,
        #: payload) of the message a creation's transaction sends (so it leaves iff the timer
        #: exists; None with one replica); ``on_change`` publishes one after a cancellation.
        self.announce, self.on_change = announce, on_change

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        """N7: fire, once and marked late, every timer that came due while nobody ran them;
        then schedule the rest."""
        if not self.shared:
            self._watched = await self.store.pending_timer_executions()
        started = time.time()
        due, _next = await self.store.due_timers(started)
        await self._fire(due, late_if_due_before=started)
        self._task = asyncio.create_task(self._schedule(), name="timers")

    async def aclose(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    # ------------------------------------------------------------------ operations

    async def create(self, agent_id: str | None, request: TimerCreateRequest) -> TimerView:
        """N5: a one-time reminder of ``text`` for the calling agent."""
        agent = await self.sessions.agent_record(agent_id)
        session = await self.sessions.session_record(agent.session_id)
        if session.state != SessionState.active:
            raise Conflict(
                f"session {session.id} is {session.state}: its timers were cancelled and "
                "no new ones are taken until a user request resumes it"
            )
        now = time.time()
        fire_at, spec = parse_when(
            request.after_ms, request.at, now, self.settings.timer_past_grace_s
        )
        values: dict[str, Any] = {
            "id": new_id("tmr"),
            "agent_id": agent.id,
            "session_id": session.id,
            "text": request.text,
            "spec": spec,
            "fire_at": fire_at,
            "execution_id": request.execution_id,
            "state": TimerState.pending.value,
            "late": False,
            "created_at": now,
        }
        if request.execution_id is not None:
            execution = await self.store.get_execution(request.execution_id)
            if execution is None or execution.agent_id != agent.id:
                raise NotFound(
                    f"no execution {request.execution_id!r}; name one of your own executions "
                    "(execution_status lists its state) or leave execution_id out"
                )
            if execution.state in FINISHED_STATES:  # N6: it already finished first
                values.update(
                    state=TimerState.cancelled.value,
                    cancelled_at=now,
                    cancel_reason=f"execution {execution.id} had already finished "
                    f"({execution.state}) when the timer was created",
                )
            elif not self.shared:
                self._watched.add(request.execution_id)
        row = await self.store.create_timer(values, announce=self.announce())
        self._changed.set()
        if row.state == TimerState.pending and request.execution_id is not None:
            # N6: the execution may have ended between the read above and the insert; its
            # end's check did not see this timer then, so this read sees the end (it waits
            # for an end still being committed: store.execution_for_new_timer).
            execution = await self.store.execution_for_new_timer(request.execution_id)
            if execution is not None and execution.state in FINISHED_STATES:
                await self._cancel_for(execution)
                row = await self.store.get_timer(row.id) or row
        return timer_view(row)

    async def list_timers(
        self,
        agent_id: str | None,
        state: str | None = None,
        after: str | None = None,
        limit: int = DEFAULT_LIST_PAGE,
    ) -> list[TimerView]:
        """One page of the agent's timers by firing time (a full page: there may be more,
        from ``after`` = its last id)."""
        if state is not None and state not in TimerState.__members__:
            raise InvalidInput(f"state must be pending, fired or cancelled, not {state!r}")
        agent = await self.sessions.agent_record(agent_id)
        rows = await self.store.list_timers(agent.id, state, after=after, limit=limit)
        return [timer_view(r) for r in rows]

    async def get(self, agent_id: str | None, timer_id: str) -> TimerView:
        return timer_view(await self._owned(agent_id, timer_id))

    async def cancel(self, agent_id: str | None, timer_id: str) -> TimerView:
        """Cancel a pending timer; a fired or cancelled one comes back unchanged."""
        row = await self._owned(agent_id, timer_id)
        if row.state == TimerState.pending:
            await self.store.cancel_timers("cancelled by timer_cancel", timer_id=timer_id)
            self._cancelled()
        return await self.get(agent_id, timer_id)

    async def execution_finished(self, row: Execution, _notice_read: bool) -> None:
        """ExecutionService observer (N6): the reminders naming this execution that had not
        come due are cancelled. On PostgreSQL the timer may have been created through another
        replica (and its fan-out message lost): the store is asked at every end."""
        execution_id = row.id
        if (
            row.timers_cancelled is not None
        ):  # done in the finishing transaction (folded_into_finish)
            if row.timers_cancelled:
                self._cancelled()
            return
        if self.shared or execution_id in self._watched:
            self._watched.discard(execution_id)
            await self._cancel_for(row)

    @property
    def folded_into_finish(self) -> bool:
        """Whether executions' ends should cancel N6 reminders in their own transaction: where
        every end asks the store anyway (PostgreSQL), that saves a transaction per end; on
        SQLite the set of watched executions spares most ends any statement."""
        return self.shared

    def changed(self) -> None:
        """Another replica created or cancelled a timer, or messages may have been missed
        (fan-out resync): read the next due time again."""
        self._changed.set()

    async def _cancel_for(self, execution: Execution) -> None:
        reason = f"execution {execution.id} finished before the reminder was due"
        if await self.store.cancel_execution_timers(execution, reason):
            self._cancelled()

    def _cancelled(self) -> None:
        self._changed.set()
        self.on_change()

    async def _owned(self, agent_id: str | None, timer_id: str) -> Timer:
        agent = await self.sessions.agent_record(agent_id)
        row = await self.store.get_timer(timer_id)
        if row is None or row.agent_id != agent.id:
            raise NotFound(f"no timer {timer_id!r}; timer_list shows yours")
        return row

    # ------------------------------------------------------------------ scheduler

    async def _schedule(self) -> None:
        while True:
            self._changed.clear()
            now = time.time()
            try:
                due, upcoming = await self.store.due_timers(now)
                if due:
                    await self._fire(due, late_if_due_before=now - self.settings.timer_late_after_s)
                    continue
            except Exception:  # the database hiccupped: try again shortly, never die
                log.exception("timer scheduler: checking due timers failed")
                upcoming = time.time() + 1.0
            timeout = self.settings.timer_poll_s
            if upcoming is not None:
                timeout = min(timeout, max(0.0, upcoming - time.time()))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), timeout)

    async def _fire(self, due: list[str], late_if_due_before: float) -> None:
        for timer_id in due:
            row, fired = await self.store.fire_timer(timer_id, late_if_due_before)
            if row is not None and fired:
                log.info(
                    "timer %s fired%s",
                    timer_id,
                    " late" if row.late else "",
                    extra={"action": "fire_timer", "timer_id": timer_id, "late": row.late},
                )
                await self.wakes.notify(row.agent_id)
