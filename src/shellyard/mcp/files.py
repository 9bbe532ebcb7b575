"""MCP tools of workspace files, snapshot history, transfers and artifacts: the contract's
``workspace_transfer`` (actions ``discover``, ``start``, ``list``, ``query``, ``cancel``) and
``file_list``, ``file_read``, ``file_write``, ``file_delete``, ``file_move``,
``snapshot_list``, ``snapshot_diff``, ``snapshot_restore``, ``artifact_declare``,
``artifact_list``. ``build_server`` adds them when its backend can serve them."""

from __future__ import annotations

import base64
import binascii
from typing import Any

from mcp.server.mcpserver import Context
from mcp.server.mcpserver.exceptions import ToolError
from mcp.server.mcpserver.tools import Tool
from pydantic import BaseModel

from shellyard.contract.files import (
    AGENT_LIST_LIMIT,
    MAX_TRANSFER_PAGE,
    TRANSFER_ACTIONS,
    ArtifactDeclareRequest,
    ArtifactView,
    DiffResult,
    DirListing,
    EditView,
    FileDeleteRequest,
    FileListRequest,
    FileMoveRequest,
    FileReadRequest,
    FileText,
    FileWriteRequest,
    HistoryView,
    SnapshotDiffRequest,
    SnapshotListRequest,
    SnapshotRestoreRequest,
    TransferFileView,
    TransferView,
    WorkspaceTransferRequest,
    WorkspaceView,
)
from shellyard.mcp.common import READ, hints, model_tool
from shellyard.sdk.client import AsyncClient


class WorkspaceList(BaseModel):
    workspaces: list[WorkspaceView]


class TransferList(BaseModel):
    transfers: list[TransferView]


class TransferQuery(TransferView):
    files: list[TransferFileView]
    files_next_offset: int | None


class ArtifactList(BaseModel):
    artifacts: list[ArtifactView]


def _need(value: Any, name: str, action: str) -> Any:
    if value is None or value == [] or value == "":
        raise ToolError(f"invalid_input: action '{action}' needs {name}")
    return value


def _page(limit: int) -> int:
    return max(1, min(limit, MAX_TRANSFER_PAGE))


def _where(request: Any) -> dict[str, Any]:
    where = {"workspace_id": request.workspace_id, "runner_id": request.runner_id}
    where["queue"] = request.queue
    if request.wait_s is not None:
        where["wait_s"] = request.wait_s
    return where


async def transfer(backend: AsyncClient, request: WorkspaceTransferRequest) -> dict[str, Any]:
    """One workspace_transfer call (the tasks extension calls it for 'start' too)."""
    action = request.action
    if action not in TRANSFER_ACTIONS:
        raise ToolError(
            f"invalid_input: action must be one of {', '.join(TRANSFER_ACTIONS)}, not {action!r}"
        )
    if action == "discover":
        views = await backend.workspaces()
        return {"workspaces": [v.model_dump(mode="json") for v in views]}
    if action == "start":
        options = {
            k: v
            for k, v in (("batch_files", request.batch_files), ("batch_bytes", request.batch_bytes))
            if v is not None
        }
        started = await backend.transfer_start(
            _need(request.source_workspace_id, "source_workspace_id", action),
            _need(request.paths, "paths (a list of files, folders or globs)", action),
            _need(request.target_workspace_id, "target_workspace_id", action),
            request.target_folder,
            queue=request.queue,
            **options,
        )
        return started.model_dump(mode="json")
    if action == "list":
        listed = await backend.transfers(_page(request.limit))
        return {"transfers": [v.model_dump(mode="json") for v in listed]}
    tid = _need(request.transfer_id, "transfer_id", action)
    if action == "cancel":
        return (await backend.transfer_cancel(tid, request.wait_s)).model_dump(mode="json")
    view = (await backend.transfer(tid)).model_dump(mode="json")
    files = await backend.transfer_files(tid, request.outcome, request.offset, _page(request.limit))
    view["files"] = [f.model_dump(mode="json") for f in files.files]
    view["files_next_offset"] = files.next_offset
    return view


def file_tools(backend: AsyncClient) -> list[Tool]:
    async def workspace_transfer(request: WorkspaceTransferRequest, ctx: Context) -> dict[str, Any]:
        return await transfer(backend, request)

    async def file_list(request: FileListRequest, ctx: Context) -> dict[str, Any]:
        listing = await backend.list_files(
            request.path,
            workspace_id=request.workspace_id,
            runner_id=request.runner_id,
            seq=request.seq,
            recursive=request.recursive,
            after=request.after,
            limit=request.limit,
        )
        return listing.model_dump(mode="json")

    async def file_read(request: FileReadRequest, ctx: Context) -> dict[str, Any]:
        text = await backend.read_text(
            request.path,
            workspace_id=request.workspace_id,
            runner_id=request.runner_id,
            seq=request.seq,
            offset=request.offset,
            limit=request.limit,
        )
        return text.model_dump(mode="json")

    async def file_write(request: FileWriteRequest, ctx: Context) -> dict[str, Any]:
        encoding = request.encoding
        if encoding not in ("utf-8", "base64"):
            raise ToolError(
                f"invalid_input: encoding must be 'utf-8' or 'base64', not {encoding!r}"
            )
        try:
            data = (
                base64.b64decode(request.content, validate=True)
                if encoding == "base64"
                else request.content.encode("utf-8")
            )
        except (binascii.Error, UnicodeEncodeError) as exc:
            raise ToolError(f"invalid_input: content is not valid {encoding}: {exc}") from None
        edit = await backend.write_file(
            request.path,
            data,
            workspace_id=request.workspace_id,
            runner_id=request.runner_id,
            mode=request.mode,
            queue=request.queue,
        )
        return edit.model_dump(mode="json")

    async def file_delete(request: FileDeleteRequest, ctx: Context) -> dict[str, Any]:
        edit = await backend.delete(request.path, recursive=request.recursive, **_where(request))
        return edit.model_dump(mode="json")

    async def file_move(request: FileMoveRequest, ctx: Context) -> dict[str, Any]:
        moved = await backend.move(
            request.source, request.destination, overwrite=request.overwrite, **_where(request)
        )
        return moved.model_dump(mode="json")

    async def snapshot_list(request: SnapshotListRequest, ctx: Context) -> dict[str, Any]:
        history = await backend.history(
            workspace_id=request.workspace_id, runner_id=request.runner_id
        )
        return history.model_dump(mode="json")

    async def snapshot_diff(request: SnapshotDiffRequest, ctx: Context) -> dict[str, Any]:
        diff = await backend.diff(
            request.from_seq,
            request.to_seq,
            request.path,
            workspace_id=request.workspace_id,
            runner_id=request.runner_id,
            after=request.after,
            limit=request.limit,
        )
        return diff.model_dump(mode="json")

    async def snapshot_restore(request: SnapshotRestoreRequest, ctx: Context) -> dict[str, Any]:
        edit = await backend.restore(request.seq, request.path, **_where(request))
        return edit.model_dump(mode="json")

    async def artifact_declare(request: ArtifactDeclareRequest, ctx: Context) -> dict[str, Any]:
        art = await backend.artifact_declare(
            request.path, request.name, workspace_id=request.workspace_id, seq=request.seq
        )
        return art.model_dump(mode="json")

    async def artifact_list(request: None, ctx: Context) -> dict[str, Any]:
        listed = await backend.artifacts()
        return {"artifacts": [a.model_dump(mode="json") for a in listed]}

    writer = hints()
    tools = [
        model_tool(
            "workspace_transfer",
            WorkspaceTransferRequest,
            workspace_transfer,
            title="Copy files between workspaces",
            description=(
                "Copy files between workspaces you may use: yours on every runner, your "
                "parent's and children's. action: 'discover' lists their ids; 'start' copies "
                "paths (files, folders, globs like 'src/**/*.py') of source_workspace_id's last "
                "snapshot into target_folder of target_workspace_id and returns transfer_id at "
                "once; 'list'; 'query' one (state, progress, per-file outcomes: copied, "
                "unchanged, skipped, failed; outcome= filters); 'cancel' after the batch in "
                "flight (committed files stay). A notice tells the end."
            ),
            # 'start' writes into the target (never deletes: files already there stay).
            annotations=writer,
        ),
        model_tool(
            "file_list",
            FileListRequest,
            file_list,
            title="List files",
            description=(
                "List a folder of your workspace (or a workspace_id from workspace_transfer "
                "discover) as committed: the latest snapshot, or seq. recursive=true lists "
                "everything below; page on with after=next_after. Entries: path, kind (file, "
                "dir, symlink), size, mode, sha256 (null if unknown), content_id, link target."
            ),
            annotations=READ,
            output=DirListing,
            defaults={"limit": AGENT_LIST_LIMIT},
        ),
        model_tool(
            "file_read",
            FileReadRequest,
            file_read,
            title="Read a file",
            description=(
                "Read a file of a committed snapshot (latest, or seq): up to limit bytes from "
                "offset, as UTF-8 text (or base64 when it is not text). Continue from "
                "next_offset until complete. A running command's unfinished writes are never "
                "visible."
            ),
            annotations=READ,
            output=FileText,
        ),
        model_tool(
            "file_write",
            FileWriteRequest,
            file_write,
            title="Write a file",
            description=(
                "Write (create or replace) a file of your workspace with content (encoding "
                "'utf-8' or 'base64'), making folders on the way. Takes the writer like a "
                "command: refused while one runs unless queue=true. Ends with a new snapshot."
            ),
            # Writing the same content twice leaves the same files (a second snapshot at most).
            annotations=hints(idempotent=True),
            output=EditView,
        ),
        model_tool(
            "file_delete",
            FileDeleteRequest,
            file_delete,
            title="Delete a file",
            description=(
                "Delete a file or link (a folder needs recursive=true) in your workspace; a "
                "writer operation ending with a snapshot. History keeps the old snapshots."
            ),
            annotations=hints(destructive=True, idempotent=True),
            output=EditView,
        ),
        model_tool(
            "file_move",
            FileMoveRequest,
            file_move,
            title="Move a file",
            description=(
                "Move or rename a file or folder in your workspace (overwrite=true replaces the "
                "destination); a writer operation ending with a snapshot."
            ),
            annotations=writer,
            output=EditView,
        ),
        model_tool(
            "snapshot_list",
            SnapshotListRequest,
            snapshot_list,
            title="Snapshot history",
            description=(
                "The snapshot history of a workspace: every snapshot (seq) with what made it "
                "(execution, edit, transfer, restore and its id) and whether it is still "
                "retained."
            ),
            annotations=READ,
            output=HistoryView,
        ),
        model_tool(
            "snapshot_diff",
            SnapshotDiffRequest,
            snapshot_diff,
            title="Compare snapshots",
            description=(
                "What changed between two snapshots (to_seq default: the latest), below path: "
                "added, removed and changed entries with their sizes. Page on with after."
            ),
            annotations=READ,
            output=DiffResult,
        ),
        model_tool(
            "snapshot_restore",
            SnapshotRestoreRequest,
            snapshot_restore,
            title="Restore a snapshot",
            description=(
                "Restore your workspace (or just path in it) to snapshot seq. A writer "
                "operation that makes a new snapshot; nothing is deleted from history, so it "
                "can be undone by restoring again."
            ),
            annotations=hints(destructive=True, idempotent=True),
            output=EditView,
        ),
        model_tool(
            "artifact_declare",
            ArtifactDeclareRequest,
            artifact_declare,
            title="Declare an artifact",
            description=(
                "Declare a file as a deliverable artifact: a file of a committed snapshot "
                "(latest, or seq) of your own workspace on the local runner. A file on another "
                "runner must be copied back first with workspace_transfer. Returns name, path, "
                "snapshot, sha256 (the real SHA-256 of its bytes), content_id and size."
            ),
            annotations=hints(idempotent=True),
            output=ArtifactView,
        ),
        model_tool(
            "artifact_list",
            None,
            artifact_list,
            title="List artifacts",
            description=(
                "Your declared artifacts (name, path, snapshot, sha256, content_id, size)."
            ),
            annotations=READ,
            output=ArtifactList,
        ),
    ]
    tools[0].fn_metadata.output_schema = transfer_output_schema()
    return tools


def transfer_output_schema() -> dict[str, Any]:
    """workspace_transfer's outputSchema: one of its actions' results."""
    from pydantic import TypeAdapter

    union = TypeAdapter(WorkspaceList | TransferList | TransferQuery | TransferView)
    schema = union.json_schema(mode="serialization")
    # MCP wants an object at the root: every arm is one.
    return {"type": "object", **schema}


__all__ = ["file_tools", "transfer"]
