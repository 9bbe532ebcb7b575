"""``shellyard token create|list|revoke``: bearer tokens scoped to a session or one agent
(docs/security.md). Runs with the home's admin token, or the token in ``$SHELLYARD_TOKEN``
(a session token may make agent tokens for its own agents). ``cli/app.py`` calls ``register``."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Annotated, Any

import typer

from shellyard.cli.common import HomeOption, JsonOption, fail, new_table, out
from shellyard.errors import ShellyardError, error_from_dict
from shellyard.home import default_home

token_app = typer.Typer(
    help="Bearer tokens: the admin token is in <home>/admin.token; make tokens that reach one "
    "session (session) or one agent (agent) for agent hosts and remote clients.",
    no_args_is_help=True,
)
COLUMNS = ("token_id", "kind", "session_id", "agent_id", "created_by", "revoked_at")


def register(app: typer.Typer) -> None:
    app.add_typer(token_app, name="token")


def _request(home: Path | None, method: str, path: str, body: Any = None) -> Any:
    import httpx

    from shellyard.home import ensure_server

    try:
        info = ensure_server(home or default_home())
        secret = os.environ.get("SHELLYARD_TOKEN") or info.token
        response = httpx.request(
            method,
            f"{info.url}{path}",
            json=body,
            headers={"Authorization": f"Bearer {secret}"},
            timeout=30,
        )
        data = response.json()
        if response.status_code >= 400:
            raise error_from_dict(data.get("error") or {"message": response.text})
        return data
    except ShellyardError as exc:
        fail(exc)
    except (httpx.HTTPError, ValueError) as exc:
        fail(ShellyardError(f"cannot talk to the control plane: {exc}"))


def _table(rows: list[dict[str, Any]]) -> None:
    table = new_table(*COLUMNS)
    for row in rows:
        table.add_row(*("" if row.get(k) is None else str(row[k]) for k in COLUMNS))
    out.print(table)


@token_app.command("create")
def create(
    kind: Annotated[str, typer.Argument(help="admin, session or agent.")],
    session: Annotated[
        str | None, typer.Option("--session", help="The session of a session token.")
    ] = None,
    agent: Annotated[
        str | None, typer.Option("--agent", help="The agent of an agent token.")
    ] = None,
    home: HomeOption = None,
    as_json: JsonOption = False,
) -> None:
    """Make a token and print its secret. It is shown only now: only its hash is stored."""
    body: dict[str, Any] = {"kind": kind}
    if session is not None:
        body["session_id"] = session
    if agent is not None:
        body["agent_id"] = agent
    made = _request(home, "POST", "/v1/tokens", body)
    if as_json:
        out.print_json(json.dumps(made))
        return
    out.print(f"{made['token_id']} ({made['kind']}): {made['token']}", highlight=False)
    out.print("Keep this secret now: it cannot be shown again.", style="dim")


@token_app.command("list")
def list_tokens(home: HomeOption = None, as_json: JsonOption = False) -> None:
    """Tokens (never their secrets): every one for the admin, a session's for its token."""
    rows = _request(home, "GET", "/v1/tokens")
    if as_json:
        out.print_json(json.dumps(rows))
    else:
        _table(rows)


@token_app.command("revoke")
def revoke(
    token_id: Annotated[str, typer.Argument(help="The token's id (tok_…), not its secret.")],
    home: HomeOption = None,
    as_json: JsonOption = False,
) -> None:
    """Revoke a token: requests with it are refused from the next one on."""
    row = _request(home, "DELETE", f"/v1/tokens/{token_id}")
    if as_json:
        out.print_json(json.dumps(row))
    else:
        _table([row])
