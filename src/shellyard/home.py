"""Finding the control-plane process that serves a home, and starting it on demand.

One process serves a home. It holds an exclusive ``flock`` on ``<home>/server.lock`` for its
whole life (the kernel drops it if the process dies, even by kill -9, so a stale file never
blocks a restart) and publishes ``<home>/server.json`` (pid, url, and where the admin token is:
``<home>/admin.token``, mode 0600; see docs/security.md). Clients
(CLI verbs, ``shellyard mcp``) read it and start the server in the background when nobody
holds the lock, the way a language server or container daemon is started on demand.

A server started here reports how its start ended on a pipe (``--ready-fd``): one JSON line,
``{"ready": true}`` once it serves, or the error it stopped on. So a failed start (a bad
database URL, a port in use, a missing bwrap, an unusable home) reaches the caller the moment
the server gives up, with the server's own message, instead of after the whole timeout; and a
server that dies without a word is noticed by the pipe's end of file.
This module stays light (no server imports) because every CLI verb loads it.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import select
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from shellyard import filemodes
from shellyard.errors import ERRORS_BY_CODE, HomeInUse, InvalidInput, ShellyardError


def default_home() -> Path:
    """``$SHELLYARD_HOME``, else ``~/.shellyard``, or ``/var/lib/shellyard`` for root (whose
    home folder is 0700 by convention; see docs/decisions.md)."""
    env = os.environ.get("SHELLYARD_HOME")
    if env:
        return Path(env).expanduser().absolute()
    if os.geteuid() == 0:
        return Path("/var/lib/shellyard")
    return Path.home() / ".shellyard"


LOCK_NAME = "server.lock"
INFO_NAME = "server.json"
LOG_NAME = "server.log"
#: The port the home's server last listened on: a restart takes it again when it is free, so
#: an agent host's fixed ``http://127.0.0.1:PORT/mcp`` survives a restart (docs/cli.md).
PORT_NAME = "server.port"
#: ``SHELLYARD_*`` variables a client reads for itself, not the server's settings.
CLIENT_ONLY = frozenset(
    {
        "SHELLYARD_HOME",
        "SHELLYARD_TOKEN",
        "SHELLYARD_AGENT",
        "SHELLYARD_START_TIMEOUT_S",
        "SHELLYARD_MCP_TOOLS",
        "SHELLYARD_LOG_LEVEL",
    }
)


def server_settings(environ: dict[str, str] | None = None) -> dict[str, str]:
    """The ``SHELLYARD_*`` variables a server started from ``environ`` reads."""
    source = os.environ if environ is None else environ
    return {
        name: value
        for name, value in sorted(source.items())
        if name.startswith("SHELLYARD_") and name not in CLIENT_ONLY
    }


@dataclass
class ServerInfo:
    pid: int
    url: str
    #: The admin token ("" when the server runs with --no-auth).
    token: str
    #: The file the token is kept in; server.json names it instead of holding the secret.
    token_file: str | None = None
    #: The ``SHELLYARD_*`` settings the server was started with (``server_settings``).
    settings: dict[str, str] | None = None


def settings_drift(info: ServerInfo) -> str | None:
    """What a client should hear when its own settings are not the running server's: the
    server keeps the ones it started with until it is restarted. None when they agree (or the
    server did not say)."""
    if info.settings is None:
        return None
    mine = server_settings()
    names = sorted(set(mine) | set(info.settings))
    changed = [name for name in names if mine.get(name) != info.settings.get(name)]
    if not changed:
        return None
    shown = ", ".join(
        f"{name}={info.settings.get(name, '(unset)')} (here: {mine.get(name, '(unset)')})"
        for name in changed
    )
    return (
        f"the running server (pid {info.pid}) keeps the settings it started with: {shown}; "
        "run 'shellyard server restart' in this environment to apply yours"
    )


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
        settings = data.get("settings")
        return ServerInfo(
            pid=int(data["pid"]),
            url=str(data["url"]),
            token=token,
            token_file=token_file,
            settings={str(k): str(v) for k, v in settings.items()}
            if isinstance(settings, dict)
            else None,
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
        if info.settings is not None:
            data["settings"] = info.settings
        json.dump(data, handle)
    os.replace(tmp, home / INFO_NAME)


def last_port(home: Path) -> int:
    """The port the home's server listened on last time (0: none recorded)."""
    try:
        port = int((home / PORT_NAME).read_text().strip())
    except (OSError, ValueError):
        return 0
    return port if 0 < port < 65536 else 0


def remember_port(home: Path, port: int) -> None:
    with contextlib.suppress(OSError):
        (home / PORT_NAME).write_text(f"{port}\n")


class StartReport:
    """The server's side of the start pipe: says once whether the start worked, then closes."""

    def __init__(self, fd: int | None) -> None:
        self._fd = fd
        if fd is not None:
            os.set_inheritable(fd, False)  # never held open by sandboxes or helpers

    def ready(self) -> None:
        self._send({"ready": True})

    def failed(self, exc: BaseException) -> None:
        if isinstance(exc, ShellyardError):
            error = {"code": exc.code, "message": exc.message}
        else:
            error = {"code": ShellyardError.code, "message": describe(exc)}
        self._send({"error": error})

    def _send(self, report: dict[str, Any]) -> None:
        fd, self._fd = self._fd, None
        if fd is None:
            return
        try:
            os.write(fd, (json.dumps(report) + "\n").encode())
        except OSError:  # the caller gave up waiting (its end is closed): nothing to tell
            pass
        finally:
            os.close(fd)


def describe(exc: BaseException) -> str:
    """One line for an error that is not a ShellyardError (an OSError, a driver's error)."""
    if isinstance(exc, OSError) and exc.strerror:
        where = f" ({exc.filename})" if exc.filename else ""
        return f"{exc.strerror}{where}"
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__


def _usable(home: Path) -> None:
    """Create the home if needed; an unusable one is a clear error, not a traceback."""
    try:
        filemodes.private_dir(home)  # 0700: the service user's alone (docs/security.md)
        if not os.access(home, os.R_OK | os.W_OK | os.X_OK):
            raise PermissionError(13, "Permission denied", str(home))
    except OSError as exc:
        raise InvalidInput(
            f"cannot use {home} as the shellyard home: {describe(exc)}. Set SHELLYARD_HOME "
            "(or --home) to a folder you can read and write"
        ) from None


#: How long a client waits for a server it started (``SHELLYARD_START_TIMEOUT_S``). A failed
#: start is reported as soon as the server gives up; this bounds only a start that hangs.
DEFAULT_START_TIMEOUT_S = 30.0


def ensure_server(
    home: Path, *, timeout_s: float | None = None, extra_args: list[str] | None = None
) -> ServerInfo:
    """The running server's address, starting ``shellyard serve`` in the background if needed.

    A start that fails raises at once the error the server stopped on (its class and message);
    another process starting the same home at the same moment is waited for, not an error."""
    if timeout_s is None:
        raw = os.environ.get("SHELLYARD_START_TIMEOUT_S")
        try:
            timeout_s = float(raw) if raw else DEFAULT_START_TIMEOUT_S
        except ValueError:
            raise InvalidInput(
                f"SHELLYARD_START_TIMEOUT_S must be a number of seconds, not {raw!r}"
            ) from None
    _usable(home)
    deadline = time.monotonic() + timeout_s
    if not is_served(home):
        _start(home, extra_args or [], deadline)
    while True:
        info = read_info(home)
        if info is not None and is_served(home) and _healthy(info):
            return info
        if time.monotonic() >= deadline:
            raise ShellyardError(
                f"the shellyard server for {home} did not come up within {timeout_s:.0f} s"
                f"{_last_log_line(home)}; see {home / LOG_NAME}"
            )
        time.sleep(0.05)


def _healthy(info: ServerInfo) -> bool:
    """``GET /health`` answers 200. With the standard library: the server is plain HTTP on
    loopback, and httpx would cost every CLI verb its import and an SSL context (measured,
    docs/benchmarks.md)."""
    import http.client
    from urllib.parse import urlsplit

    where = urlsplit(info.url)
    connection = http.client.HTTPConnection(where.hostname or "", where.port, timeout=2)
    try:
        connection.request("GET", "/health")
        return connection.getresponse().status == 200
    except (OSError, http.client.HTTPException):
        return False
    finally:
        connection.close()


def _start(home: Path, extra_args: list[str], deadline: float) -> None:
    """Start ``shellyard serve`` detached and wait for its start report (or its death)."""
    read_end, write_end = os.pipe()
    try:
        try:
            # 0600: the server's log names sessions, commands and paths (filemodes.py)
            log_fd = os.open(home / LOG_NAME, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
            filemodes.private_files([home / LOG_NAME])
            log: Any = os.fdopen(log_fd, "ab")
        except OSError:
            log = subprocess.DEVNULL  # the server reports on the pipe all the same
        args = ["serve", "--home", str(home), "--ready-fd", str(write_end), *extra_args]
        try:
            process = subprocess.Popen(
                [sys.executable, "-m", "shellyard", *args],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                start_new_session=True,
                pass_fds=(write_end,),
                env={**os.environ, "SHELLYARD_HOME": str(home)},
            )
        finally:
            if log is not subprocess.DEVNULL:
                log.close()
            os.close(write_end)
        report = _read_report(read_end, deadline)
    finally:
        os.close(read_end)
    if report is None:  # the pipe ended without a word: the process is gone
        if time.monotonic() >= deadline:
            return  # still starting after the whole timeout: the caller reports that
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=2)
        status = process.returncode
        raise ShellyardError(
            f"the shellyard server for {home} exited (status {status}) before it was ready"
            f"{_last_log_line(home)}; see {home / LOG_NAME}"
        )
    error = report.get("error")
    if isinstance(error, dict):
        cls = ERRORS_BY_CODE.get(str(error.get("code")), ShellyardError)
        if cls is HomeInUse:  # another client started it a moment earlier: use that one
            return
        raise cls(f"the shellyard server for {home} could not start: {error.get('message')}")


def _read_report(fd: int, deadline: float) -> dict[str, Any] | None:
    """The one JSON line of the start pipe, or None at its end of file (or at the deadline)."""
    data = b""
    while b"\n" not in data:
        remaining = deadline - time.monotonic()
        if remaining <= 0 or not select.select([fd], [], [], remaining)[0]:
            return None
        chunk = os.read(fd, 4096)
        if not chunk:
            return None
        data += chunk
    try:
        report = json.loads(data.split(b"\n", 1)[0])
    except ValueError:
        return None
    return report if isinstance(report, dict) else None


def _last_log_line(home: Path) -> str:
    """``: <the log's last line>`` to say why, when the log can be read."""
    try:
        with open(home / LOG_NAME, "rb") as handle:
            handle.seek(0, os.SEEK_END)
            handle.seek(max(0, handle.tell() - 4096))
            lines = [line for line in handle.read().decode(errors="replace").splitlines() if line]
    except OSError:
        return ""
    return f": {lines[-1].strip()}" if lines else ""
