"""``shellyard backup DEST`` and ``shellyard restore SRC`` (docs/operations.md). They work on
the home's files directly, served or not (a backup of a serving home is consistent: see
shellyard/backup.py), so they never start a server."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from shellyard.cli.common import HomeOption, JsonOption, fail, out, print_json
from shellyard.config import Settings
from shellyard.errors import ShellyardError

DatabaseOption = Annotated[
    str | None,
    typer.Option(
        "--database-url",
        envvar="SHELLYARD_DATABASE_URL",
        help="postgresql://… when the home's records are in PostgreSQL.",
    ),
]
SchemaOption = Annotated[
    str | None, typer.Option("--database-schema", help="PostgreSQL schema of the records.")
]


def register(app: typer.Typer) -> None:
    app.command("backup")(backup)
    app.command("restore")(restore)


def _settings(home: Path | None, database_url: str | None, schema: str | None) -> Settings:
    return Settings.from_env(
        home=home.absolute() if home else None, database_url=database_url, database_schema=schema
    )


def backup(
    destination: Annotated[Path, typer.Argument(help="A new (or empty) folder for the copy.")],
    home: HomeOption = None,
    database_url: DatabaseOption = None,
    database_schema: SchemaOption = None,
    full: Annotated[
        bool,
        typer.Option(
            "--full",
            help="Copy the files environments share with a base too. Without it they are "
            "named, and restored as links to the base on this host.",
        ),
    ] = False,
    as_json: JsonOption = False,
) -> None:
    """Copy the home (database, then the local runner's snapshots, logs and workspaces) into
    DESTINATION, consistently, while it serves. Hard links stay links. Retention waits until
    it is done."""
    from shellyard.backup import backup as take

    try:
        report = take(_settings(home, database_url, database_schema), destination, full=full)
    except ShellyardError as exc:
        fail(exc)
    if as_json:
        print_json(report)
        return
    out.print(
        f"backed up {report.executions} execution records ({report.unfinished} unfinished) and "
        f"{report.files} files ({report.bytes} bytes copied, {report.linked} hard links kept, "
        f"{report.base_files} shared with a base) to {report.destination} "
        f"in {report.duration_s:.1f} s",
        highlight=False,
    )


def restore(
    source: Annotated[Path, typer.Argument(help="A folder made by 'shellyard backup'.")],
    home: HomeOption = None,
    database_url: DatabaseOption = None,
    database_schema: SchemaOption = None,
    as_json: JsonOption = False,
) -> None:
    """Restore a backup into an empty home (not served); then start it as usual."""
    from shellyard.backup import restore as put_back

    try:
        report = put_back(_settings(home, database_url, database_schema), source)
    except ShellyardError as exc:
        fail(exc)
    if as_json:
        print_json(report)
        return
    out.print(f"restored {report.files} files ({report.bytes} bytes) into {report.home}")
