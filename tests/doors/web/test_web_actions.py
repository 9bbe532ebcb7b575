"""Issue 14 item 3, docs/contract.md "Interfaces": Cancel execution (E7), Cancel transfer (T3),
Cancel reminder (N5) and Resume (N10) each act from the page and the record changes; the
server's refusal of a Resume while the session is stopped is shown. Every control has a name
and the actions are reachable with the keyboard. Real Chromium."""

from __future__ import annotations

import asyncio

from playwright.async_api import Page, expect
from web_helpers import Served, new_session, run

pytest_plugins = ["web_fixtures"]

# Controls without an accessible name: a button/link's text or aria-label, a field's label.
UNLABELLED = """() => [...document.querySelectorAll('button, a[href], select, input, textarea')]
    .filter((el) => el.offsetParent !== null)
    .filter((el) => {
        const labelled = el.id && document.querySelector(`label[for="${el.id}"]`);
        return !(el.getAttribute('aria-label') || el.textContent.trim() || labelled);
    })
    .map((el) => el.outerHTML.slice(0, 120))"""


async def tab_to(page: Page, name: str, presses: int = 400) -> None:
    """Move the focus with the Tab key (as a keyboard user does) to the control named ``name``."""
    for _ in range(presses):
        await page.keyboard.press("Tab")
        focused = await page.evaluate(
            "() => document.activeElement.getAttribute('aria-label') || "
            "document.activeElement.textContent.trim()"
        )
        if focused == name:
            return
    raise AssertionError(f"Tab never reached {name!r}")


async def test_cancel_execution_and_reminder_with_the_keyboard(served: Served, page: Page) -> None:
    session = new_session(served)
    agent = session["main_agent_id"]
    long = run(served, agent, "sleep 600", background=True)
    execution_id = long["execution_id"]
    timer = served.call(
        "POST",
        "/v1/timers",
        agent,
        json={"text": "check the deploy", "at": "2030-01-01T09:00:00+01:00"},
    )
    await page.goto(served.login_url(session["session_id"]))
    row = page.locator(f'tr[data-execution="{execution_id}"]')
    await expect(row.locator(".badge")).to_have_text("running")
    assert await page.evaluate(UNLABELLED) == []

    await tab_to(page, f"Cancel execution {execution_id}")
    await page.keyboard.press("Enter")
    await expect(row.locator(".badge")).to_have_text("cancelled", timeout=20_000)
    status = served.call("GET", f"/v1/executions/{execution_id}", agent)
    assert status["state"] == "cancelled" and status["cancel_requested"]

    item = page.locator(f'li[data-timer="{timer["timer_id"]}"]')
    # The due time is shown in the browser's zone, with the spec it came from.
    await expect(item).to_contain_text("at: 2030-01-01T09:00:00+01:00")
    await expect(item.locator("time")).to_have_attribute("datetime", "2030-01-01T08:00:00.000Z")
    await tab_to(page, f"Cancel reminder {timer['timer_id']}")
    await page.keyboard.press("Enter")
    await expect(item.locator(".badge")).to_have_text("cancelled")
    after = served.call("GET", f"/v1/timers/{timer['timer_id']}", agent)
    assert after["state"] == "cancelled"
    await expect(item.get_by_role("button")).to_have_count(0)


async def test_cancel_transfer_keeps_the_committed_files(served: Served, page: Page) -> None:
    """A slow transfer (rate-limited, one file per batch) from the main agent's workspace to
    its child's: the page shows N/M files committed and per-file outcomes; Cancel transfer
    stops it, and the files already committed stay (T3)."""
    session = new_session(served)
    agent = session["main_agent_id"]
    child = served.call("POST", f"/v1/agents/{agent}/children")["agent_id"]
    run(
        served,
        agent,
        "mkdir out; for i in 1 2 3 4 5 6 7 8; do head -c 40000 /dev/zero > out/f$i; done",
    )
    [source] = [w for w in served.call("GET", "/v1/workspaces", agent) if w["relation"] == "own"]
    [target] = [w for w in served.call("GET", "/v1/workspaces", child) if w["relation"] == "own"]
    transfer = served.call(
        "POST",
        "/v1/transfers",
        agent,
        json={
            "source_workspace_id": source["workspace_id"],
            "paths": ["out"],
            "target_workspace_id": target["workspace_id"],
            "batch_files": 1,
            "max_bytes_per_s": 20_000,
        },
    )
    transfer_id = transfer["transfer_id"]
    await page.goto(served.login_url(session["session_id"]))
    item = page.locator(f'li[data-transfer="{transfer_id}"]')
    await expect(item).to_contain_text(f"{source['workspace_id']}")
    await expect(item).to_contain_text(f"→ {target['workspace_id']}")
    await expect(item.locator(".badge").first).to_have_text("running")
    for _ in range(200):  # until two files are committed, then cancel the rest
        if served.call("GET", f"/v1/transfers/{transfer_id}", agent)["files_copied"] >= 2:
            break
        await asyncio.sleep(0.05)
    await item.get_by_role("button", name=f"Cancel transfer {transfer_id}").click()
    await expect(item.locator(".badge").first).to_have_text("cancelled", timeout=20_000)
    record = served.call("GET", f"/v1/transfers/{transfer_id}", agent)
    assert record["state"] == "cancelled"
    committed = record["files_copied"]
    assert 2 <= committed < record["files_total"]
    await expect(item.locator(".progress-text")).to_contain_text(
        f"{committed}/{record['files_total']} files committed"
    )
    await item.get_by_role("button", name=f"Show files of transfer {transfer_id}").click()
    await expect(item.locator(".files-list li")).to_have_count(record["files_total"])
    await expect(item.locator(".files-list .badge-copied")).to_have_count(committed)
    await expect(item.locator(".files-list")).to_contain_text("39.1 KiB")
    listed = served.call(
        "GET", "/v1/files", child, params={"workspace_id": target["workspace_id"], "path": "out"}
    )
    outcomes = served.call("GET", f"/v1/transfers/{transfer_id}/files", agent)["files"]
    copied = {
        f["target_path"] for f in outcomes if f["outcome"] == "copied" and f["kind"] == "file"
    }
    assert copied and {e["path"] for e in listed["entries"]} == copied


async def test_resume_a_child_shows_the_refusal_then_resumes(served: Served, page: Page) -> None:
    session = new_session(served)
    sid = session["session_id"]
    child = served.call("POST", f"/v1/agents/{session['main_agent_id']}/children")["agent_id"]
    served.call("POST", f"/v1/agents/{child}/stop")
    served.call("POST", f"/v1/sessions/{sid}/stop")
    await page.goto(served.login_url(sid))
    item = page.locator(f'li[data-agent="{child}"]')
    await expect(item).to_contain_text("stopped")
    await item.get_by_role("button", name=f"Resume agent {child}").click()
    await expect(item.get_by_role("alert")).to_contain_text("The server refused")
    await expect(item.get_by_role("alert")).to_contain_text("resume the session first")
    assert served.call("GET", f"/v1/agents/{child}")["gate"] == "closed"

    served.call("POST", f"/v1/sessions/{sid}/resume")
    await expect(page.locator("#session-state")).to_have_text("active", timeout=5000)
    # N10: the child stopped on its own stays stopped until resumed explicitly.
    await asyncio.sleep(0.6)
    assert served.call("GET", f"/v1/agents/{child}")["gate"] == "closed"
    await item.get_by_role("button", name=f"Resume agent {child}").click()
    await expect(item).to_contain_text("gate open")
    await expect(item.get_by_role("button")).to_have_count(0)
    assert served.call("GET", f"/v1/agents/{child}")["gate"] == "open"
