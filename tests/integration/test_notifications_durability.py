"""kill -9 of the control plane (``shellyard serve`` as a subprocess) around timers and wakes
(N7, N2): a timer that comes due while the plane is down fires exactly once when it is back,
marked late, and its wake is delivered once; a webhook delivery interrupted by the crash is
resumed with the same wake and delivered once."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_durability import kill_server
from webhook_receiver import WebhookReceiver

from shellyard.contract.sessions import TimerState
from shellyard.sdk.client import Client


@pytest.fixture
def receiver(monkeypatch: pytest.MonkeyPatch) -> Iterator[WebhookReceiver]:
    started = WebhookReceiver().start()
    # On loopback: the server started on demand reaches it only by the operator's exception.
    monkeypatch.setenv("SHELLYARD_WEBHOOK_EXCEPTIONS", started.exception)
    yield started
    started.stop()


def wait_until(check: object, timeout_s: float = 30.0) -> object:
    deadline = time.monotonic() + timeout_s
    while True:
        value = check()  # type: ignore[operator]
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out waiting for {check}"
        time.sleep(0.05)


def test_kill9_timer_due_while_down_fires_once_late_and_its_wake_is_delivered_once(
    served_home: Path,
    receiver: WebhookReceiver,
) -> None:
    """N7: a timer due in 1 s; the control plane is killed with SIGKILL at once and started
    3 s later: the reminder fires exactly once, marked late, and wakes the agent once (one
    webhook delivery). Killing and restarting again changes nothing."""
    home = served_home
    client = Client.for_home(home)
    session = client.create_session()
    client.add_webhook(receiver.url, "k" * 32, session.session_id)
    agent = client.as_agent(session.main_agent_id)
    timer = agent.timer_create("the build should be done", after_ms=1000)
    kill_server(home)
    time.sleep(3)
    agent = Client.for_home(home).as_agent(session.main_agent_id)  # a new control plane
    fired = wait_until(lambda: _fired(agent, timer.timer_id))
    assert fired.late and fired.fired_at is not None  # type: ignore[attr-defined]
    assert fired.fired_at > fired.fire_at + 1.5  # type: ignore[attr-defined]  # down for 3 s
    requests = receiver.wait_for(1)
    notices = agent.inbox()
    assert [n.summary for n in notices] == ["reminder (late): the build should be done"]
    assert [n["notice_id"] for n in requests[0].json["notices"]] == [notices[0].notice_id]

    kill_server(home)  # again: nothing fires or wakes twice
    agent = Client.for_home(home).as_agent(session.main_agent_id)
    assert len(agent.inbox()) == 1
    (wake,) = agent.wakes(session.session_id)
    (delivery,) = agent.wake_deliveries(wake.wake_id)
    assert delivery.state == "delivered" and delivery.attempts == 1
    time.sleep(0.5)
    assert len(receiver.received) == 1
    assert agent.timer_list()[0].state == TimerState.fired


def _fired(client: Client, timer_id: str) -> object:
    timer = client.timer_get(timer_id)
    return timer if timer.state == TimerState.fired else None


def test_kill9_while_a_wake_is_being_delivered_delivers_it_once(
    served_home: Path,
    receiver: WebhookReceiver,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """N2: the webhook's first attempt fails; the plane is killed with SIGKILL before the retry
    (2 s later). The next plane resumes that delivery: same wake, same body, delivered once,
    every attempt recorded; no second wake is emitted for the notice."""
    monkeypatch.setenv("SHELLYARD_WEBHOOK_RETRY_BASE_S", "2")  # the served plane reads it
    receiver.statuses = [500]
    home = served_home
    client = Client.for_home(home)
    session = client.create_session()
    client.add_webhook(receiver.url, "k" * 32, session.session_id)
    agent = client.as_agent(session.main_agent_id)
    done = agent.run("echo hi", background=True)
    receiver.wait_for(1)
    # Killed once the failed attempt is recorded, before the retry: the receiver's answer
    # reaches the test before the plane has written it down (a kill in between leaves that
    # attempt's status unknown, which is not what this test is about).
    (wake,) = wait_until(lambda: client.wakes(session.session_id) or None)  # type: ignore[misc]
    wait_until(lambda: _first_failed(client, wake.wake_id))
    kill_server(home)
    client = Client.for_home(home)
    requests = receiver.wait_for(2)
    assert [r.status for r in requests] == [500, 200]
    assert requests[0].body == requests[1].body
    assert requests[0].headers["X-Shellyard-Wake-Id"] == requests[1].headers["X-Shellyard-Wake-Id"]
    (wake,) = client.wakes(session.session_id)
    assert [n.subject_id for n in wake.notices] == [done.execution_id]
    (delivery,) = wait_until(lambda: _final(client, wake.wake_id))  # type: ignore[misc]
    assert delivery.state == "delivered"
    assert [a.status_code for a in delivery.attempt_log] == [500, 200]
    time.sleep(0.5)
    assert len(receiver.received) == 2


def _first_failed(client: Client, wake_id: str) -> object:
    found = client.wake_deliveries(wake_id)
    return found if found and [a.status_code for a in found[0].attempt_log] == [500] else None


def _final(client: Client, wake_id: str) -> object:
    found = client.wake_deliveries(wake_id)
    return found if found and all(d.state != "pending" for d in found) else None
