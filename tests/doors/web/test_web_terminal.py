"""E13 on the page (docs/web.md "Terminal"): a tty execution's row says it runs on a terminal
and, while its command reads the terminal, that it waits for input; its Terminal (xterm.js,
shipped in the package) shows the terminal's output, and what is typed into it reaches the
command: ``read -p 'name? '`` answered from the keyboard prints ``hello-yard`` and exits 0.
The terminal is styled under the page's strict Content-Security-Policy, and axe-core finds no
serious or critical violation with it open. Real Chromium, a real sandbox."""

from __future__ import annotations

import subprocess
import sys
import time
import zipfile
from pathlib import Path
from typing import Any

import httpx
from playwright.async_api import Page, expect
from test_web_views import axe_check
from test_web_views import axe_source as axe_source  # the module's axe-core, installed once
from web_helpers import Served, new_session, run

pytest_plugins = ["web_fixtures"]

PROMPT = "read -p 'name? ' n; echo hello-$n"


def until_awaiting(served: Served, agent: str, execution_id: str) -> dict[str, Any]:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        view: dict[str, Any] = served.call("GET", f"/v1/executions/{execution_id}", agent)
        if view["awaiting_input"]:
            return view
        time.sleep(0.1)
    raise AssertionError(f"{execution_id} never waited for input")


async def test_the_terminal_shows_output_and_sends_what_is_typed(
    served: Served, page: Page, axe_source: str
) -> None:
    session = new_session(served)
    agent = session["main_agent_id"]
    started = run(served, agent, PROMPT, tty=True, background=True)
    execution_id = started["execution_id"]
    until_awaiting(served, agent, execution_id)

    await page.goto(served.login_url(session["session_id"]))
    row = page.locator(f'tr[data-execution="{execution_id}"]')
    await expect(row.locator(".badges")).to_contain_text("terminal")
    await expect(row.locator("[data-awaiting-input]")).to_have_text("waits for input")
    await row.get_by_role("button", name=f"Open terminal of {execution_id}").click()
    screen = page.locator("#terminal .xterm-rows")
    await expect(screen).to_contain_text("name?")
    # xterm.js's own cell layout applies (its <style> text, mirrored into an adopted sheet):
    # rows as tall as a line, the screen as wide as its 80 columns.
    layout = await page.evaluate(
        """() => {
            const rows = [...document.querySelectorAll('#terminal .xterm-rows > div')];
            const screen = document.querySelector('#terminal .xterm-screen');
            return {rows: rows.length, height: rows[0].getBoundingClientRect().height,
                    width: screen.getBoundingClientRect().width};
        }"""
    )
    assert layout["rows"] == 24 and 10 < layout["height"] < 40, layout
    assert layout["width"] > 80 * 5, layout
    await axe_check(page, axe_source, "terminal open")

    await page.locator("#terminal").click()
    await page.keyboard.type("yard")
    await page.keyboard.press("Enter")
    await expect(screen).to_contain_text("hello-yard")
    await expect(page.locator("#terminal-status")).to_contain_text("completed")
    await expect(row.locator(".badge")).to_have_text("completed", timeout=20_000)
    await expect(row.locator("[data-awaiting-input]")).to_have_count(0)
    view = served.call("GET", f"/v1/executions/{execution_id}/wait", agent, params={"timeout_s": 5})
    assert view["state"] == "completed" and view["exit_code"] == 0, view
    log = served.call("GET", f"/v1/executions/{execution_id}/logs", agent)
    assert "hello-yard" in log["data"], log


async def test_a_command_without_a_terminal_has_no_terminal_button(
    served: Served, page: Page
) -> None:
    session = new_session(served)
    agent = session["main_agent_id"]
    done = run(served, agent, "echo plain")
    await page.goto(served.login_url(session["session_id"]))
    row = page.locator(f'tr[data-execution="{done["execution_id"]}"]')
    await expect(
        row.get_by_role("button", name=f"View logs of {done['execution_id']}")
    ).to_be_visible()
    await expect(
        row.get_by_role("button", name=f"Open terminal of {done['execution_id']}")
    ).to_have_count(0)


def test_the_terminal_widget_is_served_and_ships_in_the_wheel(
    served: Served, tmp_path: Path
) -> None:
    """xterm.js comes from this server (its own CSP on it) and from the built wheel: nothing is
    fetched from another site at install or run time."""
    for name, kind in (("xterm.mjs", "javascript"), ("xterm.css", "text/css")):
        answer = httpx.get(f"{served.url}/ui/static/vendor/xterm/{name}")
        assert answer.status_code == 200 and kind in answer.headers["content-type"], name
        assert "script-src 'self'" in answer.headers["content-security-policy"]
    assert "export{" in httpx.get(f"{served.url}/ui/static/vendor/xterm/xterm.mjs").text
    root = Path(__file__).resolve().parents[3]
    subprocess.run(
        [sys.executable, "-m", "uv", "build", "--wheel", "-q", "-o", str(tmp_path), str(root)],
        check=True, capture_output=True, timeout=600,
    )  # fmt: skip
    (wheel,) = tmp_path.glob("shellyard-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    vendor = "shellyard/web/static/vendor/xterm/"
    assert {f"{vendor}{n}" for n in ("xterm.mjs", "xterm.css", "LICENSE")} <= names
    assert "shellyard/web/static/terminal.js" in names
