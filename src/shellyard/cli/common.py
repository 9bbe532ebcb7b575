"""What every verb module of the CLI shares: the consoles, the common options, printing a
result as a table or JSON, and turning a ShellyardError into the documented exit code."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, NoReturn

import typer
from pydantic import BaseModel
from rich.console import Console
from rich.table import Table

from shellyard.cli.manual import EXIT_REFUSED, EXIT_RETRY
from shellyard.config import default_home
from shellyard.contract.executions import ExecutionState, ExecutionView
from shellyard.errors import LowOnSpace, RunnerUnavailable, ShellyardError, WorkspaceBusy

if TYPE_CHECKING:
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

EXIT_BY_STATE = {
    ExecutionState.cancelled: 130,
    ExecutionState.unknown: 124,
    ExecutionState.failed: 125,
}


def exit_code_of(exc: ShellyardError) -> int:
    """75 when trying again later can work (a busy workspace, an unreachable runner, a runner
    below its free-space reserve), else 2."""
    retry = isinstance(exc, RunnerUnavailable | WorkspaceBusy | LowOnSpace)
    return EXIT_RETRY if retry else EXIT_REFUSED


def fail(exc: ShellyardError) -> NoReturn:
    err.print(f"[red]error[/red] ({exc.code}): {exc.message}", highlight=False)
    raise typer.Exit(exit_code_of(exc))


def client_for(home: Path | None) -> Client:
    from shellyard.sdk.client import Client

    return Client.for_home(home or default_home())


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
