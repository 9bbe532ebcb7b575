"""Spawning one execution's sandbox: its command line, its environment, its files on disk.

The fast durable path: bwrap is spawned detached in its own session with stdout/stderr
opened straight onto log files and ``--json-status-fd`` onto a status file. No pipes and no
per-execution Python process: if this process dies, the sandbox keeps running, logging and
finally records its exit code (``supervise.py`` re-attaches).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shlex
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from shellyard.errors import InvalidInput, NotFound, PathRefused
from shellyard.paths import normalize_relative
from shellyard.runner import processes
from shellyard.runner.network.netns import WorkspaceNetworks
from shellyard.runner.policy import ExecutionPolicy, SandboxPolicy
from shellyard.runner.protocol import RunnerExecution, StartRequest
from shellyard.runner.sandbox import bwrap as sandbox
from shellyard.runner.sandbox.seccomp import SeccompProfile

INTERPRETER_BY_SUFFIX = {".py": ["python3"], ".R": ["Rscript"], ".r": ["Rscript"], ".sh": ["bash"]}


@dataclass
class LiveExecution:
    """What this process knows about one execution it watches."""

    workspace_id: str
    directory: Path
    pid: int
    start_time: int
    started_at: float
    done: asyncio.Event = field(default_factory=asyncio.Event)
    result: RunnerExecution | None = None
    popen: subprocess.Popen[bytes] | None = None
    pidfd: int | None = None
    cancel_task: asyncio.Task[None] | None = None
    #: The managed environment mounted into the sandbox (V4), if any.
    environment_id: str | None = None
    #: The policy it was started under (None for a record of an older runner).
    policy: ExecutionPolicy | None = None
    #: W2: a reader beside the writer: no writer held, no commit at the end.
    read_only: bool = False
    #: R2: it joined its workspace's shared network namespace (netns.py).
    shared_network: bool = False


def write_json_atomic(path: Path, data: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(data)
    os.replace(tmp, path)


@dataclass
class Sandboxes:
    """Everything a spawn needs that is fixed for the runner's life: found and built once in
    ``startup`` (bwrap, the host view, the seccomp filter), so a spawn only fills in argv."""

    policy: SandboxPolicy
    ids: tuple[int, int] | None
    bwrap: str
    view: sandbox.HostView
    seccomp: SeccompProfile
    disable_userns: bool
    egress_socket: Path | None = None
    socat: str | None = None
    #: R2: one network namespace per workspace, when this runner can (netns.py).
    networks: WorkspaceNetworks | None = None
    #: What enters the network, drops privileges and sets limits in one exec (launch.py);
    #: None: the nsenter/setpriv/prlimit chain.
    launcher: Path | None = None

    def execution_policy(self) -> ExecutionPolicy:
        network = self.policy.network
        digest = self.policy.egress_digest() if network == "egress" else None
        return ExecutionPolicy(
            network=network, egress_digest=digest, seccomp_profile=self.seccomp.version
        )

    def spawn(
        self,
        request: StartRequest,
        directory: Path,
        tree: Path,
        command: list[str],
        mount: tuple[Path, dict[str, str]] | None = None,
    ) -> LiveExecution:
        flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC
        out_fd = os.open(directory / "stdout", flags, 0o600)
        err_fd = os.open(directory / "stderr", flags, 0o600)
        status_fd = os.open(directory / "status", flags, 0o600)
        seccomp_fd = self.seccomp.open()
        policy = self.execution_policy()
        networks = self.networks
        shared = None
        try:
            if networks is not None:
                shared = networks.acquire(request.workspace_id, request.execution_id)
            argv = sandbox.bwrap_argv(
                bwrap=self.bwrap,
                policy=self.policy,
                ids=self.ids,
                view=self.view,
                hardening=sandbox.Hardening(seccomp_fd, self.disable_userns),
                workspace=tree,
                status_fd=status_fd,
                command=command,
                read_only_binds=[mount[0]] if mount is not None else (),
                egress_socket=self.egress_socket,
                socat=self.socat,
                workspace_read_only=request.read_only,
                network=shared,
                launcher=self.launcher,
            )
            env = sandbox.sandbox_env(
                sandbox.WORKSPACE,
                {
                    **sandbox.proxy_variables(self.policy.network),
                    **environment_variables(mount),
                    **request.env,
                    "SHELLYARD_EXECUTION_ID": request.execution_id,
                    "SHELLYARD_WORKSPACE_ID": request.workspace_id,
                },
            )
            started_at = time.time()
            popen = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=out_fd,
                stderr=err_fd,
                pass_fds=(status_fd, seccomp_fd),
                env=env,
                cwd="/",
                start_new_session=True,
            )
        except BaseException:
            if networks is not None and shared is not None:
                networks.release(request.workspace_id, request.execution_id)
            raise
        finally:
            for fd in (out_fd, err_fd, status_fd, seccomp_fd):
                with contextlib.suppress(OSError):
                    os.close(fd)
        pid_start = processes.start_time(popen.pid) or 0
        meta = {
            "execution_id": request.execution_id,
            "workspace_id": request.workspace_id,
            "pid": popen.pid,
            "start_time": pid_start,
            "started_at": started_at,
            "environment_id": request.environment_id,
            "policy": policy.model_dump(),
            "read_only": request.read_only,
            "shared_network": shared is not None,
        }
        write_json_atomic(directory / "meta.json", json.dumps(meta))
        return LiveExecution(
            workspace_id=request.workspace_id,
            directory=directory,
            pid=popen.pid,
            start_time=pid_start,
            started_at=started_at,
            popen=popen,
            environment_id=request.environment_id,
            policy=policy,
            read_only=request.read_only,
            shared_network=shared is not None,
        )


def script_argv(tree: Path, script_path: str) -> list[str]:
    """E1: run a workspace file by its shebang, else by its extension; named by its path
    inside the sandbox (under /workspace)."""
    relative = normalize_relative(script_path)
    if not relative:
        raise InvalidInput("script_path names the workspace root; give a file inside it")
    current = tree
    for part in relative.split("/"):
        current = current / part
        if current.is_symlink():
            raise PathRefused(
                f"script_path {script_path!r} crosses a symbolic link; give the real path"
            )
    if not current.is_file():
        raise NotFound(f"script {script_path!r} does not exist in /workspace")
    inside = f"{sandbox.WORKSPACE}/{relative}"
    with current.open("rb") as handle:
        first = handle.readline(512)
    if first.startswith(b"#!"):
        return [*shlex.split(first[2:].decode("utf-8", "replace").strip()), inside]
    interpreter = INTERPRETER_BY_SUFFIX.get(current.suffix, ["bash"])
    return [*interpreter, inside]


def environment_variables(mount: tuple[Path, dict[str, str]] | None) -> dict[str, str]:
    """The environment's variables for the sandbox (V4): its PATH entries go first."""
    if mount is None:
        return {}
    variables = dict(mount[1])
    variables["PATH"] = f"{variables['PATH']}:{sandbox.SANDBOX_PATH}"
    return variables


def bwrap_error(directory: Path, returncode: int) -> str:
    """bwrap exited without starting the command: its own message is on stderr."""
    try:
        with (directory / "stderr").open("rb") as handle:
            message = handle.read(2000).decode("utf-8", "replace").strip()
    except OSError:
        message = ""
    return f"the sandbox could not start (bwrap exit {returncode}): {message or 'no message'}"
