"""``shellyard server status|stop|restart``: the background control plane of a home, which
every client verb starts on demand (docs/cli.md, "The home's server")."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import typer

from shellyard.cli.common import HomeOption, JsonOption, err, fail, out
from shellyard.errors import ShellyardError

server_app = typer.Typer(
    help="The home's control plane: show it, stop it, restart it with this shell's settings.",
    no_args_is_help=True,
)

#: How long ``stop`` waits for a SIGTERM'd server before it kills it (the server itself gives
#: open streams 3 s).
STOP_GRACE_S = 15.0


def register(app: typer.Typer) -> None:
    app.add_typer(server_app, name="server")


def _home(home: Path | None) -> Path:
    from shellyard.home import default_home

    return home or default_home()


@server_app.command("status")
def server_status(home: HomeOption = None, as_json: JsonOption = False) -> None:
    """Whether the home is served: pid, URL, the settings it runs with. Exit 0 served, 1 not."""
    from shellyard.home import is_served, read_info, settings_drift

    where = _home(home)
    info = read_info(where) if is_served(where) else None
    if as_json:
        body = {"home": str(where), "served": info is not None}
        if info is not None:
            body |= {"pid": info.pid, "url": info.url, "settings": info.settings or {}}
        out.print_json(json.dumps(body))
    elif info is None:
        out.print(f"{where}: not served (any client verb starts it)", highlight=False)
    else:
        out.print(f"{where}: served by pid {info.pid} at {info.url}", highlight=False)
        for name, value in (info.settings or {}).items():
            out.print(f"  {name}={value}", highlight=False)
        drift = settings_drift(info)
        if drift:
            err.print(f"shellyard: {drift}", highlight=False)
    raise typer.Exit(0 if info is not None else 1)


def stop_server(where: Path, grace_s: float = STOP_GRACE_S) -> int | None:
    """Stop the home's server (SIGTERM, then SIGKILL after ``grace_s``); its pid, or None when
    nothing served the home. Executions keep running (E11): the next start re-attaches them."""
    from shellyard.home import is_served, read_info

    info = read_info(where) if is_served(where) else None
    if info is None:
        return None
    try:
        os.kill(info.pid, signal.SIGTERM)
    except ProcessLookupError:
        return info.pid
    deadline = time.monotonic() + grace_s
    while is_served(where):
        if time.monotonic() >= deadline:
            try:
                os.kill(info.pid, signal.SIGKILL)
            except ProcessLookupError:
                break
            grace_s = 0
            deadline = time.monotonic() + 5
        time.sleep(0.05)
    return info.pid


@server_app.command("stop")
def server_stop(home: HomeOption = None, as_json: JsonOption = False) -> None:
    """Stop the home's server. Running commands go on; the next client verb starts it again."""
    where = _home(home)
    pid = stop_server(where)
    if as_json:
        out.print_json(json.dumps({"home": str(where), "stopped": pid}))
    elif pid is None:
        out.print(f"{where}: not served", highlight=False)
    else:
        out.print(f"{where}: stopped the server (pid {pid})", highlight=False)


@server_app.command("restart")
def server_restart(home: HomeOption = None, as_json: JsonOption = False) -> None:
    """Stop the home's server and start it with this shell's SHELLYARD_* settings, on the
    same port when it is free."""
    from shellyard.home import ensure_server

    where = _home(home)
    stop_server(where)
    try:
        info = ensure_server(where)
    except ShellyardError as exc:
        fail(exc)
    if as_json:
        out.print_json(json.dumps({"pid": info.pid, "url": info.url}))
    else:
        out.print(f"{where}: served by pid {info.pid} at {info.url}", highlight=False)


__all__ = ["register", "stop_server"]
