"""CLI verbs of transfers between workspaces: ``shellyard transfer
discover|start|list|status|files|cancel``. Each takes ``--json``; following a transfer shows a
progress bar of its bytes on a terminal. ``cli/app.py`` calls ``register``."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from shellyard.cli.common import (
    AgentOption,
    HomeOption,
    JsonOption,
    QueueOption,
    new_table,
    out,
    print_json,
    progress_bar,
    run_as,
    show,
)
from shellyard.cli.manual import EXIT_FAILED

transfer_app = typer.Typer(
    help="Copy files between workspaces (yours on every runner, your parent's, your children's).",
    no_args_is_help=True,
)


def register(app: typer.Typer) -> None:
    app.add_typer(transfer_app, name="transfer")


TRANSFER_COLUMNS = (
    "transfer_id",
    "state",
    "files_total",
    "files_copied",
    "files_unchanged",
    "files_skipped",
    "files_failed",
    "bytes_done",
    "target_seq",
)


def _show_transfer(view: Any, as_json: bool) -> None:
    if as_json:
        print_json(view)
        return
    table = new_table(show_header=False, box=None)
    for key in (*TRANSFER_COLUMNS, "source_workspace_id", "source_seq", "target_workspace_id"):
        value = getattr(view, key)
        if value is not None:
            table.add_row(key, str(value))
    if view.error:
        table.add_row("error", view.error)
    out.print(table)


@transfer_app.command("discover")
def transfer_discover(
    home: HomeOption = None, agent: AgentOption = None, as_json: JsonOption = False
) -> None:
    """The workspaces you may copy between."""
    views = run_as(home, agent, lambda c: c.workspaces())
    if as_json:
        print_json(views)
        return
    table = new_table("workspace", "runner", "agent", "relation", "head", "writer", box=None)
    for v in views:
        table.add_row(
            v.workspace_id, v.runner_id, v.agent_id, v.relation, str(v.head_seq), v.writer or ""
        )
    out.print(table)


@transfer_app.command("start")
def transfer_start(
    source: Annotated[str, typer.Argument(help="The source workspace id.")],
    paths: Annotated[list[str], typer.Argument(help="Files, folders or globs to copy.")],
    to: Annotated[str, typer.Option("--to", help="The target workspace id.")],
    folder: Annotated[str, typer.Option("--folder", help="Folder in the target.")] = "",
    queue_: QueueOption = False,
    batch_files: Annotated[int | None, typer.Option(help="Files per committed batch.")] = None,
    wait: Annotated[bool, typer.Option("--wait/--no-wait", help="Follow it to the end.")] = True,
    home: HomeOption = None,
    agent: AgentOption = None,
    as_json: JsonOption = False,
) -> None:
    """Start a transfer; with --wait (default) follow it with a progress bar."""
    options = {"batch_files": batch_files} if batch_files else {}

    def start(client: Any) -> Any:
        view = client.transfer_start(source, paths, to, folder, queue=queue_, **options)
        return _follow_transfer(client, view) if wait else view

    view = run_as(home, agent, start)
    _show_transfer(view, as_json)
    if wait and view.state != "completed":
        raise typer.Exit(EXIT_FAILED)


def _follow_transfer(client: Any, view: Any) -> Any:
    """Wait for a transfer to end, with a progress bar of its bytes on a terminal."""
    with progress_bar() as progress:
        task = progress.add_task(f"transfer {view.transfer_id}", total=view.bytes_total)
        while not view.terminal:
            view = client.transfer_wait(view.transfer_id, 1.0)
            progress.update(
                task, total=view.bytes_total, completed=view.bytes_done + view.bytes_in_flight
            )
    return view


@transfer_app.command("list")
def transfer_list(
    home: HomeOption = None, agent: AgentOption = None, as_json: JsonOption = False
) -> None:
    """Your transfers, newest first."""
    views = run_as(home, agent, lambda c: c.transfers())
    show(views, as_json, TRANSFER_COLUMNS)


@transfer_app.command("status")
def transfer_status(
    transfer_id: str,
    home: HomeOption = None,
    agent: AgentOption = None,
    follow: Annotated[
        bool, typer.Option("--follow", "-f", help="Follow it to the end with a progress bar.")
    ] = False,
    as_json: JsonOption = False,
) -> None:
    """One transfer: state and progress. With --follow, exit 1 unless it completed."""

    def status(client: Any) -> Any:
        view = client.transfer(transfer_id)
        return _follow_transfer(client, view) if follow else view

    view = run_as(home, agent, status)
    _show_transfer(view, as_json)
    if follow and view.state != "completed":
        raise typer.Exit(EXIT_FAILED)


@transfer_app.command("files")
def transfer_files(
    transfer_id: str,
    outcome: Annotated[str | None, typer.Option(help="copied, unchanged, skipped, failed…")] = None,
    home: HomeOption = None,
    agent: AgentOption = None,
    as_json: JsonOption = False,
) -> None:
    """Per-file outcomes of a transfer."""

    def files(client: Any) -> list[Any]:
        rows: list[Any] = []
        offset: int | None = 0
        while offset is not None:
            page = client.transfer_files(transfer_id, outcome, offset, 10_000)
            rows += page.files
            offset = page.next_offset
        return rows

    rows = run_as(home, agent, files)
    if as_json:
        print_json(rows)
        return
    for r in rows:
        reason = f"  ({r.reason})" if r.reason else ""
        out.print(f"{r.outcome:9} {r.source_path} -> {r.target_path}{reason}", highlight=False)


@transfer_app.command("cancel")
def transfer_cancel(
    transfer_id: str,
    wait_s: float = 15.0,
    home: HomeOption = None,
    agent: AgentOption = None,
    as_json: JsonOption = False,
) -> None:
    """Cancel a transfer: files already committed stay."""
    _show_transfer(run_as(home, agent, lambda c: c.transfer_cancel(transfer_id, wait_s)), as_json)
