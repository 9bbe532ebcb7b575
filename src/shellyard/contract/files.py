"""Request and result models of workspace files, snapshot history, transfers and artifacts
(W1–W6, T1–T5), shared by every interface (REST, MCP, SDK, CLI).
Folder listings, diffs and path entries are the Runner protocol's own models: they cross from
the runner to the caller unchanged."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from shellyard.contract.snapshots import (
    DiffEntry,
    DiffResult,
    DirListing,
    GcResult,
    PathEntry,
    PruneResult,
    TransferOutcome,
)

#: Default and largest batch of a transfer: files committed together into the target (T3).
#: Each batch costs a commit (a walk of the whole target tree) and a few records, so the
#: defaults keep a 10,000-file tree to 5 batches; pass smaller ones for finer progress.
DEFAULT_BATCH_FILES = 2000
MAX_BATCH_FILES = 100_000
DEFAULT_BATCH_BYTES = 1 << 30
#: Largest text ``file_read`` returns in one call; page with ``next_offset``.
MAX_TEXT_READ = 1 << 20
DEFAULT_TEXT_READ = 65536
#: Pages of folder listings and diffs: one default and one bound for every door.
DEFAULT_LIST_LIMIT = 1000
MAX_LIST_LIMIT = 10_000
DEFAULT_DIFF_LIMIT = 1000
#: The MCP file_list pages by 200 entries: a listing lands in a model's context, where a
#: thousand entries crowd out the work; programs (REST, SDK) take the larger page.
AGENT_LIST_LIMIT = 200
#: Pages of transfer lists and per-file outcomes.
DEFAULT_TRANSFER_PAGE = 100
MAX_TRANSFER_PAGE = 1000
DEFAULT_OUTCOME_PAGE = 1000
MAX_WRITER_WAIT_S = 3600

TransferState = Literal["queued", "running", "completed", "partial", "failed", "cancelled"]
Relation = Literal["own", "parent", "child"]


class WorkspaceView(BaseModel):
    """A workspace the calling agent may use (T1): its own on any runner, its parent's, its
    children's."""

    workspace_id: str
    runner_id: str
    agent_id: str
    relation: Relation
    head_seq: int
    #: What holds the writer now (``execution ex_…``, ``transfer tr_…``, ``edit ed_…``).
    writer: str | None = None


class SnapshotView(BaseModel):
    seq: int
    root_hash: str | None = None
    files: int | None = None
    bytes: int | None = None
    created_at: float | None = None
    #: What made it (W5): ``execution``, ``edit``, ``transfer``, ``restore``, ``created`` (the
    #: empty snapshot 0) or ``unknown`` (a commit whose record was lost in a crash).
    made_by_kind: str
    made_by_id: str | None = None
    #: False once retention pruned it (its record stays; its files cannot be read).
    retained: bool = True


class HistoryView(BaseModel):
    workspace_id: str
    runner_id: str
    head_seq: int
    snapshots: list[SnapshotView]


class EditView(BaseModel):
    """The result of a writer operation (a file write, upload, delete, move or restore)."""

    workspace_id: str
    operation_id: str
    kind: Literal["edit", "restore"]
    #: The snapshot the operation ended with (W3); ``new_snapshot`` false when nothing changed.
    snapshot_seq: int
    new_snapshot: bool
    written: list[PathEntry] = Field(default_factory=list)
    removed: list[str] = Field(default_factory=list)


class FileText(BaseModel):
    """Part of a file read as text (``utf-8``) or, when it is not valid UTF-8, as base64."""

    workspace_id: str
    seq: int
    path: str
    size: int
    offset: int
    next_offset: int
    encoding: Literal["utf-8", "base64"]
    data: str
    #: True when ``next_offset`` reached the end of the file.
    complete: bool
    #: The file's real SHA-256, or None when not known without hashing its holes.
    sha256: str | None = None
    content_id: str | None = None


class TransferRequest(BaseModel):
    """T2: copy ``paths`` (files, folders, globs with ``*``, ``?``, ``[...]`` and ``**``) of
    the source's latest committed snapshot into ``target_folder`` of the target workspace."""

    model_config = ConfigDict(extra="forbid")

    source_workspace_id: str
    paths: list[str] = Field(min_length=1, max_length=1000)
    target_workspace_id: str
    target_folder: str = ""
    #: Wait in line when the target's writer is held (state ``queued``) instead of refusing.
    queue: bool = False
    batch_files: int = Field(default=DEFAULT_BATCH_FILES, ge=1, le=MAX_BATCH_FILES)
    batch_bytes: int = Field(default=DEFAULT_BATCH_BYTES, ge=1)
    #: Limit the copy's rate (bytes of files per second), e.g. not to saturate a link.
    max_bytes_per_s: int | None = Field(default=None, ge=1)

    @field_validator("paths")
    @classmethod
    def _paths(cls, value: list[str]) -> list[str]:
        for path in value:
            if not isinstance(path, str):
                raise ValueError("each path must be a string")
        return value


_WORKSPACE = Field(
    default=None, description="a workspace id (default: your own; see workspace_transfer discover)"
)
_RUNNER = Field(default=None, description="your workspace on this runner (default local)")
_SEQ = Field(default=None, ge=0, description="a snapshot number (default: the latest)")
_QUEUE = Field(default=False, description="wait for the workspace's writer instead of refusing")
_WAIT = Field(
    default=None, ge=0, le=MAX_WRITER_WAIT_S, description="with queue, wait at most this long (s)"
)


class FileListRequest(BaseModel):
    """W2: a folder of a committed snapshot."""

    model_config = ConfigDict(extra="forbid")

    path: str = Field(default="", description="a folder of the workspace ('' is its root)")
    workspace_id: str | None = _WORKSPACE
    runner_id: str | None = _RUNNER
    seq: int | None = _SEQ
    recursive: bool = Field(default=False, description="list everything below path")
    after: str | None = Field(default=None, description="continue after this path (next_after)")
    limit: int = Field(default=DEFAULT_LIST_LIMIT, ge=1, le=MAX_LIST_LIMIT, description="entries")


class FileReadRequest(BaseModel):
    """W2: bytes of a file of a committed snapshot, as text (or base64)."""

    model_config = ConfigDict(extra="forbid")

    path: str = Field(description="a file of the workspace")
    workspace_id: str | None = _WORKSPACE
    runner_id: str | None = _RUNNER
    seq: int | None = _SEQ
    offset: int = Field(default=0, ge=0, description="byte offset to read from")
    limit: int = Field(
        default=DEFAULT_TEXT_READ, ge=1, le=MAX_TEXT_READ, description="at most this many bytes"
    )


class FileWriteRequest(BaseModel):
    """W3: create or replace a file with inline content (the MCP spelling of an upload)."""

    model_config = ConfigDict(extra="forbid")

    path: str = Field(description="the file to write; folders on the way are made")
    content: str = Field(description="the file's content, in encoding")
    encoding: str = Field(default="utf-8", description="'utf-8' or 'base64'")
    mode: int | None = Field(default=None, ge=0, le=0o777, description="permission bits")
    workspace_id: str | None = _WORKSPACE
    runner_id: str | None = _RUNNER
    queue: bool = _QUEUE


class FileDeleteRequest(BaseModel):
    """W3: delete a file, a link or (recursive) a folder."""

    model_config = ConfigDict(extra="forbid")
    path: str = Field(description="what to delete")
    recursive: bool = Field(default=False, description="needed to delete a folder")
    workspace_id: str | None = _WORKSPACE
    runner_id: str | None = _RUNNER
    queue: bool = _QUEUE
    wait_s: float | None = _WAIT


class FileMoveRequest(BaseModel):
    """W3: move or rename a file or folder."""

    model_config = ConfigDict(extra="forbid")
    source: str = Field(description="the path to move")
    destination: str = Field(description="its new path")
    overwrite: bool = Field(default=False, description="replace an existing destination")
    workspace_id: str | None = _WORKSPACE
    runner_id: str | None = _RUNNER
    queue: bool = _QUEUE
    wait_s: float | None = _WAIT


class SnapshotListRequest(BaseModel):
    """W5: the snapshot history of a workspace."""

    model_config = ConfigDict(extra="forbid")
    workspace_id: str | None = _WORKSPACE
    runner_id: str | None = _RUNNER


class SnapshotDiffRequest(BaseModel):
    """W5: what changed between two snapshots."""

    model_config = ConfigDict(extra="forbid")
    from_seq: int = Field(ge=0, description="the older snapshot")
    to_seq: int | None = Field(default=None, ge=0, description="the newer (default: the latest)")
    path: str = Field(default="", description="only below this folder")
    workspace_id: str | None = _WORKSPACE
    runner_id: str | None = _RUNNER
    after: str | None = Field(default=None, description="continue after this path")
    limit: int = Field(default=DEFAULT_DIFF_LIMIT, ge=1, le=MAX_LIST_LIMIT, description="entries")


class SnapshotRestoreRequest(BaseModel):
    """W6: restore the workspace (or path in it) to a snapshot, as a new snapshot."""

    model_config = ConfigDict(extra="forbid")
    seq: int = Field(ge=0, description="the snapshot to restore")
    path: str = Field(default="", description="only this file or folder ('' is everything)")
    workspace_id: str | None = _WORKSPACE
    runner_id: str | None = _RUNNER
    queue: bool = _QUEUE
    wait_s: float | None = _WAIT


class ArtifactDeclareRequest(BaseModel):
    """A file of a committed snapshot of the caller's own local workspace, as a deliverable."""

    model_config = ConfigDict(extra="forbid")
    path: str = Field(description="the file")
    name: str | None = Field(default=None, description="its artifact name (default: the path)")
    workspace_id: str | None = _WORKSPACE
    seq: int | None = _SEQ


#: workspace_transfer's actions (MCP), each reading the fields it names.
TRANSFER_ACTIONS = ("discover", "start", "list", "query", "cancel")


class WorkspaceTransferRequest(BaseModel):
    """T1-T5 through one MCP tool: ``action`` picks discover, start, list, query or cancel;
    each action reads the fields it names (``start`` the fields of TransferRequest)."""

    model_config = ConfigDict(extra="forbid")
    action: str = Field(
        description="discover, start, list, query or cancel",
        json_schema_extra={"enum": list(TRANSFER_ACTIONS)},
    )
    source_workspace_id: str | None = Field(default=None, description="start: copy from")
    paths: list[str] | None = Field(
        default=None, description="start: files, folders or globs such as 'data/*.csv'"
    )
    target_workspace_id: str | None = Field(default=None, description="start: copy into")
    target_folder: str = Field(default="", description="start: a folder of the target")
    transfer_id: str | None = Field(default=None, description="query, cancel: the transfer")
    queue: bool = Field(default=False, description="start: wait if the target is busy")
    batch_files: int | None = Field(
        default=None, ge=1, le=MAX_BATCH_FILES, description="start: files per committed batch"
    )
    batch_bytes: int | None = Field(
        default=None, ge=1, description="start: bytes per committed batch"
    )
    outcome: str | None = Field(default=None, description="query: only files with this outcome")
    offset: int = Field(default=0, ge=0, description="query: first per-file outcome")
    limit: int = Field(
        default=DEFAULT_TRANSFER_PAGE, description="list, query: page size (1..1000)"
    )
    wait_s: float = Field(default=0.0, ge=0, le=60, description="cancel: wait for the end")


class TransferView(BaseModel):
    transfer_id: str
    state: TransferState
    agent_id: str
    source_workspace_id: str
    #: The source's committed snapshot the copy reads (recorded at start, T2).
    source_seq: int | None
    target_workspace_id: str
    target_folder: str
    paths: list[str]
    files_total: int
    bytes_total: int
    files_copied: int
    files_unchanged: int
    files_skipped: int
    files_failed: int
    #: Bytes of files committed into the target (copied or already there).
    bytes_done: int
    #: Bytes of the batch being copied now (not committed yet: they prove nothing, T3).
    bytes_in_flight: int = 0
    #: Bytes streamed from the source runner to the target runner (0 between workspaces of
    #: one runner: they share its content-addressed store).
    bytes_sent: int = 0
    batches: int
    #: The latest target snapshot a batch of this transfer was committed in.
    target_seq: int | None
    error: str | None = None
    cancel_requested: bool = False
    created_at: float
    started_at: float | None = None
    finished_at: float | None = None

    @property
    def terminal(self) -> bool:
        return self.state in ("completed", "partial", "failed", "cancelled")


class TransferFileView(BaseModel):
    source_path: str
    target_path: str
    kind: Literal["file", "dir", "symlink"]
    size: int
    #: The real SHA-256, or None when not known without hashing holes (files of 1 MiB or
    #: more: a transfer records content ids only).
    sha256: str | None = None
    content_id: str | None = None
    #: ``pending`` while the transfer has not reached it.
    outcome: TransferOutcome | Literal["pending"]
    reason: str | None = None
    #: The target snapshot it was committed in.
    target_seq: int | None = None


class TransferFilesView(BaseModel):
    transfer_id: str
    files: list[TransferFileView]
    next_offset: int | None = None


class ArtifactView(BaseModel):
    artifact_id: str
    name: str
    agent_id: str
    workspace_id: str
    runner_id: str
    seq: int
    path: str
    #: The real SHA-256 of the artifact's bytes (what ``sha256sum`` prints).
    sha256: str
    #: The snapshot store's content id (equals ``sha256`` unless the file holds a zero MiB).
    content_id: str
    size: int
    created_at: float


class RetentionView(BaseModel):
    """What a retention pass did: snapshots pruned per workspace, objects collected per
    runner, and the runners that could not be asked."""

    keep_last: int
    pruned: list[PruneResult]
    collected: dict[str, GcResult]
    errors: dict[str, str] = Field(default_factory=dict)


# ------------------------ the GETs' query models: files (W2, W5), transfers (T1-T4)
# (``Annotated[Model, Query()]`` in api/; docs/architecture.md "The doors")


_WORKSPACE = Field(None, description="a workspace id (default: your own)")
_RUNNER = Field(None, description="your workspace on this runner (default local)")
_SEQ = Field(None, ge=0, description="a snapshot number (default: the head)")


class FileListQuery(BaseModel):
    path: str = ""
    workspace_id: str | None = _WORKSPACE
    runner_id: str | None = _RUNNER
    seq: int | None = _SEQ
    recursive: bool = False
    after: str | None = None
    limit: int = Field(DEFAULT_LIST_LIMIT, ge=1, le=MAX_LIST_LIMIT)


class FileStatQuery(BaseModel):
    path: str
    workspace_id: str | None = _WORKSPACE
    runner_id: str | None = _RUNNER
    seq: int | None = _SEQ


class FileReadTextQuery(FileStatQuery):
    offset: int = Field(0, ge=0)
    limit: int = Field(DEFAULT_TEXT_READ, ge=1, le=MAX_TEXT_READ)


class FileHistoryQuery(BaseModel):
    workspace_id: str | None = _WORKSPACE
    runner_id: str | None = _RUNNER


class FileDiffQuery(BaseModel):
    from_seq: int = Field(ge=0)
    to_seq: int | None = _SEQ
    path: str = ""
    workspace_id: str | None = _WORKSPACE
    runner_id: str | None = _RUNNER
    after: str | None = None
    limit: int = Field(DEFAULT_DIFF_LIMIT, ge=1, le=MAX_LIST_LIMIT)


class TransferListQuery(BaseModel):
    limit: int = Field(DEFAULT_TRANSFER_PAGE, ge=1, le=MAX_TRANSFER_PAGE)


class TransferWait(BaseModel):
    """T3: wait up to ``timeout_s`` for a transfer's end (the operation's bounds; the REST
    door's ``TransferWaitQuery`` narrows them, as contract/executions.py explains)."""

    timeout_s: float = Field(10, ge=0)


class TransferWaitQuery(TransferWait):
    timeout_s: float = Field(10, ge=0, le=30)


class TransferFilesQuery(BaseModel):
    outcome: Literal["pending", "copied", "unchanged", "skipped", "failed"] | None = None
    offset: int = Field(0, ge=0)
    limit: int = Field(DEFAULT_OUTCOME_PAGE, ge=1, le=MAX_LIST_LIMIT)


class TransferCancelQuery(BaseModel):
    wait_s: float = Field(0, ge=0, le=60)


__all__ = [
    "ArtifactDeclareRequest",
    "ArtifactView",
    "DiffEntry",
    "DiffResult",
    "DirListing",
    "EditView",
    "FileDeleteRequest",
    "FileDiffQuery",
    "FileHistoryQuery",
    "FileListQuery",
    "FileListRequest",
    "FileMoveRequest",
    "FileReadRequest",
    "FileReadTextQuery",
    "FileStatQuery",
    "FileText",
    "FileWriteRequest",
    "HistoryView",
    "PathEntry",
    "RetentionView",
    "SnapshotDiffRequest",
    "SnapshotListRequest",
    "SnapshotRestoreRequest",
    "SnapshotView",
    "TransferCancelQuery",
    "TransferFileView",
    "TransferFilesQuery",
    "TransferFilesView",
    "TransferListQuery",
    "TransferRequest",
    "TransferView",
    "TransferWait",
    "TransferWaitQuery",
    "WorkspaceTransferRequest",
    "WorkspaceView",
]
