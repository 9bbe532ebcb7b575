"""Webhooks go where a sandbox's ``egress`` may go, no further (R6; docs/notifications.md
"Where webhooks may point"): the control plane POSTs on the host's network, outside every
sandbox, so a webhook URL must not make it a port scanner of the host.

With real processes: ``shellyard serve`` as a subprocess, REST over HTTP with the agent token
of a second session (not the admin), listeners on the host's loopback (the webhook receiver,
PostgreSQL's port, a closed port)."""

from __future__ import annotations

import asyncio
import dataclasses
import re
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from notify_helpers import FAST, running_plane, until
from webhook_receiver import WebhookReceiver

from conftest import stop_server
from shellyard.contract.sessions import WebhookRequest
from shellyard.errors import InvalidInput
from shellyard.home import read_info
from shellyard.sdk.client import Client


@pytest.fixture
def receiver() -> Iterator[WebhookReceiver]:
    started = WebhookReceiver().start()
    yield started
    started.stop()


def _closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
    return port  # nothing listens there once the probe is closed


def _second_session_agent(home: Path) -> tuple[str, str, str]:
    """(session id, main agent id, an agent token) of a second session, made by the admin."""
    admin = Client.for_home(home)
    admin.create_session()  # the first session: the token below is of another one
    session = admin.create_session()
    made = admin._http.post("/v1/tokens", json={"kind": "agent", "agent_id": session.main_agent_id})
    assert made.status_code == 200, made.text
    return session.session_id, session.main_agent_id, made.json()["token"]


def test_a_webhook_to_host_loopback_is_refused_and_its_record_tells_no_port_state(
    served_home: Path, receiver: WebhookReceiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    """R6: an agent token of a second session registers webhooks to the host's loopback: an
    open port (a real receiver), PostgreSQL's port and a closed port. Refused at registration,
    each with the same words. Then the operator allows them (exact host:port exceptions) so
    they can be registered, and takes the exceptions back: the deliveries of a real wake are
    "refused by policy" without any connection, the receiver gets nothing, and the records of
    the open and the closed ports are the same but for the port's number."""
    home = served_home
    closed = _closed_port()
    targets = {
        "open": f"http://127.0.0.1:{receiver.exception.split(':')[1]}/hook",
        "postgres": "http://127.0.0.1:5432/hook",
        "closed": f"http://127.0.0.1:{closed}/hook",
        "mapped": f"http://[::ffff:127.0.0.1]:{closed}/",
        "localhost": f"http://localhost:{closed}/",
        "metadata": "http://169.254.169.254/latest/meta-data/",
    }
    session_id, agent_id, token = _second_session_agent(home)
    bearer = {"Authorization": f"Bearer {token}"}
    info = read_info(home)
    assert info is not None
    with httpx.Client(base_url=info.url, headers=bearer, timeout=60) as agent:
        errors = {}
        for name, url in targets.items():
            answer = agent.post("/v1/webhooks", json={"url": url})
            assert answer.status_code == 400, (name, answer.text)
            errors[name] = answer.json()["error"]["message"]
            assert "is refused" in errors[name] and "SHELLYARD_WEBHOOK_EXCEPTIONS" in errors[name]
        assert _without_ports(errors["open"]) == _without_ports(errors["closed"])
        assert agent.get("/v1/webhooks").json() == []

    # The operator allows the three loopback ports (say, receivers of their own), the agent
    # registers them; then the exceptions are taken back (a restart without them).
    exact = [f"127.0.0.1:{p}" for p in (receiver.exception.split(":")[1], 5432, closed)]
    monkeypatch.setenv("SHELLYARD_WEBHOOK_EXCEPTIONS", ",".join(exact))
    stop_server(home)
    Client.for_home(home)  # started again, with the exceptions
    info = read_info(home)
    assert info is not None
    with httpx.Client(base_url=info.url, headers=bearer, timeout=60) as agent:
        for name in ("open", "postgres", "closed"):
            answer = agent.post("/v1/webhooks", json={"url": targets[name]})
            assert answer.status_code == 200, (name, answer.text)
    monkeypatch.delenv("SHELLYARD_WEBHOOK_EXCEPTIONS")
    stop_server(home)
    Client.for_home(home)  # started again, without them
    info = read_info(home)
    assert info is not None
    with httpx.Client(base_url=info.url, headers=bearer, timeout=60) as agent:
        ran = agent.post("/v1/executions", json={"command": "true", "background": True})
        assert ran.status_code == 200, ran.text
        deadline = time.monotonic() + 60
        while True:
            wakes = agent.get(f"/v1/sessions/{session_id}/wakes").json()
            deliveries = (
                agent.get(f"/v1/wakes/{wakes[0]['wake_id']}/deliveries").json() if wakes else []
            )
            if len(deliveries) == 3 and all(d["state"] != "pending" for d in deliveries):
                break
            assert time.monotonic() < deadline, (wakes, deliveries)
            time.sleep(0.1)
        assert wakes[0]["agent_id"] == agent_id
        for delivery in deliveries:
            assert delivery["state"] == "failed" and delivery["attempts"] == 1, delivery
            (attempt,) = delivery["attempt_log"]
            assert attempt["status_code"] is None
            assert attempt["error"].startswith("refused by policy: 127.0.0.1:"), attempt
            assert "127.0.0.0/8 (loopback)" in attempt["error"]
            assert delivery["last_error"] == attempt["error"]
        errors_seen = {_without_ports(d["last_error"]) for d in deliveries}
        assert len(errors_seen) == 1, errors_seen  # open, PostgreSQL and closed: one answer
    time.sleep(0.5)
    assert receiver.received == []


def _without_ports(text: str) -> str:
    return re.sub(r":\d+", ":PORT", text)


async def test_the_operator_exception_is_exact_and_the_host_name_is_kept(
    home: Path, receiver: WebhookReceiver
) -> None:
    """R6: an exception names one host:port; the same host at another port, or the same port
    by another name, stays refused. A delivery connects to the address it checked and sends
    the registered name as the Host header."""
    port = receiver.exception.split(":")[1]
    notifications = dataclasses.replace(FAST, webhook_exceptions=[f"localhost:{port}"])
    async with running_plane(home / "home", notifications) as plane:
        session = await plane.sessions.create()
        for url in (f"http://127.0.0.1:{port}/hook", f"http://localhost:{_closed_port()}/"):
            with pytest.raises(InvalidInput, match="is refused"):
                await plane.wakes.add_webhook(WebhookRequest(url=url))
        await plane.wakes.add_webhook(
            WebhookRequest(url=f"http://localhost:{port}/hook", session_id=session.session_id)
        )
        await plane.store.add_notice(
            session.main_agent_id, "transfer", "tr_x", "transfer tr_x completed"
        )
        (wake,) = await until(lambda: plane.wakes.list_wakes(session.session_id, 0))
        requests = await asyncio.to_thread(receiver.wait_for, 1)
        assert requests[0].headers["Host"] == f"localhost:{port}"
        assert requests[0].json["wake_id"] == wake.wake_id


async def test_registration_refuses_every_special_form(home: Path) -> None:
    """R6: literal addresses of every kind the egress rules refuse are refused when a webhook
    is registered, with the reason and the way out."""
    async with running_plane(home / "home") as plane:
        for url in (
            "http://127.0.0.1/",
            "http://0.0.0.0:5432/",
            "http://[::1]:6379/",
            "http://[::7f00:1]/",
            "http://[64:ff9b::7f00:1]/",
            "http://10.0.0.1/",
            "http://192.0.2.1/",
            "http://198.18.0.1/",
            "https://[fe80::1]/",
            "http://100.64.0.1/",
        ):
            with pytest.raises(InvalidInput, match="Webhooks go only to public addresses"):
                await plane.wakes.add_webhook(WebhookRequest(url=url))
        with pytest.raises(InvalidInput, match="user name or password"):
            await plane.wakes.add_webhook(WebhookRequest(url="http://u:p@example.org/"))
        assert await plane.wakes.list_webhooks() == []
