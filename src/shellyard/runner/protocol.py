"""The Runner protocol (R1): everything the control plane may ask of a runner.

The control plane never opens a runner's files; it asks through this protocol, so the
in-process ``LocalRunner`` and the ``RemoteRunner`` (HTTP to a runner daemon) are
interchangeable. Messages are pydantic models so they cross HTTP unchanged.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from enum import StrEnum
from typing import Literal, Protocol, runtime_checkable

from pydantic import BaseModel, Field

# Re-exported: results that cross from the runner to the caller unchanged are public models.
from shellyard.contract.interactive import ScreenView as ScreenView
from shellyard.contract.packages import PackageRecord as PackageRecord
from shellyard.contract.ports import PortView as PortView
from shellyard.contract.runners import RunnerLimits as RunnerLimits
from shellyard.contract.snapshots import DiffEntry as DiffEntry
from shellyard.contract.snapshots import DiffResult as DiffResult
from shellyard.contract.snapshots import DirListing as DirListing
from shellyard.contract.snapshots import GcResult as GcResult
from shellyard.contract.snapshots import PathEntry as PathEntry
from shellyard.contract.snapshots import PruneResult as PruneResult
from shellyard.contract.snapshots import TransferOutcome as TransferOutcome

# Re-exported: the policy lives in policy.py (config.py reads it without the runner wire).
from shellyard.runner.policy import ExecutionPolicy, NetworkMode
from shellyard.runner.policy import SandboxPolicy as SandboxPolicy

#: ``stdin``: what was sent to an interactive execution (E13), kept up to a cap.
LogStream = Literal["stdout", "stderr", "stdin"]

#: Largest chunk one log or file read returns; callers page with ``next_offset``.
MAX_READ_CHUNK = 1 << 20

#: ``status``'s error for an execution id the runner never took (no folder at all): a start
#: whose answer never came did not happen (control/executions/unstarted.py reads it so).
NO_TRACE = "this runner holds no trace of the execution"
#: ``status``'s error for a start the runner was cut in (it stopped before recording the
#: sandbox; what it had spawned was killed when it came back): the outcome is unknown.
START_CUT = (
    "the runner stopped while starting the execution, before it recorded the sandbox; what "
    "it had spawned was killed when it came back, so whether the command ran is unknown"
)


class RunnerExecState(StrEnum):
    running = "running"
    #: The sandbox is gone, the snapshot is committed, the outcome is final.
    finished = "finished"
    #: The runner holds no trace of a live or finished sandbox for this id.
    lost = "lost"


#: The runner protocol's version, announced by ``info`` (``RunnerInfo.protocol``) and raised
#: whenever a request gains a field an older runner would drop without a word (pydantic ignores
#: fields it does not know). 1: no announcement (releases before 2). 2: ``start`` takes ``env``,
#: ``cwd`` and ``args`` (E1). 3: ``export_objects`` sends an object pack of version 2 (data
#: extents, no holes) when asked (``pack_version``); before, version 1 whatever was asked, so a
#: control plane asks for 2 only when the importing runner speaks 3. A control plane refuses a
#: request a runner is too old to honour (runner/transport/compat.py) instead of running it
#: differently.
PROTOCOL_VERSION = 3

#: The runner protocol from which ``export_objects`` sends (and ``import_objects`` reads)
#: object packs of version 2: data extents, no holes on the wire.
PACK_V2_SINCE = 3


def pack_version_for(importer: object) -> int:
    """The object pack version to send to ``importer`` (a runner): 2 when it reads it. A
    runner of this process (no ``protocol_version``) is of this version."""
    protocol = getattr(importer, "protocol_version", PROTOCOL_VERSION)
    return 2 if isinstance(protocol, int) and protocol >= PACK_V2_SINCE else 1


class StartRequest(BaseModel):
    execution_id: str
    workspace_id: str
    command: str | None = None
    script_path: str | None = None
    #: E1: the caller's variables, set inside the sandbox after its own (never over HOME,
    #: PWD, SHELLYARD_* ...: the contract refuses those names).
    env: dict[str, str] = Field(default_factory=dict)
    #: E1: the start folder, workspace-relative (normalised by the contract); None: the root.
    cwd: str | None = None
    #: E1: arguments appended to ``script_path``'s argv, exactly as given.
    args: list[str] = Field(default_factory=list)
    #: Mount this environment's prefix read-only and set its variables (V4).
    environment_id: str | None = None
    #: W2: run beside the writer on the last committed snapshot, bound read-only.
    read_only: bool = False
    #: Nobody waits for this start's end (a background execution, a queued one started by
    #: the previous one's end): a remote runner answers at once instead of long-polling.
    detached: bool = False
    #: E13: stdin stays open for ``send_input``; ``tty``: on a pseudo-terminal of this size.
    interactive: bool = False
    tty: bool = False
    tty_rows: int = 24
    tty_cols: int = 80


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
    #: The sandbox policy it runs under (network mode, allow-list digest, seccomp profile).
    policy: ExecutionPolicy | None = None
    #: The limit that ended the command, where the kernel or the runner tells: ``quota``,
    #: ``cpu`` (SIGXCPU), ``file_size`` (SIGXFSZ), ``memory`` (a cgroup's OOM kill).
    limit: str | None = None
    #: Bytes dropped from each log stream by the retained-log cap (only streams that were cut).
    logs_cut: dict[str, int] = Field(default_factory=dict)
    #: R2 tenants: what the execution's cgroup measured (None without cgroups).
    peak_memory_bytes: int | None = None
    cpu_seconds: float | None = None
    #: Set by ``start`` when a command without ``environment_id`` ran in the runner's default
    #: base environment (docs/environments.md): its name and revision; ``note`` when it ran without
    #: one.
    base_environment: str | None = None
    base_revision: int | None = None
    note: str | None = None
    #: E13: while it runs, whether it is blocked reading its input (None: cannot tell).
    awaiting_input: bool | None = None
    #: On an answer for an id the runner holds no record of (``untraced``): the id of the
    #: state folder that answered (runner/state_id.py), so the control plane can tell "this
    #: state never took the start" from "the state the start went to was replaced" (E9).
    #: None from runners before session 52.
    state_id: str | None = None


def untraced(execution_id: str, cut: bool, state_id: str | None = None) -> RunnerExecution:
    """``status``'s answer for an id with no record: ``cut``, a folder is left (a start the
    runner stopped in), else it never took the start; ``state_id`` says which state holds no
    record (runner/state_id.py)."""
    error = START_CUT if cut else NO_TRACE
    return RunnerExecution(
        execution_id=execution_id,
        workspace_id="",
        state=RunnerExecState.lost,
        error=error,
        state_id=state_id,
    )


class LogChunk(BaseModel):
    data: bytes
    offset: int
    next_offset: int
    #: Size of the stream on disk when read.
    size: int
    #: True when the execution is finished and ``next_offset`` reached the end.
    complete: bool


class FileChunk(BaseModel):
    data: bytes
    offset: int
    next_offset: int
    size: int


# --- files, history, transfers (W1–W6, T1–T5) ---

#: A byte stream in bounded chunks (uploads, downloads, object packs); never one big bytes.
ByteStream = AsyncIterator[bytes]


async def coalesce(data: ByteStream, size: int = 1 << 20) -> AsyncIterator[bytes]:
    """Regroup a stream's chunks (HTTP bodies arrive in small pieces) into about ``size``
    bytes each, so each worker-thread hop moves a useful amount."""
    buf = bytearray()
    async for chunk in data:
        if not buf and len(chunk) >= size:
            yield bytes(chunk)
            continue
        buf += chunk
        if len(buf) >= size:
            yield bytes(buf)
            buf.clear()
    if buf:
        yield bytes(buf)


#: Most entries one ``list_dir`` or ``diff`` page holds; callers page on with ``after``.
MAX_PAGE = 10_000


class EditResult(BaseModel):
    """What a writer operation on the runner did: the snapshot it ended with (W1, W3) and
    the entries it wrote or removed."""

    snapshot: SnapshotInfo
    written: list[PathEntry] = Field(default_factory=list)
    removed: list[str] = Field(default_factory=list)


class ApplyEntry(BaseModel):
    """One entry of a transfer batch, as the target should hold it. A file's bytes are the
    object ``sha256`` names: its content id (named so on the wire since before content ids;
    not always a SHA-256), which must be in the target runner's store (``import_objects``)."""

    path: str
    kind: Literal["file", "dir", "symlink"]
    mode: int = 0o644
    size: int = 0
    sha256: str | None = None
    target: str | None = None


class ApplyOutcome(BaseModel):
    path: str
    outcome: TransferOutcome
    reason: str | None = None


class ApplyResult(BaseModel):
    outcomes: list[ApplyOutcome]
    #: The commit that published the batch (T3: a file counts once it is in a snapshot).
    snapshot: SnapshotInfo


class ObjectResult(BaseModel):
    """How importing one object went: ``ok`` (stored or already there) or ``error``."""

    sha256: str
    ok: bool
    size: int = 0
    existed: bool = False
    error: str | None = None


class LogPruneRequest(BaseModel):
    """Retention of execution folders (docs/operations.md). The control plane chooses the
    executions (it knows which records, artifacts and notices still need them); the runner
    deletes only finished ones. ``forget`` removes the whole folder (the record is gone too);
    otherwise the small ``result.json`` stays, so a retried start still never runs twice
    (E10). No ids: only measure."""

    execution_ids: list[str] = Field(default_factory=list, max_length=10_000)
    forget: bool = False
    #: Stop once this many bytes are freed (the ids are pruned in the order given, oldest
    #: first: a size budget), None: prune them all.
    free_bytes: int | None = Field(default=None, ge=0)
    #: Instead of deleting: cut each log stream down to its head and tail, this many bytes
    #: kept (runner/limits/logcap.py), for logs an unread notice still needs. None: delete.
    keep_bytes: int | None = Field(default=None, ge=4096)


class LogPruneResult(BaseModel):
    #: Executions whose logs (and status files) are gone now.
    pruned: list[str] = Field(default_factory=list)
    bytes_freed: int = 0
    #: Bytes all execution folders hold; measured only when no ids were given.
    bytes_held: int | None = None


class RunnerInfo(BaseModel):
    runner_version: str
    #: ``PROTOCOL_VERSION`` of the runner; 1 from runners that do not announce one.
    protocol: int = 1
    sandbox: str
    network: NetworkMode
    sandbox_uid: int
    #: The effective limits and how each is enforced (docs/limits.md); None from old runners.
    limits: RunnerLimits | None = None
    #: The id of the runner's state folder (runner/state_id.py): the control plane records it
    #: with a start, to read a later ``NO_TRACE`` (E9). None from runners before session 52.
    state_id: str | None = None


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

    # E13: input to an interactive execution, its terminal's screen and size.
    async def send_input(self, execution_id: str, data: bytes, eof: bool) -> int: ...

    async def screen(self, execution_id: str) -> ScreenView: ...

    async def resize(self, execution_id: str, rows: int, cols: int) -> ScreenView: ...

    async def commit(self, workspace_id: str) -> SnapshotInfo: ...

    async def head(self, workspace_id: str) -> SnapshotInfo: ...

    async def stat_path(
        self, workspace_id: str, seq: int | None, path: str
    ) -> PathEntry | None: ...

    async def read_file(
        self, workspace_id: str, seq: int | None, path: str, offset: int, limit: int
    ) -> FileChunk: ...

    # --- files and history (W2, W5, W6): reads of committed snapshots only ---

    async def list_snapshots(self, workspace_id: str) -> list[SnapshotInfo]: ...

    async def list_dir(
        self,
        workspace_id: str,
        seq: int | None,
        path: str,
        recursive: bool,
        after: str | None,
        limit: int,
    ) -> DirListing: ...

    async def diff(
        self,
        workspace_id: str,
        from_seq: int,
        to_seq: int | None,
        path: str,
        after: str | None,
        limit: int,
    ) -> DiffResult: ...

    async def read_stream(
        self, workspace_id: str, seq: int | None, path: str, offset: int, length: int | None
    ) -> ByteStream:
        """The file's bytes from ``offset`` (``length`` None: to the end), streamed; errors
        (missing file, a folder, a link) are raised before the first chunk."""
        ...

    async def export_tar(self, workspace_id: str, seq: int | None, path: str) -> ByteStream: ...

    # --- writer operations (W1, W3): each ends with a commit; the caller holds the writer ---

    async def write_file(
        self, workspace_id: str, path: str, data: ByteStream, mode: int | None
    ) -> EditResult: ...

    async def write_tar(self, workspace_id: str, path: str, data: ByteStream) -> EditResult: ...

    async def delete_path(self, workspace_id: str, path: str, recursive: bool) -> EditResult: ...

    async def move_path(
        self, workspace_id: str, source: str, destination: str, overwrite: bool
    ) -> EditResult: ...

    async def restore(self, workspace_id: str, seq: int, path: str) -> EditResult: ...

    # --- transfers (T2–T4): objects move between runners, then a batch is applied ---

    async def missing_objects(self, sha256s: list[str]) -> list[str]: ...

    async def export_objects(self, sha256s: list[str], pack_version: int = 1) -> ByteStream: ...

    async def import_objects(self, data: ByteStream) -> list[ObjectResult]: ...

    async def apply_entries(self, workspace_id: str, entries: list[ApplyEntry]) -> ApplyResult: ...

    # --- retention ---

    async def prune_snapshots(self, workspace_id: str, keep: list[int]) -> PruneResult: ...

    async def collect_garbage(self, grace_s: float) -> GcResult: ...

    async def prune_logs(self, request: LogPruneRequest) -> LogPruneResult: ...

    # --- managed environments (V1–V8) ---

    async def environment_change(self, request: EnvironmentChangeRequest) -> EnvironmentChange:
        """Start a change (returns at once, state ``running``), or return the change with
        this id as it stands (E10-like idempotency). Refused (Conflict) while another change
        of the same environment runs or an execution using it is running on this runner."""
        ...

    async def environment_change_status(self, change_id: str) -> EnvironmentChange: ...

    async def environment_change_wait(
        self, change_id: str, timeout_s: float
    ) -> EnvironmentChange: ...

    async def environment_info(self, environment_id: str) -> EnvironmentInfo: ...

    # --- ports for the host (R5; runner/network/ports.py) ---

    async def open_port(self, workspace_id: str, port: int, host_port: int) -> PortView:
        """Forward a loopback port of the runner's host (``host_port``, 0: a free one) to
        ``port`` in the workspace's network; refused while it has no running execution."""
        ...

    async def list_ports(self, workspace_id: str | None) -> list[PortView]: ...

    async def close_port(self, workspace_id: str, port: int) -> PortView: ...

    async def aclose(self) -> None: ...


# --- managed environments (V1–V8) ---
#
# The control plane names environments and changes; the runner owns the prefix on its disk.
# A change (create, install, uninstall) is started with ``environment_change`` (idempotent by
# ``change_id``, like ``start`` for executions) and followed with ``environment_change_status``
# / ``environment_change_wait``. A change that fails, or that a crash interrupted, leaves the
# prefix as it was before the change (V8); one that succeeded reports the full package state.

EnvLanguage = Literal["python", "r"]
EnvManager = Literal["conda", "pip", "cran", "bioconductor"]
EnvAction = Literal["create", "install", "uninstall"]


class EnvironmentChangeRequest(BaseModel):
    change_id: str
    environment_id: str
    action: EnvAction
    #: ``create`` only.
    language: EnvLanguage | None = None
    #: ``create`` only: start from this base environment (``python-base``; docs/environments.md).
    base: str | None = None
    #: ``install`` / ``uninstall`` only.
    manager: EnvManager | None = None
    specs: list[str] = Field(default_factory=list)
    #: conda: channel names or URLs (``file://`` folders included).
    channels: list[str] = Field(default_factory=list)
    #: pip: ``index_url`` replaces the default index; ``find_links`` adds folders/URLs of wheels.
    index_url: str | None = None
    extra_index_urls: list[str] = Field(default_factory=list)
    find_links: list[str] = Field(default_factory=list)
    #: cran / bioconductor: repository URLs (``file://`` folders included).
    repos: list[str] = Field(default_factory=list)
    #: The caller's workspace on this runner: local sources under ``/workspace/`` name it
    #: (docs/environments.md; the control plane sets it for the agent that asked).
    workspace_id: str | None = None
    #: Asked on an agent's behalf (the control plane always says so): local sources must then
    #: lie in the caller's workspace or a folder the operator allows (docs/environments.md,
    #: "Package tools run as the sandbox uid"); False only for the operator's own direct calls.
    for_agent: bool = False


class EnvChangeState(StrEnum):
    running = "running"
    succeeded = "succeeded"
    failed = "failed"
    #: The runner holds no trace of this change id.
    lost = "lost"


#: Why a change failed, so the control plane can answer with the right error (V8).
EnvErrorKind = Literal[
    "invalid_spec", "not_found", "unreachable", "conflict", "failed", "interrupted"
]


class EnvironmentChange(BaseModel):
    change_id: str
    environment_id: str
    action: EnvAction
    state: EnvChangeState
    #: The latest progress line ("solving", "downloading 3/10", …) for a progress display.
    progress: str | None = None
    #: After success: the full package state of the prefix, every manager (V2).
    packages: list[PackageRecord] = Field(default_factory=list)
    error: str | None = None
    error_kind: EnvErrorKind | None = None
    started_at: float | None = None
    finished_at: float | None = None


class EnvironmentInfo(BaseModel):
    """Where an environment lives on its runner and what a command in it gets (V4)."""

    environment_id: str
    language: EnvLanguage
    #: The prefix on the runner's host.
    prefix: str
    #: V4: where commands (and its package tools) see the prefix: /env (seen.py), or the
    #: host path for an environment built before that; None from an older runner.
    mounted_at: str | None = None
    #: Variables set for executions using it (PATH first entries, CONDA_PREFIX, VIRTUAL_ENV,
    #: R_LIBS …); PATH here is only the prefix's part, put before the sandbox's PATH.
    #: E1: the caller's variables, set inside the sandbox after its own (never over HOME,
    #: PWD, SHELLYARD_* ...: the contract refuses those names).
    env: dict[str, str] = Field(default_factory=dict)
    #: E1: the start folder, workspace-relative (normalised by the contract); None: the root.
    cwd: str | None = None
    #: E1: arguments appended to ``script_path``'s argv, exactly as given.
    args: list[str] = Field(default_factory=list)
    #: A change is running on it now (the runner refuses to start executions on it then).
    changing: bool = False
