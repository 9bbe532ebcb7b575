"""A real OpenSSH sshd on loopback for ssh-runner tests: its own config, host key and user
key in a temporary folder, never the system's sshd or its keys.

    server = await start_sshd(folder)      # server.port, server.identity, server.known_hosts
    ...
    server.stop(); await server.start()     # the SSH connection drops, then comes back

A test that needs one server takes the ``sshd`` fixture of shared_fixtures.py by name.

Needs Debian's ``openssh-server`` (``scripts/setup`` installs it when
``SHELLYARD_SETUP_TESTS=1``); ``sshd_or_skip()`` skips with that reason when it is missing.
"""

from __future__ import annotations

import asyncio
import contextlib
import getpass
import os
import shutil
import signal
import socket
import subprocess as sp
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

SSHD = "/usr/sbin/sshd"


def sshd_or_skip() -> None:
    if not os.access(SSHD, os.X_OK) or shutil.which("ssh-keygen") is None:
        pytest.skip("OpenSSH's sshd is not installed on this machine (Debian openssh-server)")


def keygen(path: Path) -> Path:
    """A new ed25519 key pair at ``path`` (private) and ``path.pub``."""
    sp.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "shellyard-test", "-f", str(path)],
        check=True,
    )
    return path


def fingerprint(public_key: Path) -> str:
    """``SHA256:…`` of a public key, as ssh-keygen prints it."""
    out = sp.run(["ssh-keygen", "-lf", str(public_key)], check=True, capture_output=True)
    return out.stdout.decode().split()[1]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class SshServer:
    folder: Path
    port: int
    host_key: Path
    identity: Path
    user: str
    host: str = "127.0.0.1"
    #: The command prefix sshd runs under (``ip netns exec NS``).
    prefix: tuple[str, ...] = ()
    process: sp.Popen[bytes] | None = None
    log: list[str] = field(default_factory=list)

    @property
    def known_hosts(self) -> Path:
        """A known-hosts file that trusts this server's host key (written on first use)."""
        path = self.folder / "known_hosts"
        if not path.exists():
            kind, blob = self.host_key.with_suffix(".pub").read_text().split()[:2]
            path.write_text(f"[{self.host}]:{self.port} {kind} {blob}\n")
        return path

    def address(self, far_end: str = "") -> str:
        """``ssh://USER@127.0.0.1:PORT`` + ``far_end`` (``/path.sock`` or ``?port=N``; none
        for ``runner bootstrap``, which starts the daemon on a socket of its choosing)."""
        return f"ssh://{self.user}@{self.host}:{self.port}{far_end}"

    async def start(self) -> None:
        # The privilege-separation folder sshd insists on (absent until the system sshd ran).
        Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)
        argv = [*self.prefix, SSHD, "-D", "-e", "-f", str(self.folder / "sshd_config")]
        self.process = sp.Popen(argv, stdin=sp.DEVNULL, stdout=sp.DEVNULL, stderr=sp.PIPE)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                err = self.process.stderr.read().decode() if self.process.stderr else ""
                raise RuntimeError(f"sshd did not start: {err}")
            try:
                with socket.create_connection((self.host, self.port), timeout=1) as s:
                    if s.recv(4).startswith(b"SSH-"):
                        return
            except OSError:
                await asyncio.sleep(0.05)
        raise RuntimeError("sshd did not listen in 20 s")

    def stop(self) -> None:
        """SIGKILL sshd and every session it forked: established connections drop at once."""
        if self.process is None:
            return
        doomed = [self.process.pid, *_descendants(self.process.pid)]
        for pid in doomed:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        self.process.wait()
        self.process = None


def _descendants(root: int) -> list[int]:
    """Every process below ``root`` (found before anything is killed and re-parented)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                status = Path(f"/proc/{entry}/status").read_text()
            except OSError:
                continue
            for line in status.splitlines():
                if line.startswith("PPid:"):
                    children.setdefault(int(line.split()[1]), []).append(int(entry))
    found, todo = [], [root]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


async def start_sshd(
    folder: Path, host: str = "127.0.0.1", prefix: tuple[str, ...] = ()
) -> SshServer:
    """Generate keys and a config in ``folder`` and start sshd on a free port of ``host``
    (loopback; or a network namespace's address, run under ``prefix``)."""
    folder.mkdir(parents=True, exist_ok=True)
    host_key = keygen(folder / "host_ed25519")
    identity = keygen(folder / "user_ed25519")
    (folder / "authorized_keys").write_text(identity.with_suffix(".pub").read_text())
    port = _free_port() if not prefix else 2222  # a namespace of its own: the port is free
    (folder / "sshd_config").write_text(
        "\n".join(
            [
                f"Port {port}",
                f"ListenAddress {host}",
                f"HostKey {host_key}",
                f"PidFile {folder / 'sshd.pid'}",
                f"AuthorizedKeysFile {folder / 'authorized_keys'}",
                "PubkeyAuthentication yes",
                "PasswordAuthentication no",
                "KbdInteractiveAuthentication no",
                "UsePAM no",
                "StrictModes no",
                "PermitRootLogin prohibit-password",
                "AllowStreamLocalForwarding yes",
                "AllowTcpForwarding yes",
                "LogLevel ERROR",
                "",
            ]
        )
    )
    server = SshServer(folder, port, host_key, identity, getpass.getuser(), host, prefix)
    await server.start()
    return server
