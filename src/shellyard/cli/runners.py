"""Runner verbs: serve a runner daemon, register one, list, show and remove them."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from shellyard.cli.common import HomeOption, JsonOption, fail, new_table, out
from shellyard.cli.common import client_for as _client
from shellyard.errors import InvalidInput, NotFound, ShellyardError

if TYPE_CHECKING:  # the models are built on import: not at start-up (docs/benchmarks.md)
    from shellyard.contract.runners import RunnerView

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
    socket: Annotated[
        Path | None,
        typer.Option(help="Listen on this Unix socket (for ssh runners) instead of HOST:PORT."),
    ] = None,
    tls_cert: Annotated[
        Path | None, typer.Option(help="Serve HTTPS with this PEM certificate (off loopback).")
    ] = None,
    tls_key: Annotated[Path | None, typer.Option(help="The certificate's PEM key.")] = None,
) -> None:
    """Run a runner daemon: the Runner protocol over HTTP, every request signed with its key."""
    from shellyard.runner.transport.daemon import run_runner_daemon

    try:
        if (tls_cert is None) != (tls_key is None):
            raise InvalidInput("--tls-cert and --tls-key go together; give both or neither")
        unix = socket.absolute() if socket else None
        tls = (tls_cert.absolute(), tls_key.absolute()) if tls_cert and tls_key else None
        run_runner_daemon(
            root.absolute(), host, port, token_file, network, host_path or [], unix, tls
        )
    except ShellyardError as exc:
        fail(exc)


@runner_app.command("add")
def runner_add(
    runner_id: str,
    address: Annotated[
        str,
        typer.Argument(
            help="http://127.0.0.1:PORT, https://HOST:PORT (certificate pinned), or "
            "ssh://USER@HOST[:PORT]/SOCKET (or ssh://USER@HOST[:PORT]?port=N)"
        ),
    ],
    token: Annotated[str, typer.Option(help="The daemon's key (its ROOT/token file).")],
    identity: Annotated[
        Path | None, typer.Option(help="ssh: the private key to log in with.")
    ] = None,
    known_hosts: Annotated[
        Path | None, typer.Option(help="ssh: the known-hosts file holding the host's key.")
    ] = None,
    accept_new: Annotated[
        bool, typer.Option(help="ssh: record an unknown host key instead of refusing it.")
    ] = False,
    tls_fingerprint: Annotated[
        str | None, typer.Option(help="https: the certificate's SHA-256 to expect.")
    ] = None,
    home: HomeOption = None,
    as_json: JsonOption = False,
) -> None:
    """Register a runner daemon, direct or through SSH (admin); it is asked once first."""
    try:
        view = _client(home).add_runner(
            runner_id,
            address,
            token,
            identity=str(identity.absolute()) if identity else None,
            known_hosts=str(known_hosts.absolute()) if known_hosts else None,
            accept_new=accept_new,
            tls_fingerprint=tls_fingerprint,
        )
    except ShellyardError as exc:
        fail(exc)
    if as_json:
        out.print_json(view.model_dump_json())
    else:
        pin = f" ({view.fingerprint})" if view.fingerprint else ""
        out.print(f"registered {view.runner_id} at {view.address}{pin}", highlight=False)


@runner_app.command("bootstrap")
def runner_bootstrap(
    address: Annotated[
        str,
        typer.Argument(
            help="ssh://USER@HOST[:PORT] (socket ROOT/runner.sock), or "
            "ssh://USER@HOST[:PORT]/SOCKET"
        ),
    ],
    identity: Annotated[Path, typer.Option(help="The private key to log in with.")],
    known_hosts: Annotated[
        Path, typer.Option(help="The known-hosts file holding (or to hold) the host's key.")
    ],
    name: Annotated[
        str | None, typer.Option(help="The runner's id (default: the host's name).")
    ] = None,
    accept_new: Annotated[
        bool, typer.Option(help="Record an unknown host key instead of refusing it.")
    ] = False,
    root: Annotated[
        str | None, typer.Option(help="The daemon's folder there (default ~/.shellyard/runner).")
    ] = None,
    command: Annotated[
        str | None, typer.Option(help="shellyard's program there (default: shellyard on PATH).")
    ] = None,
    network: Annotated[str | None, typer.Option(help="off (default), egress or host")] = None,
    home: HomeOption = None,
    as_json: JsonOption = False,
) -> None:
    """Start a runner daemon on a host over SSH (if it is not running there) and register
    it (admin). Safe to repeat."""
    from urllib.parse import urlsplit

    runner_id = name or re.sub(r"[^A-Za-z0-9_.-]", "-", urlsplit(address).hostname or "")
    try:
        done = _client(home).bootstrap_runner(
            runner_id,
            address,
            identity=str(identity.absolute()),
            known_hosts=str(known_hosts.absolute()),
            accept_new=accept_new,
            root=root,
            command=command,
            network=network,
        )
    except ShellyardError as exc:
        fail(exc)
    if as_json:
        out.print_json(done.model_dump_json())
    else:
        view = done.runner
        out.print(
            f"daemon {done.daemon} on {done.socket}; registered {view.runner_id} at "
            f"{view.address} ({view.fingerprint}), {view.state}",
            highlight=False,
        )


def _state(view: RunnerView) -> str:
    if view.state == "unreachable" and view.unreachable_since is not None:
        since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(view.unreachable_since))
        return f"unreachable since {since}"
    return view.state


@runner_app.command("list")
def runner_list(home: HomeOption = None, as_json: JsonOption = False) -> None:
    """The runners executions can go to ('local' and registered daemons), with their state."""
    try:
        views = _client(home).runners()
    except ShellyardError as exc:
        fail(exc)
    if as_json:
        out.print_json(json.dumps([v.model_dump(mode="json") for v in views]))
        return
    table = new_table("runner", "kind", "address", "state", "version", "network", "running")
    for view in views:
        table.add_row(
            view.runner_id,
            view.kind,
            view.address or "",
            _state(view),
            view.version or "",
            view.network or "",
            str(view.running_executions),
        )
    out.print(table)


@runner_app.command("show")
def runner_show(runner_id: str, home: HomeOption = None, as_json: JsonOption = False) -> None:
    """One runner: state, version, sandbox capabilities, limits, running executions."""
    try:
        views = [v for v in _client(home).runners() if v.runner_id == runner_id]
        if not views:
            raise NotFound(f"no runner {runner_id!r}; `shellyard runner list` shows them")
    except ShellyardError as exc:
        fail(exc)
    view = views[0]
    if as_json:
        out.print_json(view.model_dump_json())
        return
    lines = [
        ("runner", view.runner_id),
        ("kind", view.kind),
        ("address", view.address or ""),
        ("state", _state(view)),
        ("last error", view.last_error or ""),
        ("version", view.version or ""),
        ("sandbox", view.sandbox or ""),
        ("network", view.network or ""),
        ("running executions", str(view.running_executions)),
        ("pinned key", view.fingerprint or ""),
    ]
    if view.limits is not None:
        lines += [(f"limit {k}", str(v)) for k, v in view.limits.model_dump().items()]
    for name, value in lines:
        out.print(f"{name:>20}  {value}", highlight=False)


@runner_app.command("remove")
def runner_remove(runner_id: str, home: HomeOption = None, as_json: JsonOption = False) -> None:
    """Forget a runner (admin); refused while executions run there."""
    try:
        view = _client(home).remove_runner(runner_id)
    except ShellyardError as exc:
        fail(exc)
    if as_json:
        out.print_json(view.model_dump_json())
    else:
        out.print(f"removed {view.runner_id}", highlight=False)
