"""``shellyard ui [--session ID] [--print-url]``: log a browser in to the web page (docs/web.md,
docs/web.md). Asks the home's server (started on demand) for a one-time login code with the
reach of the token used (``$SHELLYARD_TOKEN`` or the admin token) and opens the page with the
code in the URL's fragment; the page trades it for its login cookie. ``cli/app.py`` calls
``register``."""

from __future__ import annotations

import json
import os
import webbrowser
from typing import Annotated

import typer

from shellyard.cli.common import HomeOption, JsonOption, err, fail, out
from shellyard.config import default_home
from shellyard.errors import ShellyardError, error_from_dict


def register(app: typer.Typer) -> None:
    app.command(name="ui")(ui)


def ui(
    home: HomeOption = None,
    session: Annotated[
        str | None, typer.Option("--session", help="Open this session's panel first.")
    ] = None,
    print_url: Annotated[
        bool,
        typer.Option("--print-url", help="Print the login URL instead of opening a browser."),
    ] = False,
    as_json: JsonOption = False,
) -> None:
    """Open the web page (the session file panel, live) logged in with a one-time code: the
    link works once, for two minutes, with the reach of your token ($SHELLYARD_TOKEN or the
    home's admin token)."""
    import httpx  # here, not at import: start-up time is every verb's (docs/benchmarks.md)

    from shellyard.home import ensure_server

    try:
        info = ensure_server(home or default_home())
        token = os.environ.get("SHELLYARD_TOKEN") or info.token
        expires_at = None
        if not token:  # a --no-auth server: the page needs no login
            url = f"{info.url}/ui/" + (f"#session={session}" if session else "")
        else:
            response = httpx.post(
                f"{info.url}/v1/auth/codes",
                json={"session_id": session} if session else {},
                headers={"Authorization": f"Bearer {token}"},
                timeout=30,
            )
            data = response.json()
            if response.status_code >= 400:
                raise error_from_dict(data.get("error") or {"message": response.text})
            url = f"{info.url}{data['path']}"
            expires_at = data["expires_at"]
    except ShellyardError as exc:
        fail(exc)
    except (httpx.HTTPError, ValueError) as exc:
        fail(ShellyardError(f"cannot talk to the control plane: {exc}"))
    if as_json:  # like --print-url, for scripts
        out.print_json(json.dumps({"url": url, "expires_at": expires_at}))
        return
    if print_url or not webbrowser.open(url):
        if not print_url:
            err.print("No browser could be opened here: open this URL (it works once):")
        out.print(url, highlight=False, soft_wrap=True)
    else:
        err.print("Opened the web page in your browser (the login link works once).")


__all__ = ["register", "ui"]
