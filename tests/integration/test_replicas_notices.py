"""Timers and read notices across control-plane replicas on one PostgreSQL (issue 16; N3,
N5–N7).

Real ``shellyard serve`` processes (tests/support/replicas_fixture.py) on a database created
for each test, a real runner daemon every replica reaches, a real webhook receiver. The
schedulers' poll is set to a minute, so a timer another replica did not hear of would fire a
minute late: what these tests see on time, the fan-out did."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from replicas_fixture import (
    Replica,
    fresh_database,
    query,
    register,
    replica_env,
    start_replicas,
    stop_all,
)
from runner_daemon_fixture import RunnerDaemon, start_daemon
from webhook_receiver import WebhookReceiver

from shellyard.runner.protocol import SandboxPolicy

pytestmark = [pytest.mark.timeout(600), pytest.mark.usefixtures("postgres")]

#: Short leases (a killed replica's work and rows stop counting within seconds) and a poll long
#: enough that it cannot be what schedules a timer on time.
ENV = {"SHELLYARD_LEASE_TTL_S": "2", "SHELLYARD_TIMER_POLL_S": "60"}
POLL_S = 60.0


@contextlib.asynccontextmanager
async def cluster(home: Path, count: int) -> AsyncIterator[tuple[str, list[Replica], Any]]:
    """``count`` replicas on a fresh database with one runner daemon registered as ``r0``."""
    async with fresh_database() as url:
        daemon: RunnerDaemon = await start_daemon(home / "daemon", SandboxPolicy(), subprocess=True)
        replicas = await start_replicas(url, count, replica_env(**ENV))
        try:
            await register(replicas[0], [daemon])
            yield url, replicas, daemon
        finally:
            stop_all(replicas)
            await daemon.stop()


def agent_header(agent: str) -> dict[str, str]:
    return {"X-Shellyard-Agent": agent}


async def new_agent(replica: Replica) -> str:
    async with replica.client() as client:
        session = await client.post("/v1/sessions")
        assert session.status_code == 200, session.text
        return str(session.json()["main_agent_id"])


async def start_background(replica: Replica, agent: str, command: str) -> str:
    async with replica.client() as client:
        body = {"command": command, "runner_id": "r0", "background": True}
        answer = await client.post("/v1/executions", json=body, headers=agent_header(agent))
        assert answer.status_code == 200, answer.text
        return str(answer.json()["execution_id"])


async def until(check: Any, timeout_s: float, what: str) -> Any:
    """Poll ``check()`` (a database read) until it returns something true."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = check()
        if value:
            return value
        assert time.monotonic() < deadline, f"{what}: not within {timeout_s} s"
        await asyncio.sleep(0.1)


def timer_row(url: str, timer_id: str) -> tuple[Any, ...]:
    rows = query(
        url,
        "SELECT state, fire_at, fired_at, late, cancel_reason FROM timers WHERE id = %s",
        timer_id,
    )
    assert len(rows) == 1, rows
    return rows[0]


async def test_a_timer_fires_on_time_when_the_replica_that_took_it_is_killed(home: Path) -> None:
    """N7 across replicas: a timer created through A, A killed -9 right after; B or C fires it
    once, on time (its creation was announced to their schedulers), not at their next poll."""
    async with cluster(home, 3) as (url, replicas, _daemon):
        a = replicas[0]
        agent = await new_agent(a)
        async with a.client() as client:
            made = await client.post(
                "/v1/timers",
                json={"text": "look again", "after_ms": 3000},
                headers=agent_header(agent),
            )
        assert made.status_code == 200, made.text
        a.kill()
        timer_id = made.json()["timer_id"]
        # Generous: the schedulers' poll alone would have taken up to a minute.
        await until(lambda: timer_row(url, timer_id)[0] != "pending", 30, "the timer fired")
        state, fire_at, fired_at, late, _reason = timer_row(url, timer_id)
        assert state == "fired"
        delay = float(str(fired_at)) - float(str(fire_at))
        print(f"fired {delay:.3f} s after its due time")
        assert delay < POLL_S / 4, delay
        assert not late
        notices = query(url, "SELECT kind FROM notices WHERE subject_id = %s", timer_id)
        assert notices == [("reminder",)]  # fired once, whichever replica won


async def test_a_reminder_is_cancelled_when_another_replica_finalizes_its_execution(
    home: Path,
) -> None:
    """N6 across replicas: the execution runs through B (B watches and finalizes it), the
    reminder naming it is created through A; when B finalizes it first the reminder is
    cancelled at once, long before it would have been due, and never fires."""
    async with cluster(home, 2) as (url, replicas, _daemon):
        a, b = replicas
        agent = await new_agent(a)
        execution_id = await start_background(b, agent, "sleep 2")
        holders = query(url, "SELECT holder FROM leases WHERE subject_id = %s", execution_id)
        assert holders == [(b.replica_id,)], "B started it, so B watches it"
        async with a.client() as client:
            made = await client.post(
                "/v1/timers",
                json={"text": "check it", "after_ms": 120_000, "execution_id": execution_id},
                headers=agent_header(agent),
            )
        assert made.status_code == 200, made.text
        timer_id = made.json()["timer_id"]
        assert made.json()["state"] == "pending"
        async with b.client() as client:
            waited = await client.get(
                f"/v1/executions/{execution_id}/wait",
                params={"timeout_s": 30},
                headers=agent_header(agent),
            )
        assert waited.json()["state"] == "completed", waited.text
        await until(
            lambda: timer_row(url, timer_id)[0] != "pending", 10, "the reminder was cancelled"
        )
        state, fire_at, _fired, _late, reason = timer_row(url, timer_id)
        assert state == "cancelled", (state, reason)
        assert f"execution {execution_id} finished before the reminder was due" in str(reason)
        assert float(str(fire_at)) > time.time() + 60  # well before it came due
        assert query(url, "SELECT count(*) FROM notices WHERE subject_id = %s", timer_id) == [(0,)]
        async with a.client() as client:
            listed = await client.get("/v1/timers", headers=agent_header(agent))
        assert [(t["timer_id"], t["state"]) for t in listed.json()] == [(timer_id, "cancelled")]


class Host:
    """The agent host behind the webhook: records every wake and ends the turn it started."""

    def __init__(self, receiver: WebhookReceiver, replica: Replica) -> None:
        self.receiver = receiver
        self.replica = replica
        self.woken: list[set[str]] = []
        self._task: asyncio.Task[None] | None = None

    def subjects(self) -> set[str]:
        return set().union(*self.woken) if self.woken else set()

    async def _run(self) -> None:
        seen = 0
        async with self.replica.client() as client:
            while True:
                while seen < len(self.receiver.received):
                    wake = self.receiver.received[seen].json
                    seen += 1
                    self.woken.append({n["subject_id"] for n in wake["notices"]})
                    agent = wake["agent_id"]
                    ended = await client.post(
                        f"/v1/agents/{agent}/turn/end", headers=agent_header(agent)
                    )
                    assert ended.status_code == 200, ended.text
                await asyncio.sleep(0.05)

    def __enter__(self) -> Host:
        self._task = asyncio.create_task(self._run())
        return self

    def __exit__(self, *_exc: object) -> None:
        assert self._task is not None
        self._task.cancel()


def notice_row(url: str, execution_id: str) -> tuple[Any, ...]:
    rows = query(
        url,
        "SELECT created_at, read_at, wake_id FROM notices WHERE subject_id = %s",
        execution_id,
    )
    assert len(rows) == 1, rows
    return rows[0]


async def test_a_wait_on_one_replica_reads_the_notice_another_replica_posts(
    home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """N3 across replicas: a background execution started through B (B watches and finalizes
    it); ``execution wait`` through A sees it end, so its notice is posted read and wakes
    nobody. The control: the same execution with nobody waiting wakes its agent."""
    receiver = WebhookReceiver().start()
    # On loopback: webhooks reach it only by the operator's exception (every replica's env).
    monkeypatch.setenv("SHELLYARD_WEBHOOK_EXCEPTIONS", receiver.exception)
    try:
        async with cluster(home, 2) as (url, replicas, _daemon):
            a, b = replicas
            agent = await new_agent(a)
            async with a.client() as client:
                hook = await client.post("/v1/webhooks", json={"url": receiver.url})
                assert hook.status_code == 200, hook.text
            await asyncio.sleep(0.3)  # B heard of the webhook (fan-out)
            with Host(receiver, a) as host:
                seen = await start_background(b, agent, "sleep 2")
                async with a.client() as client:
                    waited = await client.get(
                        f"/v1/executions/{seen}/wait",
                        params={"timeout_s": 30},
                        headers=agent_header(agent),
                    )
                assert waited.json()["state"] == "completed", waited.text
                created_at, read_at, wake_id = notice_row(url, seen)
                # Posted read by B's finishing transaction, not read later by A's answer.
                assert read_at is not None and float(str(read_at)) - float(str(created_at)) < 0.5
                assert wake_id is None
                assert query(url, "SELECT count(*) FROM foreground_waits") == [(0,)]

                # The control: nobody waits, so the end wakes the agent. Wakes go out in
                # order, so once this one arrived, one for ``seen`` would have too.
                unseen = await start_background(b, agent, "sleep 1")
                await until(lambda: unseen in host.subjects(), 30, "the unseen end woke")
                assert seen not in host.subjects(), host.woken
                _created, read_at, wake_id = notice_row(url, unseen)
                assert read_at is None and wake_id is not None
    finally:
        receiver.stop()


async def test_a_killed_waiter_stops_suppressing_the_wake(
    home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """N3 across replicas, the safe side: the replica where a caller waits is killed -9 during
    the wait; its recorded wait expires (it is no longer renewed) within a lease time, so the
    end, later, wakes the agent: nobody saw it."""
    receiver = WebhookReceiver().start()
    # On loopback: webhooks reach it only by the operator's exception (every replica's env).
    monkeypatch.setenv("SHELLYARD_WEBHOOK_EXCEPTIONS", receiver.exception)
    try:
        async with cluster(home, 3) as (url, replicas, _daemon):
            a, b, c = replicas
            agent = await new_agent(c)
            async with c.client() as client:
                hook = await client.post("/v1/webhooks", json={"url": receiver.url})
                assert hook.status_code == 200, hook.text
            await asyncio.sleep(0.3)
            with Host(receiver, c) as host:
                execution_id = await start_background(b, agent, "sleep 6")
                async with a.client() as client:
                    wait = asyncio.create_task(
                        client.get(
                            f"/v1/executions/{execution_id}/wait",
                            params={"timeout_s": 30},
                            headers=agent_header(agent),
                        )
                    )

                    def recorded() -> bool:
                        assert not wait.done(), wait.result().text
                        return query(url, "SELECT count(*) FROM foreground_waits") == [(1,)]

                    await until(recorded, 10, "A recorded the wait")
                    a.kill()
                    with contextlib.suppress(httpx.HTTPError):
                        await wait
                await until(lambda: execution_id in host.subjects(), 30, "the end woke")
                _created, read_at, wake_id = notice_row(url, execution_id)
                assert read_at is None and wake_id is not None
    finally:
        receiver.stop()
