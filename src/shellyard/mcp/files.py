"""MCP tools of workspace files, snapshot history, transfers and artifacts: the contract's
``workspace_transfer`` (actions ``discover``, ``start``, ``list``, ``query``, ``cancel``) and
``file_list``, ``file_read``, ``file_write``, ``file_delete``, ``file_move``,
``snapshot_list``, ``snapshot_diff``, ``snapshot_restore``, ``artifact_declare``,
``artifact_list``. ``build_server`` adds them when its backend can serve them."""

from __future__ import annotations

import base64
import binascii
from collections.abc import AsyncIterable
from typing import Any, Protocol, runtime_checkable

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError

from shellyard.contract.files import (
    ArtifactView,
    DiffResult,
    DirListing,
    EditView,
    FileText,
    HistoryView,
    TransferFilesView,
    TransferView,
    WorkspaceView,
)
from shellyard.errors import ShellyardError
from shellyard.mcp.server import tool_error


@runtime_checkable
class FilesBackend(Protocol):
    """What the file tools call (``AsyncClient`` is one)."""

    async def workspaces(self) -> list[WorkspaceView]: ...
    async def list_files(
        self,
        path: str = "",
        *,
        workspace_id: str | None = None,
        runner_id: str | None = None,
        seq: int | None = None,
        recursive: bool = False,
        after: str | None = None,
        limit: int = 1000,
    ) -> DirListing: ...
    async def read_text(
        self,
        path: str,
        *,
        workspace_id: str | None = None,
        runner_id: str | None = None,
        seq: int | None = None,
        offset: int = 0,
        limit: int = 65536,
    ) -> FileText: ...
    async def write_file(
        self,
        path: str,
        data: bytes | AsyncIterable[bytes],
        *,
        workspace_id: str | None = None,
        runner_id: str | None = None,
        mode: int | None = None,
        queue: bool = False,
        wait_s: float | None = None,
    ) -> EditView: ...
    async def delete(self, path: str, *, recursive: bool = False, **where: Any) -> EditView: ...
    async def move(
        self, source: str, destination: str, *, overwrite: bool = False, **where: Any
    ) -> EditView: ...
    async def restore(self, seq: int, path: str = "", **where: Any) -> EditView: ...
    async def history(
        self, *, workspace_id: str | None = None, runner_id: str | None = None
    ) -> HistoryView: ...
    async def diff(
        self,
        from_seq: int,
        to_seq: int | None = None,
        path: str = "",
        *,
        workspace_id: str | None = None,
        runner_id: str | None = None,
        after: str | None = None,
        limit: int = 1000,
    ) -> DiffResult: ...
    async def transfer_start(
        self,
        source_workspace_id: str,
        paths: list[str],
        target_workspace_id: str,
        target_folder: str = "",
        *,
        queue: bool = False,
        **options: Any,
    ) -> TransferView: ...
    async def transfers(self, limit: int = 100) -> list[TransferView]: ...
    async def transfer(self, transfer_id: str) -> TransferView: ...
    async def transfer_files(
        self, transfer_id: str, outcome: str | None = None, offset: int = 0, limit: int = 1000
    ) -> TransferFilesView: ...
    async def transfer_cancel(self, transfer_id: str, wait_s: float = 0.0) -> TransferView: ...
    async def artifact_declare(
        self,
        path: str,
        name: str | None = None,
        *,
        workspace_id: str | None = None,
        seq: int | None = None,
    ) -> ArtifactView: ...
    async def artifacts(self) -> list[ArtifactView]: ...


TRANSFER_ACTIONS = ("discover", "start", "list", "query", "cancel")


def _need(value: Any, name: str, action: str) -> Any:
    if value is None or value == [] or value == "":
        raise ToolError(f"invalid_input: action '{action}' needs {name}")
    return value


def add_file_tools(server: MCPServer, backend: FilesBackend) -> None:
    @server.tool(
        description=(
            "Copy files between workspaces you may use: your own on every runner, your "
            "parent's and your children's. action: 'discover' lists those workspace ids; "
            "'start' copies paths (files, folders, globs such as 'data/*.csv' or 'src/**/*.py') "
            "of source_workspace_id's latest committed snapshot into target_folder of "
            "target_workspace_id (queue=true waits if the target is busy) and returns "
            "transfer_id at once; 'list' your transfers; 'query' one (state, progress, and "
            "per-file outcomes: copied, unchanged, skipped, failed with the reason; outcome= "
            "filters them); 'cancel' stops it after the batch in flight — files already "
            "committed stay. Copying never declares an artifact (use artifact_declare). "
            "When it ends you get a notice."
        )
    )
    async def workspace_transfer(
        action: str,
        source_workspace_id: str | None = None,
        paths: list[str] | None = None,
        target_workspace_id: str | None = None,
        target_folder: str = "",
        transfer_id: str | None = None,
        queue: bool = False,
        batch_files: int | None = None,
        batch_bytes: int | None = None,
        outcome: str | None = None,
        offset: int = 0,
        limit: int = 100,
        wait_s: float = 0.0,
    ) -> dict[str, Any]:
        if action not in TRANSFER_ACTIONS:
            raise ToolError(
                f"invalid_input: action must be one of {', '.join(TRANSFER_ACTIONS)}, "
                f"not {action!r}"
            )
        try:
            if action == "discover":
                views = await backend.workspaces()
                return {"workspaces": [v.model_dump(mode="json") for v in views]}
            if action == "start":
                options = {
                    k: v
                    for k, v in (("batch_files", batch_files), ("batch_bytes", batch_bytes))
                    if v is not None
                }
                started = await backend.transfer_start(
                    _need(source_workspace_id, "source_workspace_id", action),
                    _need(paths, "paths (a list of files, folders or globs)", action),
                    _need(target_workspace_id, "target_workspace_id", action),
                    target_folder,
                    queue=queue,
                    **options,
                )
                return started.model_dump(mode="json")
            if action == "list":
                listed = await backend.transfers(max(1, min(limit, 1000)))
                return {"transfers": [v.model_dump(mode="json") for v in listed]}
            tid = _need(transfer_id, "transfer_id", action)
            if action == "cancel":
                return (await backend.transfer_cancel(tid, wait_s)).model_dump(mode="json")
            view = (await backend.transfer(tid)).model_dump(mode="json")
            files = await backend.transfer_files(tid, outcome, offset, max(1, min(limit, 1000)))
            view["files"] = [f.model_dump(mode="json") for f in files.files]
            view["files_next_offset"] = files.next_offset
            return view
        except ShellyardError as exc:
            raise tool_error(exc) from None

    @server.tool(
        description=(
            "List a folder of your workspace (or a workspace_id from workspace_transfer "
            "discover) as committed: the latest snapshot, or seq. recursive=true lists "
            "everything below; page on with after=next_after. Entries: path, kind (file, dir, "
            "symlink), size, mode, sha256, link target."
        )
    )
    async def file_list(
        path: str = "",
        workspace_id: str | None = None,
        runner_id: str | None = None,
        seq: int | None = None,
        recursive: bool = False,
        after: str | None = None,
        limit: int = 200,
    ) -> dict[str, Any]:
        try:
            listing = await backend.list_files(
                path,
                workspace_id=workspace_id,
                runner_id=runner_id,
                seq=seq,
                recursive=recursive,
                after=after,
                limit=limit,
            )
        except ShellyardError as exc:
            raise tool_error(exc) from None
        return listing.model_dump(mode="json")

    @server.tool(
        description=(
            "Read a file of a committed snapshot (latest, or seq): up to limit bytes from "
            "offset, as UTF-8 text (or base64 when it is not text). Continue from next_offset "
            "until complete. A running command's unfinished writes are never visible."
        )
    )
    async def file_read(
        path: str,
        workspace_id: str | None = None,
        runner_id: str | None = None,
        seq: int | None = None,
        offset: int = 0,
        limit: int = 65536,
    ) -> dict[str, Any]:
        try:
            text = await backend.read_text(
                path,
                workspace_id=workspace_id,
                runner_id=runner_id,
                seq=seq,
                offset=offset,
                limit=limit,
            )
        except ShellyardError as exc:
            raise tool_error(exc) from None
        return text.model_dump(mode="json")

    @server.tool(
        description=(
            "Write (create or replace) a file in your workspace with content (encoding 'utf-8' "
            "or 'base64'); folders on the way are made. It takes the workspace's writer like a "
            "command: refused while a command runs there unless queue=true. Ends with a new "
            "snapshot (snapshot_seq)."
        )
    )
    async def file_write(
        path: str,
        content: str,
        encoding: str = "utf-8",
        mode: int | None = None,
        workspace_id: str | None = None,
        runner_id: str | None = None,
        queue: bool = False,
    ) -> dict[str, Any]:
        if encoding not in ("utf-8", "base64"):
            raise ToolError(
                f"invalid_input: encoding must be 'utf-8' or 'base64', not {encoding!r}"
            )
        try:
            data = (
                base64.b64decode(content, validate=True)
                if encoding == "base64"
                else content.encode("utf-8")
            )
        except (binascii.Error, UnicodeEncodeError) as exc:
            raise ToolError(f"invalid_input: content is not valid {encoding}: {exc}") from None
        try:
            edit = await backend.write_file(
                path,
                data,
                workspace_id=workspace_id,
                runner_id=runner_id,
                mode=mode,
                queue=queue,
            )
        except ShellyardError as exc:
            raise tool_error(exc) from None
        return edit.model_dump(mode="json")

    @server.tool(
        description=(
            "Delete a file or link (a folder needs recursive=true) in your workspace; a writer "
            "operation ending with a snapshot. History keeps the old snapshots."
        )
    )
    async def file_delete(
        path: str,
        recursive: bool = False,
        workspace_id: str | None = None,
        runner_id: str | None = None,
        queue: bool = False,
    ) -> dict[str, Any]:
        where = {"workspace_id": workspace_id, "runner_id": runner_id, "queue": queue}
        try:
            return (await backend.delete(path, recursive=recursive, **where)).model_dump(
                mode="json"
            )
        except ShellyardError as exc:
            raise tool_error(exc) from None

    @server.tool(
        description=(
            "Move or rename a file or folder in your workspace (overwrite=true replaces the "
            "destination); a writer operation ending with a snapshot."
        )
    )
    async def file_move(
        source: str,
        destination: str,
        overwrite: bool = False,
        workspace_id: str | None = None,
        runner_id: str | None = None,
        queue: bool = False,
    ) -> dict[str, Any]:
        where = {"workspace_id": workspace_id, "runner_id": runner_id, "queue": queue}
        try:
            moved = await backend.move(source, destination, overwrite=overwrite, **where)
        except ShellyardError as exc:
            raise tool_error(exc) from None
        return moved.model_dump(mode="json")

    @server.tool(
        description=(
            "The snapshot history of a workspace: every snapshot (seq) with what made it "
            "(execution, edit, transfer, restore and its id) and whether it is still retained."
        )
    )
    async def snapshot_list(
        workspace_id: str | None = None, runner_id: str | None = None
    ) -> dict[str, Any]:
        try:
            history = await backend.history(workspace_id=workspace_id, runner_id=runner_id)
        except ShellyardError as exc:
            raise tool_error(exc) from None
        return history.model_dump(mode="json")

    @server.tool(
        description=(
            "What changed between two snapshots (to_seq default: the latest), below path: "
            "added, removed and changed entries with their sizes. Page on with after."
        )
    )
    async def snapshot_diff(
        from_seq: int,
        to_seq: int | None = None,
        path: str = "",
        workspace_id: str | None = None,
        runner_id: str | None = None,
        after: str | None = None,
        limit: int = 500,
    ) -> dict[str, Any]:
        try:
            diff = await backend.diff(
                from_seq,
                to_seq,
                path,
                workspace_id=workspace_id,
                runner_id=runner_id,
                after=after,
                limit=limit,
            )
        except ShellyardError as exc:
            raise tool_error(exc) from None
        return diff.model_dump(mode="json")

    @server.tool(
        description=(
            "Restore your workspace (or just path in it) to snapshot seq. A writer operation "
            "that makes a new snapshot; nothing is deleted from history, so it can be undone "
            "by restoring again."
        )
    )
    async def snapshot_restore(
        seq: int,
        path: str = "",
        workspace_id: str | None = None,
        runner_id: str | None = None,
        queue: bool = False,
    ) -> dict[str, Any]:
        where = {"workspace_id": workspace_id, "runner_id": runner_id, "queue": queue}
        try:
            return (await backend.restore(seq, path, **where)).model_dump(mode="json")
        except ShellyardError as exc:
            raise tool_error(exc) from None

    @server.tool(
        description=(
            "Declare a file as a deliverable artifact: a file of a committed snapshot (latest, "
            "or seq) of your own workspace on the local runner. A file on another runner must "
            "be copied back first with workspace_transfer. Returns name, path, snapshot, "
            "sha256 and size."
        )
    )
    async def artifact_declare(
        path: str,
        name: str | None = None,
        workspace_id: str | None = None,
        seq: int | None = None,
    ) -> dict[str, Any]:
        try:
            art = await backend.artifact_declare(path, name, workspace_id=workspace_id, seq=seq)
        except ShellyardError as exc:
            raise tool_error(exc) from None
        return art.model_dump(mode="json")

    @server.tool(description="Your declared artifacts (name, path, snapshot, sha256, size).")
    async def artifact_list() -> dict[str, Any]:
        try:
            listed = await backend.artifacts()
        except ShellyardError as exc:
            raise tool_error(exc) from None
        return {"artifacts": [a.model_dump(mode="json") for a in listed]}


__all__ = ["FilesBackend", "add_file_tools"]
