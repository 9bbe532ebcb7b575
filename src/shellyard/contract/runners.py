"""What the runner operations take and return: the one ``RunnerView`` of REST, the SDK, the
CLI and MCP, and the one request that registers a runner (docs/runners.md)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

RunnerState = Literal["up", "unreachable", "unknown"]


class RunnerAddRequest(BaseModel):
    """Register a runner daemon: ``direct`` (http:// on loopback, https:// elsewhere, its
    certificate pinned) or ``ssh`` (ssh://USER@HOST[:PORT]/SOCKET or ...?port=N)."""

    runner_id: str = Field(
        pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$",
        description="a name of your choice: letters, digits, '_', '.', '-'",
    )
    address: str = Field(
        pattern=r"^(https?|ssh)://[!-~]+$",
        description="http(s)://HOST:PORT of a direct daemon, or ssh://USER@HOST[:PORT]/SOCKET",
    )
    token: str = Field(
        pattern=r"^[!-~]+$",
        description="the daemon's key (its ROOT/token file); it signs requests, never sent",
    )
    identity: str | None = Field(
        default=None, description="ssh: the private key file, on the control plane's host"
    )
    known_hosts: str | None = Field(
        default=None, description="ssh: the known-hosts file that holds the host's key"
    )
    accept_new: bool = Field(
        default=False, description="ssh: add an unknown host key to known_hosts instead of refusing"
    )
    tls_fingerprint: str | None = Field(
        default=None,
        pattern=r"^(SHA256:|sha256:)?[0-9A-Fa-f:]{64,95}$",
        description="https: the daemon certificate's SHA-256; omitted, the one presented is pinned",
    )


class RunnerBootstrapRequest(BaseModel):
    """Start (idempotently) a runner daemon on a host over SSH, as the SSH user, listening on
    a Unix socket, then register it as an ``ssh`` runner (docs/runners.md)."""

    runner_id: str = Field(
        pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$",
        description="a name of your choice: letters, digits, '_', '.', '-'",
    )
    address: str = Field(
        pattern=r"^ssh://[!-~]+$",
        description="ssh://USER@HOST[:PORT], or ssh://USER@HOST[:PORT]/SOCKET to choose the socket",
    )
    identity: str = Field(description="the private key file, on the control plane's host")
    known_hosts: str = Field(description="the known-hosts file that holds the host's key")
    accept_new: bool = Field(
        default=False, description="add an unknown host key to known_hosts instead of refusing"
    )
    root: str = Field(
        default="~/.shellyard/runner",
        pattern=r"^[!-~][ -~]*$",
        description="the daemon's folder on the far host (workspaces, logs, its key)",
    )
    command: str = Field(
        default="shellyard",
        pattern=r"^[!-~]+$",
        description="the shellyard program on the far host (a name on its PATH, or a path)",
    )
    network: Literal["off", "egress", "host"] = Field(
        default="off", description="the network policy of the daemon's commands"
    )


class RunnerLimits(BaseModel):
    """Effective limits of a runner (docs/limits.md), as its ``info`` reports them and
    ``runner show`` and the runner views give them."""

    #: 0: none. Enforced by watching the tree while a command runs (``quota_mechanism``).
    workspace_quota_bytes: int
    quota_mechanism: str
    #: Documented overshoot: a command is stopped within about this much above the quota.
    quota_margin_bytes: int
    log_limit_bytes: int
    free_space_reserve_bytes: int
    free_space_bytes: int
    max_cpu_seconds: int | None
    max_memory_bytes: int | None
    max_file_size_bytes: int
    max_processes: int
    max_open_files: int
    #: ``cgroup v2``, ``cgroup v1`` or ``rlimits`` (no usable cgroup: docs/limits.md).
    enforcement: str
    #: The runner's cgroup folders.
    cgroup: str | None = None
    #: R2 tenants: what ``max_memory_bytes`` and ``max_processes`` apply to, how CPU is
    #: shared, the CPU ceiling per workspace (cores), how sandbox uids are given.
    memory_scope: str | None = None
    process_scope: str | None = None
    cpu_share: str | None = None
    cpu_ceiling: float | None = None
    uids: str | None = None
    #: How a command's move into its groups waits under fork load (docs/limits.md "Moving
    #: into a group under load"): ``favordynmods …`` or ``host-wide threadgroup lock``.
    group_moves: str | None = None
    #: How an environment made ``--from`` a base gets its files (``SHELLYARD_BASE_SHARING``,
    #: docs/environments.md "Starting from a base"): ``copies …`` or ``hard links …``.
    base_sharing: str | None = None


class RunnerView(BaseModel):
    """A runner the control plane sends executions to (``local`` or a registered daemon)."""

    runner_id: str
    kind: str
    address: str | None
    #: ``up`` answered its last heartbeat; ``unreachable`` since ``unreachable_since``;
    #: ``unknown`` not asked yet.
    state: RunnerState = "unknown"
    unreachable_since: float | None = None
    last_seen: float | None = None
    last_error: str | None = None
    version: str | None = None
    #: Sandbox capabilities: the sandbox kind and the network policy of its commands.
    sandbox: str | None = None
    network: str | None = None
    #: The sandbox limits (rlimits, grace period) the runner applies, when it reports them.
    limits: RunnerLimits | None = None
    running_executions: int = 0
    #: The pinned identity: an ssh host key's or a TLS certificate's SHA-256.
    fingerprint: str | None = None


class RunnerBootstrapResult(BaseModel):
    """What ``runner bootstrap`` did: the daemon ``started`` now or found ``running``, its
    socket on the far host, and the registered runner."""

    daemon: Literal["started", "running"]
    socket: str
    runner: RunnerView
