"""Attack pass of session 44 on the web login (R5; docs/web.md "Login", docs/security.md
"Attack pass (session 44)"). Real processes: ``shellyard serve``, a page served from the
workspace of a second session's agent (made and forwarded with that agent's token over REST),
Debian's Chromium logged in as the operator (admin) opening the agent's preview.

The agent may make login codes of its own reach (``POST /v1/auth/codes``), and the page
trades a code found in its URL's fragment for the login cookie. So the agent's preview can
send the operator's browser to ``/ui/#login=<the agent's code>``: a login chosen by another
site (login CSRF)."""

from __future__ import annotations

import base64
import time

import httpx
from playwright.async_api import BrowserContext, Page, expect
from test_web_forwards import _agent_of_second_session
from web_helpers import Served

pytest_plugins = ["web_fixtures"]

PORT = 8000


def _serve_page(agent: httpx.Client, html: str) -> tuple[str, str]:
    """Serve ``html`` as index.html from the agent's workspace, forwarded; (execution, url)."""
    page = base64.b64encode(html.encode()).decode()
    ran = agent.post(
        "/v1/executions",
        json={
            "command": f"mkdir -p site && cd site && echo {page} | base64 -d > index.html && "
            f"exec python3 -m http.server {PORT} --bind 127.0.0.1",
            "background": True,
        },
    )
    assert ran.status_code == 200, ran.text
    deadline = time.monotonic() + 60
    while True:
        opened = agent.post("/v1/ports", json={"port": PORT})
        if opened.status_code == 200:
            url = str(opened.json()["url"])
            try:
                if httpx.get(url, timeout=5).status_code == 200:
                    return str(ran.json()["execution_id"]), url
            except httpx.HTTPError:
                pass
        assert time.monotonic() < deadline, opened.text
        time.sleep(0.2)


async def _login_kind(served: Served, context: BrowserContext) -> str:
    """What the browser's login cookie acts as, asked over REST with that cookie."""
    name = f"shellyard_login_{served.port}"
    [cookie] = [c for c in await context.cookies() if c["name"] == name]
    me = httpx.get(f"{served.url}/v1/auth/me", cookies={name: cookie["value"]})
    assert me.status_code == 200, me.text
    return str(me.json()["kind"])


async def test_an_agents_preview_cannot_swap_the_operators_login_for_its_own(
    served: Served, context: BrowserContext, page: Page
) -> None:
    """R5: the operator is logged in as admin and opens a second session's agent's preview,
    whose page sends the browser to the web page with a login code the agent made with its
    own token. The operator's login stays admin (the cookie still answers ``kind: admin``);
    the page asks before using a login link while someone is logged in."""
    _session, token = _agent_of_second_session(served)
    bearer = {"Authorization": f"Bearer {token}"}
    with httpx.Client(base_url=served.url, headers=bearer, timeout=60) as agent:
        made = agent.post("/v1/auth/codes", json={})
        assert made.status_code == 200, made.text
        lure = f"{served.url}{made.json()['path']}"
        html = f"<html><body><script>location.href = {lure!r};</script></body></html>"
        execution_id, url = _serve_page(agent, html)
        try:
            await page.goto(served.login_url())
            await expect(page.locator("#who")).to_contain_text("admin")

            preview = await context.new_page()
            await preview.goto(url)
            await preview.wait_for_url(f"{served.url}/ui/**")
            # The page asks; until it is answered, and after "keep", the login is admin's.
            await expect(preview.locator("#switch")).to_be_visible()
            await expect(preview.locator("#switch-text")).to_contain_text("admin")
            assert await _login_kind(served, context) == "admin"
            await preview.locator("#switch-keep").click()
            await expect(preview.locator("#who")).to_contain_text("admin")
            assert await _login_kind(served, context) == "admin"
            # The operator's own link (``shellyard ui`` while logged in) still works, by a click.
            await page.goto(served.login_url())
            await page.locator("#switch-use").click()
            await expect(page.locator("#who")).to_contain_text("admin")
        finally:
            agent.post(f"/v1/executions/{execution_id}/cancel")


def test_an_agent_token_logging_in_many_times_never_drops_the_operators_code(
    served: Served,
) -> None:
    """The web login's code table: each token keeps 10 pending codes, the table 1000. An
    agent token trades itself for web sessions (``POST /v1/auth/login`` with the token), each
    a token of its own, and fills the table with 10 codes a web session: the operator's code
    from ``shellyard ui`` must still log in (pass 36 bounded one token, not its web sessions)."""
    operator_code = served.login_url().split("#login=")[1]
    _session, token = _agent_of_second_session(served)
    name = f"shellyard_login_{served.port}"
    made = 0
    with httpx.Client(base_url=served.url, timeout=60) as client:
        for _ in range(110):
            login = client.post(
                "/v1/auth/login", json={"token": token}, headers={"X-Shellyard-CSRF": "1"}
            )
            assert login.status_code == 200, login.text
            cookie = {name: login.cookies[name]}
            csrf = {"X-Shellyard-CSRF": login.json()["csrf"]}
            for _ in range(10):
                code = client.post("/v1/auth/codes", json={}, cookies=cookie, headers=csrf)
                if code.status_code == 200:
                    made += 1
                else:  # refused is fine (the table is full of the agent's): never evicting
                    assert code.status_code == 429, code.text
            client.cookies.clear()
    assert made >= 10  # the flood did run
    with httpx.Client(base_url=served.url, headers={"X-Shellyard-CSRF": "1"}) as browser:
        login = browser.post("/v1/auth/login", json={"code": operator_code})
        assert login.status_code == 200, login.text
        assert login.json()["kind"] == "admin", login.json()
