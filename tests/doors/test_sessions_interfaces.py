"""An agent host drives a session end to end through real interfaces: the official MCP client
over stdio (``shellyard mcp --agent``) for the agent's tools, the Python client over REST for
the host (sessions, turns), and the server-sent events stream for wakes; then the CLI verbs.
The control plane is a real ``shellyard serve`` process started on demand."""

from __future__ import annotations

import json
import os
import queue
import signal
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
from mcp.client.session import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client

from conftest import sy
from shellyard.contract.sessions import WakeView
from shellyard.errors import Conflict, InvalidInput, NotFound
from shellyard.home import is_served, read_info
from shellyard.sdk.client import AsyncClient, Client


async def call(session: ClientSession, tool: str, **arguments: Any) -> dict[str, Any]:
    result = await session.call_tool(tool, arguments)
    assert not result.is_error, result.content
    assert isinstance(result.structured_content, dict)
    return result.structured_content


async def refused(session: ClientSession, tool: str, **arguments: Any) -> str:
    result = await session.call_tool(tool, arguments)
    assert result.is_error
    text: str = result.content[0].text  # type: ignore[union-attr]
    return text


class WakeListener:
    """The host's wake channel: a thread reading the session's SSE stream over real HTTP."""

    def __init__(self, home: Path, session_id: str, after: int | None = None) -> None:
        self.wakes: queue.Queue[WakeView] = queue.Queue()
        self._client = Client.for_home(home)
        self._thread = threading.Thread(target=self._listen, args=(session_id, after), daemon=True)
        self._thread.start()

    def _listen(self, session_id: str, after: int | None) -> None:
        try:
            for wake in self._client.wake_stream(session_id, after):
                self.wakes.put(wake)
        except Exception:  # the server went away at the end of the test
            return

    def next(self, timeout_s: float = 30.0) -> WakeView:
        return self.wakes.get(timeout=timeout_s)

    def nothing_more(self, wait_s: float = 0.5) -> bool:
        try:
            self.wakes.get(timeout=wait_s)
        except queue.Empty:
            return True
        return False


@pytest.fixture
def served(home: Path) -> Any:
    yield home
    info = read_info(home)
    if info is not None and is_served(home):
        os.kill(info.pid, signal.SIGTERM)


async def test_a_host_drives_a_session_through_mcp_rest_and_sse(served: Path) -> None:
    """Done-when of the sessions issue: start background work, be woken when it finishes
    (SSE), read it (marked read: no second wake), set a reminder and be woken by it, cancel
    one, stop the session (pending timers cancelled, no wake), resume it with a user request
    that summarizes, and reconnect to the stream with Last-Event-ID. N1–N9 through MCP."""
    home = served
    host = Client.for_home(home)
    session = host.create_session()
    sid, main = session.session_id, session.main_agent_id
    listener = WakeListener(home, sid)
    params = StdioServerParameters(
        command=sys.executable,
        args=["-m", "shellyard", "mcp", "--tools", "all", "--home", str(home), "--agent", main],
        env={**os.environ, "SHELLYARD_HOME": str(home)},
    )
    async with stdio_client(params) as (read, write), ClientSession(read, write) as tools:
        await tools.initialize()
        names = {tool.name for tool in (await tools.list_tools()).tools}
        assert {"timer_create", "timer_list", "timer_cancel", "inbox_list"} <= names

        # Background work wakes the idle agent once it finishes (N1, N2).
        started = await call(tools, "run_shell", command="sleep 0.3; echo built", background=True)
        wake = listener.next()
        assert wake.agent_id == main and wake.reason == "notice"
        assert [n.subject_id for n in wake.notices] == [started["execution_id"]]
        assert host.agent(main).state == "busy"  # the wake began a turn
        status = await call(tools, "execution_status", execution_id=started["execution_id"])
        assert status["state"] == "completed"  # seen through a tool call: read (N3)
        host.turn_end(main)
        assert listener.nothing_more()

        # A reminder wakes it (N5); another one is cancelled and never fires.
        timer = await call(tools, "timer_create", text="check the build", after_ms=300)
        assert timer["timer_id"].startswith("tmr_") and timer["state"] == "pending"
        wake = listener.next()
        assert [n.kind for n in wake.notices] == ["reminder"]
        assert wake.notices[0].summary == "reminder: check the build"
        host.turn_end(main)
        later = await call(tools, "timer_create", text="later", at="2030-01-15T10:00:00+09:00")
        assert later["fire_at_utc"] == "2030-01-15T01:00:00.000Z"
        cancelled = await call(tools, "timer_cancel", timer_id=later["timer_id"])
        assert cancelled["state"] == "cancelled"
        listed = await call(tools, "timer_list")
        assert {t["timer_id"]: t["state"] for t in listed["timers"]} == {
            timer["timer_id"]: "fired",
            later["timer_id"]: "cancelled",
        }

        # Bad input: clear tool errors (N5).
        naive = await refused(tools, "timer_create", text="x", at="2030-01-15T10:00:00")
        assert "has no offset or zone" in naive
        both = await refused(tools, "timer_create", text="x", after_ms=5, at="2030-01-15T10:00Z")
        assert "exactly one of after_ms" in both
        cron = await refused(tools, "timer_create", text="x", at="*/5 * * * *")
        assert "one-time only" in cron
        missing = await refused(tools, "timer_cancel", timer_id="tmr_nope")
        assert "no timer 'tmr_nope'" in missing

        inbox = await call(tools, "inbox_list")
        assert [n["kind"] for n in inbox["notices"]] == ["reminder"] and inbox["unread"] == 1
        assert (await call(tools, "inbox_mark_read"))["marked"] == 1

        # Stop: pending timers are cancelled, finished work wakes nobody (N8); a user request
        # resumes and summarizes (N9).
        pending = await call(tools, "timer_create", text="after stop", after_ms=60_000)
        late_work = await call(tools, "run_shell", command="sleep 0.3", background=True)
        assert host.stop_session(sid).state == "stopped"
        stopped = await call(tools, "timer_list", state="cancelled")
        assert pending["timer_id"] in {t["timer_id"] for t in stopped["timers"]}
        assert listener.nothing_more(1.0)
        resumed = host.user_request(sid)
        assert resumed.resumed and resumed.session.state == "active"
        assert [n.subject_id for n in resumed.summary.notices] == [late_work["execution_id"]]
        host.turn_end(main)
        assert listener.nothing_more()

    # REST: clear errors, with the status codes of their kind.
    bad = host._http.post("/v1/timers", json={"text": "x", "every": "5m"})
    assert bad.status_code == 400 and "one-time only" in bad.json()["error"]["message"]
    with pytest.raises(InvalidInput, match="at is empty"):
        host.as_agent(main).timer_create("x", at=" ")
    with pytest.raises(NotFound, match="no session 'ses_nope'"):
        host.session("ses_nope")
    with pytest.raises(Conflict, match="not archived"):
        host.restore_session(sid)

    # The stream replays what a reconnecting host missed (Last-Event-ID).
    first, second = host.wakes(sid)
    replay = WakeListener(home, sid, after=first.seq)
    assert replay.next().wake_id == second.wake_id
    assert replay.nothing_more()
    info = read_info(home)
    assert info is not None
    async_host = AsyncClient(info.url, info.token)
    stream = async_host.wake_stream(sid, after=0)
    assert [(await anext(stream)).wake_id, (await anext(stream)).wake_id] == [
        first.wake_id,
        second.wake_id,
    ]
    await stream.aclose()
    await async_host.aclose()


def test_cli_session_agent_timer_webhook_and_inbox_verbs(
    served_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The CLI verbs with --json (and a clear exit 2 for bad input). The webhook points at the
    host's loopback: the server (started on demand) allows it by the operator's exception."""
    monkeypatch.setenv("SHELLYARD_WEBHOOK_EXCEPTIONS", "127.0.0.1:9")

    def js(*args: str) -> Any:
        done = sy(served_home, *args, "--json")
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout)

    session = js("session", "create")
    sid, main = session["session_id"], session["main_agent_id"]
    child = js("agent", "create-child", main)
    assert child["parent_id"] == main and child["is_main"] is False
    assert js("agent", "turn-begin", main)["state"] == "busy"
    assert js("agent", "turn-end", main)["state"] == "idle"
    assert js("agent", "stop", child["agent_id"])["gate"] == "closed"
    assert js("agent", "resume", child["agent_id"])["gate"] == "open"

    timer = js("timer", "create", "hello", "--after-ms", "60000", "--agent", main)
    assert [t["timer_id"] for t in js("timer", "list", "--agent", main)] == [timer["timer_id"]]
    assert js("timer", "cancel", timer["timer_id"], "--agent", main)["state"] == "cancelled"
    naive = sy(served_home, "timer", "create", "x", "--at", "2030-01-01T09:00:00")
    assert naive.returncode == 2 and "has no offset or zone" in naive.stderr

    hook = js("webhook", "add", "http://127.0.0.1:9/hook", "--session", sid)
    assert hook["secret"] and hook["session_id"] == sid
    assert [h["webhook_id"] for h in js("webhook", "list")] == [hook["webhook_id"]]
    assert js("webhook", "remove", hook["webhook_id"])["active"] is False

    done = sy(served_home, "run", "--", "echo hi")  # the default session's main agent
    assert done.returncode == 0
    notices = js("inbox")
    assert len(notices) == 1 and notices[0]["read_at"] is not None  # seen in the foreground
    summary = sy(served_home, "inbox", "--summary")
    assert summary.stdout.strip() == "No unread notices."

    assert js("session", "stop", sid)["state"] == "stopped"
    request = js("session", "request", sid)
    assert request["resumed"] is True and request["summary"]["unread"] == 0
    assert js("session", "archive", sid)["state"] == "archived"
    refused_request = sy(served_home, "session", "request", sid)
    assert refused_request.returncode == 2 and "restore it first" in refused_request.stderr
    assert js("session", "restore", sid)["state"] == "stopped"
    kinds = [e["kind"] for e in js("session", "events", sid)]
    assert kinds[-3:] == ["user_request", "session_archived", "session_restored"]
    shown = js("session", "show", sid)
    assert {a["agent_id"] for a in shown["agents"]} == {main, child["agent_id"]}
