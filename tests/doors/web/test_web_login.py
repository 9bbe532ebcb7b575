"""Issue 14 (the web page's login), docs/contract.md: ``shellyard ui`` logs a browser in
with a one-time code; the cookie has the reach of the token it came from; without a login the
page shows nothing of any session; actions with the cookie are CSRF-safe. Real Chromium."""

from __future__ import annotations

import os
import subprocess
import sys

import httpx
from playwright.async_api import BrowserContext, Page, expect
from web_helpers import Served, new_session

pytest_plugins = ["web_fixtures"]


def ui_url(served: Served, *args: str) -> str:
    """The URL ``shellyard ui --print-url`` prints, run as a user would."""
    done = subprocess.run(
        [sys.executable, "-m", "shellyard", "ui", "--print-url", *args],
        env={**os.environ, "SHELLYARD_HOME": str(served.home), "COLUMNS": "500"},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    url = done.stdout.strip()
    assert url.startswith(f"{served.url}/ui/#login="), url
    return url


async def test_without_login_the_page_shows_no_session(served: Served, page: Page) -> None:
    """No cookie, no token: the login form, and no session id anywhere on the page; the
    page's API calls answer 401."""
    session = new_session(served)
    await page.goto(f"{served.url}/ui/")
    await expect(page.get_by_role("heading", name="Log in")).to_be_visible()
    await expect(page.get_by_label("Token")).to_be_visible()
    await expect(page.locator("#who")).to_contain_text("Not logged in")
    assert session["session_id"] not in await page.content()
    assert await page.locator("#app").is_hidden()
    status = await page.evaluate("fetch('/v1/panel/sessions').then(r => r.status)")
    assert status == 401
    # A wrong token typed into the form is refused with the server's message.
    await page.get_by_label("Token").fill("sy_not-a-token")
    await page.get_by_role("button", name="Log in").click()
    await expect(page.locator("#login-error")).to_contain_text("unknown or revoked")
    assert session["session_id"] not in await page.content()


async def test_shellyard_ui_logs_in_once_with_the_tokens_reach(
    served: Served, context: BrowserContext, page: Page
) -> None:
    """``shellyard ui --session ID --print-url`` → the page opens that session logged in; the
    code leaves the address bar and works only once; the cookie is HttpOnly and
    SameSite=Strict; a session token's login sees its own session only."""
    mine = new_session(served)
    other = new_session(served)
    url = ui_url(served, "--session", mine["session_id"])
    await page.goto(url)
    await expect(page.locator("#session-title")).to_contain_text(mine["session_id"])
    await expect(page.locator("#who")).to_contain_text("admin")
    assert "login=" not in page.url
    cookies = await context.cookies()
    [cookie] = [c for c in cookies if c["name"] == f"shellyard_login_{served.port}"]
    assert cookie["httpOnly"] and cookie["sameSite"] == "Strict"
    assert await page.evaluate("document.cookie") == ""  # no script can read it
    # The admin login lists every session, newest first.
    names = await page.locator("#session-list code").all_inner_texts()
    assert names.index(other["session_id"]) < names.index(mine["session_id"])

    # The same link again, in a fresh browser context: refused, nothing shown.
    fresh = await context.browser.new_context()  # type: ignore[union-attr]
    again = await fresh.new_page()
    await again.goto(url)
    await expect(again.locator("#login-error")).to_contain_text("unknown, used or expired")
    assert mine["session_id"] not in await again.locator("#app").inner_text()
    await fresh.close()

    # A session token's login: that session only, and another session's data is 404.
    body = {"kind": "session", "session_id": mine["session_id"]}
    token = served.call("POST", "/v1/tokens", json=body)
    scoped = await context.browser.new_context()  # type: ignore[union-attr]
    tab = await scoped.new_page()
    await tab.goto(served.login_url(token=token["token"]))
    await expect(tab.locator("#session-title")).to_contain_text(mine["session_id"])
    assert await tab.locator("#session-list code").all_inner_texts() == [mine["session_id"]]
    assert other["session_id"] not in await tab.content()
    status = await tab.evaluate(
        f"fetch('/v1/sessions/{other['session_id']}/executions').then(r => r.status)"
    )
    assert status == 404
    # Revoking the token the login came from ends the login on the next request.
    served.call("DELETE", f"/v1/tokens/{token['token_id']}")
    status = await tab.evaluate("fetch('/v1/panel/sessions').then(r => r.status)")
    assert status == 401
    await scoped.close()


async def test_cookie_actions_need_the_csrf_value_and_logout_ends_it(
    served: Served, page: Page
) -> None:
    """A POST with the cookie but without the page's X-Shellyard-CSRF value is refused (so a
    form of another site cannot cancel anything); with it, it acts; logging out revokes."""
    session = new_session(served)
    agent = session["main_agent_id"]
    timer = served.call("POST", "/v1/timers", agent, json={"text": "t", "after_ms": 3_600_000})
    await page.goto(served.login_url(session["session_id"]))
    await expect(page.locator("#timer-list")).to_contain_text("pending")
    refused = await page.evaluate(
        """async ([id, agent]) => {
            const r = await fetch(`/v1/timers/${id}/cancel`, {method: 'POST',
                headers: {'X-Shellyard-Agent': agent}});
            return [r.status, (await r.json()).error.code];
        }""",
        [timer["timer_id"], agent],
    )
    assert refused == [403, "forbidden"]
    assert served.call("GET", f"/v1/timers/{timer['timer_id']}", agent)["state"] == "pending"
    # The login endpoint itself needs the header, so no other site can log a browser in.
    bare = httpx.post(f"{served.url}/v1/auth/login", json={"token": served.token})
    assert bare.status_code == 403

    await page.get_by_role("button", name="Log out").click()
    await expect(page.get_by_role("heading", name="Log in")).to_be_visible()
    status = await page.evaluate("fetch('/v1/panel/sessions').then(r => r.status)")
    assert status == 401
    await page.reload()
    await expect(page.get_by_role("heading", name="Log in")).to_be_visible()
    assert session["session_id"] not in await page.content()
