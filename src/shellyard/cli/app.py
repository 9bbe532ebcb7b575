"""The ``shellyard`` command line. Verbs other than ``serve`` and ``runner serve`` are clients
of the home's control plane and start it in the background when it is not running.

Exit codes (for scripts, listed in ``shellyard --help`` and docs/cli.md): 0 done; 1 the operation
ran and failed; 2 refused (bad input or usage, not found, not allowed now); 75 try again later
(workspace busy, runner unreachable). ``run`` exits with the command's own code instead; 124
outcome unknown, 125 could not start, 130 cancelled.
"""

from __future__ import annotations

import asyncio
from typing import Annotated

import typer

from shellyard.cli import executions, runners
from shellyard.cli.common import HomeOption, fail
from shellyard.cli.manual import SUMMARY, arrange, epilog
from shellyard.config import Settings, default_home
from shellyard.errors import ShellyardError

app = typer.Typer(
    name="shellyard",
    help=SUMMARY,
    epilog=epilog(),
    rich_markup_mode="rich",
    no_args_is_help=True,
    add_completion=False,
)


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
        fail(exc)


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
        fail(exc)


# Every verb module registers its verbs on the app; none of them imports this module.
from shellyard.cli import environments, files, sessions, shell_call, tokens  # noqa: E402
from shellyard.cli import ui as ui_verb  # noqa: E402

for module in (executions, runners, sessions, files, shell_call, tokens, environments, ui_verb):
    module.register(app)

# Every verb is registered: group them for --help.
arrange(app)


def main() -> None:
    app()
