"""Artifacts (T5): files an agent declares as deliverables. Only a file of a committed snapshot
of the agent's own workspace on the local runner can be declared; a file on a remote runner
must be copied back with a transfer first, and a transfer never declares anything. The
artifact names its snapshot, path, sha256 and size; retention keeps that snapshot, so the
bytes stay downloadable whatever happens to the workspace afterwards.

The sha256 is the real SHA-256 of the bytes. For most files the snapshot store's content id
is it (contentid.py) and it is reused; for a file holding a whole zero MiB it is computed at
declaration by streaming the file (holes read as zeros), in chunks off the event loop. Its
cost is the file's apparent size, so such a file is declared only up to
``MAX_SPARSE_ARTIFACT_BYTES`` (docs/files-and-transfers.md "Artifacts")."""

from __future__ import annotations

import asyncio
import hashlib
import time

from shellyard.contract.files import ArtifactView
from shellyard.control.files.access import WorkspaceAccess
from shellyard.control.files.service import FileStream
from shellyard.control.runners import LOCAL_RUNNER_ID
from shellyard.errors import InvalidInput, NotFound
from shellyard.paths import normalize_relative
from shellyard.runner.protocol import PathEntry, Runner
from shellyard.store import Store
from shellyard.store.db import new_id
from shellyard.store.files import Artifact
from shellyard.store.records import field_names, values_of

#: The largest file with a chunk-list content id that can be declared: hashing it costs its
#: apparent size (~0.4 GiB/s measured on this project's machine under load: ~10 s at 4 GiB).
MAX_SPARSE_ARTIFACT_BYTES = 4 << 30


async def real_sha256(runner: Runner, workspace_id: str, seq: int, entry: PathEntry) -> str:
    """The file's real SHA-256: its content id when that is one, else its bytes hashed."""
    if entry.sha256 is not None:
        return entry.sha256
    if entry.size > MAX_SPARSE_ARTIFACT_BYTES:
        raise InvalidInput(
            f"{entry.path!r} is {entry.size} bytes holding runs of zeros (a sparse file or a "
            f"disk image): its SHA-256 would cost hashing all {entry.size} bytes, more than "
            f"the {MAX_SPARSE_ARTIFACT_BYTES} an artifact of such content may have. Declare "
            f"an archive of it instead, which keeps its holes small: run "
            f"'tar -cSzf {entry.path}.tar.gz {entry.path}' and declare that",
            path=entry.path,
            size=entry.size,
        )
    hasher = hashlib.sha256()
    async for chunk in await runner.read_stream(workspace_id, seq, entry.path, 0, None):
        await asyncio.to_thread(hasher.update, chunk)
    return hasher.hexdigest()


class ArtifactService:
    def __init__(self, store: Store, access: WorkspaceAccess) -> None:
        self.store = store
        self.access = access

    async def declare(
        self,
        path: str,
        *,
        name: str | None = None,
        workspace_id: str | None = None,
        seq: int | None = None,
        agent_id: str | None = None,
    ) -> ArtifactView:
        agent = await self.access.agent(agent_id)
        rel = normalize_relative(path)
        if not rel:
            raise InvalidInput("path names the workspace root; declare a file, such as 'out.csv'")
        if workspace_id is None:
            row, relation, runner = await self.access.workspace(agent, None, LOCAL_RUNNER_ID)
        else:
            row, relation, runner = await self.access.workspace(agent, workspace_id)
        ws = row.id
        if row.runner_id != LOCAL_RUNNER_ID:
            local = await self.access.own(agent, LOCAL_RUNNER_ID)
            raise InvalidInput(
                f"{rel!r} is in workspace {ws} on runner {row.runner_id!r}, not on the local "
                f"runner: only files in your own workspace on the local runner can be declared "
                f"as artifacts. Copy it back first with workspace_transfer action 'start' "
                f"(source_workspace_id={ws!r}, paths=[{rel!r}], "
                f"target_workspace_id={local.id!r}), then declare the copy",
                path=rel,
                workspace_id=ws,
            )
        if relation != "own":
            raise InvalidInput(
                f"workspace {ws} belongs to your {relation} agent: artifacts are declared only "
                f"for files in your own workspace; copy the file into yours with a transfer first",
                workspace_id=ws,
            )
        if seq is None:
            seq = (await runner.head(ws)).seq
        entry = await runner.stat_path(ws, seq, rel)
        if entry is None or entry.kind != "file":
            what = "nothing" if entry is None else f"a {entry.kind}"
            raise NotFound(
                f"snapshot {seq} of workspace {ws} has {what} at {rel!r}; an artifact is a file "
                f"of a committed snapshot (a command's files are committed when it ends)",
                path=rel,
            )
        assert entry.content_id is not None
        name = name if name is not None else rel.rsplit("/", 1)[-1]
        if not name or len(name) > 255 or "\0" in name:
            raise InvalidInput("an artifact name is 1 to 255 characters, without NUL bytes")
        if await self.store.find_artifact(agent.id, name) is not None:
            raise InvalidInput(
                f"you already declared an artifact named {name!r}; pass another name",
                name=name,
            )
        created = await self.store.create_artifact(
            {
                "id": new_id("art"),
                "agent_id": agent.id,
                "workspace_id": ws,
                "runner_id": row.runner_id,
                "seq": seq,
                "path": rel,
                "name": name,
                "sha256": await real_sha256(runner, ws, seq, entry),
                "content_id": entry.content_id,
                "size": entry.size,
                "created_at": time.time(),
            }
        )
        return _view(created)

    async def list(self, agent_id: str | None = None) -> list[ArtifactView]:
        agent = await self.access.agent(agent_id)
        return [_view(r) for r in await self.store.list_artifacts(agent.id)]

    async def get(self, artifact_id: str, agent_id: str | None = None) -> ArtifactView:
        return _view(await self._owned(artifact_id, agent_id))

    async def open(
        self, artifact_id: str, agent_id: str | None = None, offset: int = 0
    ) -> FileStream:
        """The artifact's bytes, streamed from the snapshot it was declared at."""
        row = await self._owned(artifact_id, agent_id)
        runner = self.access.runners.get(row.runner_id)
        ws, seq, path = row.workspace_id, row.seq, row.path
        entry = await runner.stat_path(ws, seq, path)
        if entry is None:
            raise NotFound(f"artifact {artifact_id}'s snapshot {seq} is no longer retained")
        if row.content_id is not None:  # its real sha256 is known: the download says it
            entry = entry.model_copy(update={"sha256": row.sha256})
        chunks = await runner.read_stream(ws, seq, path, offset, None)
        start = min(offset, entry.size)
        return FileStream(ws, seq, entry, start, entry.size - start, chunks)

    async def _owned(self, artifact_id: str, agent_id: str | None) -> Artifact:
        agent = await self.access.agent(agent_id)
        row = await self.store.get_artifact(artifact_id)
        if row is None or row.agent_id != agent.id:
            raise NotFound(f"no artifact {artifact_id!r}; list yours with artifact_list")
        return row


#: D3: the fields an artifact's record and its view share, listed once.
_VIEW_FIELDS = field_names(Artifact, ArtifactView.model_fields)


def _view(row: Artifact) -> ArtifactView:
    # a row from before content ids were recorded: its sha256 column held the content id
    content_id = row.content_id or row.sha256
    return ArtifactView.model_validate(
        {**values_of(row, _VIEW_FIELDS), "artifact_id": row.id, "content_id": content_id}
    )


__all__ = ["ArtifactService"]
