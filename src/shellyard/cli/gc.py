"""``shellyard gc``: apply the retention policy now (docs/operations.md)."""

from __future__ import annotations

from typing import Annotated

import typer

from shellyard.cli.common import HomeOption, JsonOption, client_for, err, fail, out, print_json
from shellyard.errors import ShellyardError

DaysOption = Annotated[float | None, typer.Option(min=0, help="Override the policy (days).")]


def register(app: typer.Typer) -> None:
    app.command("gc")(gc)


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
