"""Attack pass of session 36 on the web login (docs/security.md "Attack pass (session 36)",
docs/web.md): one session's agent token against the operator's login. A real ``shellyard
serve`` subprocess; plain HTTP (no browser needed for what is attacked here)."""

from __future__ import annotations

import httpx
from web_helpers import Served, new_session

pytest_plugins = ["web_fixtures"]


def _agent_token(served: Served) -> str:
    """An agent token of a second session, made through the admin API."""
    session = new_session(served)
    made = served.call(
        "POST", "/v1/tokens", json={"kind": "agent", "agent_id": session["main_agent_id"]}
    )
    return str(made["token"])


def test_an_agent_token_flooding_login_codes_never_drops_the_operators_code(
    served: Served,
) -> None:
    """The web login: codes wait in one table of at most 1000, the oldest dropped first, and
    any token may ask for codes (``POST /v1/auth/codes``). Before: an agent token asking
    for 1000 codes dropped the operator's code from ``shellyard ui``, which then answered
    'unknown, used or expired' (a login denied at will). Now a token keeps at most 10
    pending codes, its own oldest dropped first: the operator's code still logs in, and the
    flooder's latest codes still work."""
    operator_code = served.login_url().split("#login=")[1]
    flooder = _agent_token(served)
    headers = {"Authorization": f"Bearer {flooder}"}
    codes = []
    with httpx.Client(base_url=served.url, headers=headers) as client:
        for _ in range(1000):
            answer = client.post("/v1/auth/codes", json={})
            assert answer.status_code == 200, answer.text
            codes.append(answer.json()["code"])
    csrf = {"X-Shellyard-CSRF": "1"}
    with httpx.Client(base_url=served.url, headers=csrf) as browser:
        login = browser.post("/v1/auth/login", json={"code": operator_code})
        assert login.status_code == 200, login.text
        assert login.json()["kind"] == "admin", login.json()
    with httpx.Client(base_url=served.url, headers=csrf) as browser:
        oldest = browser.post("/v1/auth/login", json={"code": codes[0]})
        assert oldest.status_code == 401, oldest.text  # dropped: the flooder's own
        latest = browser.post("/v1/auth/login", json={"code": codes[-1]})
        assert latest.status_code == 200 and latest.json()["kind"] == "agent", latest.text


def test_one_sessions_child_agents_cannot_fill_the_login_code_table(served: Served) -> None:
    """The web login (docs/web.md "Login"; docs/security.md "Attack pass (session 45)"): a
    session token may make child agents and an agent token for each, every one a reach of
    its own (10 codes each), so 100 of them filled the 1,000-code table and every other
    non-admin login got 429 for two minutes. Now one session's reaches share one budget of
    ``MAX_CODES_PER_SESSION``, its own oldest dropped first: another session's agent still
    gets its code, and the flooder's latest code still works."""
    session = new_session(served)
    made = served.call(
        "POST", "/v1/tokens", json={"kind": "session", "session_id": session["session_id"]}
    )
    flooder = {"Authorization": f"Bearer {made['token']}"}
    last = ""
    with httpx.Client(base_url=served.url, headers=flooder) as client:
        for _ in range(100):
            child = client.post(f"/v1/agents/{session['main_agent_id']}/children")
            assert child.status_code == 200, child.text
            token = client.post(
                "/v1/tokens", json={"kind": "agent", "agent_id": child.json()["agent_id"]}
            )
            assert token.status_code == 200, token.text
            agent = {"Authorization": f"Bearer {token.json()['token']}"}
            for _ in range(10):
                answer = client.post("/v1/auth/codes", json={}, headers=agent)
                assert answer.status_code == 200, answer.text
                last = answer.json()["code"]
    other = httpx.post(
        f"{served.url}/v1/auth/codes",
        json={},
        headers={"Authorization": f"Bearer {_agent_token(served)}"},
    )
    assert other.status_code == 200, other.text  # before: 429, the table full
    csrf = {"X-Shellyard-CSRF": "1"}
    with httpx.Client(base_url=served.url, headers=csrf) as browser:
        latest = browser.post("/v1/auth/login", json={"code": last})
        assert latest.status_code == 200 and latest.json()["kind"] == "agent", latest.text
