"""Request and result models shared by every interface (REST, MCP, SDK, CLI)."""

from __future__ import annotations

import re
from enum import StrEnum
from typing import Literal

from pydantic import AliasChoices, BaseModel, ConfigDict, Field, model_validator

from shellyard.contract.interactive import (
    DEFAULT_TTY_COLS,
    DEFAULT_TTY_ROWS,
    check_terminal_size,
)

DEFAULT_WAIT_MS = 10_000
MAX_WAIT_MS = 30_000
DEFAULT_MAX_OUTPUT = 30_000
#: A page of ``execution_logs`` (bytes) and the longest ``execution_cancel`` wait (seconds).
DEFAULT_LOG_LIMIT = 65536
MAX_CANCEL_WAIT_S = 60.0
#: REST and the SDK return from a cancel at once by default (a program polls); the MCP tool
#: waits this long by default, because a model that asked to stop a job wants to see it stop.
AGENT_CANCEL_WAIT_S = 10.0

#: E1 options (docs/contract.md "Per-command options"): the longest ``timeout_ms`` (7 days),
#: the most ``env`` names, the longest value, the most ``args`` and their total size.
MAX_TIMEOUT_MS = 7 * 24 * 3600 * 1000
MAX_ENV_NAMES = 64
MAX_ENV_VALUE = 32_768
MAX_ARGS = 1024
MAX_ARGS_BYTES = 131_072
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
#: Names the sandbox sets itself (R2, E2): a request's ``env`` never overrides them.
SANDBOX_NAMES = frozenset(
    {"HOME", "PWD", "TMPDIR", "SHELL", "XDG_CACHE_HOME", "XDG_CONFIG_HOME", "XDG_DATA_HOME"}
    | {"XDG_STATE_HOME"}
)
PROXY_NAMES = frozenset({"HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "ALL_PROXY"})


def check_env(env: dict[str, str]) -> None:
    """E1 ``env``: valid names, bounded values, none of the sandbox's own."""
    if len(env) > MAX_ENV_NAMES:
        raise ValueError(f"env has {len(env)} names; at most {MAX_ENV_NAMES} are accepted")
    for name, value in env.items():
        if not ENV_NAME.fullmatch(name) or len(name) > 128:
            raise ValueError(
                f"env name {name[:80]!r} is not a variable name: use letters, digits and _ "
                "(not first a digit), at most 128 characters"
            )
        upper = name.upper()
        if upper in SANDBOX_NAMES or upper in PROXY_NAMES or upper.startswith("SHELLYARD_"):
            raise ValueError(
                f"env name {name!r} is set by the sandbox itself (HOME, PWD, TMPDIR, SHELL, "
                "XDG_*_HOME, SHELLYARD_*, the proxy variables) and cannot be overridden; "
                "use another name, or set it inside the command"
            )
        if "\x00" in value or len(value) > MAX_ENV_VALUE:
            raise ValueError(
                f"env {name}: the value must hold no NUL byte and be at most {MAX_ENV_VALUE} "
                "characters"
            )


class ExecutionState(StrEnum):
    queued = "queued"
    running = "running"
    completed = "completed"
    cancelled = "cancelled"
    failed = "failed"
    unknown = "unknown"

    @property
    def terminal(self) -> bool:
        return self not in (ExecutionState.queued, ExecutionState.running)


class RunShellRequest(BaseModel):
    """E1. Exactly one of ``command`` or ``script_path``."""

    model_config = ConfigDict(extra="forbid")

    command: str | None = Field(default=None, description="shell text, run by bash -c")
    script_path: str | None = Field(
        default=None,
        # E1: the seed's spelling is accepted too.
        validation_alias=AliasChoices("script_path", "scriptPath"),
        description="a script in the workspace (.py, .R, .sh or a shebang line) to run",
    )
    runner_id: str | None = Field(default=None, description="the runner (default local)")
    environment_id: str | None = Field(
        default=None, description="a managed environment to run in (read-only, bin first)"
    )
    # The range is checked below, not with ge/le, so the error says what wait_ms means.
    wait_ms: int = Field(
        default=DEFAULT_WAIT_MS,
        description=f"how long this answer may wait, 0..{MAX_WAIT_MS} ms (not a timeout)",
    )
    background: bool = Field(default=False, description="return at once; a notice tells the end")
    max_output_length: int = Field(
        default=DEFAULT_MAX_OUTPUT,
        ge=0,
        le=10_000_000,
        description="characters of stdout/stderr returned inline (head and tail kept)",
    )
    idempotency_key: str | None = Field(
        default=None,
        min_length=1,
        max_length=128,
        description="the same key returns the first execution instead of running again",
    )
    queue: bool = Field(default=False, description="wait in line when the workspace is busy")
    read_only: bool = Field(
        default=False,
        description="run beside the writer on the last snapshot, read-only, no snapshot",
    )
    timeout_ms: int | None = Field(
        default=None, ge=1, le=MAX_TIMEOUT_MS, description="cancel it after this long (ms)"
    )
    env: dict[str, str] | None = Field(default=None, description="extra variables")
    # W6 path rules checked by the control plane (control/executions/options.py).
    cwd: str | None = Field(default=None, description="start folder, workspace-relative")
    args: list[str] | None = Field(default=None, description="arguments for script_path")
    # E13: input while it runs (execution_input); tty: on a pseudo-terminal (execution_screen).
    interactive: bool = Field(default=False, description="stdin open for execution_input")
    tty: bool = Field(default=False, description="on a terminal (implies interactive)")
    tty_rows: int = Field(default=DEFAULT_TTY_ROWS, description="tty: rows")
    tty_cols: int = Field(default=DEFAULT_TTY_COLS, description="tty: columns")

    @model_validator(mode="after")
    def _check(self) -> RunShellRequest:
        if (self.command is None) == (self.script_path is None):
            raise ValueError(
                "give exactly one of 'command' (shell text) or 'script_path' "
                "(a file in the workspace)"
            )
        if not 0 <= self.wait_ms <= MAX_WAIT_MS:
            # E1: out of range is an error, never a clamp.
            raise ValueError(
                f"wait_ms must be between 0 and {MAX_WAIT_MS} (it is a response budget, not a "
                f"timeout; got {self.wait_ms}). For longer work pass background: true and poll "
                "execution_status"
            )
        if self.command is not None and "\x00" in self.command:
            raise ValueError("command contains a NUL byte")
        if self.env is not None:
            check_env(self.env)
        if self.args is not None:
            if self.script_path is None:
                raise ValueError(
                    "args go with script_path only; with command, put the arguments in the "
                    "shell text"
                )
            if len(self.args) > MAX_ARGS or sum(len(a) for a in self.args) > MAX_ARGS_BYTES:
                raise ValueError(
                    f"args: at most {MAX_ARGS} arguments and {MAX_ARGS_BYTES} characters"
                )
            if any("\x00" in arg for arg in self.args):
                raise ValueError("args: an argument contains a NUL byte")
        check_terminal_size(self.tty_rows, self.tty_cols)
        if self.tty:
            self.interactive = True
        return self


def parse_run_shell(data: dict[str, object]) -> RunShellRequest:
    """``run_shell``'s body as its model (``rawjson.parse``; E1's rules are the model's)."""
    from shellyard.contract.rawjson import parse

    return parse(RunShellRequest, data)


class ExecutionPolicyView(BaseModel):
    """The sandbox policy an execution ran under (R2): its network mode, a digest of the
    egress allow-list and exceptions (egress only), the seccomp profile's version."""

    network: str
    egress_digest: str | None = None
    seccomp_profile: str


class ExecutionView(BaseModel):
    """What ``execution_status`` (and ``run_shell``) report about one execution."""

    execution_id: str
    state: ExecutionState
    exit_code: int | None
    environment_id: str | None = None
    environment_revision: int | None = None
    #: V5: while queued behind an environment change, that change's id.
    waiting_for: str | None = None
    agent_id: str
    workspace_id: str
    runner_id: str
    command: str | None = None
    script_path: str | None = None
    background: bool = False
    error: str | None = None
    snapshot_seq: int | None = None
    was_unknown: bool = False
    cancel_requested: bool = False
    created_at: float
    started_at: float | None = None
    finished_at: float | None = None
    #: Recorded when the execution ends; None while it runs and for older records.
    policy: ExecutionPolicyView | None = None
    #: Set when retention deleted the execution's logs (docs/operations.md).
    logs_pruned_at: float | None = None
    #: W2: it ran beside the writer on the committed snapshot (no snapshot of its own).
    read_only: bool = False
    #: R2: the limit that ended it (``memory``, ``quota``, ``cpu``, ``file_size`` …), if one
    #: did; the sentence is in ``error``.
    limit: str | None = None
    #: R2 tenants: what its cgroup measured (None without cgroups: docs/limits.md).
    peak_memory_bytes: int | None = None
    cpu_seconds: float | None = None
    #: E13: its stdin takes execution_input; ``tty``: on a pseudo-terminal.
    interactive: bool = False
    tty: bool = False
    #: E13: while it runs, whether it is blocked reading its input (None: not detectable,
    #: not interactive, or ended).
    awaiting_input: bool | None = None


class RunShellResult(ExecutionView):
    stdout: str = ""
    stderr: str = ""
    output_truncated: bool = False
    #: Something the caller should know about how the command ran, e.g. that no default
    #: environment is prepared on the runner and the command that prepares it
    #: (docs/environments.md).
    note: str | None = None


class LogsResult(BaseModel):
    execution_id: str
    stream: Literal["stdout", "stderr", "stdin"]
    data: str
    offset: int
    next_offset: int
    size: int
    complete: bool
    state: ExecutionState
    #: Set when retention deleted the execution's logs (docs/operations.md): ``data`` is empty
    #: and stays so; the record itself still reads.
    logs_pruned_at: float | None = None
    #: How ``data`` holds the bytes: ``utf-8`` text (bytes that are not UTF-8 read as U+FFFD),
    #: or ``base64`` of the exact bytes when asked with ``encoding=base64`` (docs/cli.md).
    encoding: Literal["utf-8", "base64"] = "utf-8"

    def raw(self) -> bytes:
        """The page's bytes: exact with ``encoding=base64``, else the text's UTF-8."""
        if self.encoding == "base64":
            import base64

            return base64.b64decode(self.data)
        return self.data.encode()


_EXECUTION_ID = Field(description="an execution id (ex_...) from run_shell")


class ExecutionStatusRequest(BaseModel):
    """E5: the state of one execution."""

    model_config = ConfigDict(extra="forbid")

    execution_id: str = _EXECUTION_ID


class ExecutionLogsRequest(BaseModel):
    """E6: one page of an execution's log, from a byte offset or its tail."""

    model_config = ConfigDict(extra="forbid")

    execution_id: str = _EXECUTION_ID
    stream: Literal["stdout", "stderr", "stdin"] = Field(default="stdout", description="which log")
    offset: int = Field(default=0, ge=0, description="byte offset to read from")
    limit: int = Field(default=DEFAULT_LOG_LIMIT, ge=0, description="at most this many bytes")
    tail: int | None = Field(default=None, ge=0, description="the last tail bytes instead")


class ExecutionCancelRequest(BaseModel):
    """E7: SIGTERM, then the whole sandbox after the grace period."""

    model_config = ConfigDict(extra="forbid")

    execution_id: str = _EXECUTION_ID
    wait_s: float = Field(
        default=0.0,
        ge=0,
        le=MAX_CANCEL_WAIT_S,
        description=f"wait up to this long (0..{MAX_CANCEL_WAIT_S:g} s) for state 'cancelled'",
    )


# ------------------------ the GETs' query models: executions (E1-E13)
# (``Annotated[Model, Query()]`` in api/; docs/architecture.md "The doors")
# A control method takes its operation's model whole. Where the REST door bounds a field
# tighter than the operation does (a page of at most 1000, a wait of at most 30 s), the
# operation's model (``ExecutionList``, ``ExecutionWait``) carries the operation's bounds and
# the door's ``...Query`` narrows them: callers inside the server (a cancel that waits 60 s,
# the tests) build the operation's model, the door validates the narrower one.


class ExecutionList(BaseModel):
    """The acting agent's executions, newest first (``limit`` of them)."""

    limit: int = Field(100, ge=1)


class ExecutionListQuery(ExecutionList):
    limit: int = Field(100, ge=1, le=1000)


class ExecutionWait(BaseModel):
    """Wait up to ``timeout_s`` for an execution's end (a budget for the answer, never a
    process timeout, as E3's ``wait_ms``)."""

    timeout_s: float = Field(10, ge=0)


class ExecutionWaitQuery(ExecutionWait):
    timeout_s: float = Field(10, ge=0, le=30)


class ExecutionResultQuery(BaseModel):
    max_output_length: int = Field(DEFAULT_MAX_OUTPUT, ge=0, le=10_000_000)


class ExecutionLogsQuery(BaseModel):
    stream: str = "stdout"
    offset: int = Field(0, ge=0)
    limit: int = Field(DEFAULT_LOG_LIMIT, ge=0)
    tail: int | None = Field(None, ge=0)
    tail_lines: int | None = Field(None, ge=0)
    #: base64: the exact bytes (the SDK's follow_logs, the CLI; docs/cli.md)
    encoding: Literal["utf-8", "base64"] = "utf-8"


class ExecutionCancelQuery(BaseModel):
    wait_s: float = Field(0, ge=0, le=MAX_CANCEL_WAIT_S)
