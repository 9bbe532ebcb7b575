"""Workspace networks on a runner that is not root (R2; docs/decisions.md).

Without CAP_SYS_ADMIN the runner cannot bind-mount a namespace on a file (netns.py), and
``bwrap --unshare-net`` gives each sandbox a namespace owned by a user namespace of its own
that nothing else can join. What works unprivileged: a **holder** process made by
``unshare --user --map-current-user --net --keep-caps`` (one new user namespace that owns one
new network namespace; the runner's uid maps to itself, so files keep their owner) runs
``relay.py --hold``, which brings ``lo`` up with the capabilities it kept and stays. Sandboxes
join it with ``nsenter --user=/proc/PID/ns/user --net=/proc/PID/ns/net --preserve-credentials``
before bwrap, which nests its own user namespace inside as usual; the runner's uid owns the
holder's user namespace, so it may enter it. Under ``egress`` the holder itself listens on
127.0.0.1:3128 in the namespace and relays to the proxy's socket.

The holder is detached (its own session) and recorded (``DIR/WORKSPACE.json``: pid, start
time, and the inodes of its two namespaces), so it outlives a restart of the runner process
(E11) and is stopped when the workspace's last execution ends. A holder killed while
executions still run in its namespace (an operator, the OOM killer) is replaced by one that
joins that same namespace through one of them (``rejoin``): the workspace keeps one network,
and its next command still reaches its running server.
"""

from __future__ import annotations

import functools
import json
import os
import select
import shutil
import signal
import subprocess
import sys
from pathlib import Path

from shellyard.errors import SandboxUnavailable
from shellyard.runner import processes
from shellyard.runner.network.egress_proxy import SANDBOX_PORT

RELAY = Path(__file__).with_name("relay.py")
READY_TIMEOUT_S = 10.0


def available() -> bool:
    """Whether this host lets this user make a user namespace with a network namespace."""
    return interpreter() is not None


@functools.cache
def interpreter() -> str | None:
    """A Python that runs inside a new user namespace, for relay.py (standard library only):
    this one, else the system's. A namespace maps no other uid, so an interpreter reached
    only through another user's folder (as the runner it works by that folder's grant to
    this uid's groups, which a user namespace drops) may not start there."""
    unshare = shutil.which("unshare")
    if unshare is None or shutil.which("nsenter") is None:
        return None
    candidates = [sys.executable, shutil.which("python3") or "/usr/bin/python3"]
    for python in dict.fromkeys(candidates):
        probe = [unshare, "--user", "--map-current-user", "--net", "--keep-caps", "--"]
        done = subprocess.run(
            [*probe, python, "-I", "-c", "pass"], capture_output=True, check=False
        )
        if done.returncode == 0:
            return python
    return None


def net_path(pid: int) -> Path:
    return Path(f"/proc/{pid}/ns/net")


def find(record: Path) -> Path | None:
    """The namespace of the holder recorded at ``record`` while it is alive."""
    try:
        data = json.loads(record.read_text())
        pid, started = int(data["pid"]), int(data["start_time"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    processes.reap_if_child(pid)
    return net_path(pid) if processes.is_same_process(pid, started) else None


def inodes(record: Path) -> dict[str, int]:
    """The inodes of the recorded holder's namespaces (``net``, ``user``) as it was started:
    what a descriptor opened later must be (netns.py ``WorkspaceNetworks.open``)."""
    try:
        data = json.loads(record.read_text())
        return {kind: int(data[kind]) for kind in ("net", "user") if data.get(kind)}
    except (OSError, ValueError, KeyError, TypeError):
        return {}


def _ns_inode(pid: int | str, kind: str) -> int | None:
    try:
        return os.stat(f"/proc/{pid}/ns/{kind}").st_ino
    except OSError:
        return None


def _member(net: int, user: int) -> int | None:
    """A live process in the network namespace ``net`` entered with the user namespace
    ``user`` (a sandbox's bwrap, a forward's relay), found by their inodes."""
    for entry in os.scandir("/proc"):
        inside = entry.name.isdigit() and _ns_inode(entry.name, "net") == net
        if inside and _ns_inode(entry.name, "user") == user:
            return int(entry.name)
    return None


def rejoin(record: Path, egress_socket: Path | None) -> Path | None:
    """The recorded holder died while processes still use its namespace: start a holder
    inside that same namespace, and return it; None when nothing uses it any more."""
    try:
        data = json.loads(record.read_text())
        net, user = int(data["net"]), int(data["user"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    member = _member(net, user)
    if member is None:
        return None
    nsenter = shutil.which("nsenter") or "/usr/bin/nsenter"
    ns = f"/proc/{member}/ns"
    join = [nsenter, f"--user={ns}/user", f"--net={ns}/net", "--preserve-credentials", "--"]
    try:
        path = start(record, egress_socket, join=join)
    except SandboxUnavailable:
        return None  # it ended meanwhile: a new namespace, then
    if _ns_inode(path.parts[2], "net") != net:  # pragma: no cover - a pid reused meanwhile
        stop(record)
        return None
    return path


def start(record: Path, egress_socket: Path | None, join: list[str] | None = None) -> Path:
    """Start a holder (with the egress relay when ``egress_socket``), record it, and return
    its namespace once its loopback is up. ``join``: enter existing namespaces (an nsenter
    prefix) instead of making new ones."""
    unshare = shutil.which("unshare") or "/usr/bin/unshare"
    argv = join or [unshare, "--user", "--map-current-user", "--net", "--keep-caps", "--"]
    argv = [*argv, interpreter() or sys.executable, "-I", str(RELAY), "--hold"]
    if egress_socket is not None:
        argv += ["--listen-port", str(SANDBOX_PORT), "--unix", str(egress_socket)]
    log_path = record.with_suffix(".log")
    with open(log_path, "wb") as log:
        popen = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=log,
            start_new_session=True,
            cwd="/",
        )
    assert popen.stdout is not None
    with popen.stdout:
        ready, _, _ = select.select([popen.stdout], [], [], READY_TIMEOUT_S)
        line = popen.stdout.readline() if ready else b""
    started = processes.start_time(popen.pid)
    if line.strip() != b"ready" or started is None:
        processes.signal_process(popen.pid, signal.SIGKILL)
        popen.wait()
        message = log_path.read_text(errors="replace").strip() or "no message"
        raise SandboxUnavailable(
            f"could not make the workspace's network (unshare --user --net): {message[-500:]}"
        )
    tmp = record.with_suffix(".tmp")
    namespaces = {kind: _ns_inode(popen.pid, kind) for kind in ("net", "user")}
    tmp.write_text(json.dumps({"pid": popen.pid, "start_time": started, **namespaces}))
    os.replace(tmp, record)
    return net_path(popen.pid)


def stop(record: Path) -> None:
    """Stop the holder: its namespace goes with the last process in it."""
    try:
        data = json.loads(record.read_text())
        pid, started = int(data["pid"]), int(data["start_time"])
    except (OSError, ValueError, KeyError, TypeError):
        pid = started = -1
    if pid > 0 and processes.is_same_process(pid, started):
        processes.signal_process(pid, signal.SIGKILL)
        processes.reap_if_child(pid)
    record.unlink(missing_ok=True)
    record.with_suffix(".log").unlink(missing_ok=True)


__all__ = ["available", "find", "inodes", "interpreter", "net_path", "rejoin", "start", "stop"]
