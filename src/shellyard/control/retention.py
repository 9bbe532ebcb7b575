"""Retention of what grows without end (docs/operations.md): execution logs and status files on
every runner (by age and within a size budget), old execution records, session events, wakes
and their deliveries, read notices and past timers (archived sessions first); then the SQLite
file gives the space back (incremental vacuum). ``shellyard gc`` runs it on demand (with the
snapshot retention of FileService), the service every ``interval_s``.

What is never pruned: anything of an execution that is not finished, whose notice is unread,
whose snapshot an artifact names, or that a pending reminder waits for. The runner's files go
through the Runner protocol (``prune_logs``); the control plane never opens them.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import logging
import os
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from shellyard.config import RetentionSettings
from shellyard.contract.maintenance import GcReport, GcRequest
from shellyard.control.runners import RunnerRegistry
from shellyard.errors import Conflict, ShellyardError
from shellyard.runner.protocol import LogPruneRequest
from shellyard.store import Store
from shellyard.store.retention import Cutoffs
from shellyard.store.tokens import WEB_SESSION_TTL_S

if TYPE_CHECKING:
    from shellyard.control.files.service import FileService

log = logging.getLogger(__name__)

#: Rows (or executions) per transaction or runner call: short enough that requests are served
#: between two batches.
BATCH = 500
#: Held (flock) by a retention pass and by a backup, so a backup never copies a half-pruned
#: home and a pass never deletes what a backup is copying.
MAINTENANCE_LOCK = "maintenance.lock"
#: What each log stream of an unread execution keeps (head and tail) when the runner is over
#: its log budget (docs/operations.md).
UNREAD_KEEP_BYTES = 1 << 20
#: A day, for the policy's ``*_days`` fields.
DAY_S = 86400.0


#: How long a pass that does not wait tries for a lock it finds taken.
HOLDER_GRACE_S = 1.0


@contextlib.contextmanager
def maintenance_lock(home: Path, *, wait: bool) -> Iterator[None]:
    """Exclusive ``flock`` on ``<home>/maintenance.lock``; with ``wait=False`` a holder makes
    it raise Conflict after ``HOLDER_GRACE_S``: a process forked while the last pass held the
    lock (a spawn's child between its fork and its exec) shares the lock's open file for a
    moment after that pass let it go (seen once in CI: the next pass refused)."""
    home.mkdir(parents=True, exist_ok=True)
    fd = os.open(home / MAINTENANCE_LOCK, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        try:
            give_up = time.monotonic() + (0 if wait else HOLDER_GRACE_S)
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
                    break
                except BlockingIOError:
                    if time.monotonic() >= give_up:
                        raise
                    time.sleep(0.05)
        except BlockingIOError:
            raise Conflict(
                f"a backup or another retention pass holds {home / MAINTENANCE_LOCK}; "
                "try again when it is done"
            ) from None
        yield
    finally:
        os.close(fd)


class RetentionService:
    def __init__(
        self,
        store: Store,
        runners: RunnerRegistry,
        settings: RetentionSettings,
        home: Path,
        files: FileService | None = None,
    ) -> None:
        self.store = store
        self.runners = runners
        self.settings = settings
        self.home = home
        self.files = files
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        if self.settings.interval_s > 0:
            self._task = asyncio.create_task(self._loop(), name="retention")

    async def aclose(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
            self._task = None

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self.settings.interval_s)
            try:
                # Snapshots have their own schedule (FileService, same interval).
                await self.run(GcRequest(snapshots=False))
            except Conflict as exc:
                log.info("retention pass skipped: %s", exc.message)
            except Exception:
                log.exception("retention pass failed")

    # ------------------------------------------------------------------ one pass

    async def run(self, request: GcRequest | None = None) -> GcReport:
        request = request or GcRequest()
        policy = self._policy(request)
        started = time.monotonic()
        report = GcReport(database_bytes_before=self._database_bytes())
        with maintenance_lock(self.home, wait=False):
            for runner_id in self.runners.ids():
                try:
                    await self._runner_pass(runner_id, policy, report)
                except ShellyardError as exc:
                    report.errors[runner_id] = exc.message
            if policy.record_days is not None or policy.archived_days is not None:
                await self._transfers(policy, report)
            if policy.event_days is not None:
                await self._events(policy, report)
            await self._web_sessions(report)
            if request.snapshots and self.files is not None:
                report.snapshots = await self.files.collect()
            await self.store.reclaim_pages()
            if self.store.ballast is not None:  # room for a full volume (store/ballast.py)
                await asyncio.to_thread(self.store.ballast.ensure)
        report.database_bytes_after = self._database_bytes()
        report.duration_s = round(time.monotonic() - started, 3)
        log.info(
            "retention: %d logs pruned (%d bytes), %d records, %d transfers, events %s",
            report.logs_pruned,
            report.log_bytes_freed,
            report.records_deleted,
            report.transfers_deleted,
            report.events_deleted,
            extra={"action": "retention"},
        )
        return report

    def _policy(self, request: GcRequest) -> RetentionSettings:
        overrides = {
            name: getattr(request, name)
            for name in ("log_days", "log_budget_bytes", "record_days", "event_days")
            if getattr(request, name) is not None
        }
        if request.archived_days is not None:
            overrides["archived_days"] = request.archived_days
        return replace(self.settings, **overrides)

    def _cutoffs(self, policy: RetentionSettings) -> Cutoffs:
        never = float("inf")

        def days(value: float | None) -> float:
            return never if value is None else value

        # ``archived_days`` only ever shortens the others for archived sessions.
        archived = days(policy.archived_days)
        return Cutoffs.from_days(
            days(policy.log_days),
            days(policy.record_days),
            days(policy.event_days),
            archived,
        )

    async def _runner_pass(
        self, runner_id: str, policy: RetentionSettings, report: GcReport
    ) -> None:
        runner = self.runners.get(runner_id)
        cutoffs = self._cutoffs(policy)
        archived = cutoffs.archived
        # Old records first: their whole folder goes, then the record and its notice.
        while policy.record_days is not None or policy.archived_days is not None:
            ids = await self.store.record_candidates(runner_id, cutoffs.records, archived, BATCH)
            if not ids:
                break
            result = await runner.prune_logs(LogPruneRequest(execution_ids=ids, forget=True))
            report.records_deleted += await self.store.delete_executions(result.pruned)
            report.log_bytes_freed += result.bytes_freed
            if not result.pruned:
                break  # the runner still runs them (it lost track of none): next pass
        # Then logs past their age.
        while True:
            ids = await self.store.log_candidates(runner_id, cutoffs.logs, archived, BATCH)
            if not ids or not await self._prune_logs(runner_id, ids, report):
                break
        # Then the size budget, oldest first.
        held = (await runner.prune_logs(LogPruneRequest())).bytes_held or 0
        while policy.log_budget_bytes is not None and held > policy.log_budget_bytes:
            ids = await self.store.log_candidates(runner_id, None, None, BATCH)
            excess = held - policy.log_budget_bytes
            freed = await self._prune_logs(runner_id, ids, report, excess) if ids else None
            if not freed:
                break
            held -= freed
        # Still over: logs an unread notice keeps are cut to their head and tail (never
        # deleted: the notice's reader still sees how it began and ended).
        offset = 0
        while policy.log_budget_bytes is not None and held > policy.log_budget_bytes:
            ids = await self.store.unread_log_candidates(runner_id, offset, BATCH)
            if not ids:
                break
            offset += len(ids)
            request = LogPruneRequest(
                execution_ids=ids,
                keep_bytes=UNREAD_KEEP_BYTES,
                free_bytes=held - policy.log_budget_bytes,
            )
            result = await runner.prune_logs(request)
            report.logs_cut += len(result.pruned)
            report.log_bytes_freed += result.bytes_freed
            held -= result.bytes_freed
        report.runner_log_bytes[runner_id] = held

    async def _prune_logs(
        self, runner_id: str, ids: list[str], report: GcReport, free_bytes: int | None = None
    ) -> int | None:
        """Bytes freed (None: the runner pruned none of them)."""
        request = LogPruneRequest(execution_ids=ids, free_bytes=free_bytes)
        result = await self.runners.get(runner_id).prune_logs(request)
        await self.store.mark_logs_pruned(result.pruned)
        report.logs_pruned += len(result.pruned)
        report.log_bytes_freed += result.bytes_freed
        return result.bytes_freed if result.pruned else None

    async def _transfers(self, policy: RetentionSettings, report: GcReport) -> None:
        """Finished transfers and their entries, under ``record_days`` like execution
        records (docs/operations.md), in short transactions."""
        cutoffs = self._cutoffs(policy)
        while True:
            done, entries = await self.store.prune_transfers(cutoffs, BATCH // 10)
            report.transfers_deleted += done
            report.transfer_entries_deleted += entries
            if not done and not entries:
                return
            await asyncio.sleep(0)  # let requests in between two batches

    async def _events(self, policy: RetentionSettings, report: GcReport) -> None:
        cutoffs = self._cutoffs(policy)
        while True:
            counts = await self.store.prune_events(cutoffs, BATCH)
            for kind, count in counts.items():
                report.events_deleted[kind] = report.events_deleted.get(kind, 0) + count
            if not any(counts.values()):
                return
            await asyncio.sleep(0)  # let requests in between two batches

    async def _web_sessions(self, report: GcReport) -> None:
        """Web logins past their 7 days (they answer 401 already): deleted whatever the
        policy, since each login makes one and nothing else ever removes it."""
        before = time.time() - WEB_SESSION_TTL_S
        while deleted := await self.store.delete_expired_web_sessions(before, BATCH):
            report.events_deleted["web_sessions"] = (
                report.events_deleted.get("web_sessions", 0) + deleted
            )
            await asyncio.sleep(0)  # let requests in between two batches

    def _database_bytes(self) -> int | None:
        path = self.store.database_path()
        if path is None:
            return None
        return sum(
            p.stat().st_size for p in (path, path.with_name(path.name + "-wal")) if p.exists()
        )


__all__ = ["GcReport", "GcRequest", "RetentionService", "maintenance_lock"]


#: The per-object structures of the control plane and the local runner that must stay flat
#: over months (docs/operations.md): (label, owner attribute path). Sizes are read defensively so a
#: renamed attribute shows as -1 instead of breaking the report.
TRACKED = (
    ("executions.finished_events", ("executions", "_finished")),
    ("executions.watchers", ("executions", "_watchers")),
    ("executions.foreground", ("executions", "_foreground")),
    ("executions.workspace_cache", ("executions", "_workspaces")),
    ("wakes.subscribers", ("wakes", "_subscribers")),
    ("wakes.tasks", ("wakes", "_tasks")),
    ("wakes.deliveries", ("wakes", "_deliveries")),
    ("timers.watched", ("timers", "_watched")),
    ("transfers.tasks", ("transfers", "_tasks")),
    ("transfers.cancel", ("transfers", "_cancel")),
    ("transfers.in_flight", ("transfers", "batches.in_flight")),
    ("environments.drivers", ("environments", "_drivers")),
    ("environments.wakeups", ("environments", "_wakeups")),
    ("environments.ended", ("environments", "_ended")),
)
LOCAL_TRACKED = (
    ("local.live", "_runs._live"),
    ("local.tasks", "_runs._tasks"),
    ("local.busy_workspaces", "_runs.busy_workspaces"),
    ("local.environment_users", "_runs.environment_users"),
)


def structure_sizes(plane: object, local_runner: object | None) -> dict[str, int]:
    """Sizes of the tracked structures, the asyncio task count and this process's open fds
    and RSS (for the admin debug endpoint, the soak test and bench/bench_soak.py)."""
    sizes: dict[str, int] = {}
    for label, (service, attribute) in TRACKED:
        value: object = getattr(plane, service, None)
        for name in attribute.split("."):
            value = getattr(value, name, None)
        sizes[label] = len(value) if hasattr(value, "__len__") else -1
    for label, path in LOCAL_TRACKED:
        found: object = local_runner
        for attribute in path.split("."):
            found = getattr(found, attribute, None)
        sizes[label] = len(found) if hasattr(found, "__len__") else -1
    sizes["asyncio_tasks"] = len(asyncio.all_tasks())
    sizes["open_fds"] = len(os.listdir("/proc/self/fd"))
    with contextlib.suppress(OSError, ValueError, IndexError):
        pages = int(Path("/proc/self/statm").read_text().split()[1])
        sizes["rss_bytes"] = pages * os.sysconf("SC_PAGE_SIZE")
    return sizes
