"""The ``shellyard`` command line. Verbs other than ``serve`` and ``runner serve`` are clients
of the home's control plane and start it in the background when it is not running.

Exit codes (for scripts, listed in ``shellyard --help`` and docs/cli.md): 0 done; 1 the operation
ran and failed; 2 refused (bad input or usage, not found, not allowed now); 75 try again later
(workspace busy, runner unreachable). ``run`` exits with the command's own code instead; 124
outcome unknown, 125 could not start, 130 cancelled.
"""

from __future__ import annotations

import os
import sys
import traceback
import types
from typing import Annotated

import typer

from shellyard.cli import executions, runners
from shellyard.cli.common import (
    HomeOption,
    LogLevelOption,
    configure_json_logging,
    configure_logging,
    fail,
    refuse_initialize,
)
from shellyard.cli.manual import SUMMARY, arrange, epilog
from shellyard.errors import InvalidInput, ShellyardError
from shellyard.home import default_home

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
    port: Annotated[
        int,
        typer.Option(envvar="SHELLYARD_PORT", help="0 picks a free port (written to server.json)."),
    ] = 0,
    network: Annotated[
        str | None, typer.Option(help="Local runner network: off (default), egress or host.")
    ] = None,
    no_auth: Annotated[
        bool,
        typer.Option(
            "--no-auth",
            help="Development only: accept requests without a bearer token. Allowed only on a "
            "loopback --host.",
        ),
    ] = False,
    log_level: LogLevelOption = "warning",
    ready_fd: Annotated[
        int | None,
        typer.Option("--ready-fd", hidden=True, help="Report the start's outcome on this fd."),
    ] = None,
    log_format: Annotated[
        str,
        typer.Option(
            "--log-format",
            envvar="SHELLYARD_LOG_FORMAT",
            help="text (default) or json: one JSON object per line, with execution, session "
            "and runner ids where known (docs/operations.md).",
        ),
    ] = "text",
) -> None:
    """Run the control plane for a home in the foreground: the REST API, MCP over streamable
    HTTP at /mcp, timers and wakes. The admin token is kept in <home>/admin.token (0600)."""
    from shellyard.home import LOCK_NAME, StartReport, lock_home

    # Whoever started this server in the background (home.ensure_server) waits on this pipe
    # for "ready" or the error the start stopped on. The error is written to stderr (the
    # server's log) first, so the log has the reason by the time the caller reports it.
    report = StartReport(ready_fd)
    where = (home.absolute() if home else None) or default_home()
    try:
        configure_logging(log_level)
        if log_format not in ("text", "json"):
            # the value may come from the environment: name both ways of setting it
            raise InvalidInput(
                f"--log-format (SHELLYARD_LOG_FORMAT) must be text or json, not {log_format!r}"
            )
        if log_format == "json":
            configure_json_logging(log_level)
        if (where / LOCK_NAME).exists():  # served already: say so before the heavy imports
            os.close(lock_home(where))
        from shellyard.api.server import serve as run_server
        from shellyard.config import Settings
        from shellyard.runner.policy import parse_network

        settings = Settings.from_env(home=where, database_url=database_url)
        if network is not None:
            settings.local_policy = settings.local_policy.model_copy(
                update={"network": parse_network(network, "--network")}
            )
        if settings.local_policy.network == "host":
            typer.echo(
                "warning: network 'host': commands share this host's network, its loopback "
                "services included (see docs/security.md)",
                err=True,
            )
        run_server(
            settings,
            host,
            port,
            auth=not no_auth,
            on_ready=report.ready,
            log_level=log_level.lower(),
            json_logs=log_format == "json",
        )
    except ValueError as exc:
        error = InvalidInput(str(exc))
        try:
            fail(error)
        finally:
            report.failed(error)
    except ShellyardError as exc:
        try:
            fail(exc)
        finally:
            report.failed(exc)
    except Exception as exc:
        traceback.print_exc()
        sys.stderr.flush()
        report.failed(exc)
        raise typer.Exit(1) from None


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
    tools: Annotated[
        str | None,
        typer.Option(
            "--tools",
            envvar="SHELLYARD_MCP_TOOLS",
            help=(
                "The toolsets to list, comma-separated: default (the seed's tools and the "
                "basic file tools), core, files, env, timers, transfers, ports, all."
            ),
        ),
    ] = None,
    log_level: LogLevelOption = "warning",
) -> None:
    """Serve MCP over stdio (what an agent host launches). The same tools are served over
    streamable HTTP at /mcp of 'shellyard serve' (toolsets: /mcp?tools=...)."""
    from shellyard import loops
    from shellyard.home import ensure_server
    from shellyard.mcp.server import parse_toolsets

    # Agent hosts keep a server's stderr in their logs: only warnings and errors by default.
    configure_logging(log_level)
    where = home or default_home()
    try:
        parse_toolsets(tools)
        loops.chosen()  # a bad SHELLYARD_LOOP is said here, before a server is started for it
        ensure_server(where)
    except ShellyardError as exc:
        # The host is waiting for MCP's initialize answer: answer it with the error (hosts
        # show that), then say it on stderr too and exit.
        refuse_initialize(f"{exc.code}: {exc.message}")
        fail(exc)
    from shellyard.mcp.server import serve_stdio

    try:
        loops.run(serve_stdio(where, agent, token, tools))  # on uvloop by default
    except ShellyardError as exc:
        fail(exc)


# Every verb module registers its verbs on the app; none of them imports this module.
from shellyard.cli import (  # noqa: E402
    artifacts,
    environments,
    files,
    maintenance,
    ports,
    server,
    sessions,
    shell_call,
    tokens,
    transfers,
    ui,
)

VERB_MODULES = (
    executions,
    runners,
    sessions,
    files,
    transfers,
    artifacts,
    shell_call,
    tokens,
    environments,
    maintenance,  # gc, backup, restore (docs/operations.md)
    ui,
    ports,  # R5: ports for the host
    server,  # the home's background server (docs/cli.md)
)
for module in VERB_MODULES:
    module.register(app)

# Every verb is registered: group them for --help.
arrange(app)


def _verbs_of(module: types.ModuleType) -> set[str]:
    """The top-level words a verb module registers (commands and command groups)."""
    scratch = typer.Typer()
    module.register(scratch)
    names = {
        c.name or (c.callback.__name__ if c.callback else "") for c in scratch.registered_commands
    }
    names |= {g.name or "" for g in scratch.registered_groups}
    return {name.replace("_", "-") for name in names if name}


def main() -> None:
    """Run the CLI. Typer builds every command's parameters when it starts (about a sixth of
    ``shellyard run -- true``, measured in docs/benchmarks.md), so a verb of a verb module runs
    in an app that holds only that module; help, ``serve``, ``mcp`` and anything unknown go
    to the whole app."""
    word = sys.argv[1] if len(sys.argv) > 1 else ""
    from shellyard.cli.helppage.outline import is_top_level_help, outline

    if is_top_level_help(sys.argv[1:]):  # the same page without building every verb
        outline(app)()
        return
    owner = next((m for m in VERB_MODULES if word in _verbs_of(m)), None)
    if owner is None or word.startswith("-"):
        app()
        return
    single = typer.Typer(
        name="shellyard",
        help=SUMMARY,
        rich_markup_mode="rich",
        no_args_is_help=True,
        add_completion=False,
    )

    @single.callback()
    def _group() -> None:  # a callback keeps the verb a subcommand, as in the whole app
        pass

    owner.register(single)
    single()
