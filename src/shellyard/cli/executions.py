"""Execution verbs: run, status, logs, cancel (E1–E7 from a terminal)."""

from __future__ import annotations

import json
import shlex
import sys
from typing import TYPE_CHECKING, Annotated

import typer

from shellyard.cli.common import (
    EXIT_BY_STATE,
    HomeOption,
    JsonOption,
    err,
    fail,
    new_table,
    out,
    print_view,
)
from shellyard.cli.common import client_for as _client
from shellyard.errors import ShellyardError

if TYPE_CHECKING:
    from shellyard.contract.executions import ExecutionView, RunShellResult
    from shellyard.sdk.client import Client


def register(app: typer.Typer) -> None:
    app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})(run)
    for verb in (status, logs, cancel):
        app.command()(verb)


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
    read_only: Annotated[
        bool,
        typer.Option(
            "--read-only",
            help="Run beside the workspace's writer (a background server) on its committed "
            "files, read-only; no snapshot.",
        ),
    ] = False,
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
            read_only=read_only,
        )
        if as_json:
            out.print_json(result.model_dump_json())
            raise typer.Exit(0)
        if result.note and sys.stderr.isatty():
            # docs/environments.md: no base prepared yet, so the command ran with the host's tools
            # only; the note names the command that prepares one. On a terminal only: a script's
            # stderr stays the command's own (--json carries the note as a field).
            err.print(f"shellyard: note: {result.note}", highlight=False)
        if background:
            out.print(result.execution_id)
            raise typer.Exit(0)
        code = finish_run(client, result)
    except ShellyardError as exc:
        fail(exc)
    raise typer.Exit(code)


def finish_run(client: Client, result: RunShellResult) -> int:
    """Print a foreground run's output (following it live if it is still going) and its
    error line; the exit code ``run`` ends with. Shared with the fast path (``cli.entry``)."""
    if result.state.terminal:
        sys.stdout.write(result.stdout)
        sys.stderr.write(result.stderr)
        final: ExecutionView = result
    else:
        for text in client.follow(result.execution_id, "stdout"):
            sys.stdout.write(text)
            sys.stdout.flush()
        for text in client.follow(result.execution_id, "stderr"):
            sys.stderr.write(text)
        final = client.wait(result.execution_id, 30)
    if final.error:
        err.print(f"shellyard: {final.state.value}: {final.error}", highlight=False)
    return final.exit_code if final.exit_code is not None else EXIT_BY_STATE.get(final.state, 1)


def status(
    execution_id: Annotated[str | None, typer.Argument()] = None,
    home: HomeOption = None,
    as_json: JsonOption = False,
) -> None:
    """Show one execution, or list recent ones."""
    try:
        client = _client(home)
        if execution_id is not None:
            print_view(client.status(execution_id), as_json)
            return
        views = client.list()
    except ShellyardError as exc:
        fail(exc)
    if as_json:
        out.print_json(json.dumps([v.model_dump(mode="json") for v in views]))
        return
    table = new_table("execution", "state", "exit", "command")
    for view in views:
        table.add_row(
            view.execution_id,
            view.state.value,
            "" if view.exit_code is None else str(view.exit_code),
            view.command or view.script_path or "",
        )
    out.print(table)


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
        fail(exc)
    if as_json:
        out.print_json(chunk.model_dump_json())
    else:
        sys.stdout.write(chunk.data)


def cancel(
    execution_id: str,
    home: HomeOption = None,
    wait_s: Annotated[float, typer.Option(help="Wait this long for the final state.")] = 15.0,
    as_json: JsonOption = False,
) -> None:
    """Cancel an execution (SIGTERM, then the whole sandbox after the grace period)."""
    try:
        print_view(_client(home).cancel(execution_id, wait_s), as_json)
    except ShellyardError as exc:
        fail(exc)
