"""R5: a forwarded port never receives a credential of the control plane or its web page
(docs/web.md "The login cookie and forwarded ports"). Real processes: ``shellyard serve``, a
server in the workspace of a second session's agent (started and forwarded with that agent's
token over REST), Debian's Chromium logged in as the operator (admin) opening the agent's
preview.

Browsers send a host's cookies to every port of it, so a forward on the page's own host
(127.0.0.1) received the login cookie, and the cookie, then a token secret, answered as a
bearer token with the operator's reach. Now a forward listens on the workspace's own loopback
address, another host to the browser, and the cookie is a web session id that is no bearer
token and names nothing at another origin."""

from __future__ import annotations

import json
import time
from typing import Any

import httpx
from playwright.async_api import BrowserContext, Page, expect
from web_helpers import Served, new_session

pytest_plugins = ["web_fixtures"]

PORT = 8000
#: A server in the workspace that answers every request with the headers it received.
ECHO = f"""python3 - <<'PY'
import http.server, json
class Echo(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = json.dumps(dict(self.headers.items())).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *args):
        pass
http.server.ThreadingHTTPServer(("127.0.0.1", {PORT}), Echo).serve_forever()
PY"""


def _agent_of_second_session(served: Served) -> tuple[dict[str, Any], str]:
    new_session(served)  # the operator's own session
    session = new_session(served)
    made = served.call(
        "POST", "/v1/tokens", json={"kind": "agent", "agent_id": session["main_agent_id"]}
    )
    return session, str(made["token"])


def _forward(agent: httpx.Client) -> tuple[str, dict[str, Any]]:
    """Start the echo server in the agent's workspace, forward its port; (execution, view)."""
    ran = agent.post("/v1/executions", json={"command": ECHO, "background": True})
    assert ran.status_code == 200, ran.text
    deadline = time.monotonic() + 60
    while True:
        opened = agent.post("/v1/ports", json={"port": PORT})
        if opened.status_code == 200:
            view: dict[str, Any] = opened.json()
            try:
                if httpx.get(view["url"], timeout=5).status_code == 200:
                    return str(ran.json()["execution_id"]), view
            except httpx.HTTPError:
                pass
        assert time.monotonic() < deadline, opened.text
        time.sleep(0.2)


async def test_a_forwarded_port_never_receives_a_credential_that_authenticates(
    served: Served, context: BrowserContext, page: Page
) -> None:
    """R5: the operator, logged in as admin, opens the preview of a second session's agent:
    the agent's server gets no cookie and no Authorization, and nothing it received
    authenticates on the API. The login cookie itself is no bearer token, and at another
    origin of the same server it names nothing."""
    session, token = _agent_of_second_session(served)
    with httpx.Client(
        base_url=served.url, headers={"Authorization": f"Bearer {token}"}, timeout=60
    ) as agent:
        execution_id, view = _forward(agent)
        try:
            assert view["host"] != "127.0.0.1" and view["host"].startswith("127.")
            await page.goto(served.login_url())
            await expect(page.locator("#who")).to_contain_text("admin")
            [cookie] = [
                c for c in await context.cookies() if c["name"] == f"shellyard_login_{served.port}"
            ]
            assert cookie["domain"] == "127.0.0.1"

            preview = await context.new_page()
            answer = await preview.goto(view["url"])
            assert answer is not None and answer.status == 200
            received = {k.lower(): v for k, v in json.loads(await answer.text()).items()}
            assert received["host"] == f"{view['host']}:{view['host_port']}"
            assert "cookie" not in received, received
            assert "authorization" not in received, received
            assert cookie["value"] not in json.dumps(received)
            # Whatever it did receive, nothing of it authenticates (as a bearer or a cookie).
            for value in received.values():
                for word in {value, *value.replace(";", " ").replace("=", " ").split()}:
                    tried = httpx.get(
                        f"{served.url}/v1/auth/me",
                        headers={"Authorization": f"Bearer {word}"},
                    )
                    assert tried.status_code == 401, (word, tried.text)
        finally:
            agent.post(f"/v1/executions/{execution_id}/cancel")

    # The login cookie's value is a web session id, not a token: as a bearer it is refused,
    # on REST and on /mcp; as the cookie, at the origin that set it, it works (so the
    # refusals are not for a dead login); at another origin of the same server, nothing.
    value = cookie["value"]
    assert value.startswith("syw_")
    name = f"shellyard_login_{served.port}"
    bearer = httpx.get(f"{served.url}/v1/auth/me", headers={"Authorization": f"Bearer {value}"})
    assert bearer.status_code == 401, bearer.text
    mcp = httpx.post(
        f"{served.url}/mcp",
        headers={
            "Authorization": f"Bearer {value}",
            "Accept": "application/json, text/event-stream",
        },
        json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"},
        timeout=60,
    )
    assert mcp.status_code == 401, mcp.text
    same = httpx.get(f"{served.url}/v1/auth/me", cookies={name: value})
    assert same.status_code == 200 and same.json()["kind"] == "admin", same.text
    elsewhere = httpx.get(  # the same server addressed as localhost: another origin
        f"{served.url}/v1/auth/me",
        cookies={name: value},
        headers={"Host": f"localhost:{served.port}"},
    )
    assert elsewhere.status_code == 401, elsewhere.text
    assert session["session_id"] not in elsewhere.text
