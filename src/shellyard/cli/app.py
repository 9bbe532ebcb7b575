"""The ``shellyard`` command line. Verbs other than ``serve`` and ``runner serve`` are clients
of the home's control plane and start it in the background when it is not running.

Exit codes (for scripts, listed in ``shellyard --help`` and docs/cli.md): 0 done; 1 the operation
ran and failed; 2 refused (bad input or usage, not found, not allowed now); 75 try again later
(workspace busy, runner unreachable). ``run`` exits with the command's own code instead; 124
outcome unknown, 125 could not start, 130 cancelled.
"""

from __future__ import annotations

import asyncio
import json
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer
from pydantic import BaseModel
from rich.console import Console
from rich.table import Table

from shellyard.cli.manual import EXIT_REFUSED, EXIT_RETRY, SUMMARY, arrange, epilog
from shellyard.config import Settings, default_home
from shellyard.contract.executions import ExecutionState, ExecutionView
from shellyard.errors import RunnerUnavailable, ShellyardError, WorkspaceBusy

app = typer.Typer(
    name="shellyard",
    help=SUMMARY,
    epilog=epilog(),
    rich_markup_mode="rich",
    no_args_is_help=True,
    add_completion=False,
)
runner_app = typer.Typer(help="Runner daemons on this or other hosts.", no_args_is_help=True)
app.add_typer(runner_app, name="runner")

err = Console(stderr=True)
out = Console()


def print_json(result: BaseModel | Sequence[BaseModel]) -> None:
    """One model, or a list of them, as JSON on stdout (every verb's ``--json``)."""
    if isinstance(result, BaseModel):
        out.print_json(result.model_dump_json())
    else:
        out.print_json(json.dumps([r.model_dump(mode="json") for r in result]))


def show(result: BaseModel | Sequence[BaseModel], as_json: bool, columns: Sequence[str]) -> None:
    """``--json``, or a human table: one model as key/value rows, a list with a row each."""
    if as_json:
        print_json(result)
        return
    if isinstance(result, BaseModel):
        table = Table(show_header=False, box=None)
        for key in columns:
            value = getattr(result, key)
            if value is not None:
                table.add_row(key, str(value.value if hasattr(value, "value") else value))
        out.print(table)
        return
    table = Table(*columns)
    for row in result:
        values = (getattr(row, key) for key in columns)
        table.add_row(*("" if v is None else str(getattr(v, "value", v)) for v in values))
    out.print(table)


HomeOption = Annotated[
    Path | None,
    typer.Option(
        "--home",
        help="State folder (default $SHELLYARD_HOME, ~/.shellyard, or "
        "/var/lib/shellyard for root).",
    ),
]
JsonOption = Annotated[bool, typer.Option("--json", help="Print JSON instead of text.")]

EXIT_BY_STATE = {
    ExecutionState.cancelled: 130,
    ExecutionState.unknown: 124,
    ExecutionState.failed: 125,
}


def exit_code_of(exc: ShellyardError) -> int:
    """75 when trying again later can work (a busy workspace, an unreachable runner), else 2."""
    return EXIT_RETRY if isinstance(exc, RunnerUnavailable | WorkspaceBusy) else EXIT_REFUSED


def _fail(exc: ShellyardError) -> NoReturn:
    err.print(f"[red]error[/red] ({exc.code}): {exc.message}", highlight=False)
    raise typer.Exit(exit_code_of(exc))


def _client(home: Path | None) -> Any:
    from shellyard.sdk.client import Client

    return Client.for_home(home or default_home())


def _print_view(view: ExecutionView, as_json: bool) -> None:
    if as_json:
        out.print_json(view.model_dump_json())
        return
    table = Table(show_header=False, box=None)
    for key in (
        "execution_id",
        "state",
        "exit_code",
        "workspace_id",
        "runner_id",
        "command",
        "script_path",
        "error",
        "snapshot_seq",
        "environment_id",
        "environment_revision",
        "waiting_for",
    ):
        value = getattr(view, key)
        if value is not None:
            table.add_row(key, str(value))
    out.print(table)


@app.command()
def serve(
    home: HomeOption = None,
    database_url: Annotated[
        str | None, typer.Option(help="postgresql://… instead of SQLite.")
    ] = None,
    host: Annotated[
        str,
        typer.Option(
            help="Address to listen on. Loopback by default; any other address needs tokens "
            "(the default), see 'shellyard token'."
        ),
    ] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="0 picks a free port (written to server.json).")] = 0,
    network: Annotated[str | None, typer.Option(help="Local runner network: on or off.")] = None,
    no_auth: Annotated[
        bool,
        typer.Option(
            "--no-auth",
            help="Development only: accept requests without a bearer token. Allowed only on a "
            "loopback --host.",
        ),
    ] = False,
) -> None:
    """Run the control plane for a home in the foreground: the REST API, MCP over streamable
    HTTP at /mcp, timers and wakes. The admin token is kept in <home>/admin.token (0600)."""
    from shellyard.api.server import serve as run_server

    settings = Settings.from_env(home=home.absolute() if home else None, database_url=database_url)
    if network is not None:
        settings.local_policy = settings.local_policy.model_copy(update={"network": network})
    try:
        run_server(settings, host, port, auth=not no_auth)
    except ShellyardError as exc:
        _fail(exc)


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def run(
    ctx: typer.Context,
    home: HomeOption = None,
    script: Annotated[str | None, typer.Option("--script", help="Run a workspace file.")] = None,
    runner_id: Annotated[str | None, typer.Option("--runner")] = None,
    env: Annotated[
        str | None, typer.Option("--env", help="Run in this environment (id or name).")
    ] = None,
    wait_ms: Annotated[int, typer.Option(help="Response budget before following logs.")] = 30_000,
    background: Annotated[
        bool, typer.Option("--background", "-b", help="Print the execution id and return.")
    ] = False,
    follow: Annotated[
        bool, typer.Option("--follow", "-f", help="Stream the output live from the start.")
    ] = False,
    queue: Annotated[bool, typer.Option(help="Wait in line if the workspace is busy.")] = False,
    as_json: JsonOption = False,
) -> None:
    """Run one command: shellyard run -- CMD [ARGS...]. Prints its output (after --wait-ms, or
    live with --follow) and exits with its exit code."""
    words = list(ctx.args)
    command = words[0] if len(words) == 1 else shlex.join(words) if words else None
    if (command is None) == (script is None):
        err.print("give a command after '--' (shellyard run -- ls -la) or --script PATH")
        raise typer.Exit(2)
    try:
        client = _client(home)
        if env is not None:
            from shellyard.cli.environments import _resolve

            env = _resolve(client, env)
        result = client.run(
            command,
            script_path=script,
            runner_id=runner_id,
            environment_id=env,
            wait_ms=0 if follow else wait_ms,
            background=background,
            queue=queue,
        )
        if as_json:
            out.print_json(result.model_dump_json())
            raise typer.Exit(0)
        if background:
            out.print(result.execution_id)
            raise typer.Exit(0)
        if result.state.terminal:
            sys.stdout.write(result.stdout)
            sys.stderr.write(result.stderr)
            final = result
        else:
            for text in client.follow(result.execution_id, "stdout"):
                sys.stdout.write(text)
                sys.stdout.flush()
            for text in client.follow(result.execution_id, "stderr"):
                sys.stderr.write(text)
            final = client.wait(result.execution_id, 30)
    except ShellyardError as exc:
        _fail(exc)
    if final.error:
        err.print(f"shellyard: {final.state.value}: {final.error}", highlight=False)
    raise typer.Exit(
        final.exit_code if final.exit_code is not None else EXIT_BY_STATE.get(final.state, 1)
    )


@app.command()
def status(
    execution_id: Annotated[str | None, typer.Argument()] = None,
    home: HomeOption = None,
    as_json: JsonOption = False,
) -> None:
    """Show one execution, or list recent ones."""
    try:
        client = _client(home)
        if execution_id is not None:
            _print_view(client.status(execution_id), as_json)
            return
        views = client.list()
    except ShellyardError as exc:
        _fail(exc)
    if as_json:
        out.print_json(json.dumps([v.model_dump(mode="json") for v in views]))
        return
    table = Table("execution", "state", "exit", "command")
    for view in views:
        table.add_row(
            view.execution_id,
            view.state.value,
            "" if view.exit_code is None else str(view.exit_code),
            view.command or view.script_path or "",
        )
    out.print(table)


@app.command()
def logs(
    execution_id: str,
    home: HomeOption = None,
    stream: Annotated[str, typer.Option(help="stdout or stderr")] = "stdout",
    offset: int = 0,
    limit: int = 65536,
    tail: Annotated[int | None, typer.Option(help="Only the last N bytes.")] = None,
    follow: Annotated[bool, typer.Option("--follow", "-f")] = False,
    as_json: JsonOption = False,
) -> None:
    """Print an execution's log; --follow keeps printing until it ends."""
    try:
        client = _client(home)
        if follow:
            for text in client.follow(execution_id, stream, offset):
                sys.stdout.write(text)
                sys.stdout.flush()
            return
        chunk = client.logs(execution_id, stream, offset, limit, tail)
    except ShellyardError as exc:
        _fail(exc)
    if as_json:
        out.print_json(chunk.model_dump_json())
    else:
        sys.stdout.write(chunk.data)


@app.command()
def cancel(
    execution_id: str,
    home: HomeOption = None,
    wait_s: Annotated[float, typer.Option(help="Wait this long for the final state.")] = 15.0,
    as_json: JsonOption = False,
) -> None:
    """Cancel an execution (SIGTERM, then the whole sandbox after the grace period)."""
    try:
        _print_view(_client(home).cancel(execution_id, wait_s), as_json)
    except ShellyardError as exc:
        _fail(exc)


@app.command()
def mcp(
    home: HomeOption = None,
    agent: Annotated[
        str | None,
        typer.Option(
            "--agent",
            envvar="SHELLYARD_AGENT",
            help="Serve the tools for this agent (default: the default session's main agent).",
        ),
    ] = None,
    token: Annotated[
        str | None,
        typer.Option(
            "--token",
            envvar="SHELLYARD_TOKEN",
            help="A session or agent token to act with (default: the home's admin token).",
        ),
    ] = None,
) -> None:
    """Serve MCP over stdio (what an agent host launches). The same tools are served over
    streamable HTTP at /mcp of 'shellyard serve'."""
    from shellyard.mcp.server import serve_stdio

    try:
        asyncio.run(serve_stdio(home or default_home(), agent, token))
    except ShellyardError as exc:
        _fail(exc)


@runner_app.command("serve")
def runner_serve(
    root: Annotated[Path, typer.Option(help="The runner's folder (workspaces, logs, snapshots).")],
    host: str = "127.0.0.1",
    port: int = 8765,
    token_file: Annotated[Path | None, typer.Option(help="Default: ROOT/token")] = None,
    network: Annotated[str, typer.Option(help="on or off")] = "on",
) -> None:
    """Run a runner daemon: the Runner protocol over HTTP, token-authenticated."""
    from shellyard.runner.daemon import run_runner_daemon

    try:
        run_runner_daemon(root.absolute(), host, port, token_file, network)
    except ShellyardError as exc:
        _fail(exc)


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
        _fail(exc)
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
        _fail(exc)
    if as_json:
        out.print_json(json.dumps([v.model_dump(mode="json") for v in views]))
        return
    table = Table("runner", "kind", "address")
    for view in views:
        table.add_row(view.runner_id, view.kind, view.address or "")
    out.print(table)


# session, agent, timer, webhook and inbox verbs; at the end: that module imports this one.
from shellyard.cli.sessions import register  # noqa: E402

register(app)

# files, transfer and artifact verbs (that module imports this one too).
from shellyard.cli.files import register as register_files  # noqa: E402

register_files(app)
# shell-call: a shell_call item on stdin, its shell_call_output item on stdout (S1).
from shellyard.cli.shell_call import register as register_shell_call  # noqa: E402

register_shell_call(app)
from shellyard.cli.tokens import register as register_tokens  # noqa: E402

register_tokens(app)
# env verbs (that module imports this one too).
from shellyard.cli.environments import register as register_env  # noqa: E402

register_env(app)

# Every verb is registered: group them for --help.
arrange(app)


def main() -> None:
    app()
