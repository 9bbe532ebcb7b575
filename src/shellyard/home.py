"""Finding the control-plane process that serves a home, and starting it on demand.

One process serves a home. It holds an exclusive ``flock`` on ``<home>/server.lock`` for its
whole life (the kernel drops it if the process dies, even by kill -9, so a stale file never
blocks a restart) and publishes ``<home>/server.json`` (pid, url, and where the admin token is:
``<home>/admin.token``, mode 0600; see docs/security.md). Clients
(CLI verbs, ``shellyard mcp``) read it and start the server in the background when nobody
holds the lock, the way a language server or container daemon is started on demand.
This module stays light (no server imports) because every CLI verb loads it.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

from shellyard.errors import HomeInUse, ShellyardError

LOCK_NAME = "server.lock"
INFO_NAME = "server.json"
LOG_NAME = "server.log"


@dataclass
class ServerInfo:
    pid: int
    url: str
    #: The admin token ("" when the server runs with --no-auth).
    token: str
    #: The file the token is kept in; server.json names it instead of holding the secret.
    token_file: str | None = None


def lock_home(home: Path) -> int:
    """Take the home's lock or raise HomeInUse. The fd stays open for the process's life."""
    fd = os.open(home / LOCK_NAME, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        info = read_info(home)
        who = f"process {info.pid} at {info.url}" if info else "another process"
        raise HomeInUse(
            f"{home} is already served by {who}; use it, or stop it before starting another"
        ) from None
    return fd


def is_served(home: Path) -> bool:
    lock_file = home / LOCK_NAME
    if not lock_file.exists():
        return False
    fd = os.open(lock_file, os.O_RDWR | os.O_CLOEXEC)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # closing drops a lock we may have taken
    return False


def read_info(home: Path) -> ServerInfo | None:
    try:
        data = json.loads((home / INFO_NAME).read_text())
        token_file = data.get("token_file")
        token = Path(token_file).read_text().strip() if token_file else str(data["token"])
        return ServerInfo(
            pid=int(data["pid"]), url=str(data["url"]), token=token, token_file=token_file
        )
    except (OSError, ValueError, KeyError):
        return None


def write_info(home: Path, info: ServerInfo) -> None:
    tmp = home / (INFO_NAME + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        data: dict[str, object] = {"pid": info.pid, "url": info.url}
        if info.token_file:
            data["token_file"] = info.token_file
        else:
            data["token"] = info.token
        json.dump(data, handle)
    os.replace(tmp, home / INFO_NAME)


def ensure_server(
    home: Path, *, timeout_s: float = 30.0, extra_args: list[str] | None = None
) -> ServerInfo:
    """The running server's address, starting ``shellyard serve`` in the background if needed."""
    home.mkdir(parents=True, exist_ok=True)
    if not is_served(home):
        log = open(home / LOG_NAME, "ab")  # noqa: SIM115 - handed to the child
        subprocess.Popen(
            [sys.executable, "-m", "shellyard", "serve", "--home", str(home), *(extra_args or [])],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            start_new_session=True,
            env={**os.environ, "SHELLYARD_HOME": str(home)},
        )
        log.close()
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        info = read_info(home)
        if info is not None and is_served(home):
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{info.url}/health", timeout=2).status_code == 200:
                    return info
        time.sleep(0.05)
    raise ShellyardError(
        f"the shellyard server for {home} did not come up within {timeout_s:.0f} s; "
        f"see {home / LOG_NAME}"
    )
