"""``shellyard port``: forward a loopback port of the runner's host into a workspace's
network (R5), list the forwards, close one.

    shellyard port WS PORT [--host-port N]    open (prints the url)
    shellyard port list [WS]                  the open forwards
    shellyard port close WS PORT              stop one
"""

from __future__ import annotations

from typing import Annotated, Any

import typer

from shellyard.cli.common import (
    AgentOption,
    HomeOption,
    JsonOption,
    fail,
    new_table,
    out,
    print_json,
    run_as,
)
from shellyard.errors import InvalidInput

USAGE = "give WS PORT to open, 'list [WS]', or 'close WS PORT'"


def register(app: typer.Typer) -> None:
    app.command("port", no_args_is_help=True)(port)


def _port_number(text: str) -> int:
    if not text.isdigit() or not 1 <= int(text) <= 65535:
        fail(InvalidInput(f"PORT must be a number 1..65535, not {text!r}; {USAGE}"))
    return int(text)


def _where(workspace: str | None, runner: str | None) -> dict[str, Any]:
    return {"workspace_id": workspace or None, "runner_id": runner}


def port(
    words: Annotated[
        list[str],
        typer.Argument(
            help="WS PORT (open), list [WS], or close WS PORT",
            metavar="WS PORT | list [WS] | close WS PORT",
            show_default=False,
        ),
    ],
    host_port: Annotated[
        int, typer.Option(help="open: the loopback port on the runner's host (0: any free one)")
    ] = 0,
    runner: Annotated[str | None, typer.Option(help="the workspace's runner")] = None,
    home: HomeOption = None,
    agent: AgentOption = None,
    as_json: JsonOption = False,
) -> None:
    """Forward HOST_PORT on WS's own loopback address (127.X.Y.Z) of the runner's host to PORT
    inside workspace WS (its server runs as a background execution), for a browser on that
    host. The forward goes when closed or when the workspace's last execution ends."""
    action, rest = (words[0], words[1:]) if words[0] in ("list", "close") else ("open", words)
    if action == "list":
        if len(rest) > 1:
            fail(InvalidInput(f"'port list' takes at most one WS; {USAGE}"))
        where = _where(rest[0] if rest else None, runner)
        views = run_as(home, agent, lambda c: c.ports(**where))
        if as_json:
            print_json(views)
            return
        table = new_table("workspace", "port", "url", "runner")
        for view in views:
            table.add_row(view.workspace_id, str(view.port), view.url, view.runner_id or "")
        out.print(table)
        return
    if len(rest) != 2:
        fail(InvalidInput(f"'port {'' if action == 'open' else 'close '}' needs WS PORT; {USAGE}"))
    where = _where(rest[0], runner)
    number = _port_number(rest[1])
    if action == "close":
        view = run_as(home, agent, lambda c: c.close_port(number, **where))
    else:
        view = run_as(home, agent, lambda c: c.open_port(number, host_port, **where))
    if as_json:
        print_json(view)
    elif action == "close":
        out.print(f"closed {view.url} (port {view.port} of {view.workspace_id})", highlight=False)
    else:
        out.print(view.url, highlight=False)


__all__ = ["register"]
