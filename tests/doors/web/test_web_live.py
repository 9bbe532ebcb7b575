"""Issue 14 item 4 and docs/contract.md "Interfaces": the "Executions and reminders" region updates
live over the server's event stream — an execution started through MCP (the official ``mcp``
SDK's client over streamable HTTP), its state change and a fired reminder (N1, N5) show within
2 s without a reload, and the page reconnects after the server restarts (E11: the records are
all still there). View logs follows a running command's output (E6). Real Chromium."""

from __future__ import annotations

import asyncio
import time

from mcp.client.session import ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client
from playwright.async_api import Page, expect
from web_helpers import Served, new_session, run

pytest_plugins = ["web_fixtures"]

LIVE_MS = 2000


def region(page: Page):  # type: ignore[no-untyped-def]
    return page.get_by_role("region", name="Executions and reminders")


async def test_mcp_execution_state_change_and_reminder_show_live(
    served: Served, page: Page
) -> None:
    session = new_session(served)
    agent = session["main_agent_id"]
    token = served.call("POST", "/v1/tokens", json={"kind": "agent", "agent_id": agent})["token"]
    await page.goto(served.login_url(session["session_id"]))
    panel = region(page)
    await expect(panel.locator("#execution-rows")).to_contain_text("No execution yet")
    await expect(page.locator("#live")).to_have_text("Live")

    headers = {"Authorization": f"Bearer {token}"}
    async with (
        create_mcp_http_client(headers=headers) as client,
        streamable_http_client(f"{served.url}/mcp?tools=all", http_client=client) as (read, write),
        ClientSession(read, write) as mcp,
    ):
        await mcp.initialize()
        started = await mcp.call_tool(
            "run_shell", {"command": "sleep 3; echo done", "background": True}
        )
        assert not started.is_error, started.content
        assert isinstance(started.structured_content, dict)
        execution_id = started.structured_content["execution_id"]
        # long enough to be seen pending after the 3 s command and its checks on a loaded machine
        timer = await mcp.call_tool("timer_create", {"text": "look at it", "after_ms": 12000})
        assert isinstance(timer.structured_content, dict)
        timer_id = timer.structured_content["timer_id"]

    row = panel.locator(f'tr[data-execution="{execution_id}"]')
    # The new execution appears, running, without a reload (2 s, issue 14).
    await expect(row).to_be_visible(timeout=LIVE_MS)
    await expect(row.locator(".badge")).to_have_text("running", timeout=LIVE_MS)
    await expect(row).to_contain_text("sleep 3; echo done")
    await expect(row.get_by_role("button", name=f"Cancel execution {execution_id}")).to_be_visible()
    # Its state change: completed, exit code 0, and no more Cancel button.
    assert (
        served.call("GET", f"/v1/executions/{execution_id}/wait?timeout_s=20", agent)["state"]
        == "completed"
    )
    changed = time.monotonic()
    await expect(row.locator(".badge")).to_have_text("completed", timeout=LIVE_MS)
    await expect(row.locator(".exit")).to_have_text("exit 0")
    cancel = row.get_by_role("button", name=f"Cancel execution {execution_id}")
    await expect(cancel).to_have_count(0)
    assert time.monotonic() - changed < LIVE_MS / 1000
    # Its completion notice (N1) shows in the inbox.
    await expect(panel.locator("#notice-list")).to_contain_text(execution_id, timeout=LIVE_MS)

    reminder = panel.locator(f'li[data-timer="{timer_id}"]')
    await expect(reminder.locator(".badge")).to_have_text("pending")
    await expect(reminder).to_contain_text("after_ms: 12000")
    for _ in range(300):  # until the server fired it (12 s after it was made)
        if served.call("GET", f"/v1/timers/{timer_id}", agent)["state"] == "fired":
            break
        await asyncio.sleep(0.1)
    await expect(reminder.locator(".badge")).to_have_text("fired", timeout=LIVE_MS)
    await expect(panel.locator("#notice-list")).to_contain_text("look at it", timeout=LIVE_MS)


async def test_page_reconnects_after_a_server_restart(own_served: Served, page: Page) -> None:
    served = own_served
    session = new_session(served)
    agent = session["main_agent_id"]
    first = run(served, agent, "echo before")
    await page.goto(served.login_url(session["session_id"]))
    await expect(page.locator(f'tr[data-execution="{first["execution_id"]}"]')).to_be_visible()
    await expect(page.locator("#live")).to_have_text("Live")

    served.stop()
    await expect(page.locator("#live")).to_have_text("Reconnecting…", timeout=10_000)
    served.start()  # same home, same port: the page's origin
    await expect(page.locator("#live")).to_have_text("Live", timeout=15_000)
    later = run(served, agent, "echo after", background=True)
    row = page.locator(f'tr[data-execution="{later["execution_id"]}"]')
    await expect(row).to_be_visible(timeout=LIVE_MS)
    await expect(row.locator(".badge")).to_have_text("completed", timeout=5000)
    await expect(page.locator(f'tr[data-execution="{first["execution_id"]}"]')).to_be_visible()


async def test_view_logs_follows_a_running_command(served: Served, page: Page) -> None:
    session = new_session(served)
    agent = session["main_agent_id"]
    command = "for i in 1 2 3 4 5 6; do echo line$i; echo warn$i >&2; sleep 0.5; done"
    started = run(served, agent, command, background=True)
    execution_id = started["execution_id"]
    await page.goto(served.login_url(session["session_id"]))
    row = page.locator(f'tr[data-execution="{execution_id}"]')
    await row.get_by_role("button", name=f"View logs of {execution_id}").click()
    stdout = page.get_by_label("stdout", exact=True)
    await expect(stdout).to_contain_text("line1")
    await expect(page.locator("#log-status")).to_contain_text("following")
    # Lines written after the viewer opened arrive without another click.
    await expect(stdout).to_contain_text("line6", timeout=10_000)
    await expect(page.get_by_label("stderr", exact=True)).to_contain_text("warn6")
    await expect(page.locator("#log-status")).to_contain_text("completed: all output shown")
    text = await stdout.inner_text()
    assert text.split() == [f"line{i}" for i in range(1, 7)]  # each line once, in order
