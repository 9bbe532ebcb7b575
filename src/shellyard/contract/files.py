"""Request and result models of workspace files, snapshot history, transfers and artifacts
(W1–W6, T1–T5), shared by every interface (REST, MCP, SDK, CLI).
Folder listings, diffs and path entries are the Runner protocol's own models: they cross from
the runner to the caller unchanged."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from shellyard.runner.protocol import (
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
    sha256: str | None = None


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
    sha256: str | None = None
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
    sha256: str
    size: int
    created_at: float


class RetentionView(BaseModel):
    """What a retention pass did: snapshots pruned per workspace, objects collected per
    runner, and the runners that could not be asked."""

    keep_last: int
    pruned: list[PruneResult]
    collected: dict[str, GcResult]
    errors: dict[str, str] = Field(default_factory=dict)


__all__ = [
    "ArtifactView",
    "DiffEntry",
    "DiffResult",
    "DirListing",
    "EditView",
    "FileText",
    "HistoryView",
    "PathEntry",
    "RetentionView",
    "SnapshotView",
    "TransferFileView",
    "TransferFilesView",
    "TransferRequest",
    "TransferView",
    "WorkspaceView",
]
