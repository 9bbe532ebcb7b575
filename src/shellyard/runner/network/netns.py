"""One private network namespace per workspace (R2): every execution of a workspace, its
writer and its read-only ones, joins the same namespace, so a background server is reached
from a reader at ``localhost:PORT``; no other workspace and not the host can reach it.

bwrap 0.8 cannot join an existing namespace, so the runner (root) makes one per workspace
with ``unshare --net=FILE`` (the namespace is bind-mounted on a file under the runner's root:
it survives a restart of the runner process, E11, and needs no holder process), brings its
loopback up, and starts bwrap under ``nsenter --net=FILE`` with ``--share-net``: every other
flag of the sandbox stays. The namespace goes when the workspace's last live execution ends.
Under ``egress`` the relay to the proxy lives with the namespace (runner/network/ports.py), not in
each sandbox. Not root (``nsenter`` needs CAP_SYS_ADMIN), or network ``host``: each execution
keeps the namespace bwrap gives it (docs/decisions.md).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import fcntl
import logging
import os
import shutil
import socket
import struct
import subprocess
import threading
from collections.abc import Callable
from pathlib import Path

from shellyard.errors import SandboxUnavailable
from shellyard.runner.kept import Kept
from shellyard.runner.network import holder

log = logging.getLogger(__name__)

SIOCGIFFLAGS = 0x8913
SIOCSIFFLAGS = 0x8914
IFF_UP = 0x1
CLONE_NEWNET = 0x40000000
CLONE_NEWUSER = 0x10000000
#: ioctl(2) on a namespace descriptor: its kind, a CLONE_NEW* flag (Linux 4.11)
NS_GET_NSTYPE = 0xB703


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)


def supported(network: str) -> bool:
    """Whether this runner gives workspaces a shared namespace under ``network``: as root
    with a namespace bind-mounted on a file, otherwise held by a process (holder.py)."""
    if network not in ("off", "egress") or shutil.which("nsenter") is None:
        return False
    return os.geteuid() == 0 or holder.available()


class WorkspaceNetworks:
    """The namespaces of one runner's workspaces, under ``directory``, and who uses each."""

    def __init__(self, directory: Path, egress_socket: Path | None = None) -> None:
        self.directory = directory
        #: workspace → its namespace file's path, joined once (``path`` is asked at every
        #: command's start on the loop's thread, docs/benchmarks.md §72): only a name, the
        #: file itself is looked at each time (``_mounted``); bounded (kept.py)
        self._paths: Kept[str, Path] = Kept(lambda workspace_id: directory / workspace_id)
        #: Not root: each namespace is held by a process (holder.py), which also runs
        #: the egress relay when ``egress_socket`` is given.
        self.held = os.geteuid() != 0
        self.egress_socket = egress_socket
        #: Executions holding each namespace: the live ones and, for NETWORK_LINGER_S after
        #: they end, the last ones (runner/sandbox/supervise.py), so the next command joins it.
        self._users: dict[str, set[str]] = {}
        #: Of those, the ones still running: a workspace without any has no live server, so
        #: its forwarded ports go at once (R5), whatever the namespace's linger.
        self._live: dict[str, set[str]] = {}
        #: Called with (workspace, namespace file) when a user arrives (the first: made now,
        #: or found mounted after a restart; each later one too, so a relay killed meanwhile
        #: is started again), and with the workspace before its namespace goes: the relays
        #: that live with it (runner/network/ports.py).
        self.on_ready: list[Callable[[str, Path], None]] = []
        self.on_gone: list[Callable[[str], None]] = []
        #: Called with the workspace when its last live execution ended (the namespace may
        #: linger): the forwarded ports, which must not outlive the workspace's servers.
        self.on_idle: list[Callable[[str], None]] = []
        #: root: the inode of each workspace's namespace as ``acquire`` found or made it
        self._made: dict[str, int] = {}
        #: R2: each in-use workspace's namespace descriptors (``open``: checked once, when it
        #: got its first user or was made anew), kept until its last user goes. The relays
        #: (runner/network/ports.py) enter it by these, never by the path, which a mount
        #: over it or a rename may have made another namespace meanwhile.
        self._kept: dict[str, tuple[int | None, int]] = {}
        self._kept_lock = threading.Lock()

    def startup(self) -> None:
        self.directory.mkdir(mode=0o700, exist_ok=True)

    def path(self, workspace_id: str) -> Path:
        return self._paths(workspace_id)

    def acquire(self, workspace_id: str, execution_id: str) -> Path:
        """The workspace's namespace file, made on first use (or again after a reboot)."""
        if self.held:
            record = self._record(workspace_id)
            path = (
                holder.find(record)
                # a holder killed under live executions: the same namespace, held again
                or (self._users.get(workspace_id) and holder.rejoin(record, self.egress_socket))
                or holder.start(record, self.egress_socket)
            )
        else:
            path = self.path(workspace_id)
            if not _mounted(path):
                _create(path)
                self._made[workspace_id] = os.stat(path).st_ino
            elif workspace_id not in self._kept or workspace_id not in self._made:
                # found mounted (first use, or after a restart, E11); while one is kept, the
                # recorded inode stays that one's, so what the path names now is checked
                self._made[workspace_id] = os.stat(path).st_ino
        self._keep(workspace_id, path)
        users = self._users.setdefault(workspace_id, set())
        users.add(execution_id)
        self._live.setdefault(workspace_id, set()).add(execution_id)
        try:
            for hook in self.on_ready:
                hook(workspace_id, path)
        except BaseException:
            self.release(workspace_id, execution_id)
            raise
        return path

    def open(self, workspace_id: str, path: Path) -> tuple[int | None, int]:
        """Descriptors of the namespaces ``acquire`` gave ``path`` for (the user namespace
        of a holder's, or None; the network namespace), for a spawn to inherit and enter
        (launch.c ``--netns-fd``): a descriptor keeps its namespace alive and is never
        another one, where a path opened later may be (R2: a holder killed between the
        check and the join, its pid reused by a process on the host's network; a mount
        gone). Each is checked: a namespace of its kind, the one recorded when it was made,
        never the runner's own. Refused: SandboxUnavailable, and what the path names is
        dropped, so the workspace's next command gets a fresh namespace."""
        opened: list[int] = []
        try:
            if self.held:
                expect = holder.inodes(self._record(workspace_id))
                user = _open_ns(path.with_name("user"), CLONE_NEWUSER, expect.get("user"))
                opened.append(user)
                opened.append(_open_ns(path, CLONE_NEWNET, expect.get("net")))
                return user, opened[1]
            return None, _open_ns(path, CLONE_NEWNET, self._made.get(workspace_id))
        except (OSError, _Refused) as exc:
            for fd in opened:
                os.close(fd)
            log.warning("the network of %s is not the one made for it: %s", workspace_id, exc)
            self._made.pop(workspace_id, None)
            if not self.held:
                # what was mounted over the kept namespace (which stays, and the next acquire
                # finds again), or, none kept, all of it: the next acquire makes a fresh one
                _remove(path, keep=self._kept_inode(workspace_id))
            raise SandboxUnavailable(
                f"the workspace's network namespace went away before the command could join "
                f"it ({exc}); nothing ran; run the command again (it gets a fresh one)"
            ) from None

    def _keep(self, workspace_id: str, path: Path) -> None:
        """Open and check the namespace's descriptors unless the kept ones are still the
        namespace recorded for the workspace (made anew: the new one's)."""
        if self.held:
            expect = holder.inodes(self._record(workspace_id)).get("net")
        else:
            expect = self._made.get(workspace_id)
        with self._kept_lock:
            kept = self._kept.get(workspace_id)
            if kept is not None and os.fstat(kept[1]).st_ino == expect:
                return
            self._forget_kept(workspace_id)
        fds = self.open(workspace_id, path)  # refused: SandboxUnavailable, nothing kept
        with self._kept_lock:
            self._forget_kept(workspace_id)
            self._kept[workspace_id] = fds

    def _forget_kept(self, workspace_id: str) -> None:
        for fd in self._kept.pop(workspace_id, (None, None)):
            if fd is not None:
                os.close(fd)

    def _kept_inode(self, workspace_id: str) -> int | None:
        with self._kept_lock:
            kept = self._kept.get(workspace_id)
            return os.fstat(kept[1]).st_ino if kept is not None else None

    def duplicate(self, workspace_id: str) -> tuple[int | None, int] | None:
        """Copies of the workspace's kept namespace descriptors (user namespace or None,
        network namespace), the caller's to close; None while it has no user."""
        with self._kept_lock:
            kept = self._kept.get(workspace_id)
            if kept is None:
                return None
            user = os.dup(kept[0]) if kept[0] is not None else None
            return user, os.dup(kept[1])

    def holders(self, workspace_id: str) -> set[str]:
        """The ids holding the workspace's namespace (executions, a warm sandbox)."""
        return set(self._users.get(workspace_id, ()))

    def in_use(self, workspace_id: str) -> Path | None:
        """The workspace's namespace while it has a live execution, else None."""
        if not self._live.get(workspace_id):
            return None
        return holder.find(self._record(workspace_id)) if self.held else self.path(workspace_id)

    def _record(self, workspace_id: str) -> Path:
        return self.directory / f"{workspace_id}.json"

    def ended(self, workspace_id: str, execution_id: str) -> None:
        """``execution_id`` ended but keeps the namespace until ``release``; the last live one
        of the workspace closes its forwarded ports now."""
        live = self._live.get(workspace_id, set())
        live.discard(execution_id)
        if live:
            return
        self._live.pop(workspace_id, None)
        for hook in self.on_idle:
            try:
                hook(workspace_id)
            except Exception:  # a forward that will not close must not fail the finish
                log.exception("could not close the forwarded ports of %s", workspace_id)

    def release(self, workspace_id: str, execution_id: str) -> None:
        """``execution_id`` lets go; the last one of the workspace takes the namespace along."""
        self.ended(workspace_id, execution_id)
        users = self._users.get(workspace_id, set())
        users.discard(execution_id)
        if users:
            return
        self._users.pop(workspace_id, None)
        self._gone(workspace_id)
        self._drop(workspace_id)

    def _drop(self, workspace_id: str) -> None:
        with self._kept_lock:
            self._forget_kept(workspace_id)
        if self.held:
            holder.stop(self._record(workspace_id))
        else:
            _remove(self.path(workspace_id))

    def _gone(self, workspace_id: str) -> None:
        for hook in self.on_gone:
            try:
                hook(workspace_id)
            except Exception:  # a relay that will not stop must not keep the namespace
                log.exception("could not stop the relays of %s", workspace_id)

    def forget_unused(self) -> None:
        """After re-attaching (E11): namespaces left by workspaces with no live execution."""
        if not self.directory.is_dir():
            return
        for path in self.directory.iterdir():
            workspace_id = path.stem if self.held else path.name
            if (path.suffix == ".json") == self.held and workspace_id not in self._users:
                self._gone(workspace_id)
                self._drop(workspace_id)


def prefix_fds(fds: tuple[int | None, int]) -> list[str]:
    """Put in front of a spawn's argv (before the privilege drop: nsenter needs root) that
    must run in the namespaces of the inherited descriptors ``fds`` (``duplicate``; the
    spawn's ``pass_fds``): a holder's network namespace is entered with the user namespace
    that owns it, keeping the runner's uid and groups. Never a namespace's path (R2)."""
    nsenter = shutil.which("nsenter") or "/usr/bin/nsenter"
    user, net = fds
    if user is not None:
        return [
            nsenter,
            f"--user=/proc/self/fd/{user}",
            f"--net=/proc/self/fd/{net}",
            "--preserve-credentials",
            "--",
        ]
    return [nsenter, f"--net=/proc/self/fd/{net}", "--"]


def socket_in(net_fd: int, family: socket.AddressFamily = socket.AF_INET) -> socket.socket:
    """A socket of the network namespace of the descriptor ``net_fd`` (``duplicate``, never a
    path opened now: R2): a socket belongs to the namespace of the thread that made it, so a
    short thread joins the namespace, makes it and ends (the caller's own threads never
    change namespace)."""
    made: list[socket.socket] = []
    failure: list[BaseException] = []

    def work() -> None:
        try:
            _join(net_fd)
            made.append(socket.socket(family, socket.SOCK_STREAM))
        except OSError as exc:
            failure.append(exc)

    thread = threading.Thread(target=work, name="netns-socket")
    thread.start()
    thread.join()
    if failure:
        raise SandboxUnavailable(f"could not make a socket in the workspace network: {failure[0]}")
    return made[0]


def _join(fd: int) -> None:
    """Move the calling thread into the network namespace of the descriptor ``fd``."""
    # os.setns is Python 3.12+; the libc call is the same syscall
    if _libc().setns(fd, CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))


class _Refused(Exception):
    """A namespace descriptor that is not the one expected."""


def _open_ns(path: Path, kind: int, expect: int | None) -> int:
    """``path`` opened, checked to be a namespace of ``kind`` with the inode ``expect``
    (when known) and not this process's own (the host's, for the runner)."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        try:
            found = fcntl.ioctl(fd, NS_GET_NSTYPE)
        except OSError:
            raise _Refused(f"{path} is no namespace any more") from None
        info = os.fstat(fd)
        own = os.stat(f"/proc/self/ns/{'net' if kind == CLONE_NEWNET else 'user'}")
        if found != kind:
            raise _Refused(f"{path} is a namespace of another kind")
        if (info.st_dev, info.st_ino) == (own.st_dev, own.st_ino):
            raise _Refused(f"{path} names the runner's own namespace")
        if expect is not None and info.st_ino != expect:
            raise _Refused(f"{path} names another namespace than the one made")
    except BaseException:
        os.close(fd)
        raise
    return fd


def _mounted(path: Path) -> bool:
    """A namespace file is a mount of nsfs: its device differs from its folder's."""
    try:
        return os.stat(path).st_dev != os.stat(path.parent).st_dev
    except FileNotFoundError:
        return False


def _create(path: Path) -> None:
    path.touch(mode=0o600, exist_ok=True)
    unshare = shutil.which("unshare") or "/usr/bin/unshare"
    done = subprocess.run(
        [unshare, f"--net={path}", "true"], capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        raise SandboxUnavailable(
            f"could not make the workspace's network namespace ({unshare} --net): "
            f"{done.stderr.strip() or 'no message'}"
        )
    _loopback_up(path)


def _loopback_up(path: Path) -> None:
    """``lo`` starts down in a new namespace. Brought up from a thread that joins it (a
    thread's network namespace is its own; the thread ends right after), so no ``ip``
    binary is needed."""
    failure: list[BaseException] = []

    def work() -> None:
        try:
            fd = _open_ns(path, CLONE_NEWNET, None)  # just made: not the runner's own
            try:
                _join(fd)
            finally:
                os.close(fd)
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
                request = struct.pack("16sH14x", b"lo", 0)
                flags = struct.unpack("16sH", fcntl.ioctl(sock, SIOCGIFFLAGS, request)[:18])[1]
                fcntl.ioctl(sock, SIOCSIFFLAGS, struct.pack("16sH14x", b"lo", flags | IFF_UP))
        except (OSError, _Refused) as exc:
            failure.append(exc)

    thread = threading.Thread(target=work, name="netns-lo")
    thread.start()
    thread.join()
    if failure:
        _remove(path)
        raise SandboxUnavailable(
            f"could not bring up the workspace network's loopback: {failure[0]}"
        )


def _remove(path: Path, keep: int | None = None) -> None:
    """Unmount each namespace mounted on ``path`` (more than one: ``open`` refused what it
    named) and remove the file; ``keep``: stop at the namespace of that inode (kept: its
    descriptor keeps its mount busy)."""
    for _ in range(8):
        if not _mounted(path):
            break
        if keep is not None and os.stat(path).st_ino == keep:
            return
        umount = shutil.which("umount") or "/usr/bin/umount"
        done = subprocess.run([umount, str(path)], capture_output=True, text=True, check=False)
        if done.returncode != 0:
            log.warning("could not unmount %s: %s", path, done.stderr.strip())
            return
    path.unlink(missing_ok=True)
