"""Wakes and the inbox (N1–N4, N8–N11) on a real control plane running real sandboxed commands:
the wake matrix, children, stopping, archiving, webhooks (a real HTTP receiver)."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from notify_helpers import FAST, Host, running_plane, settle, until
from webhook_receiver import WebhookReceiver

from shellyard.config import NotificationSettings
from shellyard.contract.executions import (
    ExecutionCancelQuery,
    ExecutionList,
    ExecutionLogsQuery,
    ExecutionState,
    ExecutionWait,
    RunShellRequest,
)
from shellyard.contract.sessions import (
    DeliveryView,
    NoticeView,
    TimerCreateRequest,
    TimerState,
    WakeView,
    WebhookRequest,
)
from shellyard.control.notify.wakes import verify_signature
from shellyard.control.plane import ControlPlane
from shellyard.errors import Conflict


@pytest.fixture
async def plane(home: Path) -> AsyncIterator[ControlPlane]:
    async with running_plane(home / "home") as opened:
        yield opened


# ---------------------------------------------------------------------- the wake matrix

SOURCES = ("background", "wait_ran_out", "finished_in_wait", "status_after_finish", "reminder")
OWNERS = ("idle", "busy", "agent_stopped", "session_stopped")


@dataclass
class Expect:
    notice: bool  # a notice is posted at all
    read: bool  # its read mark at the end
    wake: str | None  # when the one wake happens: at the "notice", at the "release", or never
    in_summary: bool  # listed in the summary the user request returns (session_stopped only)


def expected(source: str, owner: str) -> Expect:
    if source == "reminder" and owner == "session_stopped":
        return Expect(notice=False, read=False, wake=None, in_summary=False)  # N8: cancelled
    read = source in ("finished_in_wait", "status_after_finish")  # N3: seen through a tool call
    if source == "finished_in_wait":
        wake = None  # read at once: wakes nobody (N3)
    elif owner == "idle":
        wake = "notice"  # N2: idle, gates open: a new turn at once
    elif source == "status_after_finish" or owner == "session_stopped":
        # Read during the turn before it ended; or delivered by the user request's summary (N9)
        wake = None
    else:
        wake = "release"  # busy: when the turn ends (N2); stopped: when it resumes (N8)
    return Expect(True, read, wake, in_summary=owner == "session_stopped" and not read)


@pytest.mark.parametrize("owner", OWNERS)
@pytest.mark.parametrize("source", SOURCES)
async def test_wake_matrix(plane: ControlPlane, source: str, owner: str) -> None:
    """N1–N3, N8, N9: for each notice source × owner condition, whether a wake happens, when
    (at the notice, or when the owner is released: turn end, agent resume, user request), and
    the notice's read mark. A notice is never in two wakes."""
    host = await Host.open(plane)
    sessions = plane.sessions

    async def apply_condition() -> None:
        if owner == "busy":
            await sessions.turn_begin(host.main)
        elif owner == "agent_stopped":
            await sessions.stop_agent(host.main)
        elif owner == "session_stopped":
            await sessions.stop(host.session.session_id)

    # Start the work, put the owner in its condition while the work runs, let it finish.
    foreground = None
    if source == "reminder":
        timer = await plane.timers.create(host.main, TimerCreateRequest(text="look", after_ms=400))
        subject = timer.timer_id
    elif source in ("wait_ran_out", "finished_in_wait"):
        wait_ms = 100 if source == "wait_ran_out" else 20_000
        foreground = asyncio.create_task(host.run("sleep 0.4; echo done", wait_ms=wait_ms))
        listed = await until(
            lambda: plane.executions.list(ExecutionList(), host.main), what="the execution"
        )
        subject = listed[0].execution_id
    else:
        subject = (await host.run("sleep 0.4; echo done", background=True)).execution_id
    await apply_condition()
    if foreground is not None:
        result = await foreground
        finished_in_wait = result.state == ExecutionState.completed
        assert finished_in_wait == (source == "finished_in_wait")
    if source == "reminder":
        await until(
            lambda: plane.timers.get(host.main, subject),
            what="the timer",
        )
        final = await until(
            lambda: _settled_timer(plane, host.main, subject), what="the timer to fire or cancel"
        )
        assert final == (TimerState.cancelled if owner == "session_stopped" else TimerState.fired)
    else:
        await host.wait_notice(subject)
    if source == "status_after_finish":
        assert (await plane.executions.status(subject, host.main)).state.terminal
    await settle()
    at_notice = len(host.woken_for(subject))

    # Release the owner.
    summary = None
    if owner == "busy":
        await sessions.turn_end(host.main)
    elif owner == "agent_stopped":
        await sessions.resume_agent(host.main)
    elif owner == "session_stopped":
        summary = (await sessions.user_request(host.session.session_id)).summary
        await sessions.turn_end(host.main)  # the user's turn ends: nothing may wake again
    await settle()
    after_release = len(host.woken_for(subject))

    expect = expected(source, owner)
    notice = await host.notice(subject)
    assert (notice is not None) == expect.notice
    happened = "notice" if at_notice else "release" if after_release else None
    assert happened == expect.wake, (at_notice, after_release)
    assert after_release <= 1, "a notice was in two wakes"
    if notice is not None:
        assert (notice.read_at is not None) == expect.read
        if expect.wake is not None:
            (wake,) = host.woken_for(subject)
            assert wake.agent_id == host.main and wake.is_main
            assert notice.wake_id == wake.wake_id
    if summary is not None:
        listed = {n.subject_id for n in summary.notices}
        assert (subject in listed) == expect.in_summary
        assert summary.unread == len(summary.notices)
    recorded = await plane.wakes.list_wakes(host.session.session_id, 0)
    assert [w.wake_id for w in recorded] == [w.wake_id for w in host.wakes]


@pytest.mark.parametrize("how", ["wait", "cancel_with_wait"])
async def test_a_result_seen_through_wait_or_cancel_wakes_nobody(
    plane: ControlPlane, how: str
) -> None:
    """N3: a caller blocked in execution wait (or a cancel that waits) when the execution
    ends sees its result, so the notice is read at once and no turn starts, even when idle."""
    host = await Host.open(plane)
    command = "sleep 0.4; echo done" if how == "wait" else "sleep 30"
    subject = (await host.run(command, background=True)).execution_id
    if how == "wait":
        view = await plane.executions.wait(subject, ExecutionWait(timeout_s=20), host.main)
        assert view.state == ExecutionState.completed
    else:
        view = await plane.executions.cancel(subject, ExecutionCancelQuery(wait_s=20), host.main)
        assert view.state == ExecutionState.cancelled
    await host.wait_notice(subject)
    await settle()
    notice = await host.notice(subject)
    assert notice is not None and notice.read_at is not None
    assert host.woken_for(subject) == []


async def _settled_timer(plane: ControlPlane, agent: str, timer_id: str) -> TimerState | None:
    timer = await plane.timers.get(agent, timer_id)
    return None if timer.state == TimerState.pending else timer.state


# ---------------------------------------------------------------------- agents and sessions


async def test_child_notices_wake_the_child_not_the_main_agent(plane: ControlPlane) -> None:
    """N4: a child's background execution runs in the child's own workspace and its notice
    wakes the child, in its own context, never the main agent."""
    host = await Host.open(plane)
    child = await plane.sessions.create_child(host.main)
    assert child.parent_id == host.main and not child.is_main
    mine = await host.run("echo main > who", wait_ms=20_000)
    theirs = await host.run(
        "cat who 2>/dev/null; echo child", agent=child.agent_id, background=True
    )
    notice = await host.wait_notice(theirs.execution_id, agent=child.agent_id)
    await settle()
    (wake,) = host.wakes
    assert wake.agent_id == child.agent_id and wake.parent_agent_id == host.main
    assert not wake.is_main and [n.notice_id for n in wake.notices] == [notice.notice_id]
    assert theirs.workspace_id != mine.workspace_id  # its own workspace root
    logs = await plane.executions.logs(theirs.execution_id, ExecutionLogsQuery(), child.agent_id)
    assert logs.data == "child\n"  # the main agent's file is not in the child's workspace
    assert await plane.inbox.notices(host.main, unread_only=True) == []
    assert (await plane.sessions.get_agent(host.main)).state == "idle"  # not woken
    assert (await plane.sessions.get_agent(child.agent_id)).state == "busy"  # its turn began


async def test_a_child_stopped_on_its_own_needs_an_explicit_resume(plane: ControlPlane) -> None:
    """N10: the child stopped on its own stays stopped when the session resumes; resuming it is
    refused while the session is stopped and allowed after; then its notice wakes it."""
    host = await Host.open(plane)
    child = await plane.sessions.create_child(host.main)
    await plane.sessions.stop_agent(child.agent_id)
    started = await host.run("sleep 0.2", agent=child.agent_id, background=True)
    await host.wait_notice(started.execution_id, agent=child.agent_id)
    await plane.sessions.stop(host.session.session_id)
    with pytest.raises(Conflict, match="resume the session first"):
        await plane.sessions.resume_agent(child.agent_id)
    resumed = await plane.sessions.user_request(host.session.session_id)
    assert resumed.resumed
    await settle()
    assert (await plane.sessions.get_agent(child.agent_id)).gate == "closed"
    assert host.wakes == []
    assert (await plane.sessions.resume_agent(child.agent_id)).gate == "open"
    await settle()
    (wake,) = host.wakes
    assert wake.agent_id == child.agent_id and wake.reason == "resume"
    kinds = [e.kind for e in await plane.sessions.events(host.session.session_id)]
    assert kinds == [
        "session_created",
        "agent_created",
        "agent_stopped",
        "session_stopped",
        "session_resumed",
        "user_request",
        "agent_resumed",
    ]


async def test_archive_restore_no_timer_no_wake_then_a_user_request_summarizes(
    plane: ControlPlane,
) -> None:
    """N8, N9, N11: archiving cancels pending timers; work that finishes meanwhile wakes nobody;
    restoring resumes nothing and the cancelled timer never fires; a user request to the
    restored (stopped) session resumes it and returns the summary, replaying nothing."""
    host = await Host.open(plane)
    sid = host.session.session_id
    # due well after the archive below (300 ms fired first under CI's load); the test waits
    # for its time to pass later, so it costs these seconds once
    timer = await plane.timers.create(host.main, TimerCreateRequest(text="t", after_ms=5_000))
    work = await host.run("sleep 0.3; echo once >> runs", background=True)
    archived = await plane.sessions.archive(sid)
    assert archived.state == "archived"
    cancelled = await plane.timers.get(host.main, timer.timer_id)
    assert cancelled.state == TimerState.cancelled
    assert cancelled.cancel_reason == "the session was archived"
    await host.wait_notice(work.execution_id)
    with pytest.raises(Conflict, match="restore it first"):
        await plane.sessions.user_request(sid)
    with pytest.raises(Conflict, match="archived"):
        await plane.timers.create(host.main, TimerCreateRequest(text="t", after_ms=10))
    restored = await plane.sessions.restore(sid)
    assert restored.state == "stopped"
    await until(lambda: _past(cancelled.fire_at + 0.3), what="the timer's time to pass")
    await settle()
    assert host.wakes == []
    after = await plane.timers.get(host.main, timer.timer_id)
    assert after.state == TimerState.cancelled and after.fired_at is None
    assert [n.kind for n in await plane.inbox.notices(host.main)] == ["execution"]

    result = await plane.sessions.user_request(sid)
    assert result.resumed and result.session.state == "active"
    assert [n.subject_id for n in result.summary.notices] == [work.execution_id]
    assert result.summary.by_kind == {"execution": 1}
    assert work.execution_id in result.summary.text
    await plane.sessions.turn_end(host.main)
    await settle()
    assert host.wakes == []  # the summary delivered it
    check = await host.run("cat runs", wait_ms=20_000)
    assert check.stdout == "once\n"  # nothing replayed
    assert (await plane.timers.get(host.main, timer.timer_id)).state == TimerState.cancelled
    kinds = [e.kind for e in await plane.sessions.events(sid)]
    assert kinds == [
        "session_created",
        "session_archived",
        "session_restored",
        "session_resumed",
        "user_request",
    ]


async def _past(moment: float) -> bool:
    return time.time() > moment


async def test_a_turn_that_ends_with_unread_notices_wakes_again_once(plane: ControlPlane) -> None:
    """N2: a wake starts a turn (the agent is busy); what arrives meanwhile waits; the turn's
    end wakes it with the new notices only; a notice left unread is not woken twice."""
    host = await Host.open(plane)
    first = await host.run("true", background=True)
    await host.wait_notice(first.execution_id)
    await settle()
    assert len(host.wakes) == 1 and (await plane.sessions.get_agent(host.main)).state == "busy"
    second = await host.run("true", background=True)
    await host.wait_notice(second.execution_id)
    await settle()
    assert len(host.wakes) == 1
    await plane.sessions.turn_end(host.main)
    await settle()
    assert [[n.subject_id for n in w.notices] for w in host.wakes] == [
        [first.execution_id],
        [second.execution_id],
    ]
    assert host.wakes[1].reason == "turn_end"
    await plane.sessions.turn_end(host.main)  # both notices still unread: no third wake
    await settle()
    assert len(host.wakes) == 2
    assert (await plane.inbox.summary(host.main)).unread == 2
    assert await plane.inbox.mark_read(host.main, None) == 2
    assert (await plane.inbox.summary(host.main)).text == "No unread notices."


async def test_notices_wait_for_a_channel_and_other_kinds_wake_too(plane: ControlPlane) -> None:
    """N1, N2: with no channel registered nothing is emitted (the notice waits, unwoken); a
    callback registered later gets it. A notice of another kind (a transfer, posted through
    Store.add_notice) wakes like any other."""
    session = await plane.sessions.create()
    main = session.main_agent_id
    done = await plane.executions.run_shell(RunShellRequest(command="true", background=True), main)
    notice = await until(
        lambda: _notice_of(plane, main, done.execution_id), what="the execution's notice"
    )
    assert notice.woke_at is None
    got: list[WakeView] = []

    async def callback(wake: WakeView) -> None:
        got.append(wake)

    remove = await plane.wakes.add_callback(callback, session.session_id)
    await settle()
    assert len(got) == 1 and got[0].reason == "channel"
    await plane.sessions.turn_end(main)
    await plane.store.add_notice(main, "transfer", "tr_1", "transfer tr_1 completed")
    await settle()
    assert len(got) == 2
    assert [n.kind for n in got[1].notices] == ["transfer"]
    remove()


async def _notice_of(plane: ControlPlane, agent: str, subject: str) -> NoticeView | None:
    found = [n for n in await plane.inbox.notices(agent) if n.subject_id == subject]
    return found[0] if found else None


# ---------------------------------------------------------------------- webhooks


async def test_webhook_that_fails_twice_then_succeeds_is_delivered_once(home: Path) -> None:
    """N2: a webhook answering 500, 500, 200 gets the same signed wake three times and it is
    delivered once; every attempt is recorded with its status. The receiver is on loopback,
    which webhooks reach only through the operator's exact host:port exception."""
    receiver = WebhookReceiver(statuses=[500, 500]).start()
    notifications = dataclasses.replace(FAST, webhook_exceptions=[receiver.exception])
    try:
        async with running_plane(home / "home", notifications) as plane:
            session = await plane.sessions.create()
            hook = await plane.wakes.add_webhook(
                WebhookRequest(url=receiver.url, secret="s" * 32, session_id=session.session_id)
            )
            assert hook.secret == "s" * 32
            done = await plane.executions.run_shell(
                RunShellRequest(command="echo hi", background=True), session.main_agent_id
            )
            wakes = await until(
                lambda: plane.wakes.list_wakes(session.session_id, 0), what="the wake"
            )
            (wake,) = wakes
            deliveries = await until(
                lambda: _delivered(plane, wake.wake_id), what="the delivery to succeed"
            )
            requests = await asyncio.to_thread(receiver.wait_for, 3)
            assert [r.status for r in requests] == [500, 500, 200]
            assert len({r.body for r in requests}) == 1  # the same body every time
            for r in requests:
                assert r.headers["X-Shellyard-Wake-Id"] == wake.wake_id
                assert verify_signature(
                    "s" * 32,
                    r.headers["X-Shellyard-Timestamp"],
                    r.body,
                    r.headers["X-Shellyard-Signature"],
                )
                assert not verify_signature(
                    "t" * 32,
                    r.headers["X-Shellyard-Timestamp"],
                    r.body,
                    r.headers["X-Shellyard-Signature"],
                )
            body = json.loads(requests[0].body)
            assert body["wake_id"] == wake.wake_id and body["agent_id"] == session.main_agent_id
            assert [n["subject_id"] for n in body["notices"]] == [done.execution_id]
            (delivery,) = deliveries
            assert delivery.state == "delivered" and delivery.attempts == 3
            assert [a.status_code for a in delivery.attempt_log] == [500, 500, 200]
            assert [a.error for a in delivery.attempt_log] == ["HTTP 500", "HTTP 500", None]
            await asyncio.sleep(0.3)  # well past the retry delays: nothing more is sent
            assert len(receiver.received) == 3
    finally:
        receiver.stop()


async def _delivered(plane: ControlPlane, wake_id: str) -> list[DeliveryView]:
    found = await plane.wakes.deliveries(wake_id)
    return found if found and all(d.state != "pending" for d in found) else []


async def test_webhook_gives_up_after_its_attempts(home: Path) -> None:
    """A webhook that never answers 2xx (here: nothing listens) is marked failed after the
    configured attempts, each recorded with its error."""
    settings = NotificationSettings(
        webhook_max_attempts=3,
        webhook_retry_base_s=0.02,
        webhook_timeout_s=2,
        webhook_exceptions=["127.0.0.1:9"],  # loopback: only by the operator's exception
    )
    async with running_plane(home / "home", settings) as plane:
        session = await plane.sessions.create()
        await plane.wakes.add_webhook(
            WebhookRequest(url="http://127.0.0.1:9/nobody", session_id=session.session_id)
        )
        await plane.store.add_notice(
            session.main_agent_id, "transfer", "tr_x", "transfer tr_x completed"
        )
        (wake,) = await until(lambda: plane.wakes.list_wakes(session.session_id, 0))
        (delivery,) = await until(lambda: _delivered(plane, wake.wake_id))
        assert delivery.state == "failed" and delivery.attempts == 3
        assert all(a.error and a.status_code is None for a in delivery.attempt_log)


async def test_bad_webhook_and_unknown_ids_are_refused_clearly(plane: ControlPlane) -> None:
    from pydantic import ValidationError

    from shellyard.errors import NotFound

    with pytest.raises(ValidationError, match="http:// or https://"):
        WebhookRequest(url="ftp://x")
    with pytest.raises(NotFound, match="no session 'ses_nope'"):
        await plane.wakes.add_webhook(WebhookRequest(url="http://x", session_id="ses_nope"))
    with pytest.raises(NotFound, match="no agent 'agt_nope'"):
        await plane.sessions.turn_begin("agt_nope")
