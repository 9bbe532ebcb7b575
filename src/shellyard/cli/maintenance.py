"""Operating a home (docs/operations.md): ``shellyard gc`` applies the retention policy now
(through the home's server); ``shellyard backup DEST`` and ``shellyard restore SRC`` work on the
home's files directly, served or not (a backup of a serving home is consistent: see
shellyard/backup.py), so they never start a server."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from shellyard.cli.common import HomeOption, JsonOption, client_for, err, fail, out, print_json
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
    app.command("gc")(gc)
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


DaysOption = Annotated[float | None, typer.Option(min=0, help="Override the policy (days).")]


def gc(
    log_days: DaysOption = None,
    record_days: DaysOption = None,
    event_days: DaysOption = None,
    archived_days: DaysOption = None,
    log_budget_bytes: Annotated[
        int | None, typer.Option(min=0, help="Override the per-runner log budget (bytes).")
    ] = None,
    no_snapshots: Annotated[
        bool, typer.Option("--no-snapshots", help="Leave snapshots and objects alone.")
    ] = False,
    home: HomeOption = None,
    as_json: JsonOption = False,
) -> None:
    """Apply the retention policy now (admin): execution logs and old records on every
    runner, events, wakes and read notices, snapshots and unreferenced objects; then the
    database gives the space back. The server also runs it every interval."""
    from pydantic import TypeAdapter

    from shellyard.contract.maintenance import GcReport, GcRequest
    from shellyard.sdk.base import call

    request = GcRequest(
        log_days=log_days,
        record_days=record_days,
        event_days=event_days,
        archived_days=archived_days,
        log_budget_bytes=log_budget_bytes,
        snapshots=not no_snapshots,
    )
    body = request.model_dump(exclude_none=True)
    try:
        client = client_for(home)
        report = client._send(
            call("POST", "/v1/gc", TypeAdapter(GcReport), body=body, timeout_s=3600)
        )
    except ShellyardError as exc:
        fail(exc)
    if as_json:
        print_json(report)
        return
    out.print(
        f"pruned the logs of {report.logs_pruned} executions ({report.log_bytes_freed} bytes), "
        f"deleted {report.records_deleted} records and "
        f"{sum(report.events_deleted.values())} events, wakes, notices and timers",
        highlight=False,
    )
    if report.snapshots is not None:
        removed = sum(len(p.removed) for p in report.snapshots.pruned)
        freed = sum(g.bytes_removed for g in report.snapshots.collected.values())
        out.print(f"pruned {removed} snapshots; freed {freed} bytes of objects", highlight=False)
    if report.database_bytes_after is not None:
        out.print(
            f"database: {report.database_bytes_before} → {report.database_bytes_after} bytes",
            highlight=False,
        )
    for runner_id, message in report.errors.items():
        err.print(f"runner {runner_id}: {message}", highlight=False)
