"""Transfers (T1–T4): explicit copies from a source workspace's committed snapshot into a target
workspace, on the same runner or across runners, through one code path.

``start`` records the source's latest committed snapshot on the transfer (T2), expands the
paths (files, folders, globs) against that snapshot into one row per entry, and takes the
target's writer (refused naming the holder, or queued). A background task then copies in
batches (by count and by bytes). Per batch:

1. ``missing_objects`` on the target runner: which contents it lacks. Between two workspaces
   of one runner the answer is "none" — they share the content-addressed store, so no byte
   moves through the control plane.
2. ``export_objects`` on the source runner streamed into ``import_objects`` on the target (one
   stream per batch, bounded chunks; each object verified against its sha256).
3. ``apply_entries`` on the target: the batch is written into the live tree and committed, and
   per entry the runner answers ``copied``, ``unchanged``, ``skipped`` or ``failed`` + reason.

Only then are the outcomes recorded, with the target snapshot that holds them (T3: a file counts
once it is committed). A cancel or a failure stops between batches and keeps every committed batch.
A runner that cannot be reached mid-batch (R3: its daemon killed, the SSH connection dropped, the
route cut) makes the batch be tried again with backoff, as E9 retries a status query: every step is
idempotent (objects already imported are not sent again, an entry already committed answers
``unchanged``), so a short drop costs only time. After ``BATCH_ATTEMPTS`` consecutive failures
(transfer_batch.py, which copies one batch) the batch's files fail with the runner's error and the
files not reached yet are ``skipped``; starting the same transfer again once the runner is back
copies the rest. The final state is ``completed``, ``partial``, ``failed`` or ``cancelled``; a
finished transfer posts a notice to its owner (N1). Transfers survive a restart of the control
plane: an unfinished one resumes with its pending files.

With several replicas on one database (docs/operations.md) each unfinished transfer is copied by the
one replica holding its lease (``leases``, given when built by control/plane.py): a replica that
dies leaves its lease to expire and another adopts the transfer, which resumes with its pending
files exactly as after a restart. A cancel or a wait on another replica goes through the record: the
cancel request is a column the holder reads between batches (and a fan-out message makes it stop
mid-batch), a wait re-reads the record until it is terminal, woken by the fan-out. Each batch is
fenced by the copier's lease (``store.hold_transfer`` before it is applied, ``record_outcomes``
with the holder): a copier that stalled past its lease, or whose transfer another replica ended,
stops without finishing it (``Fenced``)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

from shellyard.contract.files import (
    DEFAULT_BATCH_BYTES,
    DEFAULT_BATCH_FILES,
    TransferCancelQuery,
    TransferFilesQuery,
    TransferFilesView,
    TransferFileView,
    TransferListQuery,
    TransferRequest,
    TransferView,
    TransferWait,
    WorkspaceView,
)
from shellyard.contract.snapshots import CONTENT_CHUNK
from shellyard.control.executions.hooks import WatchLeases
from shellyard.control.files.access import WorkspaceAccess
from shellyard.control.files.transfer_batch import Batch, BatchCopier, Cancelled, Fenced, Outcome
from shellyard.control.files.transfer_plan import glob_text, is_glob, parse_request, plan
from shellyard.control.runners import LOCAL_RUNNER_ID
from shellyard.errors import (
    InvalidInput,
    NotFound,
    ShellyardError,
)
from shellyard.paths import normalize_relative
from shellyard.runner.protocol import (
    MAX_PAGE,
)
from shellyard.store import Store
from shellyard.store.db import new_id
from shellyard.store.files import (
    ENDED,
    HELD,
    LOST,
    TERMINAL_TRANSFER_STATES,
    Transfer,
    TransferFile,
)
from shellyard.store.leases import TRANSFER
from shellyard.store.records import field_names, values_of

log = logging.getLogger(__name__)

#: D3: the fields a transfer's record and its view share, listed once.
_TRANSFER_VIEW_FIELDS = field_names(Transfer, TransferView.model_fields)
_TRANSFER_FILE_VIEW_FIELDS = field_names(TransferFile, TransferFileView.model_fields)


def _file_view(row: TransferFile) -> TransferFileView:
    """A row's view: its ``sha256`` column holds the content id, which is the file's real
    sha256 only for sure under one chunk (contentid.py); above, the view says nothing rather
    than risk showing a chunk-list id as a sha256."""
    view = TransferFileView.model_validate(values_of(row, _TRANSFER_FILE_VIEW_FIELDS))
    view.content_id = row.sha256
    if row.sha256 is not None and row.size >= CONTENT_CHUNK:
        view.sha256 = None
    return view


#: Pending rows read from the database at once (cut into batches in memory).
_PAGE_ROWS = 5000
#: Why a copier stopped at a fence (``_copy``).
_FENCED = {
    ENDED: "the transfer was made final elsewhere",
    LOST: "another replica holds its lease (this one stalled past it)",
}
_FENCED_RECORD = "its batch's outcomes were not this replica's to record: " + " or ".join(
    _FENCED.values()
)
#: How often a wait for a transfer another replica copies reads its record again (besides
#: being woken by the fan-out when it ends).
_FOREIGN_POLL_S = 1.0


class TransferService:
    def __init__(
        self,
        store: Store,
        access: WorkspaceAccess,
        *,
        leases: WatchLeases,
        on_signal: Callable[[str], None],
        max_entries: int | None = None,
    ) -> None:
        # Given when built (docs/architecture.md "Wiring"): ``leases`` picks the replica copying
        # each transfer; ``on_signal`` tells the fan-out of an end or a cancel asked here (a
        # no-op with one replica); ``max_entries``: Settings.transfer_max_entries (None: the
        # default of transfer_plan.py).
        self.leases, self.on_signal, self.max_entries = leases, on_signal, max_entries
        leases.register(TRANSFER, self.adopt, self.forget, sweep=self._sweep)
        self.store = store
        self.access = access
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._cancel: dict[str, asyncio.Event] = {}
        self.batches = BatchCopier()
        self._closing = False
        #: transfer id → set when it ends (or a cancel arrives), for waits on this replica.
        self._changed: dict[str, asyncio.Event] = {}

    @property
    def retry_base_s(self) -> float:
        """First backoff between tries of a batch when a runner cannot be reached (doubles)."""
        return self.batches.retry_base_s

    @retry_base_s.setter
    def retry_base_s(self, value: float) -> None:
        self.batches.retry_base_s = value

    # ------------------------------------------------------------------ lifecycle

    async def startup(self) -> None:
        """Resume the transfers a previous control plane left queued or running (with
        replicas: those whose lease this one gets; the others' holders are alive)."""
        for row in await self.store.active_transfers():
            self._launch(row.id)

    async def adopt(self, transfer_id: str) -> None:
        """This replica took over the transfer's lease (its holder died): resume it."""
        await self.access.runners.load_registered()  # its runners may be another's adds
        self._launch(transfer_id)

    def forget(self, transfer_id: str) -> None:
        """Another replica took the lease (this one stalled past its expiry): stop copying
        here without finishing; the new holder resumes with the pending files."""
        task = self._tasks.pop(transfer_id, None)
        if task is not None:
            task.cancel()

    async def _sweep(self) -> None:
        """Active transfers no replica held a lease on for a lease time (leased as recorded:
        an older release or a failed lease write left them), resumed here; the in-process
        runner's are left out (only its own home reaches them)."""
        for transfer_id in await self.store.unleased_transfers(self.leases.ttl_s, LOCAL_RUNNER_ID):
            await self.adopt(transfer_id)

    def watched(self) -> list[str]:
        """Transfers waited for or copied here (a fan-out gap may have hidden their news)."""
        return list({*self._changed, *self._tasks})

    def signal(self, transfer_id: str) -> None:
        """Another replica says the transfer ended or a cancel was asked."""
        self._wake_waiters(transfer_id)
        if transfer_id in self._tasks:
            # A cancel recorded elsewhere: the copy reads the request and stops (T3 keeps
            # every committed batch).
            asyncio.get_running_loop().create_task(self._cancel_if_asked(transfer_id))

    async def _cancel_if_asked(self, transfer_id: str) -> None:
        with contextlib.suppress(Exception):
            row = await self.store.get_transfer(transfer_id)
            event = self._cancel.get(transfer_id)
            if row is not None and row.cancel_requested and event is not None:
                event.set()

    def _wake_waiters(self, transfer_id: str) -> None:
        event = self._changed.pop(transfer_id, None)
        if event is not None:
            event.set()

    def _publish(self, transfer_id: str) -> None:
        """It ended here: this replica's waits, and the other replicas', read it again (no
        cancel check: the copy that would read it is the one ending)."""
        self._wake_waiters(transfer_id)
        self.on_signal(transfer_id)

    async def _lease(self, transfer_id: str, source_runner: str, target_runner: str) -> bool:
        """Take the transfer's lease; its scope is the home's when either end is the
        in-process runner (no other replica reaches that)."""
        local = LOCAL_RUNNER_ID in (source_runner, target_runner)
        return await self.leases.acquire(
            TRANSFER, transfer_id, LOCAL_RUNNER_ID if local else target_runner
        )

    async def _lease_for(self, row: Transfer) -> bool:
        source = await self.store.get_workspace(row.source_workspace_id)
        target = await self.store.get_workspace(row.target_workspace_id)
        assert source is not None and target is not None
        return await self._lease(row.id, source.runner_id, target.runner_id)

    async def _release(self, transfer_id: str) -> None:
        await self.leases.release(TRANSFER, transfer_id)

    async def aclose(self) -> None:
        self._closing = True
        tasks = list(self._tasks.values())
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._tasks.clear()

    # ------------------------------------------------------------------ T1

    async def discover(self, agent_id: str | None = None) -> list[WorkspaceView]:
        return await self.access.discover(await self.access.agent(agent_id))

    # ------------------------------------------------------------------ T2

    async def start(
        self, request: TransferRequest | Mapping[str, Any], agent_id: str | None = None
    ) -> TransferView:
        if not isinstance(request, TransferRequest):
            request = parse_request(request)
        agent = await self.access.agent(agent_id)
        src, _r1, src_runner = await self.access.workspace(
            agent, request.source_workspace_id, use="transfer"
        )
        dst, _r2, _dst_runner = await self.access.workspace(
            agent, request.target_workspace_id, use="transfer"
        )
        target_folder = normalize_relative(request.target_folder)
        patterns = [
            normalize_relative(p) if not is_glob(p) else glob_text(p) for p in request.paths
        ]
        source_seq = (await src_runner.head(src.id)).seq
        files = await plan(
            src_runner, src.id, source_seq, patterns, target_folder, self.max_entries
        )
        transfer_id = new_id("tr")
        dst_id = dst.id
        cancel = asyncio.Event()
        # Leased before it is recorded: a replica dying in between leaves a lease that
        # expires, never a transfer nobody copies.
        await self._lease(transfer_id, src.runner_id, dst.runner_id)
        # T2: the target's writer is held for the whole copy; refused (naming the holder) or
        # queued, like an execution.
        if request.queue:
            holds = await self.store.take_writer(dst_id, "transfer", transfer_id)
        else:
            holds = await self.access.take_writer(dst_id, "transfer", transfer_id, queue=False)
        options = request.model_dump(
            include={"queue", "batch_files", "batch_bytes", "max_bytes_per_s"}
        )
        values = {
            "id": transfer_id,
            "agent_id": agent.id,
            "source_workspace_id": src.id,
            "source_seq": source_seq,
            "target_workspace_id": dst_id,
            "target_folder": target_folder,
            "paths": list(request.paths),
            "options": options,
            "state": "running" if holds else "queued",
            "files_total": len(files),
            "bytes_total": sum(int(f["size"]) for f in files if f["kind"] == "file"),
            "files_copied": 0,
            "files_unchanged": 0,
            "files_skipped": 0,
            "files_failed": 0,
            "bytes_done": 0,
            "bytes_sent": 0,
            "batches": 0,
            "cancel_requested": False,
            "created_at": time.time(),
            "started_at": time.time() if holds else None,
        }
        try:
            row = await self.store.create_transfer(values, files)
        except BaseException:
            if holds:
                await self.access.release_writer(dst_id, transfer_id)
            await self._release(transfer_id)
            raise
        self._cancel[transfer_id] = cancel
        self._launch(transfer_id)
        return self._view(row)

    def _launch(self, transfer_id: str) -> None:
        if self._closing or transfer_id in self._tasks:
            return
        self._cancel.setdefault(transfer_id, asyncio.Event())
        task = asyncio.create_task(self._run(transfer_id), name=f"transfer-{transfer_id}")
        self._tasks[transfer_id] = task
        # Only this task's entry: after a lost lease a later adoption may have a new one.
        task.add_done_callback(
            lambda t: self._tasks.pop(transfer_id) if self._tasks.get(transfer_id) is t else None
        )

    # ------------------------------------------------------------------ the copy

    async def _run(self, transfer_id: str) -> None:
        row = await self.store.get_transfer(transfer_id)
        if row is None or row.state in TERMINAL_TRANSFER_STATES:
            await self._release(transfer_id)  # an adopted lease of work already done
            return
        if not await self._lease_for(row):
            self._cancel.pop(transfer_id, None)
            return  # another live replica copies it
        cancel = self._cancel[transfer_id]
        if row.cancel_requested:
            cancel.set()
        target = row.target_workspace_id
        try:
            if not await self.access.take_writer(
                target, "transfer", transfer_id, queue=True, cancelled=cancel
            ):
                await self._finish(row, "cancelled", None)
                return
            if row.state == "queued":
                await self.store.update_transfer(
                    transfer_id, state="running", started_at=time.time()
                )
            error = await self._copy(row, cancel)
            await self._finish(row, "cancelled" if cancel.is_set() else None, error)
        except Fenced as stop:
            # Not this replica's to finish: the transfer's end (or its new holder) has it.
            log.warning("transfer %s: stopped copying here: %s", transfer_id, stop)
            self._cancel.pop(transfer_id, None)
            await self._release(transfer_id)  # only a lease still ours (a record ended by hand)
            self._wake_waiters(transfer_id)
        except asyncio.CancelledError:
            # The control plane is closing (the transfer resumes on the next start, or on
            # the replica that takes the lease over), or another replica took the lease.
            raise
        except Exception as exc:
            log.exception("transfer %s failed", transfer_id)
            await self._finish(row, None, f"{type(exc).__name__}: {exc}")
        finally:
            self.batches.in_flight.pop(transfer_id, None)

    async def _copy(self, row: Transfer, cancel: asyncio.Event) -> str | None:
        """Copy the pending files batch by batch; the error that stopped it, if any."""
        transfer_id = row.id
        options = row.options
        batch_files = int(options.get("batch_files") or DEFAULT_BATCH_FILES)
        batch_bytes = int(options.get("batch_bytes") or DEFAULT_BATCH_BYTES)
        rate = options.get("max_bytes_per_s")
        src = await self.store.get_workspace(row.source_workspace_id)
        dst = await self.store.get_workspace(row.target_workspace_id)
        assert src is not None and dst is not None
        src_runner = self.access.runners.get(src.runner_id)
        dst_runner = self.access.runners.get(dst.runner_id)
        await self.access.ensure(dst)
        started = time.monotonic()
        moved = 0
        after = -1
        rows: list[TransferFile] = []
        # a batch's outcomes are recorded while the runner copies the next batch
        recording: asyncio.Future[Transfer | None] | None = None
        # Replicas: every batch is fenced by this replica's lease, right before it is applied
        # to the target and again when its outcomes are recorded (docs/files-and-transfers.md,
        # "Transfers across replicas: fenced batches").
        holder = self.leases.replica_id if self.leases.shared else None

        async def fence() -> None:
            if holder is not None:
                found = await self.store.hold_transfer(transfer_id, holder, self.leases.ttl_s)
                if found != HELD:
                    raise Fenced(_FENCED[found])

        async def recorded(done: asyncio.Future[Transfer | None]) -> None:
            if await done is None:
                raise Fenced(_FENCED_RECORD)

        try:
            while not cancel.is_set():
                if not rows:  # pending rows come a page at a time, several batches' worth
                    rows = await self.store.pending_files(
                        transfer_id, after, max(batch_files, _PAGE_ROWS)
                    )
                    if not rows:
                        return None
                if await self._cancel_recorded(transfer_id, cancel):
                    return None
                batch: list[TransferFile] = []
                size = 0
                for r in rows[:batch_files]:
                    if batch and size + r.size > batch_bytes:
                        break
                    batch.append(r)
                    size += r.size if r.kind == "file" else 0
                rows = rows[len(batch) :]
                after = batch[-1].idx
                work = asyncio.ensure_future(
                    self.batches.tried(
                        Batch(
                            transfer_id=transfer_id,
                            rows=tuple(batch),
                            src_runner=src_runner,
                            dst_runner=dst_runner,
                            dst_ws=dst.id,
                            cancel=cancel,
                            fence=fence,
                        )
                    )
                )
                try:
                    if recording is not None:
                        previous, recording = recording, None
                        await recorded(previous)
                    outcomes, snapshot, sent = await work
                except Cancelled:
                    return None
                except ShellyardError as exc:
                    if cancel.is_set():
                        return None
                    reason = f"the batch could not be copied: {exc.message}"
                    failed: list[Outcome] = [(r.idx, "failed", reason, None) for r in batch]
                    if (
                        await self.store.record_outcomes(transfer_id, failed, None, holder=holder)
                        is None
                    ):
                        raise Fenced(_FENCED_RECORD) from exc
                    return exc.message
                finally:
                    if not work.done():
                        work.cancel()
                        with contextlib.suppress(BaseException):
                            await work
                    self.batches.in_flight[transfer_id] = 0
                sizes = {r.idx: r.size for r in batch}
                done = sum(sizes[i] for i, o, _r, _s in outcomes if o in ("copied", "unchanged"))
                recording = asyncio.ensure_future(
                    self.store.record_outcomes(
                        transfer_id, outcomes, snapshot, sent, done, holder=holder
                    )
                )
                moved += size
                if rate:
                    lag = moved / float(rate) - (time.monotonic() - started)
                    if lag > 0:
                        with contextlib.suppress(TimeoutError):
                            await asyncio.wait_for(cancel.wait(), lag)
            return None
        finally:
            if recording is not None:
                await recorded(recording)

    async def _cancel_recorded(self, transfer_id: str, cancel: asyncio.Event) -> bool:
        """A cancel asked on another replica whose fan-out message was lost, or the transfer
        made final there (this replica stalled past its lease, another took it over and
        ended it): the record says so, read once per batch (only with replicas; one process
        sets ``cancel`` itself). A final one stops the copy (``Fenced``) before its next
        batch reaches the target, whose writer its end released (W1)."""
        if not self.leases.shared:
            return cancel.is_set()
        row = await self.store.get_transfer(transfer_id)
        if row is None or row.state in TERMINAL_TRANSFER_STATES:
            raise Fenced(_FENCED[ENDED])
        if row.cancel_requested:
            cancel.set()
        return cancel.is_set()

    async def _finish(self, row: Transfer, forced: str | None, error: str | None) -> None:
        transfer_id = row.id
        fresh = await self.store.get_transfer(transfer_id)
        assert fresh is not None
        done = fresh.files_copied + fresh.files_unchanged
        if forced is not None:
            state = forced
        elif error is not None or fresh.files_failed:
            state = "partial" if done else "failed"
        else:
            state = "completed"
        reason = (
            "the transfer was cancelled before this file was copied"
            if state == "cancelled"
            else f"not copied: the transfer stopped ({error})"
        )
        # The lease goes in the transaction that makes it final: a wait woken by it (or a
        # replica reading it) never finds a finished transfer still leased.
        final = await self.store.finish_transfer(
            transfer_id, state, error, reason, self.leases.letting_go(TRANSFER, transfer_id)
        )
        self._cancel.pop(transfer_id, None)
        await self.access.writer_released(row.target_workspace_id)
        self._publish(transfer_id)
        if final is None:
            return
        if state != "cancelled":  # the owner asked for a cancel: it knows (N3's spirit)
            summary = (
                f"transfer {transfer_id} {state}: {final.files_copied} copied, "
                f"{final.files_unchanged} unchanged, {final.files_skipped} skipped, "
                f"{final.files_failed} failed into workspace {final.target_workspace_id}"
                + (f" (snapshot {final.target_seq})" if final.target_seq is not None else "")
            )
            await self.store.add_notice(final.agent_id, "transfer", transfer_id, summary)

    # ------------------------------------------------------------------ T3

    async def _owned(self, transfer_id: str, agent_id: str | None) -> Transfer:
        agent = await self.access.agent(agent_id)
        row = await self.store.get_transfer(transfer_id)
        if row is None or row.agent_id != agent.id:
            raise NotFound(
                f"no transfer {transfer_id!r}; list yours with workspace_transfer action 'list'"
            )
        return row

    async def query(self, transfer_id: str, agent_id: str | None = None) -> TransferView:
        return self._view(await self._owned(transfer_id, agent_id))

    async def list(
        self, request: TransferListQuery, agent_id: str | None = None
    ) -> list[TransferView]:
        agent = await self.access.agent(agent_id)
        rows = await self.store.list_transfers(agent.id, request.limit)
        return [self._view(r) for r in rows]

    async def files(
        self, transfer_id: str, request: TransferFilesQuery, agent_id: str | None = None
    ) -> TransferFilesView:
        outcome, offset, limit = request.outcome, request.offset, request.limit
        if outcome not in (None, "pending", "copied", "unchanged", "skipped", "failed"):
            raise InvalidInput(
                f"outcome must be one of pending, copied, unchanged, skipped, failed; not "
                f"{outcome!r}"
            )
        if offset < 0 or not 1 <= limit <= MAX_PAGE:
            raise InvalidInput(f"offset must be 0 or more and limit between 1 and {MAX_PAGE}")
        await self._owned(transfer_id, agent_id)
        rows = await self.store.transfer_files(transfer_id, outcome, offset, limit + 1)
        views = [_file_view(r) for r in rows[:limit]]
        return TransferFilesView(
            transfer_id=transfer_id,
            files=views,
            next_offset=offset + limit if len(rows) > limit else None,
        )

    async def wait(
        self, transfer_id: str, request: TransferWait, agent_id: str | None = None
    ) -> TransferView:
        """The transfer once it is terminal, or as it is when ``timeout_s`` runs out."""
        row = await self._owned(transfer_id, agent_id)
        deadline = time.monotonic() + request.timeout_s
        while row.state not in TERMINAL_TRANSFER_STATES:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            task = self._tasks.get(transfer_id)
            if task is not None:
                with contextlib.suppress(TimeoutError, asyncio.CancelledError):
                    await asyncio.wait_for(asyncio.shield(task), left)
            else:
                # Copied by another replica (or about to be adopted): its end arrives by the
                # fan-out, or this re-read finds it.
                event = self._changed.setdefault(transfer_id, asyncio.Event())
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(event.wait(), min(left, _FOREIGN_POLL_S))
            row = await self._owned(transfer_id, agent_id)
        return self._view(row)

    async def cancel(
        self, transfer_id: str, request: TransferCancelQuery, agent_id: str | None = None
    ) -> TransferView:
        """Stop after the batch being copied; every committed file stays (T3)."""
        row = await self._owned(transfer_id, agent_id)
        if row.state in TERMINAL_TRANSFER_STATES:
            return self._view(row)
        await self.store.update_transfer(transfer_id, cancel_requested=True)
        event = self._cancel.get(transfer_id)
        if event is not None:
            event.set()
        if transfer_id not in self._tasks:
            if await self._lease_for(row):
                await self._finish(row, "cancelled", None)  # nobody copies it: end it here
            else:
                self.on_signal(transfer_id)  # the replica copying it stops after its batch
        if request.wait_s > 0:
            return await self.wait(transfer_id, TransferWait(timeout_s=request.wait_s), agent_id)
        return await self.query(transfer_id, agent_id)

    def _view(self, row: Transfer) -> TransferView:
        # D3: the view is the record's shared fields, plus its id under the view's name and
        # what only this replica knows (the batch in flight).
        return TransferView.model_validate(
            {
                **values_of(row, _TRANSFER_VIEW_FIELDS),
                "transfer_id": row.id,
                "bytes_in_flight": self.batches.in_flight.get(row.id, 0),
            }
        )


__all__ = ["TransferService"]
