"""Workspace files and snapshot history (W1–W6) for the doors, through the Runner
protocol only: reads come from committed snapshots (W2); edits, uploads, deletes, moves and
restores are writer operations (W1) that end with a commit recorded with what made it (W3, W5).
Retention prunes old snapshots and collects unreferenced objects."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Literal

from shellyard.config import RetentionSettings
from shellyard.contract.files import (
    MAX_TEXT_READ,
    EditView,
    FileDiffQuery,
    FileHistoryQuery,
    FileListQuery,
    FileReadTextQuery,
    FileStatQuery,
    FileText,
    HistoryView,
    RetentionView,
    SnapshotView,
    WorkspaceView,
)
from shellyard.control.executions.output import safe_decode
from shellyard.control.files.access import WorkspaceAccess
from shellyard.errors import InvalidInput, NotFound, RunnerUnavailable, ShellyardError
from shellyard.runner.protocol import (
    ByteStream,
    DiffResult,
    DirListing,
    EditResult,
    GcResult,
    PathEntry,
    PruneResult,
    Runner,
)
from shellyard.store import Store
from shellyard.store.db import new_id
from shellyard.store.workspaces import Workspace

log = logging.getLogger(__name__)

#: How long a queued file operation waits for the writer before it is refused.
DEFAULT_QUEUE_WAIT_S = 60.0


@dataclass
class FileStream:
    """An open read of one file of a snapshot: its entry, the snapshot, and its bytes."""

    workspace_id: str
    seq: int
    entry: PathEntry
    offset: int
    length: int
    chunks: ByteStream


@dataclass
class ArchiveStream:
    workspace_id: str
    seq: int
    path: str
    chunks: ByteStream


class FileService:
    def __init__(
        self,
        store: Store,
        access: WorkspaceAccess,
        retention: RetentionSettings,
    ) -> None:
        self.store = store
        self.access = access
        self.retention = retention
        self._retention_task: asyncio.Task[None] | None = None

    # ------------------------------------------------------------------ lifecycle

    async def startup(self) -> None:
        if self.retention.interval_s > 0:
            self._retention_task = asyncio.create_task(self._retention_loop())

    async def aclose(self) -> None:
        if self._retention_task is not None:
            self._retention_task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._retention_task

    async def _retention_loop(self) -> None:
        while True:
            await asyncio.sleep(self.retention.interval_s)
            try:
                await self.collect()
            except Exception:
                log.exception("retention pass failed")

    # ------------------------------------------------------------------ reads (W2)

    async def workspaces(self, agent_id: str | None = None) -> list[WorkspaceView]:
        return await self.access.discover(await self.access.agent(agent_id))

    async def _target(
        self,
        agent_id: str | None,
        workspace_id: str | None,
        runner_id: str | None,
        use: Literal["read", "write"] = "read",
    ) -> tuple[Workspace, Runner]:
        agent = await self.access.agent(agent_id)
        row, _relation, runner = await self.access.workspace(agent, workspace_id, runner_id, use)
        return row, runner

    async def list(self, request: FileListQuery, agent_id: str | None = None) -> DirListing:
        row, runner = await self._target(agent_id, request.workspace_id, request.runner_id)
        return await runner.list_dir(
            row.id, request.seq, request.path, request.recursive, request.after, request.limit
        )

    async def stat(self, request: FileStatQuery, agent_id: str | None = None) -> PathEntry:
        path, seq = request.path, request.seq
        row, runner = await self._target(agent_id, request.workspace_id, request.runner_id)
        entry = await runner.stat_path(row.id, seq, path)
        if entry is None:
            where = "the head" if seq is None else f"snapshot {seq}"
            raise NotFound(
                f"no {path!r} in {where} of workspace {row.id}; list the folder to see what "
                f"it holds",
                path=path,
            )
        return entry

    async def open(
        self,
        path: str,
        *,
        workspace_id: str | None = None,
        runner_id: str | None = None,
        seq: int | None = None,
        offset: int = 0,
        length: int | None = None,
        agent_id: str | None = None,
    ) -> FileStream:
        """Stream a file of a committed snapshot (the head when ``seq`` is None), from
        ``offset``, ``length`` bytes (None: to the end). The snapshot is fixed first, so the
        whole read comes from one committed version, whatever commits meanwhile (W2)."""
        if offset < 0 or (length is not None and length < 0):
            raise InvalidInput(f"offset ({offset}) and length ({length}) must be zero or more")
        row, runner = await self._target(agent_id, workspace_id, runner_id)
        ws = row.id
        if seq is None:
            seq = (await runner.head(ws)).seq
        entry = await runner.stat_path(ws, seq, path)
        if entry is None:
            raise NotFound(
                f"no file {path!r} in snapshot {seq} of workspace {ws}; list the folder to see "
                f"what it holds",
                path=path,
            )
        chunks = await runner.read_stream(ws, seq, path, offset, length)
        start = min(offset, entry.size)
        end = entry.size if length is None else min(entry.size, start + length)
        return FileStream(ws, seq, entry, start, end - start, chunks)

    async def read_text(self, request: FileReadTextQuery, agent_id: str | None = None) -> FileText:
        """Up to ``limit`` bytes as text (UTF-8, never split inside a character) or base64
        when the bytes are not text. Page on with ``next_offset``."""
        limit = request.limit
        if not 0 < limit <= MAX_TEXT_READ:
            raise InvalidInput(f"limit must be between 1 and {MAX_TEXT_READ} bytes, not {limit}")
        stream = await self.open(
            request.path,
            workspace_id=request.workspace_id,
            runner_id=request.runner_id,
            seq=request.seq,
            offset=request.offset,
            length=limit,
            agent_id=agent_id,
        )
        data = b"".join([chunk async for chunk in stream.chunks])
        used = safe_decode(data)[1]
        encoding: Literal["utf-8", "base64"] = "utf-8"
        try:
            text = data[:used].decode("utf-8")
            if used == 0 and data:
                raise UnicodeDecodeError("utf-8", data, 0, len(data), "a lone partial character")
        except UnicodeDecodeError:
            text, used, encoding = base64.b64encode(data).decode(), len(data), "base64"
        next_offset = stream.offset + used
        return FileText(
            workspace_id=stream.workspace_id,
            seq=stream.seq,
            path=stream.entry.path,
            size=stream.entry.size,
            offset=stream.offset,
            next_offset=next_offset,
            encoding=encoding,
            data=text,
            complete=next_offset >= stream.entry.size,
            sha256=stream.entry.sha256,
            content_id=stream.entry.content_id,
        )

    async def archive(
        self,
        path: str = "",
        *,
        workspace_id: str | None = None,
        runner_id: str | None = None,
        seq: int | None = None,
        agent_id: str | None = None,
    ) -> ArchiveStream:
        """A folder (or file) of a committed snapshot as a tar stream."""
        row, runner = await self._target(agent_id, workspace_id, runner_id)
        ws = row.id
        if seq is None:
            seq = (await runner.head(ws)).seq
        return ArchiveStream(ws, seq, path, await runner.export_tar(ws, seq, path))

    async def history(self, request: FileHistoryQuery, agent_id: str | None = None) -> HistoryView:
        """W5: every snapshot with what made it; pruned ones are listed, marked."""
        row, runner = await self._target(agent_id, request.workspace_id, request.runner_id)
        ws = row.id
        retained = {s.seq: s for s in await runner.list_snapshots(ws)}
        recorded = {r.seq: r for r in await self.store.snapshot_rows(ws)}
        views: list[SnapshotView] = []
        for seq in sorted(set(retained) | set(recorded) | {0}):
            info, rec = retained.get(seq), recorded.get(seq)
            kind = "created" if seq == 0 else "unknown"
            views.append(
                SnapshotView(
                    seq=seq,
                    root_hash=info.root_hash if info else rec.root_hash if rec else None,
                    files=info.files if info else rec.files if rec else None,
                    bytes=info.bytes if info else rec.bytes if rec else None,
                    created_at=info.created_at if info else rec.created_at if rec else None,
                    made_by_kind=rec.made_by_kind if rec else kind,
                    made_by_id=rec.made_by_id if rec else None,
                    retained=info is not None,
                )
            )
        head = max(retained) if retained else row.head_seq
        return HistoryView(workspace_id=ws, runner_id=row.runner_id, head_seq=head, snapshots=views)

    async def diff(self, request: FileDiffQuery, agent_id: str | None = None) -> DiffResult:
        row, runner = await self._target(agent_id, request.workspace_id, request.runner_id)
        return await runner.diff(
            row.id, request.from_seq, request.to_seq, request.path, request.after, request.limit
        )

    # ------------------------------------------------------------------ writer operations

    async def _writer_op(
        self,
        agent_id: str | None,
        workspace_id: str | None,
        runner_id: str | None,
        kind: Literal["edit", "restore"],
        queue: bool,
        wait_s: float | None,
        operation: Callable[[Runner, str], Awaitable[EditResult]],
    ) -> EditView:
        """W1: take the writer (refused naming the holder, or queued), run the operation on
        the runner (it ends with a commit), record the snapshot with what made it (W3, W5),
        release the writer."""
        row, runner = await self._target(agent_id, workspace_id, runner_id, "write")
        ws = row.id
        op_id = new_id("ed" if kind == "edit" else "rs")
        timeout_s = DEFAULT_QUEUE_WAIT_S if wait_s is None else wait_s
        await self.access.take_writer(ws, kind, op_id, queue=queue, timeout_s=timeout_s)
        try:
            result = await operation(runner, ws)
            snap = result.snapshot
            if snap.new:
                await self.store.record_snapshot(
                    ws, snap.seq, snap.root_hash, snap.files, snap.bytes, kind, op_id
                )
        finally:
            await self.access.release_writer(ws, op_id)
        return EditView(
            workspace_id=ws,
            operation_id=op_id,
            kind=kind,
            snapshot_seq=snap.seq,
            new_snapshot=snap.new,
            written=result.written,
            removed=result.removed,
        )

    async def write(
        self,
        path: str,
        data: ByteStream | bytes,
        *,
        workspace_id: str | None = None,
        runner_id: str | None = None,
        mode: int | None = None,
        queue: bool = False,
        wait_s: float | None = None,
        agent_id: str | None = None,
    ) -> EditView:
        """Write or replace a file (streamed, any size): a writer operation ending with a
        commit. ``mode`` (e.g. 0o755) defaults to the replaced file's, else 0o644."""
        if mode is not None and not 0 <= mode <= 0o777:
            raise InvalidInput(f"mode must be permission bits between 0 and 0o777, not {mode!r}")
        stream = _as_stream(data)
        return await self._writer_op(
            agent_id,
            workspace_id,
            runner_id,
            "edit",
            queue,
            wait_s,
            lambda runner, ws: runner.write_file(ws, path, stream, mode),
        )

    async def upload_archive(
        self,
        data: ByteStream | bytes,
        path: str = "",
        *,
        workspace_id: str | None = None,
        runner_id: str | None = None,
        queue: bool = False,
        wait_s: float | None = None,
        agent_id: str | None = None,
    ) -> EditView:
        """Unpack a tar stream below ``path`` (a folder upload): all or nothing."""
        stream = _as_stream(data)
        return await self._writer_op(
            agent_id,
            workspace_id,
            runner_id,
            "edit",
            queue,
            wait_s,
            lambda runner, ws: runner.write_tar(ws, path, stream),
        )

    async def delete(
        self,
        path: str,
        *,
        recursive: bool = False,
        workspace_id: str | None = None,
        runner_id: str | None = None,
        queue: bool = False,
        wait_s: float | None = None,
        agent_id: str | None = None,
    ) -> EditView:
        return await self._writer_op(
            agent_id,
            workspace_id,
            runner_id,
            "edit",
            queue,
            wait_s,
            lambda runner, ws: runner.delete_path(ws, path, recursive),
        )

    async def move(
        self,
        source: str,
        destination: str,
        *,
        overwrite: bool = False,
        workspace_id: str | None = None,
        runner_id: str | None = None,
        queue: bool = False,
        wait_s: float | None = None,
        agent_id: str | None = None,
    ) -> EditView:
        return await self._writer_op(
            agent_id,
            workspace_id,
            runner_id,
            "edit",
            queue,
            wait_s,
            lambda runner, ws: runner.move_path(ws, source, destination, overwrite),
        )

    async def restore(
        self,
        seq: int,
        path: str = "",
        *,
        workspace_id: str | None = None,
        runner_id: str | None = None,
        queue: bool = False,
        wait_s: float | None = None,
        agent_id: str | None = None,
    ) -> EditView:
        """W5: make the workspace (or ``path`` in it) what it was in snapshot ``seq``. A
        writer operation that makes a new snapshot; history keeps every snapshot."""
        if isinstance(seq, bool) or not isinstance(seq, int) or seq < 0:
            raise InvalidInput(f"seq must be a snapshot number (0 or more), not {seq!r}")
        return await self._writer_op(
            agent_id,
            workspace_id,
            runner_id,
            "restore",
            queue,
            wait_s,
            lambda runner, ws: runner.restore(ws, seq, path),
        )

    # ------------------------------------------------------------------ retention

    async def collect(
        self, keep_last: int | None = None, grace_s: float | None = None
    ) -> RetentionView:
        """Prune every workspace's snapshots beyond its last ``keep_last`` that no record
        names, then delete objects no retained snapshot names (older than ``grace_s``), on
        every runner. Safe while readers and writers run (see runner/snapshots/objects.py)."""
        keep_last = self.retention.keep_last if keep_last is None else keep_last
        grace_s = self.retention.grace_s if grace_s is None else grace_s
        if keep_last < 1:
            raise InvalidInput(
                f"keep_last must be 1 or more (the head is always kept), not {keep_last}"
            )
        if grace_s < 0:
            raise InvalidInput(f"grace_s must be zero or more, not {grace_s}")
        pruned: list[PruneResult] = []
        collected: dict[str, GcResult] = {}
        errors: dict[str, str] = {}
        for row in await self.store.all_workspaces():
            ws, runner_id = row.id, row.runner_id
            if runner_id in errors:
                continue
            try:
                runner = self.access.runners.get(runner_id)
                seqs = sorted(s.seq for s in await runner.list_snapshots(ws))
            except NotFound:
                continue  # never created on the runner
            except RunnerUnavailable as exc:
                errors[runner_id] = exc.message
                continue
            keep = set(seqs[-keep_last:]) | await self.store.referenced_seqs(ws)
            if set(seqs) <= keep:
                continue
            try:
                result = await runner.prune_snapshots(ws, sorted(keep))
            except ShellyardError as exc:
                errors[runner_id] = exc.message
                continue
            await self.store.mark_snapshots_pruned(ws, result.removed)
            pruned.append(result)
        for runner_id in self.access.runners.ids():
            if runner_id in errors:
                continue
            try:
                collected[runner_id] = await self.access.runners.get(runner_id).collect_garbage(
                    grace_s
                )
            except ShellyardError as exc:
                errors[runner_id] = exc.message
        return RetentionView(keep_last=keep_last, pruned=pruned, collected=collected, errors=errors)


def _as_stream(data: ByteStream | bytes) -> ByteStream:
    if isinstance(data, bytes | bytearray | memoryview):
        payload = bytes(data)

        async def once() -> AsyncIterator[bytes]:
            for start in range(0, len(payload), 1 << 20):
                yield payload[start : start + (1 << 20)]

        return once()
    return data


__all__ = ["ArchiveStream", "FileService", "FileStream"]
