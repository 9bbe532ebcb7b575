"""Runner verbs: serve a runner daemon, register one, list them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from shellyard.cli.common import HomeOption, JsonOption, fail, new_table, out
from shellyard.cli.common import client_for as _client
from shellyard.errors import ShellyardError

runner_app = typer.Typer(help="Runner daemons on this or other hosts.", no_args_is_help=True)


def register(app: typer.Typer) -> None:
    app.add_typer(runner_app, name="runner")


@runner_app.command("serve")
def runner_serve(
    root: Annotated[Path, typer.Option(help="The runner's folder (workspaces, logs, snapshots).")],
    host: str = "127.0.0.1",
    port: int = 8765,
    token_file: Annotated[Path | None, typer.Option(help="Default: ROOT/token")] = None,
    network: Annotated[str, typer.Option(help="off (default), egress or host")] = "off",
    host_path: Annotated[
        list[str] | None, typer.Option(help="A host path shown read-only in every sandbox.")
    ] = None,
) -> None:
    """Run a runner daemon: the Runner protocol over HTTP, token-authenticated."""
    from shellyard.runner.daemon import run_runner_daemon

    try:
        run_runner_daemon(root.absolute(), host, port, token_file, network, host_path or [])
    except ShellyardError as exc:
        fail(exc)


@runner_app.command("add")
def runner_add(
    runner_id: str,
    address: str,
    token: Annotated[str, typer.Option(help="The daemon's token (its ROOT/token file).")],
    home: HomeOption = None,
    as_json: JsonOption = False,
) -> None:
    """Register a runner daemon reached directly over HTTP (admin)."""
    try:
        view = _client(home).add_runner(runner_id, address, token)
    except ShellyardError as exc:
        fail(exc)
    if as_json:
        out.print_json(view.model_dump_json())
    else:
        out.print(f"registered {view.runner_id} at {view.address}", highlight=False)


@runner_app.command("list")
def runner_list(home: HomeOption = None, as_json: JsonOption = False) -> None:
    """The runners executions can go to ('local' and registered daemons)."""
    try:
        views = _client(home).runners()
    except ShellyardError as exc:
        fail(exc)
    if as_json:
        out.print_json(json.dumps([v.model_dump(mode="json") for v in views]))
        return
    table = new_table("runner", "kind", "address")
    for view in views:
        table.add_row(view.runner_id, view.kind, view.address or "")
    out.print(table)
