"""The runner wire: how each Runner method (runner/protocol.py, the contract) crosses HTTP.

Every method is ``POST /v1/<method>``. ``OPERATIONS`` is the one table the daemon derives its
routes from and ``RemoteRunner`` its calls from; a method's request model lists its
arguments by the Protocol's parameter names, so neither side spells them out again. Four
kinds of operation:

A request model derived from ``LongPoll`` makes a long poll: the daemon caps ``timeout_s``
at ``WAIT_CAP_S`` and the client polls again while the answer's state is ``running``.

- ``json``: a JSON body (the request model), a JSON answer (the response model, or the one
  ``unwrap`` field of it when the method returns a list or a number).
- ``chunk``: a JSON body; the answer is the raw bytes of a ``LogChunk`` / ``FileChunk`` with
  its other fields in ``X-Shellyard-<Field>`` headers, so a 1 MiB chunk is not inflated by
  base64 in JSON.
- ``download``: a JSON body; the answer is a byte stream (files, tar archives, object packs).
- ``upload``: the request model travels in the ``X-Shellyard-Args`` header (ASCII JSON), the
  body is the raw byte stream given to the method as ``data``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from pydantic import Base64Bytes, BaseModel, Field

from shellyard.runner.protocol import (
    ApplyEntry,
    ApplyResult,
    DiffResult,
    DirListing,
    EditResult,
    EnvironmentChange,
    EnvironmentChangeRequest,
    EnvironmentInfo,
    FileChunk,
    GcResult,
    LogChunk,
    LogPruneRequest,
    LogPruneResult,
    ObjectResult,
    PathEntry,
    PortView,
    PruneResult,
    RunnerExecution,
    RunnerInfo,
    ScreenView,
    SnapshotInfo,
    StartRequest,
)

API_PREFIX = "/v1"
#: The server answers a long poll (``wait``, ``environment_change_wait``) after at most this
#: long; the client loops for longer waits.
WAIT_CAP_S = 30.0
#: Request header of the upload operations: their arguments as ASCII JSON.
H_ARGS = "X-Shellyard-Args"
#: Response headers of the chunk operations (``chunk_header(field)`` for each field but data).
H_OFFSET = "X-Shellyard-Offset"
H_NEXT_OFFSET = "X-Shellyard-Next-Offset"
H_SIZE = "X-Shellyard-Size"
H_COMPLETE = "X-Shellyard-Complete"


def chunk_header(field: str) -> str:
    """``next_offset`` → ``X-Shellyard-Next-Offset``."""
    return "X-Shellyard-" + "-".join(part.capitalize() for part in field.split("_"))


# --- request models: one per argument list, fields named as the Protocol's parameters ---


class NoArgs(BaseModel):
    """The arguments of a method that has none (besides an upload's body)."""


class ExecutionRef(BaseModel):
    execution_id: str


class LongPoll(BaseModel):
    """The arguments of a long poll: the daemon caps ``timeout_s`` at ``WAIT_CAP_S``."""

    timeout_s: float = Field(allow_inf_nan=False)


class WaitRequest(LongPoll):
    execution_id: str


class WorkspaceRef(BaseModel):
    workspace_id: str


class LogRef(BaseModel):
    execution_id: str
    #: Any text: the runner itself refuses an unknown stream, with the same error as locally.
    stream: str


class LogReadRequest(LogRef):
    offset: int
    limit: int


class PathRef(BaseModel):
    workspace_id: str
    seq: int | None = None
    path: str


class FileReadRequest(PathRef):
    offset: int
    limit: int


class ListDirRequest(BaseModel):
    workspace_id: str
    seq: int | None = None
    path: str = ""
    recursive: bool = False
    after: str | None = None
    limit: int = 1000


class DiffRequest(BaseModel):
    workspace_id: str
    from_seq: int
    to_seq: int | None = None
    path: str = ""
    after: str | None = None
    limit: int = 1000


class ReadStreamRequest(PathRef):
    offset: int = 0
    length: int | None = None


class WriteFileArgs(BaseModel):
    workspace_id: str
    path: str
    mode: int | None = None


class WriteTarArgs(BaseModel):
    workspace_id: str
    path: str = ""


class DeleteRequest(BaseModel):
    workspace_id: str
    path: str
    recursive: bool = False


class MoveRequest(BaseModel):
    workspace_id: str
    source: str
    destination: str
    overwrite: bool = False


class RestoreRequest(BaseModel):
    workspace_id: str
    seq: int
    path: str = ""


class ObjectList(BaseModel):
    sha256s: list[str]


class ExportRequest(BaseModel):
    sha256s: list[str]
    #: The object pack version the importer reads (snapshots/objects.py); an older daemon
    #: drops this field and sends version 1, which every importer reads.
    pack_version: int = Field(default=1, ge=1, le=2)


class ApplyRequest(BaseModel):
    workspace_id: str
    entries: list[ApplyEntry]


class PruneRequest(BaseModel):
    workspace_id: str
    keep: list[int]


class GcRequest(BaseModel):
    grace_s: float = Field(ge=0, allow_inf_nan=False)


class ChangeRef(BaseModel):
    change_id: str


class ChangeWaitRequest(LongPoll):
    change_id: str


class EnvironmentRef(BaseModel):
    environment_id: str


# --- the start op: a short long poll, so a quick command costs one round trip ---

#: The daemon waits at most this long in ``start`` for the command to end (``wait_s``).
START_WAIT_CAP_S = 5.0
#: Most bytes of each log stream a ``start`` answer carries (``log_bytes``).
START_LOG_CAP = 1 << 20


class StartWait(StartRequest):
    """``start`` on the wire: the StartRequest, plus how long the daemon may wait for the
    command to end (``wait_s``, capped at ``START_WAIT_CAP_S``) and how many bytes of each log
    it then sends along (``log_bytes``). Both default to 0, the old behaviour; a daemon older
    than these fields ignores them (pydantic drops unknown fields) and answers at once, without
    ``logs``, so old and new ends interoperate."""

    wait_s: float = Field(default=0.0, ge=0, allow_inf_nan=False)
    log_bytes: int = Field(default=0, ge=0, le=START_LOG_CAP)


class LogHead(BaseModel):
    """A finished execution's log stream: its size and its first bytes (all of it when
    ``len(data) == size``)."""

    stream: str
    size: int
    #: Base64 in JSON; the raw bytes in Python (build it with ``model_construct``).
    data: Base64Bytes = b""


class StartAnswer(RunnerExecution):
    """``start``'s answer: the record; ``logs`` (stdout, stderr) only when it ended within
    ``wait_s`` and the daemon knows the fields."""

    logs: list[LogHead] | None = None


class PortOpenArgs(BaseModel):
    workspace_id: str
    port: int
    host_port: int = 0


class PortRef(BaseModel):
    workspace_id: str
    port: int


class PortsOf(BaseModel):
    workspace_id: str | None = None


class InputArgs(BaseModel):
    """E13 ``send_input``: the bytes (base64 in JSON) and the end of input."""

    execution_id: str
    data: Base64Bytes = b""
    eof: bool = False


class ResizeArgs(BaseModel):
    execution_id: str
    rows: int
    cols: int


# --- response wrappers: a method that returns a list or a number answers an object ---


class Accepted(BaseModel):
    accepted: int


class LogSize(BaseModel):
    size: int


class ObjectResults(BaseModel):
    results: list[ObjectResult]


class SnapshotList(BaseModel):
    snapshots: list[SnapshotInfo]


class PortViews(BaseModel):
    ports: list[PortView]


# --- the table ---

OpKind = Literal["json", "chunk", "download", "upload"]


@dataclass(frozen=True)
class Operation:
    """How one Runner method crosses the wire."""

    name: str
    request: type[BaseModel]
    #: The answer's model: a JSON answer (``json``, ``upload``) or the chunk (``chunk``);
    #: None for ``download``.
    response: type[BaseModel] | None = None
    kind: OpKind = "json"
    #: The request model is the method's single argument (``start(request)``), not its
    #: argument list.
    whole: bool = False
    #: The method's result is this one field of ``response``.
    unwrap: str | None = None
    #: The answer may be ``null`` (``stat_path`` of a missing path).
    nullable: bool = False
    #: Work grows with the workspace or a grace period: the client's slow timeout applies.
    slow: bool = False

    @property
    def path(self) -> str:
        return f"{API_PREFIX}/{self.name}"


def _table(*ops: Operation) -> dict[str, Operation]:
    return {op.name: op for op in ops}


OPERATIONS: dict[str, Operation] = _table(
    Operation("info", NoArgs, RunnerInfo),
    Operation("ensure_workspace", WorkspaceRef, SnapshotInfo, slow=True),
    Operation("start", StartWait, StartAnswer, whole=True, slow=True),
    Operation("status", ExecutionRef, RunnerExecution),
    Operation("wait", WaitRequest, RunnerExecution),
    Operation("cancel", ExecutionRef, RunnerExecution, slow=True),
    Operation("read_log", LogReadRequest, LogChunk, kind="chunk"),
    Operation("log_size", LogRef, LogSize, unwrap="size"),
    # E13: interactive executions
    Operation("send_input", InputArgs, Accepted, unwrap="accepted", slow=True),
    Operation("screen", ExecutionRef, ScreenView),
    Operation("resize", ResizeArgs, ScreenView),
    Operation("commit", WorkspaceRef, SnapshotInfo, slow=True),
    Operation("head", WorkspaceRef, SnapshotInfo),
    Operation("stat_path", PathRef, PathEntry, nullable=True),
    Operation("read_file", FileReadRequest, FileChunk, kind="chunk"),
    # files and history
    Operation("list_snapshots", WorkspaceRef, SnapshotList, unwrap="snapshots"),
    Operation("list_dir", ListDirRequest, DirListing),
    Operation("diff", DiffRequest, DiffResult),
    Operation("read_stream", ReadStreamRequest, kind="download"),
    Operation("export_tar", PathRef, kind="download"),
    Operation("write_file", WriteFileArgs, EditResult, kind="upload"),
    Operation("write_tar", WriteTarArgs, EditResult, kind="upload"),
    Operation("delete_path", DeleteRequest, EditResult, slow=True),
    Operation("move_path", MoveRequest, EditResult, slow=True),
    Operation("restore", RestoreRequest, EditResult, slow=True),
    # transfers and retention
    Operation("missing_objects", ObjectList, ObjectList, unwrap="sha256s"),
    Operation("export_objects", ExportRequest, kind="download"),
    Operation("import_objects", NoArgs, ObjectResults, kind="upload", unwrap="results"),
    Operation("apply_entries", ApplyRequest, ApplyResult, slow=True),
    Operation("prune_snapshots", PruneRequest, PruneResult, slow=True),
    Operation("collect_garbage", GcRequest, GcResult, slow=True),
    Operation("prune_logs", LogPruneRequest, LogPruneResult, whole=True, slow=True),
    # managed environments (V1–V8)
    Operation(
        "environment_change", EnvironmentChangeRequest, EnvironmentChange, whole=True, slow=True
    ),
    Operation("environment_change_status", ChangeRef, EnvironmentChange),
    Operation("environment_change_wait", ChangeWaitRequest, EnvironmentChange),
    Operation("environment_info", EnvironmentRef, EnvironmentInfo),
    # ports for the host (R5): the daemon forwards a loopback port of its own host
    Operation("open_port", PortOpenArgs, PortView),
    Operation("list_ports", PortsOf, PortViews, unwrap="ports"),
    Operation("close_port", PortRef, PortView),
)


def arguments(op: Operation, body: BaseModel) -> dict[str, object]:
    """The keyword arguments of the Runner method for a validated request ``body``.

    Fields are taken as attributes, not dumped, so nested models stay models."""
    if op.whole:
        return {"request": body}
    return {name: getattr(body, name) for name in type(body).model_fields}
