"""The Runner protocol (R1): everything the control plane may ask of a runner.

The control plane never opens a runner's files; it asks through this protocol, so the
in-process ``LocalRunner`` and the ``RemoteRunner`` (HTTP to a runner daemon) are
interchangeable. Messages are pydantic models so they cross HTTP unchanged.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Literal, Protocol, runtime_checkable

from pydantic import BaseModel, Field

LogStream = Literal["stdout", "stderr"]

#: Largest chunk one log or file read returns; callers page with ``next_offset``.
MAX_READ_CHUNK = 1 << 20


class RunnerExecState(StrEnum):
    running = "running"
    #: The sandbox is gone, the snapshot is committed, the outcome is final.
    finished = "finished"
    #: The runner holds no trace of a live or finished sandbox for this id.
    lost = "lost"


class SandboxPolicy(BaseModel):
    """Per-runner sandbox settings (R2)."""

    network: Literal["on", "off"] = "on"
    max_processes: int = Field(default=4096, ge=16)
    max_open_files: int = Field(default=4096, ge=64)
    max_file_size_bytes: int = Field(default=64 << 30, ge=1 << 20)
    max_memory_bytes: int | None = Field(default=None, ge=64 << 20)
    #: uid/gid the sandbox runs as when the runner is root; None picks the default.
    sandbox_uid: int | None = None
    sandbox_gid: int | None = None
    cancel_grace_s: float = Field(default=5.0, ge=0.0, le=300.0)


class StartRequest(BaseModel):
    execution_id: str
    workspace_id: str
    command: str | None = None
    script_path: str | None = None
    env: dict[str, str] = Field(default_factory=dict)


class SnapshotInfo(BaseModel):
    workspace_id: str
    seq: int
    root_hash: str
    files: int
    bytes: int
    created_at: float
    #: False when the tree was unchanged and the head was reused.
    new: bool = True


class RunnerExecution(BaseModel):
    execution_id: str
    workspace_id: str
    state: RunnerExecState
    exit_code: int | None = None
    cancelled: bool = False
    #: The commit made after the sandbox ended (W3), before the result turned final.
    snapshot: SnapshotInfo | None = None
    started_at: float | None = None
    finished_at: float | None = None
    error: str | None = None


class LogChunk(BaseModel):
    data: bytes
    offset: int
    next_offset: int
    #: Size of the stream on disk when read.
    size: int
    #: True when the execution is finished and ``next_offset`` reached the end.
    complete: bool


class PathEntry(BaseModel):
    path: str
    kind: Literal["file", "dir", "symlink"]
    size: int
    mode: int
    sha256: str | None = None
    target: str | None = None


class FileChunk(BaseModel):
    data: bytes
    offset: int
    next_offset: int
    size: int


class RunnerInfo(BaseModel):
    runner_version: str
    sandbox: str
    network: Literal["on", "off"]
    sandbox_uid: int


@runtime_checkable
class Runner(Protocol):
    """What every runner implements. All methods are idempotent where it matters:
    ``start`` with a known execution id returns the existing execution (E10)."""

    async def info(self) -> RunnerInfo: ...

    async def ensure_workspace(self, workspace_id: str) -> SnapshotInfo: ...

    async def start(self, request: StartRequest) -> RunnerExecution: ...

    async def status(self, execution_id: str) -> RunnerExecution: ...

    async def wait(self, execution_id: str, timeout_s: float) -> RunnerExecution: ...

    async def cancel(self, execution_id: str) -> RunnerExecution: ...

    async def read_log(
        self, execution_id: str, stream: LogStream, offset: int, limit: int
    ) -> LogChunk: ...

    async def log_size(self, execution_id: str, stream: LogStream) -> int: ...

    async def commit(self, workspace_id: str) -> SnapshotInfo: ...

    async def head(self, workspace_id: str) -> SnapshotInfo: ...

    async def stat_path(
        self, workspace_id: str, seq: int | None, path: str
    ) -> PathEntry | None: ...

    async def read_file(
        self, workspace_id: str, seq: int | None, path: str, offset: int, limit: int
    ) -> FileChunk: ...

    async def aclose(self) -> None: ...
