"""REST endpoints of workspace files, snapshot history, retention, transfers and artifacts
(W1–W6, T1–T5). ``create_app`` mounts them behind the same bearer token; every call acts for
the agent named in ``X-Shellyard-Agent`` (the default session's main agent without it).

Bytes travel raw, both ways, streamed: a file download (``GET /v1/files/content``, with
``Range: bytes=a-b`` support) and a folder download as a tar stream, an upload as the request
body. Neither side ever holds a whole file in memory."""

from collections.abc import AsyncIterator
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Header, Query, Request
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field

from shellyard.api.auth import AgentHeader, admin_only
from shellyard.api.bodies import body_of
from shellyard.api.docs import BINARY_RESPONSE, TAR_RESPONSE, body_doc
from shellyard.api.forward import Forward, add_routes
from shellyard.contract import rawjson
from shellyard.contract.files import (
    MAX_WRITER_WAIT_S,
    ArtifactDeclareRequest,
    ArtifactView,
    DiffResult,
    DirListing,
    EditView,
    FileDeleteRequest,
    FileDiffQuery,
    FileHistoryQuery,
    FileListQuery,
    FileMoveRequest,
    FileReadTextQuery,
    FileStatQuery,
    FileText,
    HistoryView,
    PathEntry,
    RetentionView,
    SnapshotRestoreRequest,
    TransferCancelQuery,
    TransferFilesQuery,
    TransferFilesView,
    TransferListQuery,
    TransferRequest,
    TransferView,
    TransferWaitQuery,
    WorkspaceView,
)
from shellyard.control.files.service import FileStream
from shellyard.control.plane import ControlPlane
from shellyard.errors import InvalidInput

H_SEQ = "X-Shellyard-Seq"
#: The real SHA-256 of the file, omitted when the runner does not know it (docs/files-and-
#: transfers.md "Snapshots"); the content id is always sent.
H_SHA = "X-Shellyard-Sha256"
H_CONTENT_ID = "X-Shellyard-Content-Id"
H_SIZE = "X-Shellyard-Size"

Workspace = Annotated[str | None, Query(description="a workspace id (default: your own)")]
RunnerQ = Annotated[str | None, Query(description="your workspace on this runner (default local)")]
Seq = Annotated[int | None, Query(ge=0, description="a snapshot number (default: the head)")]


class RetentionRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    keep_last: int | None = Field(default=None, ge=1)
    grace_s: float | None = Field(default=None, ge=0)


def _range(header: str | None) -> tuple[int, int | None]:
    """(offset, length) of a ``Range: bytes=a-b`` or ``bytes=a-`` header."""
    if not header:
        return 0, None
    unit, _, spec = header.partition("=")
    start, dash, end = spec.strip().partition("-")
    if unit.strip() != "bytes" or not dash or not start.isdigit() or "," in spec:
        raise InvalidInput(
            f"unsupported Range {header!r}: give one range 'bytes=START-END' or 'bytes=START-'"
        )
    if end and (not end.isdigit() or int(end) < int(start)):
        raise InvalidInput(f"bad Range {header!r}: END must be a number at least START")
    return int(start), (int(end) - int(start) + 1) if end else None


def _file_response(stream: FileStream, ranged: bool, media: str) -> StreamingResponse:
    headers = {
        H_SEQ: str(stream.seq),
        H_SIZE: str(stream.entry.size),
        "Content-Length": str(stream.length),
        "Accept-Ranges": "bytes",
    }
    if stream.entry.sha256:
        headers[H_SHA] = stream.entry.sha256
    if stream.entry.content_id:
        headers[H_CONTENT_ID] = stream.entry.content_id
    status = 200
    if ranged:
        status = 206
        last = stream.offset + stream.length - 1
        headers["Content-Range"] = f"bytes {stream.offset}-{last}/{stream.entry.size}"
    return StreamingResponse(stream.chunks, status_code=status, media_type=media, headers=headers)


async def _body(request: Request) -> AsyncIterator[bytes]:
    async for chunk in request.stream():
        if chunk:
            yield chunk


class PathsJSON(JSONResponse):
    """The answers of the file and transfer routes: a name that is not UTF-8 is written as
    the JSON escape ``\\udcNN`` (docs/files-and-transfers.md, "Names that are not UTF-8")
    where the default answer would fail to encode it and give a 500."""

    def render(self, content: Any) -> bytes:
        return rawjson.dumps_value(content)


#: The reads (W2, W5), transfers (T1-T4) and artifacts (T5) that hand their path ids, their
#: query model or body and the acting agent to a service unchanged.
FILE_ROUTES = (
    Forward("GET", "/v1/workspaces", "workspaces", "files.workspaces", list[WorkspaceView],
            agent=True),
    Forward("GET", "/v1/files", "list_files", "files.list", DirListing, FileListQuery, agent=True),
    Forward("GET", "/v1/files/stat", "stat", "files.stat", PathEntry, FileStatQuery, agent=True),
    Forward("GET", "/v1/files/text", "read_text", "files.read_text", FileText, FileReadTextQuery,
            agent=True),
    Forward("GET", "/v1/files/history", "history", "files.history", HistoryView, FileHistoryQuery,
            agent=True),
    Forward("GET", "/v1/files/diff", "diff", "files.diff", DiffResult, FileDiffQuery, agent=True),
    Forward("POST", "/v1/transfers", "start_transfer", "transfers.start", TransferView,
            agent=True, body=TransferRequest),
    Forward("GET", "/v1/transfers", "list_transfers", "transfers.list", list[TransferView],
            TransferListQuery, agent=True),
    Forward("GET", "/v1/transfers/{transfer_id}", "query_transfer", "transfers.query",
            TransferView, agent=True),
    Forward("GET", "/v1/transfers/{transfer_id}/wait", "wait_transfer", "transfers.wait",
            TransferView, TransferWaitQuery, agent=True),
    Forward("GET", "/v1/transfers/{transfer_id}/files", "transfer_files", "transfers.files",
            TransferFilesView, TransferFilesQuery, agent=True),
    Forward("POST", "/v1/transfers/{transfer_id}/cancel", "cancel_transfer", "transfers.cancel",
            TransferView, TransferCancelQuery, agent=True),
    Forward("GET", "/v1/artifacts", "list_artifacts", "artifacts.list", list[ArtifactView],
            agent=True),
    Forward("GET", "/v1/artifacts/{artifact_id}", "get_artifact", "artifacts.get", ArtifactView,
            agent=True),
)  # fmt: skip


def files_router(plane: ControlPlane) -> APIRouter:
    router = APIRouter(default_response_class=PathsJSON)
    add_routes(router, plane, FILE_ROUTES)

    # ------------------------------------------------------------------ reads (W2, W5)

    @router.get("/v1/files/content", response_class=StreamingResponse, responses=BINARY_RESPONSE)
    async def read_content(
        path: str,
        workspace_id: Workspace = None,
        runner_id: RunnerQ = None,
        seq: Seq = None,
        range_header: Annotated[str | None, Header(alias="Range")] = None,
        agent: AgentHeader = None,
    ) -> StreamingResponse:
        offset, length = _range(range_header)
        stream = await plane.files.open(
            path,
            workspace_id=workspace_id,
            runner_id=runner_id,
            seq=seq,
            offset=offset,
            length=length,
            agent_id=agent,
        )
        return _file_response(stream, range_header is not None, "application/octet-stream")

    @router.get("/v1/files/archive", response_class=StreamingResponse, responses=TAR_RESPONSE)
    async def download_archive(
        path: str = "",
        workspace_id: Workspace = None,
        runner_id: RunnerQ = None,
        seq: Seq = None,
        agent: AgentHeader = None,
    ) -> StreamingResponse:
        archive = await plane.files.archive(
            path, workspace_id=workspace_id, runner_id=runner_id, seq=seq, agent_id=agent
        )
        return StreamingResponse(
            archive.chunks, media_type="application/x-tar", headers={H_SEQ: str(archive.seq)}
        )

    # ------------------------------------------------------------------ writes (W1, W3)

    @router.put("/v1/files/content")
    async def write_content(
        request: Request,
        path: str,
        workspace_id: Workspace = None,
        runner_id: RunnerQ = None,
        mode: Annotated[int | None, Query(ge=0, le=0o777)] = None,
        queue: bool = False,
        wait_s: Annotated[float | None, Query(ge=0, le=MAX_WRITER_WAIT_S)] = None,
        agent: AgentHeader = None,
    ) -> EditView:
        return await plane.files.write(
            path,
            _body(request),
            workspace_id=workspace_id,
            runner_id=runner_id,
            mode=mode,
            queue=queue,
            wait_s=wait_s,
            agent_id=agent,
        )

    @router.post("/v1/files/archive")
    async def upload_archive(
        request: Request,
        path: str = "",
        workspace_id: Workspace = None,
        runner_id: RunnerQ = None,
        queue: bool = False,
        wait_s: Annotated[float | None, Query(ge=0, le=MAX_WRITER_WAIT_S)] = None,
        agent: AgentHeader = None,
    ) -> EditView:
        return await plane.files.upload_archive(
            _body(request),
            path,
            workspace_id=workspace_id,
            runner_id=runner_id,
            queue=queue,
            wait_s=wait_s,
            agent_id=agent,
        )

    @router.post("/v1/files/delete", openapi_extra=body_doc(FileDeleteRequest))
    async def delete(
        *, agent: AgentHeader = None, r: Annotated[FileDeleteRequest, body_of(FileDeleteRequest)]
    ) -> EditView:
        return await plane.files.delete(
            r.path,
            recursive=r.recursive,
            workspace_id=r.workspace_id,
            runner_id=r.runner_id,
            queue=r.queue,
            wait_s=r.wait_s,
            agent_id=agent,
        )

    @router.post("/v1/files/move", openapi_extra=body_doc(FileMoveRequest))
    async def move(
        *, agent: AgentHeader = None, r: Annotated[FileMoveRequest, body_of(FileMoveRequest)]
    ) -> EditView:
        return await plane.files.move(
            r.source,
            r.destination,
            overwrite=r.overwrite,
            workspace_id=r.workspace_id,
            runner_id=r.runner_id,
            queue=r.queue,
            wait_s=r.wait_s,
            agent_id=agent,
        )

    @router.post("/v1/files/restore", openapi_extra=body_doc(SnapshotRestoreRequest))
    async def restore(
        *,
        agent: AgentHeader = None,
        r: Annotated[SnapshotRestoreRequest, body_of(SnapshotRestoreRequest)],
    ) -> EditView:
        return await plane.files.restore(
            r.seq,
            r.path,
            workspace_id=r.workspace_id,
            runner_id=r.runner_id,
            queue=r.queue,
            wait_s=r.wait_s,
            agent_id=agent,
        )

    @router.post(
        "/v1/retention",
        dependencies=[Depends(admin_only)],
        openapi_extra=body_doc(RetentionRequest),
    )
    async def retention(r: Annotated[RetentionRequest, body_of(RetentionRequest)]) -> RetentionView:
        return await plane.files.collect(r.keep_last, r.grace_s)

    # ------------------------------------------------------------------ artifacts (T5)

    @router.post("/v1/artifacts", openapi_extra=body_doc(ArtifactDeclareRequest))
    async def declare_artifact(
        *,
        agent: AgentHeader = None,
        r: Annotated[ArtifactDeclareRequest, body_of(ArtifactDeclareRequest)],
    ) -> ArtifactView:
        return await plane.artifacts.declare(
            r.path, name=r.name, workspace_id=r.workspace_id, seq=r.seq, agent_id=agent
        )

    @router.get(
        "/v1/artifacts/{artifact_id}/content",
        response_class=StreamingResponse,
        responses=BINARY_RESPONSE,
    )
    async def artifact_content(artifact_id: str, agent: AgentHeader = None) -> StreamingResponse:
        stream = await plane.artifacts.open(artifact_id, agent)
        return _file_response(stream, False, "application/octet-stream")

    return router


__all__ = ["files_router"]
