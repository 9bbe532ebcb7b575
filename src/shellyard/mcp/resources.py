"""MCP resource templates: an execution's logs, a workspace file at a snapshot, an artifact.

- ``shellyard://executions/{execution_id}/stdout`` and ``.../stderr``: the whole log (E6),
  read page by page from the backend; ``run_shell`` links to them when its inline output was
  cut (E12).
- ``shellyard://workspaces/{workspace_id}/snapshots/{seq}/files/{+path}``: a file of a
  committed snapshot (W2), as text, or base64 in a blob when it is not UTF-8.
- ``shellyard://artifacts/{artifact_id}``: a declared artifact's file.

A read returns at most MAX_RESOURCE_BYTES: a resource is one message, and memory stays
bounded; past that the text ends with a line saying how to read the rest (execution_logs or
file_read from the offset it names).
"""

from __future__ import annotations

import base64

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ResourceError
from mcp_types import ResourceLink

from shellyard.contract.executions import DEFAULT_LOG_LIMIT
from shellyard.contract.files import MAX_TEXT_READ
from shellyard.errors import ShellyardError
from shellyard.sdk.client import AsyncClient

MAX_RESOURCE_BYTES = 8 << 20
LOG_URI = "shellyard://executions/{execution_id}/{stream}"
FILE_URI = "shellyard://workspaces/{workspace_id}/snapshots/{seq}/files/{+path}"
ARTIFACT_URI = "shellyard://artifacts/{artifact_id}"


def log_uri(execution_id: str, stream: str) -> str:
    return LOG_URI.format(execution_id=execution_id, stream=stream)


def log_links(execution_id: str) -> list[ResourceLink]:
    """E12: where the whole output of an execution is, when run_shell's inline copy was cut."""
    return [
        ResourceLink(
            type="resource_link",
            uri=log_uri(execution_id, stream),
            name=f"{execution_id} {stream}",
            description=f"the whole {stream} of {execution_id}",
            mime_type="text/plain",
        )
        for stream in ("stdout", "stderr")
    ]


async def read_log(backend: AsyncClient, execution_id: str, stream: str) -> str:
    parts: list[str] = []
    offset = 0
    while True:
        chunk = await backend.logs(execution_id, stream, offset, DEFAULT_LOG_LIMIT * 4)
        parts.append(chunk.data)
        if chunk.next_offset >= chunk.size or chunk.next_offset == offset:
            return "".join(parts)
        offset = chunk.next_offset
        if offset >= MAX_RESOURCE_BYTES:
            parts.append(
                f"\n[shellyard: the first {offset} bytes; read on with execution_logs "
                f"from offset {offset}]\n"
            )
            return "".join(parts)


async def read_file(
    backend: AsyncClient, path: str, *, workspace_id: str | None, seq: int | None
) -> str | bytes:
    texts: list[str] = []
    blobs: list[bytes] = []
    offset = 0
    while True:
        page = await backend.read_text(
            path, workspace_id=workspace_id, seq=seq, offset=offset, limit=MAX_TEXT_READ
        )
        if page.encoding == "base64":
            blobs.append(base64.b64decode(page.data))
        else:
            texts.append(page.data)
        if page.complete or page.next_offset == offset or page.next_offset >= MAX_RESOURCE_BYTES:
            break
        offset = page.next_offset
    # A file cut at MAX_RESOURCE_BYTES is returned as far as read: file_read pages on.
    return b"".join(blobs) + "".join(texts).encode() if blobs else "".join(texts)


def add_resources(server: MCPServer, backend: AsyncClient) -> None:
    def failure(exc: ShellyardError) -> ResourceError:
        return ResourceError(f"{exc.code}: {exc.message}")

    @server.resource(
        LOG_URI,
        name="execution_log",
        title="Execution log",
        description="The whole stdout or stderr of an execution (stream: stdout or stderr).",
        mime_type="text/plain",
    )
    async def execution_log(execution_id: str, stream: str) -> str:
        if stream not in ("stdout", "stderr"):
            raise ResourceError(f"invalid_input: stream must be stdout or stderr, not {stream!r}")
        try:
            return await read_log(backend, execution_id, stream)
        except ShellyardError as exc:
            raise failure(exc) from None

    @server.resource(
        FILE_URI,
        name="workspace_file",
        title="Workspace file at a snapshot",
        description="A file of a committed snapshot of a workspace you may read.",
    )
    async def workspace_file(workspace_id: str, seq: str, path: str) -> str | bytes:
        if not seq.isdigit():
            raise ResourceError(f"invalid_input: seq must be a snapshot number, not {seq!r}")
        try:
            return await read_file(backend, path, workspace_id=workspace_id, seq=int(seq))
        except ShellyardError as exc:
            raise failure(exc) from None

    @server.resource(
        ARTIFACT_URI,
        name="artifact",
        title="Artifact",
        description="The file of one of your declared artifacts.",
    )
    async def artifact(artifact_id: str) -> str | bytes:
        try:
            found = [a for a in await backend.artifacts() if a.artifact_id == artifact_id]
            if not found:
                raise ResourceError(f"not_found: no artifact {artifact_id!r}; see artifact_list")
            art = found[0]
            return await read_file(backend, art.path, workspace_id=art.workspace_id, seq=art.seq)
        except ShellyardError as exc:
            raise failure(exc) from None


__all__ = ["add_resources", "log_links", "log_uri", "read_log"]
