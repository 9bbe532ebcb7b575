"""REST endpoints of session-wide reads (docs/web.md): what the web page's session file panel
shows, usable by any client. The per-agent endpoints (``X-Shellyard-Agent``) answer for one
agent; these answer for every agent of a session the token reaches (an agent token: its own).

- ``GET /v1/panel/sessions``: sessions newest first, with their agents.
- ``GET /v1/sessions/{id}/executions``: executions, newest first, paged server-side
  (``before_seq`` cursor), with counts per state.
- ``.../transfers``, ``.../timers``, ``.../notices``, ``.../artifacts``, ``.../workspaces``.
- ``.../files/content`` and ``.../files/archive``: a file, or a folder as tar, of a committed
  snapshot (W2) of a workspace of the session, as a download (``Content-Disposition``), so
  that a plain link can fetch it.
- ``.../files/preview``: a file of a committed snapshot for the page's ``<img>`` (PNG, JPEG,
  GIF, WebP, SVG) with its own strict type, a sandboxing policy and ``nosniff``; anything
  else as an attachment, so no workspace file ever runs script at the page's origin.
- ``.../executions/{eid}/logs/{stream}``: the whole of one stream of an execution as a
  plain-text download, read page by page (E6 byte offsets; never all in memory).
- ``.../panel/stream``: server-sent events, one ``change`` event naming the parts that
  changed (the first names all of them); the page reads those parts again.

No ``from __future__ import annotations``: FastAPI resolves the annotations at declaration."""

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Annotated
from urllib.parse import quote

from fastapi import APIRouter, Depends, Query
from fastapi.responses import StreamingResponse
from fastapi.sse import EventSourceResponse, ServerSentEvent

from shellyard.api.auth import PrincipalDep
from shellyard.api.docs import BINARY_RESPONSE, JSON_ERROR_RESPONSES, TAR_RESPONSE
from shellyard.api.files import _file_response
from shellyard.contract.executions import ExecutionLogsQuery
from shellyard.contract.files import ArtifactView, TransferView, WorkspaceView
from shellyard.contract.panel import MAX_EXECUTION_PAGE, ExecutionPage
from shellyard.contract.sessions import NoticeView, SessionView, TimerView
from shellyard.control.panel import PanelService
from shellyard.control.plane import ControlPlane
from shellyard.errors import NotFound

Limit = Annotated[int, Query(ge=1, le=1000)]
#: The panel's pages of a session's latest objects: (PanelService method, answer, default limit)
RECENT: tuple[tuple[str, object, int], ...] = (
    ("transfers", list[TransferView], 50),
    ("timers", list[TimerView], 100),
    ("notices", list[NoticeView], 100),
    ("artifacts", list[ArtifactView], 200),
)
SeqQ = Annotated[int | None, Query(ge=0, description="a snapshot number (default: the head)")]
#: What the preview route serves inline, by the file name's ending (docs/web.md "Previews").
PREVIEW_TYPES = {
    "png": "image/png",
    "jpg": "image/jpeg",
    "jpeg": "image/jpeg",
    "gif": "image/gif",
    "webp": "image/webp",
    "svg": "image/svg+xml",
}
#: No script, no connection, no frame; SVG may keep its inline styles.
PREVIEW_CSP = "default-src 'none'; style-src 'unsafe-inline'; sandbox"
#: A page of a log download (one read of the log at a time).
LOG_PAGE = 1 << 20
#: How long the browser waits before reconnecting a dropped stream.
RETRY_MS = 1000


def _attachment(name: str) -> str:
    """A Content-Disposition that survives any file name (RFC 6266 / 5987)."""
    ascii_name = "".join(
        c if c.isascii() and c.isprintable() and c not in '"\\' else "_" for c in name
    )
    return f"attachment; filename=\"{ascii_name}\"; filename*=UTF-8''{quote(name, safe='')}"


def panel_router(plane: ControlPlane) -> APIRouter:
    router = APIRouter()
    service = PanelService(plane)

    async def known_session(session_id: str, who: PrincipalDep) -> str:
        """A dependency, so that an unknown session is a JSON 404 before a stream starts."""
        await service.agents(who, session_id)
        return session_id

    @router.get("/v1/panel/sessions")
    async def sessions(who: PrincipalDep) -> list[SessionView]:
        """Sessions newest first, each with the agents the token reaches."""
        return await service.sessions(who)

    @router.get("/v1/sessions/{session_id}/executions")
    async def executions(
        session_id: str,
        who: PrincipalDep,
        before_seq: Annotated[int | None, Query(ge=0)] = None,
        limit: Annotated[int, Query(ge=1, le=MAX_EXECUTION_PAGE)] = 50,
    ) -> ExecutionPage:
        """Executions of the session's agents, newest first; ``before_seq`` pages on."""
        return await service.executions(who, session_id, before_seq, limit)

    def recent(read: str, default: int) -> Callable[..., Awaitable[object]]:
        async def page(session_id: str, who: PrincipalDep, limit: Limit = default) -> object:
            return await getattr(service, read)(who, session_id, limit)

        page.__name__ = read
        return page

    # The session's latest transfers, timers, notices and artifacts: one page each
    for read, result, default in RECENT:
        router.add_api_route(
            f"/v1/sessions/{{session_id}}/{read}",
            recent(read, default),
            methods=["GET"],
            name=read,
            response_model=result,
        )

    @router.get("/v1/sessions/{session_id}/workspaces")
    async def workspaces(session_id: str, who: PrincipalDep) -> list[WorkspaceView]:
        return await service.workspaces(who, session_id)

    @router.get(
        "/v1/sessions/{session_id}/files/content",
        response_class=StreamingResponse,
        responses=BINARY_RESPONSE,
    )
    async def download_file(
        session_id: str, workspace_id: str, path: str, who: PrincipalDep, seq: SeqQ = None
    ) -> StreamingResponse:
        """One file of a committed snapshot, as a download."""
        owner = await service.owner_of_workspace(who, session_id, workspace_id)
        stream = await plane.files.open(path, workspace_id=workspace_id, seq=seq, agent_id=owner)
        response = _file_response(stream, False, "application/octet-stream")
        response.headers["Content-Disposition"] = _attachment(path.rsplit("/", 1)[-1] or "file")
        return response

    @router.get(
        "/v1/sessions/{session_id}/files/preview",
        response_class=StreamingResponse,
        responses=BINARY_RESPONSE,
    )
    async def preview_file(
        session_id: str, workspace_id: str, path: str, who: PrincipalDep, seq: SeqQ = None
    ) -> StreamingResponse:
        """An image of a committed snapshot with its type, for ``<img>``; others as a download.
        Always sandboxed (``Content-Security-Policy: sandbox``) and never sniffed."""
        owner = await service.owner_of_workspace(who, session_id, workspace_id)
        stream = await plane.files.open(path, workspace_id=workspace_id, seq=seq, agent_id=owner)
        name = path.rsplit("/", 1)[-1] or "file"
        media = PREVIEW_TYPES.get(name.rsplit(".", 1)[-1].lower() if "." in name else "")
        response = _file_response(stream, False, media or "application/octet-stream")
        response.headers["Content-Security-Policy"] = PREVIEW_CSP
        response.headers["X-Content-Type-Options"] = "nosniff"
        response.headers["Cache-Control"] = "private, no-store"
        if media is None:
            response.headers["Content-Disposition"] = _attachment(name)
        return response

    @router.get(
        "/v1/sessions/{session_id}/executions/{execution_id}/logs/{stream}",
        response_class=StreamingResponse,
        responses=BINARY_RESPONSE,
    )
    async def download_log(
        session_id: str, execution_id: str, stream: str, agent_id: str, who: PrincipalDep
    ) -> StreamingResponse:
        """One stream of an execution of ``agent_id`` (an agent of the session), as a file."""
        agents = await service.agent_ids(who, session_id)
        if agent_id not in agents:
            raise NotFound(f"no agent {agent_id!r} in session {session_id}")

        def page(offset: int) -> ExecutionLogsQuery:
            return ExecutionLogsQuery(stream=stream, offset=offset, limit=LOG_PAGE)

        first = None
        # The execution may be any agent's of the session (the panel shows them all).
        for owner in (agent_id, *(a for a in agents if a != agent_id)):
            try:
                first = await plane.executions.logs(execution_id, page(0), owner)
            except NotFound:
                continue
            agent_id = owner
            break
        if first is None:
            raise NotFound(f"no execution {execution_id!r} in session {session_id}")

        async def pages() -> AsyncIterator[bytes]:
            part = first
            while True:
                if part.data:
                    yield part.data.encode("utf-8", "surrogateescape")
                if part.next_offset >= part.size or part.next_offset <= part.offset:
                    return
                part = await plane.executions.logs(execution_id, page(part.next_offset), agent_id)

        return StreamingResponse(
            pages(),
            media_type="text/plain; charset=utf-8",
            headers={
                "Content-Disposition": _attachment(f"{execution_id}.{stream}.log"),
                "X-Content-Type-Options": "nosniff",
            },
        )

    @router.get(
        "/v1/sessions/{session_id}/files/archive",
        response_class=StreamingResponse,
        responses=TAR_RESPONSE,
    )
    async def download_folder(
        session_id: str, workspace_id: str, who: PrincipalDep, path: str = "", seq: SeqQ = None
    ) -> StreamingResponse:
        """A folder of a committed snapshot (default: all of it) as a tar stream."""
        owner = await service.owner_of_workspace(who, session_id, workspace_id)
        archive = await plane.files.archive(
            path, workspace_id=workspace_id, seq=seq, agent_id=owner
        )
        name = (path.strip("/").rsplit("/", 1)[-1] or workspace_id) + f"@{archive.seq}.tar"
        return StreamingResponse(
            archive.chunks,
            media_type="application/x-tar",
            headers={"Content-Disposition": _attachment(name), "X-Shellyard-Seq": str(archive.seq)},
        )

    @router.get(
        "/v1/sessions/{session_id}/artifacts/{artifact_id}/content",
        response_class=StreamingResponse,
        responses=BINARY_RESPONSE,
    )
    async def download_artifact(
        session_id: str, artifact_id: str, who: PrincipalDep
    ) -> StreamingResponse:
        for artifact in await service.artifacts(who, session_id, 1000):
            if artifact.artifact_id == artifact_id:
                stream = await plane.artifacts.open(artifact_id, artifact.agent_id)
                response = _file_response(stream, False, "application/octet-stream")
                response.headers["Content-Disposition"] = _attachment(artifact.name)
                return response
        raise NotFound(f"no artifact {artifact_id!r} in session {session_id}")

    @router.get(
        "/v1/sessions/{session_id}/panel/stream",
        response_class=EventSourceResponse,
        responses=JSON_ERROR_RESPONSES,  # errors are JSON, not events
    )
    async def panel_stream(
        session_id: Annotated[str, Depends(known_session)], who: PrincipalDep
    ) -> AsyncIterator[ServerSentEvent]:
        """Server-sent events: ``change`` with the parts of the panel that changed. The first
        event of every connection names them all (so a reconnect reads everything again)."""
        async for change in service.changes(who, session_id):
            yield ServerSentEvent(
                data=change.model_dump(mode="json"), event="change", retry=RETRY_MS
            )

    return router


__all__ = ["panel_router"]
