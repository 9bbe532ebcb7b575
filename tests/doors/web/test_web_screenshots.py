"""Issue 14: screenshots of the main views for docs/web.md — the session file panel at
1280×800 with the "Executions and reminders" region (running and finished executions, a
transfer, reminders, a stopped child, notices), View logs, the diff, the login form, and the
narrow layout. Each view is checked to be laid out within the viewport's width (usable at
1280×800 and narrow). With SHELLYARD_WEB_SCREENSHOTS=DIR the PNGs are written there
(``SHELLYARD_WEB_SCREENSHOTS=docs/web pytest tests/doors/web/test_web_screenshots.py``)."""

from __future__ import annotations

import os
from pathlib import Path

from playwright.async_api import Browser, Page, expect
from web_helpers import Served, new_session, png, run, upload

pytest_plugins = ["web_fixtures"]

WIDE = {"width": 1280, "height": 800}
NARROW = {"width": 390, "height": 844}

# How far the page is wider than the viewport (0: nothing sticks out; wide tables scroll
# inside their own box).
OVERFLOW = """() => document.documentElement.scrollWidth - window.innerWidth"""


def scene(served: Served) -> dict[str, str]:
    session = new_session(served)
    agent = session["main_agent_id"]
    run(
        served,
        agent,
        "mkdir -p src data && printf 'import sys\\nprint(sys.argv)\\n' > src/app.py"
        " && seq 1 200 > data/numbers.txt && printf '# Report\\n\\nAll good.\\n' > REPORT.md",
    )
    upload(served, agent, "plot.png", png(320, 180))
    upload(served, agent, "data/scores.csv", b"name,score,passed\nada,3,yes\nbob,5,no\ncy,4,yes\n")
    run(served, agent, "python3 src/app.py one two; echo 'a warning' >&2")
    run(served, agent, "seq 1 200 | tail -n 100 > data/numbers.txt && echo done > done.txt")
    run(served, agent, "exit 2")
    running = run(
        served,
        agent,
        "for i in $(seq 1 300); do printf '\\033[32mtick %s\\033[0m \\033[1;31mwarn\\033[0m\\n' $i;"
        " sleep 1; done",
        background=True,
    )
    served.call("POST", "/v1/artifacts", agent, json={"path": "REPORT.md", "name": "report"})
    served.call(
        "POST",
        "/v1/timers",
        agent,
        json={
            "text": "check the long job",
            "after_ms": 3_600_000,
            "execution_id": running["execution_id"],
        },
    )
    served.call(
        "POST",
        "/v1/timers",
        agent,
        json={"text": "stand-up", "at": "2030-06-01T09:30:00[Europe/Paris]"},
    )
    child = served.call("POST", f"/v1/agents/{agent}/children")["agent_id"]
    [source] = [w for w in served.call("GET", "/v1/workspaces", agent) if w["relation"] == "own"]
    [target] = [w for w in served.call("GET", "/v1/workspaces", child) if w["relation"] == "own"]
    transfer = served.call(
        "POST",
        "/v1/transfers",
        agent,
        json={
            "source_workspace_id": source["workspace_id"],
            "paths": ["data", "src"],
            "target_workspace_id": target["workspace_id"],
            "target_folder": "inputs",
        },
    )
    served.call("GET", f"/v1/transfers/{transfer['transfer_id']}/wait?timeout_s=20", agent)
    served.call("POST", f"/v1/agents/{child}/stop")
    return {"session": session["session_id"], "agent": agent, "running": running["execution_id"]}


async def shoot(page: Page, name: str, full_page: bool = False) -> None:
    assert await page.evaluate(OVERFLOW) <= 0, f"{name}: the page is wider than the viewport"
    target = os.environ.get("SHELLYARD_WEB_SCREENSHOTS")
    data = await page.screenshot(full_page=full_page)
    assert data.startswith(b"\x89PNG") and len(data) > 10_000
    if target:
        Path(target).mkdir(parents=True, exist_ok=True)
        (Path(target) / f"{name}.png").write_bytes(data)


async def test_screenshots_of_the_main_views(served: Served, browser: Browser) -> None:
    ids = scene(served)
    context = await browser.new_context(viewport=WIDE)
    page = await context.new_page()
    await page.goto(f"{served.url}/ui/")
    await expect(page.get_by_role("heading", name="Log in")).to_be_visible()
    await shoot(page, "login")

    await page.goto(served.login_url(ids["session"]))
    region = page.get_by_role("region", name="Executions and reminders")
    await expect(region.locator("#transfer-list .badge").first).to_have_text("completed")
    await expect(page.locator("#file-table")).to_contain_text("REPORT.md")
    await expect(region.locator("#timer-list")).to_contain_text("stand-up")
    await shoot(page, "panel")
    await page.get_by_role("button", name="Preview REPORT.md").click()
    await expect(page.locator("#preview .markdown")).to_contain_text("All good.")
    await page.get_by_role("heading", name="Files").scroll_into_view_if_needed()
    await page.evaluate("() => document.getElementById('ws-select').scrollIntoView()")
    await shoot(page, "files")
    await shoot(page, "panel-full", full_page=True)

    await page.get_by_role("button", name=f"View logs of {ids['running']}").click()
    await expect(page.get_by_label("stdout", exact=True)).to_contain_text("tick 2")
    await page.locator("#log-view").scroll_into_view_if_needed()
    await shoot(page, "logs")
    await page.get_by_role("button", name="Close logs").click()

    await page.get_by_role("button", name="Preview plot.png").click()
    await page.wait_for_function("() => document.getElementById('preview-image')?.naturalWidth > 0")
    await page.locator("#preview").scroll_into_view_if_needed()
    await shoot(page, "preview")
    await page.get_by_role("button", name="Open folder data").click()
    await page.get_by_role("button", name="Preview scores.csv").click()
    await expect(page.locator("#csv-table th").first).to_have_text("name")
    await page.locator("#preview").scroll_into_view_if_needed()
    await shoot(page, "csv")

    await page.get_by_role("button", name="Show diff").click()
    await expect(page.locator("#diff-result")).to_contain_text("Changes from")
    await expect(page.locator("#diff-result tr.line-added").first).to_be_visible()
    await page.locator("#diff-result").scroll_into_view_if_needed()
    await shoot(page, "diff")
    await context.close()

    dark = await browser.new_context(viewport=WIDE, color_scheme="dark")
    night = await dark.new_page()
    await night.goto(served.login_url(ids["session"]))
    await expect(night.locator("#execution-rows tr[data-execution]").first).to_be_visible()
    await shoot(night, "dark")
    await dark.close()

    narrow = await browser.new_context(viewport=NARROW)
    phone = await narrow.new_page()
    await phone.goto(served.login_url(ids["session"]))
    await expect(phone.locator("#execution-rows tr[data-execution]").first).to_be_visible()
    await shoot(phone, "narrow")
    await narrow.close()
    served.call("POST", f"/v1/executions/{ids['running']}/cancel", ids["agent"])
