"""Request and result of an on-demand retention pass (``shellyard gc``, ``POST /v1/gc``;
docs/operations.md)."""

from __future__ import annotations

from pydantic import BaseModel, Field

from shellyard.contract.files import RetentionView


class GcRequest(BaseModel):
    """Overrides of the configured policy for one on-demand pass (None: the configured
    value). Days may be fractions; 0 prunes everything finished that nothing needs."""

    log_days: float | None = Field(default=None, ge=0)
    log_budget_bytes: int | None = Field(default=None, ge=0)
    record_days: float | None = Field(default=None, ge=0)
    event_days: float | None = Field(default=None, ge=0)
    archived_days: float | None = Field(default=None, ge=0)
    #: Also prune snapshots and collect unreferenced objects (FileService.collect).
    snapshots: bool = True


class GcReport(BaseModel):
    logs_pruned: int = 0
    #: Executions whose logs were cut to head and tail (unread ones, over the log budget).
    logs_cut: int = 0
    log_bytes_freed: int = 0
    records_deleted: int = 0
    #: Finished transfers deleted under ``record_days``, and their entries (per-file rows).
    transfers_deleted: int = 0
    transfer_entries_deleted: int = 0
    #: Rows deleted per kind: wakes (with their deliveries), session_events, notices, timers.
    events_deleted: dict[str, int] = Field(default_factory=dict)
    #: Bytes of execution folders per runner after the pass.
    runner_log_bytes: dict[str, int] = Field(default_factory=dict)
    #: SQLite: the database file (with its WAL) before and after; None on PostgreSQL.
    database_bytes_before: int | None = None
    database_bytes_after: int | None = None
    snapshots: RetentionView | None = None
    #: Runners that could not be reached (their part waits for the next pass).
    errors: dict[str, str] = Field(default_factory=dict)
    duration_s: float = 0.0
