"""Timers (N5–N7): the `at`/`after_ms` contract with its clear refusals, firing at the right
instant (IANA zones, offsets, DST), N6 cancellation by a finishing execution, no writer taken,
restarts that fire an overdue timer once (late), and exactly-once between two control planes
sharing PostgreSQL."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest
from notify_helpers import FAST, Host, running_plane, settle, until
from pydantic import ValidationError

from conftest import POSTGRES_URL
from shellyard.contract.executions import ExecutionCancelQuery, ExecutionList
from shellyard.contract.sessions import TimerCreateRequest, TimerState, TimerView
from shellyard.control.notify.timers import parse_at, parse_when
from shellyard.control.plane import ControlPlane
from shellyard.errors import Conflict, InvalidInput, NotFound


@pytest.fixture
async def plane(home: Path) -> AsyncIterator[ControlPlane]:
    async with running_plane(home / "home") as opened:
        yield opened


def utc(text: str) -> float:
    return datetime.fromisoformat(text).replace(tzinfo=UTC).timestamp()


# ---------------------------------------------------------------------- the `at` contract


@pytest.mark.parametrize(
    ("at", "instant"),
    [
        ("2030-01-15T10:00:00+09:00", "2030-01-15T01:00:00"),
        ("2030-01-15T10:00:00Z", "2030-01-15T10:00:00"),
        ("2030-01-15T10:00:00[Europe/Paris]", "2030-01-15T09:00:00"),  # winter, +01:00
        ("2030-07-15T10:00:00 Europe/Paris", "2030-07-15T08:00:00"),  # summer, +02:00
        ("2030-07-15 10:00[Asia/Tokyo]", "2030-07-15T01:00:00"),
        # DST edges in Paris: spring forward on 2030-03-31 at 02:00, fall back on 2030-10-27.
        ("2030-03-31T01:59:59[Europe/Paris]", "2030-03-31T00:59:59"),
        ("2030-03-31T03:30:00[Europe/Paris]", "2030-03-31T01:30:00"),
        ("2030-10-27T02:30:00+02:00[Europe/Paris]", "2030-10-27T00:30:00"),  # the first 02:30
        ("2030-10-27T02:30:00+01:00[Europe/Paris]", "2030-10-27T01:30:00"),  # the second one
        ("2030-10-27T03:30:00[Europe/Paris]", "2030-10-27T02:30:00"),
    ],
)
def test_at_with_an_offset_or_an_iana_zone_is_the_right_instant(at: str, instant: str) -> None:
    """N5: `at` carries an offset or an IANA zone; the instant is exact, across DST changes."""
    fire_at, _zone = parse_at(at)
    assert fire_at == utc(instant)


@pytest.mark.parametrize(
    ("at", "message"),
    [
        ("2030-01-15T10:00:00", "has no offset or zone"),
        ("2030-03-31T02:30:00[Europe/Paris]", "does not exist: clocks in Europe/Paris skip"),
        ("2030-10-27T02:30:00[Europe/Paris]", "happens twice in Europe/Paris"),
        ("2030-10-27T02:30:00+05:00[Europe/Paris]", "is not at offset +05:00"),
        ("2030-01-15T10:00:00[Mars/Olympus]", "unknown time zone 'Mars/Olympus'"),
        ("*/5 * * * *", "one-time only"),
        ("0 9 * * MON-FRI", "one-time only"),
        ("@daily", "one-time only"),
        ("every day at 9", "one-time only"),
        ("R5/2030-01-01T00:00:00Z/PT1H", "one-time only"),
        ("2030-01-01T00:00:00Z/2030-01-02T00:00:00Z", "one-time only"),
        ("PT5M", "is a duration, not a time; for 'in N minutes' use after_ms"),
        ("tomorrow at noon", "is not a time I can read"),
        ("", "at is empty"),
    ],
)
def test_bad_at_is_refused_with_a_clear_error(at: str, message: str) -> None:
    """N5: naive times, DST gaps and overlaps, unknown zones, recurring syntax: clear errors."""
    with pytest.raises(InvalidInput, match=message.replace("*", r"\*").replace("+", r"\+")):
        parse_at(at)


def test_ambiguous_local_time_names_both_choices() -> None:
    with pytest.raises(InvalidInput) as caught:
        parse_at("2030-10-27T02:30:00[Europe/Paris]")
    assert "2030-10-27T02:30:00+02:00[Europe/Paris]" in caught.value.message
    assert "2030-10-27T02:30:00+01:00[Europe/Paris]" in caught.value.message


def test_exactly_one_of_after_ms_or_at_and_no_past_beyond_the_grace() -> None:
    now = time.time()
    for after_ms, at in ((None, None), (1000, "2030-01-01T00:00:00Z")):
        with pytest.raises(InvalidInput, match="exactly one of after_ms"):
            parse_when(after_ms, at, now, 10)
    with pytest.raises(InvalidInput, match="after_ms must be a whole number"):
        parse_when(-1, None, now, 10)
    with pytest.raises(InvalidInput, match="10 years"):
        parse_when(None, "2100-01-01T00:00:00Z", now, 10)
    past = datetime.fromtimestamp(now - 60, UTC).isoformat()
    with pytest.raises(InvalidInput, match="in the past"):
        parse_when(None, past, now, 10)
    recent = datetime.fromtimestamp(now - 5, UTC).isoformat()
    assert parse_when(None, recent, now, 10)[0] == pytest.approx(now - 5, abs=1e-5)
    assert parse_when(1500, None, now, 10) == (now + 1.5, {"after_ms": 1500})
    with pytest.raises(ValidationError, match="one-time only"):
        TimerCreateRequest.model_validate({"text": "x", "after_ms": 5, "every": "5m"})
    with pytest.raises(ValidationError, match="text"):
        TimerCreateRequest.model_validate({"text": "", "after_ms": 5})


# ---------------------------------------------------------------------- firing


async def test_zone_and_offset_timers_fire_at_their_instants_in_order(plane: ControlPlane) -> None:
    """N5: a Paris local time and a +09:00 time fire as reminder notices, in the order of their
    instants, never before them."""
    host = await Host.open(plane)
    now = time.time()
    paris = datetime.fromtimestamp(now + 1.2, ZoneInfo("Europe/Paris"))
    tokyo = datetime.fromtimestamp(now + 0.6, timezone(timedelta(hours=9)))
    late_one = await plane.timers.create(
        host.main,
        TimerCreateRequest(
            text="paris", at=paris.replace(tzinfo=None).isoformat() + "[Europe/Paris]"
        ),
    )
    early_one = await plane.timers.create(
        host.main, TimerCreateRequest(text="tokyo", at=tokyo.isoformat())
    )
    assert late_one.fire_at == pytest.approx(paris.timestamp(), abs=1e-6)
    assert early_one.fire_at == pytest.approx(tokyo.timestamp(), abs=1e-6)
    assert late_one.spec["zone"] == "Europe/Paris" and early_one.spec["zone"] is None
    await until(lambda: _all_fired(plane, host.main), what="both timers to fire")
    reminders = [n for n in await plane.inbox.notices(host.main) if n.kind == "reminder"]
    assert [n.subject_id for n in reminders] == [early_one.timer_id, late_one.timer_id]
    assert [n.summary for n in reminders] == ["reminder: tokyo", "reminder: paris"]
    for timer in await plane.timers.list_timers(host.main):
        assert timer.fired_at is not None and timer.fired_at >= timer.fire_at
        assert not timer.late
    await settle()
    assert [w.notices[0].subject_id for w in host.wakes] == [early_one.timer_id]  # then busy


async def _all_fired(plane: ControlPlane, agent: str) -> bool:
    timers = await plane.timers.list_timers(agent)
    return bool(timers) and all(t.state == TimerState.fired for t in timers)


async def test_a_reminder_naming_an_execution_is_cancelled_when_it_finishes_first(
    plane: ControlPlane,
) -> None:
    """N6: finishing first cancels the reminder (it never fires); a reminder whose execution is
    still running fires; naming an already finished execution gives a cancelled timer; naming
    someone else's execution is refused."""
    host = await Host.open(plane)
    quick = await host.run("sleep 0.2", background=True)
    slow = await host.run("sleep 30", background=True, queue=True)  # after quick (W1)
    on_quick = await plane.timers.create(
        host.main,
        TimerCreateRequest(text="check quick", after_ms=3000, execution_id=quick.execution_id),
    )
    on_slow = await plane.timers.create(
        host.main,
        TimerCreateRequest(text="check slow", after_ms=300, execution_id=slow.execution_id),
    )
    await host.wait_notice(quick.execution_id)
    cancelled = await plane.timers.get(host.main, on_quick.timer_id)
    assert cancelled.state == TimerState.cancelled
    assert cancelled.cancel_reason == (
        f"execution {quick.execution_id} finished before the reminder was due"
    )
    fired = await until(lambda: _fired(plane, host.main, on_slow.timer_id), what="the reminder")
    assert fired.execution_id == slow.execution_id
    after = await plane.timers.create(
        host.main, TimerCreateRequest(text="too late", after_ms=10, execution_id=quick.execution_id)
    )
    assert after.state == TimerState.cancelled and "had already finished" in (
        after.cancel_reason or ""
    )
    other = await plane.sessions.create()
    with pytest.raises(NotFound, match=f"no execution '{slow.execution_id}'"):
        await plane.timers.create(
            other.main_agent_id,
            TimerCreateRequest(text="x", after_ms=10, execution_id=slow.execution_id),
        )
    await plane.executions.cancel(slow.execution_id, ExecutionCancelQuery(wait_s=20), host.main)
    await asyncio.sleep(0.2)
    assert (await plane.timers.get(host.main, on_quick.timer_id)).state == TimerState.cancelled
    assert not any(n.subject_id == on_quick.timer_id for n in await plane.inbox.notices(host.main))


async def _fired(plane: ControlPlane, agent: str, timer_id: str) -> TimerView | None:
    timer = await plane.timers.get(agent, timer_id)
    return timer if timer.state == TimerState.fired else None


async def test_timers_take_no_writer_and_run_nothing(plane: ControlPlane) -> None:
    """N5: while a command holds the workspace's writer a timer is set and fires; it delivers
    text only (no execution is created) and the writer is untouched."""
    host = await Host.open(plane)
    holder = await host.run("sleep 30", background=True)
    timer = await plane.timers.create(
        host.main, TimerCreateRequest(text="echo hacked", after_ms=50)
    )
    await until(lambda: _fired(plane, host.main, timer.timer_id), what="the reminder")
    workspace = await plane.store.get_workspace(holder.workspace_id)
    assert workspace is not None and workspace.writer_id == holder.execution_id
    assert [e.execution_id for e in await plane.executions.list(ExecutionList(), host.main)] == [
        holder.execution_id
    ]
    await plane.executions.cancel(holder.execution_id, ExecutionCancelQuery(wait_s=20), host.main)


async def test_cancel_list_and_ownership(plane: ControlPlane) -> None:
    """timer_cancel: a cancelled timer never fires; cancelling again returns it unchanged;
    another agent's timer is reported like a missing one."""
    host = await Host.open(plane)
    timer = await plane.timers.create(host.main, TimerCreateRequest(text="t", after_ms=2_000))
    cancelled = await plane.timers.cancel(host.main, timer.timer_id)
    assert cancelled.state == TimerState.cancelled and cancelled.cancel_reason
    assert await plane.timers.cancel(host.main, timer.timer_id) == cancelled
    await until(lambda: _after(timer.fire_at + 0.3), what="its time to pass")
    assert (await plane.timers.get(host.main, timer.timer_id)).state == TimerState.cancelled
    assert await plane.inbox.notices(host.main) == []
    assert [t.timer_id for t in await plane.timers.list_timers(host.main, "cancelled")] == [
        timer.timer_id
    ]
    assert await plane.timers.list_timers(host.main, "pending") == []
    with pytest.raises(InvalidInput, match="state must be pending, fired or cancelled"):
        await plane.timers.list_timers(host.main, "done")
    other = await plane.sessions.create()
    with pytest.raises(NotFound, match=f"no timer '{timer.timer_id}'"):
        await plane.timers.cancel(other.main_agent_id, timer.timer_id)
    await plane.sessions.stop(other.session_id)
    with pytest.raises(Conflict, match="is stopped"):
        await plane.timers.create(other.main_agent_id, TimerCreateRequest(text="t", after_ms=1))


async def _after(moment: float) -> bool:
    return time.time() > moment


async def test_a_timer_due_while_the_plane_was_down_fires_once_late(home: Path) -> None:
    """N7 (graceful stop): the next start fires it once, marked late; later starts never again."""
    async with running_plane(home / "home") as plane:
        session = await plane.sessions.create()
        timer = await plane.timers.create(
            session.main_agent_id, TimerCreateRequest(text="wake up", after_ms=200)
        )
    await until(lambda: _after(timer.fire_at + 0.5), what="the timer to come due while down")
    for _ in range(2):
        async with running_plane(home / "home") as plane:
            fired = await plane.timers.get(session.main_agent_id, timer.timer_id)
            assert fired.state == TimerState.fired and fired.late
            assert fired.fired_at is not None and fired.fired_at > fired.fire_at + 0.4
            reminders = await plane.inbox.notices(session.main_agent_id)
            assert [n.summary for n in reminders] == ["reminder (late): wake up"]
            assert reminders[0].payload is not None and reminders[0].payload["late"] is True


@pytest.mark.postgres
async def test_two_control_planes_on_postgresql_fire_a_timer_once(
    home: Path, request: pytest.FixtureRequest
) -> None:
    """N7 exactly once between control planes sharing PostgreSQL: both schedulers race for the
    same due timer; the conditional claim lets one fire it."""
    schema = request.getfixturevalue("pg_schema")
    fast_poll = dataclasses.replace(FAST, timer_poll_s=0.05)
    opened = {"database_url": POSTGRES_URL, "database_schema": schema}
    async with (
        running_plane(home / "a", fast_poll, **opened) as first,
        running_plane(home / "b", fast_poll, **opened) as second,
    ):
        session = await first.sessions.create()
        agent = session.main_agent_id
        timers = [
            await first.timers.create(agent, TimerCreateRequest(text=f"t{i}", after_ms=300))
            for i in range(5)
        ]
        await until(lambda: _all_fired(second, agent), what="every timer to fire")
        notices = await second.inbox.notices(agent)
        assert sorted(n.subject_id for n in notices) == sorted(t.timer_id for t in timers)
