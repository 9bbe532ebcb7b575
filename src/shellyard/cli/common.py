"""What every verb module of the CLI shares: the consoles, the common options, calling the
home's server, progress bars, printing a result as a table or JSON, and turning a
ShellyardError into the documented exit code."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, NoReturn

import typer
from pydantic import BaseModel
from rich.console import Console
from rich.table import Table

from shellyard.cli.manual import EXIT_REFUSED, EXIT_RETRY
from shellyard.config import default_home
from shellyard.contract.executions import ExecutionState, ExecutionView
from shellyard.errors import RunnerUnavailable, ShellyardError, WorkspaceBusy

if TYPE_CHECKING:
    from rich.progress import Progress, TaskID

    from shellyard.sdk.client import Client

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
AgentOption = Annotated[
    str | None,
    typer.Option("--agent", envvar="SHELLYARD_AGENT", help="Act for this agent."),
]
WorkspaceOption = Annotated[
    str | None, typer.Option("--workspace", "-w", help="A workspace id (default: yours).")
]
SeqOption = Annotated[
    int | None, typer.Option("--seq", help="A snapshot number (default: the latest).")
]
QueueOption = Annotated[
    bool, typer.Option("--queue", help="Wait for the workspace's writer instead of failing.")
]

EXIT_BY_STATE = {
    ExecutionState.cancelled: 130,
    ExecutionState.unknown: 124,
    ExecutionState.failed: 125,
}


def exit_code_of(exc: ShellyardError) -> int:
    """75 when trying again later can work (a busy workspace, an unreachable runner), else 2."""
    return EXIT_RETRY if isinstance(exc, RunnerUnavailable | WorkspaceBusy) else EXIT_REFUSED


def fail(exc: ShellyardError) -> NoReturn:
    err.print(f"[red]error[/red] ({exc.code}): {exc.message}", highlight=False)
    raise typer.Exit(exit_code_of(exc))


def client_for(home: Path | None) -> Client:
    from shellyard.sdk.client import Client

    return Client.for_home(home or default_home())


def run_as(home: Path | None, agent: str | None, action: Callable[[Any], Any]) -> Any:
    """Call the home's server (started on demand) as ``agent``; a shellyard error exits with
    its documented code and text."""
    from shellyard.sdk.client import Client

    try:
        with Client.for_home(home or default_home(), agent_id=agent) as client:
            return action(client)
    except ShellyardError as exc:
        fail(exc)


def progress_bar() -> Progress:
    """A byte progress bar on stderr, shown only on a terminal (uploads, downloads, transfers)."""
    from rich.progress import (
        BarColumn,
        DownloadColumn,
        Progress,
        TextColumn,
        TimeRemainingColumn,
        TransferSpeedColumn,
    )

    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        DownloadColumn(),
        TransferSpeedColumn(),
        TimeRemainingColumn(),
        console=err,
        transient=True,
        disable=not err.is_terminal,
    )


def counted(chunks: Iterable[bytes], progress: Progress, task: TaskID) -> Iterator[bytes]:
    """Pass chunks through, advancing the progress bar's task by their sizes."""
    for chunk in chunks:
        progress.update(task, advance=len(chunk))
        yield chunk


def wrote(written: dict[str, Any], as_json: bool) -> None:
    """Report a download: JSON on stdout, or one line on stderr (stdout may be the data)."""
    if as_json:
        out.print_json(json.dumps(written))
        return
    size = f" ({written['size']} bytes)" if "size" in written else ""
    err.print(f"wrote {written['path']}{size}", highlight=False)


def print_view(view: ExecutionView, as_json: bool) -> None:
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
