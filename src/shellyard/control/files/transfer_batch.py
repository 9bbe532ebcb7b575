"""One batch of a transfer's copy (control/files/transfers.py says how a transfer runs): which
objects the target lacks, the object stream from the source runner into the target runner, and
the entries applied and committed on the target; tried again with backoff while a runner cannot
be reached (R3)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from shellyard.errors import RunnerUnavailable
from shellyard.runner.protocol import ApplyEntry, ByteStream, Runner, pack_version_for
from shellyard.store.files import TransferFile

log = logging.getLogger(__name__)

#: Consecutive tries of one batch while a runner cannot be reached (E9's five failures).
BATCH_ATTEMPTS = 5

#: A batch's outcomes: (file idx, outcome, reason, the target seq that holds it).
Outcome = tuple[int, str, str | None, int | None]


class Cancelled(Exception):
    """Raised inside an object stream to stop it when the transfer is cancelled."""


class Fenced(Exception):
    """The copy stops without finishing the transfer: the transfer was made final elsewhere,
    or another replica holds its lease (this one stalled past it)."""


#: Called right before a batch is applied to the target; raises ``Fenced`` when this copier
#: may no longer publish into it.
Fence = Callable[[], Awaitable[None]]


@dataclass(frozen=True, slots=True)
class Batch:
    """One batch of a transfer and where it goes: built once by the transfer's copy loop and
    handed whole to every try of it (``BatchCopier.tried``, ``copy``)."""

    transfer_id: str
    rows: tuple[TransferFile, ...]
    src_runner: Runner
    dst_runner: Runner
    #: The target workspace (the source's objects are named by content, not by workspace).
    dst_ws: str
    #: Set when the transfer is cancelled: the tries, their backoff and the stream stop.
    cancel: asyncio.Event
    fence: Fence


class BatchCopier:
    """Copies batches for the transfer service; holds what the service's views show of the
    batch in flight (``in_flight``: bytes of its object stream so far, by transfer id)."""

    def __init__(self) -> None:
        self.in_flight: dict[str, int] = {}
        #: First backoff between tries of a batch when a runner cannot be reached (doubles).
        self.retry_base_s = 0.5

    async def tried(self, batch: Batch) -> tuple[list[Outcome], dict[str, Any] | None, int]:
        """``copy``, tried again with backoff while a runner cannot be reached (R3)."""
        transfer_id, cancel = batch.transfer_id, batch.cancel
        attempt = 0
        while True:
            attempt += 1
            try:
                return await self.copy(batch)
            except RunnerUnavailable as exc:
                if attempt == BATCH_ATTEMPTS or cancel.is_set():
                    raise RunnerUnavailable(
                        f"{exc.message} (tried {attempt} times); start the transfer again "
                        "once the runner is back: what is committed counts as unchanged"
                    ) from exc
                log.warning(
                    "transfer %s: batch try %d failed, trying again: %s",
                    transfer_id,
                    attempt,
                    exc.message,
                )
                self.in_flight[transfer_id] = 0
                with contextlib.suppress(TimeoutError):
                    delay = min(30.0, self.retry_base_s * 2 ** (attempt - 1))
                    await asyncio.wait_for(cancel.wait(), delay)
                if cancel.is_set():
                    raise Cancelled from exc

    async def copy(self, batch: Batch) -> tuple[list[Outcome], dict[str, Any] | None, int]:
        """Copy one batch: (outcomes, the target snapshot as a dict, bytes sent between
        runners)."""
        transfer_id, rows, cancel = batch.transfer_id, batch.rows, batch.cancel
        src_runner, dst_runner = batch.src_runner, batch.dst_runner
        shas = list(dict.fromkeys(r.sha256 for r in rows if r.kind == "file" and r.sha256))
        lacking = await dst_runner.missing_objects(shas) if shas else []
        bad: dict[str, str] = {}
        sent = 0
        if lacking:
            # holes stay off the wire when the target reads pack version 2 (a source too
            # old to write it sends version 1, which every target reads)
            pack = await src_runner.export_objects(lacking, pack_version_for(dst_runner))
            try:
                results = await dst_runner.import_objects(self._watch(transfer_id, pack, cancel))
            finally:
                # A target that failed mid-stream leaves the source's stream open otherwise
                # (its HTTP response, or the local store's reader thread).
                close = getattr(pack, "aclose", None)
                if close is not None:
                    with contextlib.suppress(Exception):
                        await close()
            if cancel.is_set():
                raise Cancelled
            # what crossed: the pack's bytes (``_watch`` counts them), not the files' sizes,
            # which a sparse file's extents make far larger
            sent = self.in_flight.get(transfer_id, 0)
            got = {r.sha256: r for r in results}
            for sha in lacking:
                result = got.get(sha)
                if result is None or not result.ok:
                    bad[sha] = (result.error or "failed") if result else "it never arrived"
        if cancel.is_set():
            raise Cancelled
        entries = [
            ApplyEntry.model_construct(  # rows we wrote from a validated plan
                path=r.target_path,
                kind=r.kind,
                mode=r.mode,
                size=r.size,
                sha256=r.sha256,
                target=r.link_target,
            )
            for r in rows
            if not (r.kind == "file" and r.sha256 in bad)
        ]
        outcome_of: dict[str, tuple[str, str | None]] = {}
        snapshot: dict[str, Any] | None = None
        seq: int | None = None
        if entries:
            # The last moment before the batch is published in the target (its apply commits
            # a snapshot): a copier that stalled past its lease, or whose transfer ended
            # elsewhere meanwhile, stops here (the import above can take minutes).
            await batch.fence()
            applied = await dst_runner.apply_entries(batch.dst_ws, entries)
            snapshot = applied.snapshot.model_dump()
            seq = applied.snapshot.seq
            outcome_of = {o.path: (o.outcome, o.reason) for o in applied.outcomes}
        outcomes: list[Outcome] = []
        for r in rows:
            if r.kind == "file" and r.sha256 in bad:
                why = f"could not copy its content from the source: {bad[r.sha256]}"
                outcomes.append((r.idx, "failed", why, None))
                continue
            outcome, reason = outcome_of.get(
                r.target_path, ("failed", "the target runner did not report it")
            )
            committed = outcome in ("copied", "unchanged")
            outcomes.append((r.idx, outcome, reason, seq if committed else None))
        return outcomes, snapshot, sent

    async def _watch(
        self, transfer_id: str, stream: ByteStream, cancel: asyncio.Event
    ) -> AsyncIterator[bytes]:
        """Count the bytes of an object stream (progress) and stop it on cancel."""
        self.in_flight[transfer_id] = 0
        async for chunk in stream:
            if cancel.is_set():
                close = getattr(stream, "aclose", None)
                if close is not None:
                    await close()
                raise Cancelled
            self.in_flight[transfer_id] = self.in_flight.get(transfer_id, 0) + len(chunk)
            yield chunk


__all__ = ["BATCH_ATTEMPTS", "Batch", "BatchCopier", "Cancelled", "Fence", "Fenced", "Outcome"]
