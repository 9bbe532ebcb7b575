"""The relays that live with a workspace's network namespace (R2; netns.py):

- a **forwarded port**: a listening socket on the runner host's loopback (never another
  address), relayed into the workspace's namespace to ``127.0.0.1:PORT``, for a person's
  browser; opened and closed explicitly, gone when the workspace's last execution ends. It
  listens on a loopback address of the workspace's own (``workspace_address``: 127.X.Y.Z in
  127.128.0.0/9, never 127.0.0.1), so the page a forward serves is another host to a browser
  than the web page at 127.0.0.1: browsers send cookies to every port of a host, and the web
  login's cookie must never reach an agent's server (R5; docs/web.md);
- under network ``egress``, the **egress relay**: ``127.0.0.1:3128`` inside the namespace,
  relayed to the runner's egress proxy socket, started when the namespace gets its first
  execution (a per-sandbox relay would die with the execution that started it).

Each is a detached ``relay.py`` process that inherits the listening socket the runner made
in the right network, so nothing races for the port and it keeps serving while the runner
process restarts (E11). Its record (``DIR/WORKSPACE/NAME.json``: pid, start time, ports) is
how a restarted runner finds, lists and stops it; a record whose process is gone is dropped.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from shellyard.contract.ports import PortView
from shellyard.errors import InvalidInput, NotFound, SandboxUnavailable
from shellyard.runner import processes
from shellyard.runner.network import holder, netns
from shellyard.runner.network.egress_proxy import SANDBOX_PORT
from shellyard.runner.network.netns import WorkspaceNetworks

log = logging.getLogger(__name__)

RELAY = Path(__file__).with_name("relay.py")
LOOPBACK = "127.0.0.1"
#: The loopback block forwards listen in (Linux routes all of 127/8 to ``lo``); far from
#: 127.0.0.1 (the web page, other services), 127.0.1.1 (Debian's host name) and 127.0.0.53.
FORWARD_BLOCK = "127.128.0.0/9"
#: Forwards one workspace may hold at once (each is a process).
MAX_PORTS = 16
EGRESS = "egress"


class Relays:
    """The relay processes of one runner's workspace networks, recorded under ``directory``."""

    def __init__(
        self,
        directory: Path,
        networks: WorkspaceNetworks,
        egress_socket: Path | None,
        run_as: tuple[int, int] | None = None,
    ) -> None:
        """``run_as``: the uid and gid a root runner's relays drop to (``_unprivileged``)."""
        self.directory = directory
        self.run_as = run_as
        self.networks = networks
        self.egress_socket = egress_socket
        self._lock = threading.Lock()
        networks.on_ready.append(self._ready)
        networks.on_gone.append(self.close_workspace)
        networks.on_idle.append(self.close_forwards)

    def startup(self) -> None:
        self.directory.mkdir(mode=0o700, exist_ok=True)

    def forget_unused(self) -> None:
        """After re-attaching (E11): relays of workspaces that have no live execution."""
        for folder in list(self.directory.iterdir()):
            if self.networks.in_use(folder.name) is None:
                self.close_workspace(folder.name)

    # ------------------------------------------------------------------ forwarded ports

    def open(self, workspace_id: str, port: int, host_port: int = 0) -> PortView:
        """Forward ``127.0.0.1:host_port`` of this host (0: a free one) to ``port`` inside the
        workspace's network; asking again for the same port answers the same forward."""
        _check_port(port, "port", 1)
        _check_port(host_port, "host_port", 0)
        with self._lock:
            fds = self.networks.duplicate(workspace_id)
            try:
                if fds is None or self.networks.in_use(workspace_id) is None:
                    raise InvalidInput(
                        f"workspace {workspace_id} has no running execution, so it has no "
                        f"network to forward into: start the server first as a background "
                        f"execution (run_shell background=true), then open the port"
                    )
                record = self._forward(workspace_id, port, host_port, fds)
            finally:
                _close(fds)
            return _view(workspace_id, record)

    def _forward(
        self, workspace_id: str, port: int, host_port: int, fds: tuple[int | None, int]
    ) -> dict[str, Any]:
        """``open``'s forward: the live one, or a new relay entering the workspace's network
        by its kept descriptors ``fds`` (R2: the namespace checked when it got its first
        user, whatever its path names by now)."""
        existing = self._alive(workspace_id, _name(port))
        if existing is not None:
            if host_port in (0, existing["host_port"]):
                return existing
            raise InvalidInput(
                f"port {port} of workspace {workspace_id} is already forwarded to host "
                f"port {existing['host_port']}; close it first to choose another"
            )
        if len(self._records(workspace_id)) >= MAX_PORTS:
            raise InvalidInput(
                f"workspace {workspace_id} already forwards {MAX_PORTS} ports; close one first"
            )
        address = workspace_address(workspace_id)
        listener = _host_listener(address, host_port)
        with listener:
            record = self._start(
                workspace_id,
                _name(port),
                listener,
                ["--tcp-port", str(port), *_unprivileged(self.run_as)],
                inside=fds,
                extra={
                    "port": port,
                    "host": address,
                    "host_port": listener.getsockname()[1],
                },
            )
        log.info(
            "port forwarded",
            extra={
                "workspace_id": workspace_id,
                "port": port,
                "host": address,
                "host_port": record["host_port"],
            },
        )
        return record

    def forwards(self, workspace_id: str | None = None) -> list[PortView]:
        """The live forwards of ``workspace_id`` (of every workspace when None)."""
        with self._lock:
            names = [workspace_id] if workspace_id else self._workspaces()
            views = []
            for name in names:
                for record in self._records(name):
                    if "port" in record:
                        views.append(_view(name, record))
            return sorted(views, key=lambda v: (v.workspace_id, v.port))

    def close(self, workspace_id: str, port: int) -> PortView:
        with self._lock:
            record = self._alive(workspace_id, _name(port))
            if record is None:
                raise NotFound(
                    f"port {port} of workspace {workspace_id} is not forwarded; list the open "
                    f"ones with action 'list'"
                )
            self._stop(workspace_id, _name(port), record)
            return _view(workspace_id, record)

    def close_forwards(self, workspace_id: str) -> None:
        """Stop the workspace's forwarded ports (its last execution ended), not its egress
        relay: the namespace it serves may still be used by the next command."""
        with self._lock:
            for record in self._records(workspace_id):
                if "port" in record:
                    self._stop(workspace_id, _name(record["port"]), record)

    def close_workspace(self, workspace_id: str) -> None:
        """Stop every relay of the workspace (its last execution ended)."""
        with self._lock:
            folder = self.directory / workspace_id
            for file in sorted(folder.glob("*.json")):
                record = _read(file)
                if record is not None:
                    self._stop(workspace_id, file.stem, record)
                file.unlink(missing_ok=True)
            with contextlib.suppress(OSError):
                folder.rmdir()

    # ------------------------------------------------------------------ egress

    def _ready(self, workspace_id: str, path: Path) -> None:
        """The namespace has a new execution (its first, or one more: a relay killed meanwhile
        is started again, the sandbox has none of its own): under egress, make sure its relay
        runs, listening in the namespace of the kept descriptor (R2), not whatever ``path``
        names."""
        if self.egress_socket is None or self.networks.held:
            return  # a holder runs its own egress relay (holder.py)
        with self._lock:
            if self._alive(workspace_id, EGRESS) is not None:
                return  # still running from before a restart of the runner
            fds = self.networks.duplicate(workspace_id)
            if fds is None:
                raise SandboxUnavailable(f"workspace {workspace_id} has no network to relay in")
            try:
                listener = netns.socket_in(fds[1])
            finally:
                _close(fds)
            with listener:
                listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                listener.bind((LOOPBACK, SANDBOX_PORT))
                listener.listen(128)
                self._start(
                    workspace_id,
                    EGRESS,
                    listener,
                    ["--unix", str(self.egress_socket), *_unprivileged(self.run_as)],
                    inside=None,
                    extra={},
                )

    # ------------------------------------------------------------------ records and processes

    def _start(
        self,
        workspace_id: str,
        name: str,
        listener: socket.socket,
        target: list[str],
        *,
        inside: tuple[int | None, int] | None,
        extra: dict[str, Any],
    ) -> dict[str, Any]:
        fd = listener.fileno()
        python = (holder.interpreter() if self.networks.held else None) or sys.executable
        argv = [python, "-I", str(RELAY), "--listen-fd", str(fd), *target]
        passed = [fd]
        if inside is not None:  # it connects from inside the workspace's network, entered
            # by the inherited descriptors (nsenter ``/proc/self/fd/N``), which the relay
            # closes before it serves (``--close-fd``)
            entered = [x for x in inside if x is not None]
            argv = [*netns.prefix_fds(inside), *argv]
            argv += [arg for x in entered for arg in ("--close-fd", str(x))]
            passed += entered
        popen = subprocess.Popen(
            argv,
            pass_fds=passed,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
            cwd="/",
        )
        started = processes.start_time(popen.pid)
        if started is None:
            raise SandboxUnavailable(f"the relay of workspace {workspace_id} exited at once")
        record = {"pid": popen.pid, "start_time": started, "opened_at": time.time(), **extra}
        folder = self.directory / workspace_id
        folder.mkdir(mode=0o700, exist_ok=True)
        tmp = folder / f".{name}.tmp"
        tmp.write_text(json.dumps(record))
        os.replace(tmp, folder / f"{name}.json")
        return record

    def _stop(self, workspace_id: str, name: str, record: dict[str, Any]) -> None:
        pid = int(record["pid"])
        if processes.is_same_process(pid, int(record["start_time"])):
            processes.signal_process(pid, signal.SIGKILL)
        processes.reap_if_child(pid)
        (self.directory / workspace_id / f"{name}.json").unlink(missing_ok=True)

    def _alive(self, workspace_id: str, name: str) -> dict[str, Any] | None:
        file = self.directory / workspace_id / f"{name}.json"
        record = _read(file)
        if record is None:
            return None
        pid = int(record["pid"])
        processes.reap_if_child(pid)
        if processes.is_same_process(pid, int(record["start_time"])):
            return record
        file.unlink(missing_ok=True)  # it died (or the host rebooted): no forward any more
        return None

    def _records(self, workspace_id: str) -> list[dict[str, Any]]:
        # A listing of the folder, not ``Path.glob``: asked at every execution's end on the
        # loop's thread (``close_forwards``), where the folder is most often missing or
        # empty and the glob's machinery was most of the cost (docs/benchmarks.md §72).
        # The same records in the same order: every entry named ``*.json``, by file name.
        try:
            with os.scandir(f"{self.directory}/{workspace_id}") as entries:
                names = sorted(e.name for e in entries if e.name.endswith(".json"))
        except OSError:  # no folder (nothing was forwarded), as the glob found none
            return []
        found = []
        for name in names:
            record = self._alive(workspace_id, Path(name).stem)
            if record is not None:
                found.append(record)
        return found

    def _workspaces(self) -> list[str]:
        if not self.directory.is_dir():
            return []
        return sorted(p.name for p in self.directory.iterdir() if p.is_dir())


def _unprivileged(run_as: tuple[int, int] | None) -> list[str]:
    """As root, a relay runs as the shared sandbox uid once its sockets are set up: it only
    copies bytes (a forward's to 127.0.0.1 of the network it entered, the egress relay's to
    the proxy's socket, reached through its folder opened before the drop, which the sandbox
    group may pass). Not ``nobody``: a host's daemons run as nobody, and a process of the
    same uid may signal the relay (a local user's kill -9 closed every forward and cut every
    egress sandbox off); no account and no process outside a sandbox's own pid namespace
    has the sandbox uid."""
    if os.geteuid() != 0 or run_as is None:
        return []
    return ["--run-as", f"{run_as[0]}:{run_as[1]}"]


def _close(fds: tuple[int | None, int] | None) -> None:
    for fd in fds or ():
        if fd is not None:
            os.close(fd)


def _name(port: int) -> str:
    return f"port-{port}"


def _check_port(value: int, field: str, low: int) -> None:
    if not low <= value <= 65535:
        raise InvalidInput(f"{field} must be a TCP port number {low}..65535, not {value}")


def workspace_address(workspace_id: str) -> str:
    """The workspace's own loopback address for its forwards: the same on every call (a
    browser's bookmark keeps working), in ``FORWARD_BLOCK``. Two workspaces may share one by
    chance (1 in 8 million); what they share is only each other's forwards, never the page."""
    digest = hashlib.sha256(workspace_id.encode()).digest()
    return f"127.{128 + digest[0] % 128}.{digest[1]}.{1 + digest[2] % 254}"


def _host_listener(address: str, host_port: int) -> socket.socket:
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind((address, host_port))
        listener.listen(128)
    except OSError as exc:
        listener.close()
        if exc.errno in (errno.EADDRINUSE, errno.EACCES):
            raise InvalidInput(
                f"host port {host_port} cannot be used on {address} ({exc.strerror}): pass "
                f"another host_port, or 0 for any free one"
            ) from None
        raise
    return listener


def _read(file: Path) -> dict[str, Any] | None:
    try:
        record = json.loads(file.read_text())
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) else None


def _view(workspace_id: str, record: dict[str, Any]) -> PortView:
    host_port = int(record["host_port"])
    host = str(record.get("host", LOOPBACK))  # a forward opened before per-workspace addresses
    return PortView(
        workspace_id=workspace_id,
        port=int(record["port"]),
        host=host,
        host_port=host_port,
        url=f"http://{host}:{host_port}/",
        opened_at=float(record["opened_at"]),
    )


__all__ = ["FORWARD_BLOCK", "MAX_PORTS", "Relays", "workspace_address"]
