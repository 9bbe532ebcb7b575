"""SSH-tunnel runners (R1, R4): the runner protocol carried by one SSH connection.

``ssh://USER@HOST[:PORT][/SOCKET]`` names a runner daemon on HOST listening on the Unix
socket SOCKET (``shellyard runner serve --socket SOCKET``), or with ``?port=N`` on HOST's
loopback port N. asyncssh holds one connection per runner; a private local Unix socket is
forwarded over it to the daemon, and ``RemoteRunner`` speaks to that local socket exactly as
it speaks to a ``direct`` daemon, signing every request with the runner's key: the control
plane cannot tell the two kinds apart. Host keys are checked against a known-hosts file; an
unknown key is refused with its fingerprint unless the operator accepts it at ``runner add``.
After a drop the connection is made again on the next request, no sooner than a backoff
that doubles from ``BACKOFF_MIN_S`` to ``BACKOFF_MAX_S`` while attempts fail.
"""

from __future__ import annotations

import asyncio
import contextlib
import shlex
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import asyncssh
import httpx

from shellyard.errors import InvalidInput, RunnerUnavailable, ShellyardError, Unauthorized
from shellyard.runner.transport.client import RemoteRunner

BACKOFF_MIN_S = 0.2
BACKOFF_MAX_S = 30.0
CONNECT_TIMEOUT_S = 10.0
#: An idle connection is probed this often; this many unanswered probes drop it, so a dead
#: route is noticed in about 15 s even when no request is under way.
KEEPALIVE_S = 5.0
KEEPALIVE_COUNT = 3


@dataclass(frozen=True)
class SshTarget:
    """Where an ssh runner's daemon is: the SSH server, and the far end's socket or port."""

    user: str
    host: str
    port: int
    socket: str | None
    remote_port: int | None

    @classmethod
    def parse(cls, address: str, far_end: bool = True) -> SshTarget:
        """``far_end`` False: the socket (or port) may be left out (``runner bootstrap``)."""
        parts = urlsplit(address)
        example = "ssh://USER@HOST[:PORT]/path/to/runner.sock or ssh://USER@HOST[:PORT]?port=8765"
        if parts.scheme != "ssh" or not parts.hostname or not parts.username:
            raise InvalidInput(f"bad ssh runner address {address!r}; write {example}")
        try:
            port = parts.port or 22
        except ValueError:
            raise InvalidInput(f"bad SSH port in {address!r}; write {example}") from None
        query = parse_qs(parts.query)
        remote_port: int | None = None
        if "port" in query:
            value = query["port"][0]
            if not value.isdigit() or not 0 < int(value) < 65536:
                raise InvalidInput(f"bad far-end port {value!r} in {address!r}; write {example}")
            remote_port = int(value)
        socket = parts.path if parts.path not in ("", "/") else None
        if (socket is not None and remote_port is not None) or (
            far_end and socket is None and remote_port is None
        ):
            raise InvalidInput(
                f"ssh runner address {address!r} must name the daemon's Unix socket (a path) "
                f"or its loopback port (?port=N), one of the two; write {example}"
            )
        return cls(parts.username, parts.hostname, port, socket, remote_port)

    @property
    def label(self) -> str:
        far = self.socket if self.socket else f"127.0.0.1:{self.remote_port}"
        return f"ssh://{self.user}@{self.host}:{self.port} → {far}"


def _known_hosts_name(target: SshTarget) -> str:
    return target.host if target.port == 22 else f"[{target.host}]:{target.port}"


async def check_host_key(target: SshTarget, known_hosts: Path, accept_new: bool) -> str:
    """The server's host key fingerprint, once it is known: a key absent from ``known_hosts``
    is refused with its fingerprint, or (``accept_new``) appended to the file. A key that
    differs from the recorded one is refused by the connection itself (never replaced)."""
    try:
        key = await asyncio.wait_for(
            asyncssh.get_server_host_key(target.host, target.port), CONNECT_TIMEOUT_S
        )
    except (OSError, asyncssh.Error, TimeoutError) as e:
        raise RunnerUnavailable(
            f"cannot reach the SSH server of {target.label} ({e!r}); check the host and port"
        ) from e
    if key is None:
        raise RunnerUnavailable(f"the SSH server of {target.label} offered no host key")
    fingerprint = key.get_fingerprint("sha256")
    known = asyncssh.read_known_hosts(str(known_hosts)) if known_hosts.exists() else None
    if known is not None:
        trusted = known.match(target.host, target.host, target.port)[0]
        if trusted:
            return fingerprint
    if not accept_new:
        raise Unauthorized(
            f"unknown SSH host key for {target.host}:{target.port}: {key.get_algorithm()} "
            f"{fingerprint}; compare it with the host's own "
            "(ssh-keygen -lf /etc/ssh/ssh_host_*_key.pub), then add it to the known-hosts file "
            "or pass --accept-new",
            fingerprint=fingerprint,
        )
    known_hosts.parent.mkdir(parents=True, exist_ok=True)
    public = key.export_public_key("openssh").decode().split()
    with known_hosts.open("a", encoding="utf-8") as f:
        f.write(f"{_known_hosts_name(target)} {public[0]} {public[1]}\n")
    return fingerprint


def _refusal(target: SshTarget, e: BaseException) -> ShellyardError:
    if isinstance(e, asyncssh.HostKeyNotVerifiable):
        return Unauthorized(
            f"the SSH host key of {target.host}:{target.port} is not the one in the "
            f"known-hosts file ({e}); if the host was re-installed, check its new key and "
            "replace the line, else someone may be in the middle"
        )
    if isinstance(e, asyncssh.PermissionDenied):
        return Unauthorized(
            f"the SSH server of {target.label} refused user {target.user!r} with this "
            f"identity ({e}); add the identity's public key to that user's authorized_keys"
        )
    return RunnerUnavailable(
        f"cannot connect to the SSH server of {target.label} ({e!r}); what runs there keeps "
        "running; retried with backoff"
    )


class SshTunnel:
    """One SSH connection to a runner host and a local Unix socket forwarded to its daemon."""

    def __init__(self, target: SshTarget, identity: Path, known_hosts: Path) -> None:
        self.target = target
        self._identity = identity
        self._known_hosts = known_hosts
        # A private folder: only this process's user may connect to the forwarded socket
        # (and every request must still be signed with the runner's key).
        self._dir = Path(tempfile.mkdtemp(prefix="shellyard-ssh-"))
        self.local_path = str(self._dir / "runner.sock")
        self._conn: asyncssh.SSHClientConnection | None = None
        self._listener: asyncssh.SSHListener | None = None
        self._lock = asyncio.Lock()
        self._failures = 0
        self._next_attempt = 0.0
        self.connects = 0
        self.last_error: ShellyardError | None = None

    @property
    def connected(self) -> bool:
        return self._conn is not None and not self._conn.is_closed()

    async def ensure(self) -> None:
        """Connect (again) if the connection is down; raise ``ShellyardError`` if it cannot
        be made now. Within the backoff after a failure, raise at once."""
        if self.connected:
            return
        async with self._lock:
            if self.connected:
                return
            wait_s = self._next_attempt - time.monotonic()
            if wait_s > 0 and self.last_error is not None:
                raise RunnerUnavailable(
                    f"{self.last_error.message} (next attempt in {wait_s:.1f} s)",
                )
            try:
                await self._connect()
            except (OSError, asyncssh.Error, TimeoutError) as e:
                self._failures += 1
                backoff = min(BACKOFF_MAX_S, BACKOFF_MIN_S * 2 ** (self._failures - 1))
                self._next_attempt = time.monotonic() + backoff
                self.last_error = _refusal(self.target, e)
                raise self.last_error from e
            self._failures = 0
            self.last_error = None

    async def open_connection(self) -> asyncssh.SSHClientConnection:
        """A new SSH connection with this tunnel's checks (host key, user key); the caller
        closes it."""
        return await asyncio.wait_for(
            asyncssh.connect(
                self.target.host,
                self.target.port,
                username=self.target.user,
                client_keys=[str(self._identity)],
                known_hosts=str(self._known_hosts),
                agent_path=None,
                config=None,
                keepalive_interval=KEEPALIVE_S,
                keepalive_count_max=KEEPALIVE_COUNT,
            ),
            CONNECT_TIMEOUT_S,
        )

    async def _connect(self) -> None:
        await self._drop()
        conn = await self.open_connection()
        try:
            Path(self.local_path).unlink(missing_ok=True)
            if self.target.socket is not None:
                listener = await conn.forward_local_path(self.local_path, self.target.socket)
            else:
                assert self.target.remote_port is not None  # SshTarget.parse: one of the two
                listener = await conn.forward_local_path_to_port(
                    self.local_path, "127.0.0.1", self.target.remote_port
                )
        except BaseException:
            conn.close()
            raise
        self._conn, self._listener = conn, listener
        self.connects += 1

    async def _drop(self) -> None:
        if self._listener is not None:
            self._listener.close()
            self._listener = None
        if self._conn is not None:
            self._conn.close()
            with contextlib.suppress(TimeoutError, OSError, asyncssh.Error):
                await asyncio.wait_for(self._conn.wait_closed(), 5)
            self._conn = None

    def disconnect(self) -> None:
        """Drop the connection now, as a network failure would (tests, ``runner remove``)."""
        if self._conn is not None:
            self._conn.abort()

    async def aclose(self) -> None:
        await self._drop()
        shutil.rmtree(self._dir, ignore_errors=True)


class SshTransport(httpx.AsyncBaseTransport):
    """httpx over the tunnel's local socket; makes the connection first when it is down."""

    def __init__(self, tunnel: SshTunnel) -> None:
        self.tunnel = tunnel
        self._inner = httpx.AsyncHTTPTransport(uds=tunnel.local_path)

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        try:
            await self.tunnel.ensure()
        except ShellyardError as e:
            # RemoteRunner turns a connect error into RunnerUnavailable (E9) with this text.
            raise httpx.ConnectError(e.message, request=request) from e
        return await self._inner.handle_async_request(request)

    async def aclose(self) -> None:
        await self._inner.aclose()
        await self.tunnel.aclose()


def ssh_runner(
    address: str, key: str, identity: Path, known_hosts: Path, **options: Any
) -> RemoteRunner:
    """A ``RemoteRunner`` on the daemon behind ``address`` (nothing is connected yet)."""
    target = SshTarget.parse(address)
    transport = SshTransport(SshTunnel(target, identity, known_hosts))
    return RemoteRunner(
        "http://ssh-runner", key, transport=transport, label=target.label, **options
    )


# --- bootstrap: start the daemon on the far host over SSH ---

#: Where ``runner bootstrap`` puts the daemon's folder on the far host when not told.
BOOTSTRAP_ROOT = "~/.shellyard/runner"
BOOTSTRAP_TIMEOUT_S = 60.0

# Run by ``sh -s`` as the SSH user. Idempotent: a daemon whose pid file names a live process
# and whose socket exists is left alone; otherwise one is started in a session of its own
# (it outlives the SSH session), and the script waits for its socket. It prints the socket's
# absolute path and the daemon's key (its token file, made by the daemon at first start);
# the key crosses only this SSH channel.
_BOOTSTRAP = r"""
set -eu
root=$1; sock=$2; cmd=$3; network=$4
case $root in "~"|"~/"*) root=$HOME${root#"~"} ;; esac
[ -n "$sock" ] || sock=$root/runner.sock
case $sock in "~"|"~/"*) sock=$HOME${sock#"~"} ;; esac
# (the daemon sets the root's mode itself: traversable by the sandbox uid, not listable)
mkdir -p "$root"
pidfile=$root/daemon.pid
# A live process, not a zombie nobody reaped (a killed daemon's parent is init, or nothing).
alive() {
  [ -f "$pidfile" ] && pid=$(cat "$pidfile") && kill -0 "$pid" 2>/dev/null || return 1
  case $(ps -o stat= -p "$pid" 2>/dev/null) in Z*) return 1 ;; esac
}
if alive && [ -S "$sock" ]; then
  state=running
else
  if alive; then kill "$(cat "$pidfile")" 2>/dev/null || true; sleep 1; fi
  rm -f "$sock"
  command -v "$cmd" >/dev/null 2>&1 || {
    echo "no $cmd on the far host's PATH; install shellyard there or pass --command" >&2
    exit 3; }
  log=$root/daemon.log
  nohup setsid "$cmd" runner serve --root "$root" --socket "$sock" --network "$network" \
    >>"$log" 2>&1 </dev/null &
  echo $! >"$pidfile"
  i=0
  until [ -S "$sock" ] && [ -s "$root/token" ]; do
    if ! alive || [ $i -ge 300 ]; then
      echo "the runner daemon did not start; the end of $root/daemon.log:" >&2
      tail -n 20 "$root/daemon.log" >&2; exit 3
    fi
    i=$((i + 1)); sleep 0.1
  done
  state=started
fi
printf 'state=%s
socket=%s
token=%s
' "$state" "$sock" "$(cat "$root/token")"
"""


@dataclass(frozen=True)
class Bootstrapped:
    """What ``start_daemon`` found or did on the far host."""

    #: ``started`` now, or already ``running``.
    state: str
    #: The daemon's socket (absolute path on the far host).
    socket: str
    key: str


async def start_daemon(
    target: SshTarget,
    identity: Path,
    known_hosts: Path,
    *,
    root: str = BOOTSTRAP_ROOT,
    command: str = "shellyard",
    network: str = "off",
) -> Bootstrapped:
    """Start (idempotently) ``COMMAND runner serve --socket`` on the far host as the SSH user,
    listening on ``target.socket`` (default ``ROOT/runner.sock``); its socket and key."""
    if target.remote_port is not None:
        raise InvalidInput(
            "runner bootstrap starts a daemon on a Unix socket: give ssh://USER@HOST[:PORT] "
            "or ssh://USER@HOST[:PORT]/SOCKET, not ?port=N"
        )
    tunnel = SshTunnel(target, identity, known_hosts)
    try:
        try:
            conn = await tunnel.open_connection()
        except (OSError, asyncssh.Error, TimeoutError) as e:
            raise _refusal(target, e) from e
        async with conn:
            args = " ".join(shlex.quote(a) for a in (root, target.socket or "", command, network))
            try:
                done = await asyncio.wait_for(
                    conn.run(f"sh -s -- {args}", input=_BOOTSTRAP, check=False),
                    BOOTSTRAP_TIMEOUT_S,
                )
            except (OSError, asyncssh.Error, TimeoutError) as e:
                raise RunnerUnavailable(
                    f"starting the runner daemon on {target.label} failed ({e!r}); try again"
                ) from e
    finally:
        await tunnel.aclose()
    out, err = str(done.stdout or ""), str(done.stderr or "").strip()
    if done.exit_status != 0:
        raise ShellyardError(
            f"could not start the runner daemon on {target.host} as {target.user} (exit "
            f"{done.exit_status}): {err or out.strip() or 'no message'}"
        )
    fields = dict(line.split("=", 1) for line in out.splitlines() if "=" in line)
    if not fields.get("token") or not fields.get("socket", "").startswith("/"):
        raise ShellyardError(
            f"the bootstrap on {target.host} answered something unexpected: {out[:300]!r}"
        )
    return Bootstrapped(fields.get("state", "started"), fields["socket"], fields["token"])


async def probe(target: SshTarget, identity: Path, known_hosts: Path) -> None:
    """Connect once, as ``runner add`` does before it records anything: a refused host key
    or user key is the operator's to fix, so it is raised as ``Unauthorized``."""
    tunnel = SshTunnel(target, identity, known_hosts)
    try:
        await tunnel.ensure()
    finally:
        await tunnel.aclose()
