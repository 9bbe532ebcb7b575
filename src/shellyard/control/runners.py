"""Runner registry: runner id → a Runner protocol object, and each runner's health.

The control plane asks only this. ``local`` is in-process; ``direct`` and ``ssh`` runners are
``RemoteRunner`` objects (R1), the first over HTTP(S), the second over an SSH connection.
What a runner needs besides its address (its key, an ssh identity and known-hosts file, a
pinned TLS certificate) is kept in the runner row's ``token`` column as JSON
(docs/runners.md). A heartbeat asks every runner for its ``info`` each ``heartbeat_s``:
``up``, or ``unreachable`` since the first failed beat.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import json
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from pydantic import ValidationError

from shellyard.contract.runners import (
    RunnerAddRequest,
    RunnerBootstrapRequest,
    RunnerBootstrapResult,
    RunnerState,
    RunnerView,
)
from shellyard.errors import Conflict, InvalidInput, NotFound, ShellyardError, validation_message
from shellyard.runner.protocol import Runner, RunnerInfo
from shellyard.store import Store
from shellyard.store.owners import RunnerRecord

logger = logging.getLogger(__name__)

LOCAL_RUNNER_ID = "local"
HEARTBEAT_S = 10.0
#: A heartbeat that takes longer than this counts as a failure.
HEARTBEAT_TIMEOUT_S = 5.0
#: The ``kind`` of a removed runner's row, kept because past executions reference it.
REMOVED = "removed"


@dataclass
class Health:
    state: RunnerState = "unknown"
    unreachable_since: float | None = None
    last_seen: float | None = None
    last_error: str | None = None
    info: RunnerInfo | None = None


def is_loopback(address: str) -> bool:
    host = urlsplit(address).hostname or ""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _secrets(token: str | None) -> dict[str, Any]:
    """The row's token column: a plain key (direct runners of old) or a JSON object."""
    if token and token.startswith("{"):
        data: dict[str, Any] = json.loads(token)
        return data
    return {"key": token or ""}


class RunnerRegistry:
    def __init__(
        self, store: Store, *, on_change: Callable[[], None], heartbeat_s: float = HEARTBEAT_S
    ) -> None:
        self._store = store
        self._runners: dict[str, Runner] = {}
        self._kinds: dict[str, tuple[str, str | None, str | None]] = {}
        self._health: dict[str, Health] = {}
        self.heartbeat_s = heartbeat_s
        self._beating: asyncio.Task[None] | None = None
        #: Called after a runner was added or removed here: other replicas reload
        #: (docs/operations.md; a no-op with one replica).
        self.on_change = on_change
        #: Called with a runner's id before ``remove`` forgets it: the execution service ends
        #: the executions only that runner could settle (their unknown outcomes).
        self.on_removing: list[Callable[[str], Awaitable[None]]] = []

    async def add_local(self, runner: Runner) -> None:
        await self._store.upsert_runner(LOCAL_RUNNER_ID, "local", None, None)
        self._put(LOCAL_RUNNER_ID, runner, "local", None, None)

    async def add_direct(self, runner_id: str, address: str, token: str) -> Runner:
        """A runner daemon reached over HTTP with its key (R1, R4)."""
        await self.add(_request(runner_id=runner_id, address=address, token=token))
        return self.get(runner_id)

    async def add_ssh(
        self,
        runner_id: str,
        address: str,
        token: str,
        identity: Path,
        known_hosts: Path,
        *,
        accept_new: bool = False,
    ) -> Runner:
        """A runner daemon behind an SSH server (R1, R4)."""
        request = _request(
            runner_id=runner_id,
            address=address,
            token=token,
            identity=str(identity),
            known_hosts=str(known_hosts),
            accept_new=accept_new,
        )
        await self.add(request)
        return self.get(runner_id)

    async def add(self, request: RunnerAddRequest) -> RunnerView:
        """Check that the runner can be reached as described (host key, user key, TLS
        certificate, its key), record it, and connect to it."""
        runner_id = request.runner_id
        if runner_id == LOCAL_RUNNER_ID:
            raise InvalidInput(f"runner id {runner_id!r} is reserved; pick another")
        if request.address.startswith("ssh://"):
            kind, secrets = "ssh", await self._ssh_secrets(request)
        else:
            kind, secrets = "direct", await self._direct_secrets(request)
        runner = _connect(kind, request.address, secrets)
        try:
            info = await runner.info()  # a wrong key is refused here, before anything is kept
        except BaseException:
            await runner.aclose()
            raise
        token = json.dumps(secrets) if len(secrets) > 1 else request.token
        await self._store.upsert_runner(runner_id, kind, request.address, token)
        old = self._runners.pop(runner_id, None)
        if old is not None:
            await old.aclose()
        self._put(runner_id, runner, kind, request.address, secrets.get("fingerprint"))
        self._health[runner_id] = Health("up", None, time.time(), None, info)
        self.on_change()
        return await self.view(runner_id)

    async def bootstrap(self, request: RunnerBootstrapRequest) -> RunnerBootstrapResult:
        """Start the daemon on the far host over SSH unless it runs there already, then
        register it (again only if its address or key changed). Safe to repeat."""
        from shellyard.runner.transport.ssh import SshTarget, check_host_key, start_daemon

        if request.runner_id == LOCAL_RUNNER_ID:
            raise InvalidInput(f"runner id {request.runner_id!r} is reserved; pick another")
        target = SshTarget.parse(request.address, far_end=False)
        identity, known_hosts = _ssh_files(request.identity, request.known_hosts)
        known = self._kinds.get(request.runner_id)
        if known is not None:
            # Refused before the host is touched: one daemon per root, so starting another
            # one there would take the registered runner's place.
            was = SshTarget.parse(known[1] or "", far_end=False) if known[0] == "ssh" else None
            if (
                was is None
                or (was.user, was.host, was.port)
                != (
                    target.user,
                    target.host,
                    target.port,
                )
                or (target.socket is not None and target.socket != was.socket)
            ):
                raise Conflict(
                    f"runner {request.runner_id!r} is registered at {known[1]}; remove it "
                    "first or bootstrap under another name"
                )
        await check_host_key(target, known_hosts, request.accept_new)
        started = await start_daemon(
            target,
            identity,
            known_hosts,
            root=request.root,
            command=request.command,
            network=request.network,
        )
        address = f"ssh://{target.user}@{target.host}:{target.port}{started.socket}"
        if known is not None and known[1] != address:
            raise Conflict(
                f"runner {request.runner_id!r} is registered at {known[1]}, not {address}; "
                "remove it first or bootstrap under another name"
            )
        if known is None or (await self._key_of(request.runner_id)) != started.key:
            await self.add(
                _request(
                    runner_id=request.runner_id,
                    address=address,
                    token=started.key,
                    identity=str(identity),
                    known_hosts=str(known_hosts),
                )
            )
        return RunnerBootstrapResult(
            daemon="started" if started.state == "started" else "running",
            socket=started.socket,
            runner=await self.view(request.runner_id),
        )

    async def _key_of(self, runner_id: str) -> str | None:
        for row in await self._store.list_runners():
            if row.id == runner_id:
                return str(_secrets(row.token).get("key") or "") or None
        return None

    async def _ssh_secrets(self, request: RunnerAddRequest) -> dict[str, Any]:
        from shellyard.runner.transport.ssh import SshTarget, check_host_key, probe

        target = SshTarget.parse(request.address)
        identity, known_hosts = _ssh_files(request.identity, request.known_hosts)
        fingerprint = await check_host_key(target, known_hosts, request.accept_new)
        await probe(target, identity, known_hosts)
        return {
            "key": request.token,
            "identity": str(identity),
            "known_hosts": str(known_hosts),
            "fingerprint": fingerprint,
        }

    async def _direct_secrets(self, request: RunnerAddRequest) -> dict[str, Any]:
        secrets: dict[str, Any] = {"key": request.token}
        if request.address.startswith("https://"):
            from shellyard.runner.transport.tls import fetch_certificate

            pem, fingerprint = await fetch_certificate(request.address, request.tls_fingerprint)
            secrets.update(tls_cert=pem, fingerprint=fingerprint)
        elif not is_loopback(request.address):
            raise InvalidInput(
                f"{request.address} is plain HTTP off loopback: anyone on the path could read "
                "every command and file; serve the daemon with --tls-cert/--tls-key and "
                "register https://…, or use an ssh:// runner"
            )
        return secrets

    async def remove(self, runner_id: str) -> None:
        """Forget a runner; refused while executions run (or wait to run) there. Those whose
        outcome is unknown and still asked about do not refuse it (a runner gone for good
        could never be removed): ``on_removing`` ends them, unknown with the reason."""
        if runner_id == LOCAL_RUNNER_ID:
            raise InvalidInput("the local runner cannot be removed")
        self.get(runner_id)
        await self._refuse_while_running(runner_id)
        for removing in self.on_removing:
            await removing(runner_id)
        # a start answered just before made one running: it refuses the removal
        await self._refuse_while_running(runner_id)
        # The row stays (past executions reference it), without its secrets.
        await self._store.upsert_runner(runner_id, REMOVED, None, None)
        runner = self._runners.pop(runner_id)
        self._kinds.pop(runner_id, None)
        self._health.pop(runner_id, None)
        await runner.aclose()
        self.on_change()

    async def _refuse_while_running(self, runner_id: str) -> None:
        running = await self._running(runner_id)
        if running:
            raise Conflict(
                f"runner {runner_id!r} has {running} execution(s) running or queued; cancel "
                "them or wait until they end, then remove it",
                running_executions=running,
            )

    async def load_registered(self) -> None:
        """Reconnect to every direct and ssh runner recorded in the store."""
        self._connect_recorded(await self._store.list_runners())

    async def registered(self, runner_id: str) -> bool:
        """Whether the runner is registered by the records (``removed`` is not), reconnecting
        every recorded one as ``load_registered`` does when it is: one read of the records for
        both (an environment change's start asks both)."""
        rows = await self._store.list_runners()
        if runner_id != LOCAL_RUNNER_ID:
            row = next((row for row in rows if row.id == runner_id), None)
            if row is None or row.kind == REMOVED:
                return False
        self._connect_recorded(rows)
        return True

    def _connect_recorded(self, rows: list[RunnerRecord]) -> None:
        for row in rows:
            kind, runner_id = row.kind, row.id
            if kind in ("direct", "ssh") and runner_id not in self._runners:
                secrets = _secrets(row.token)
                runner = _connect(kind, str(row.address), secrets)
                self._put(runner_id, runner, kind, row.address, secrets.get("fingerprint"))

    async def reload(self) -> None:
        """Another replica added or removed a runner (docs/operations.md): follow the records."""
        rows = {row.id: row for row in await self._store.list_runners()}
        for runner_id in [r for r in self._runners if r != LOCAL_RUNNER_ID]:
            row = rows.get(runner_id)
            kind, address, _pin = self._kinds.get(runner_id, ("", None, None))
            if row is None or row.kind != kind or row.address != address:
                self._kinds.pop(runner_id, None)
                self._health.pop(runner_id, None)
                await self._runners.pop(runner_id).aclose()
        await self.load_registered()

    def _put(
        self, runner_id: str, runner: Runner, kind: str, address: str | None, pin: str | None
    ) -> None:
        self._runners[runner_id] = runner
        self._kinds[runner_id] = (kind, address, pin)
        self._health.setdefault(runner_id, Health())

    def get(self, runner_id: str) -> Runner:
        runner = self._runners.get(runner_id)
        if runner is None:
            known = ", ".join(sorted(self._runners)) or "none"
            raise NotFound(f"unknown runner {runner_id!r}; registered runners: {known}")
        return runner

    def ids(self) -> list[str]:
        return sorted(self._runners)

    def state_id(self, runner_id: str) -> str | None:
        """The runner's state id (runner/state_id.py) as its last ``info`` answer said (when
        added, then each heartbeat); None before one came or from a runner of before session
        52. A start is sent to this state unless it was replaced since that answer: then the
        record names an older state, and the runner's NO_TRACE reads "not known" (E9)."""
        health = self._health.get(runner_id)
        info = health.info if health is not None else None
        return info.state_id if info is not None else None

    async def removed(self, runner_id: str) -> bool:
        """The runner is removed (or was never added) by the records, which every replica
        shares: this one may not have heard yet of a runner another replica added."""
        if runner_id == LOCAL_RUNNER_ID:
            return False
        row = await self._store.get_runner(runner_id)
        return row is None or row.kind == REMOVED

    # --- health ---

    def start_heartbeats(self) -> None:
        if self._beating is None:
            self._beating = asyncio.create_task(self._beat_forever(), name="runner-heartbeats")

    async def _beat_forever(self) -> None:
        while True:
            await self.heartbeat()
            await asyncio.sleep(self.heartbeat_s)

    async def heartbeat(self) -> None:
        """Ask every runner for its info once (concurrently) and record the outcome."""
        await asyncio.gather(*(self._beat(rid) for rid in list(self._runners)))

    async def _beat(self, runner_id: str) -> None:
        runner = self._runners.get(runner_id)
        if runner is None:
            return
        health = self._health.setdefault(runner_id, Health())
        try:
            info = await asyncio.wait_for(runner.info(), HEARTBEAT_TIMEOUT_S)
        except (ShellyardError, TimeoutError, OSError) as e:
            if health.state != "unreachable":
                health.unreachable_since = time.time()
                logger.warning(
                    "runner unreachable",
                    extra={"action": "runner_unreachable", "runner_id": runner_id},
                )
            health.state = "unreachable"
            health.last_error = str(e) or type(e).__name__
            return
        if health.state == "unreachable":
            logger.info("runner back", extra={"action": "runner_up", "runner_id": runner_id})
        health.state, health.unreachable_since, health.last_error = "up", None, None
        health.last_seen, health.info = time.time(), info

    async def _running(self, runner_id: str) -> int:
        rows = await self._store.active_executions()
        return sum(1 for row in rows if row.runner_id == runner_id)

    async def view(self, runner_id: str) -> RunnerView:
        self.get(runner_id)
        return (await self.views([runner_id]))[0]

    async def views(self, runner_ids: list[str] | None = None) -> list[RunnerView]:
        """What ``runner list`` / ``runner show`` print: the registered runners, their state,
        version, sandbox, limits and running executions."""
        rows = await self._store.active_executions()
        running: dict[str, int] = {}
        for row in rows:
            running[row.runner_id] = running.get(row.runner_id, 0) + 1
        result = []
        for runner_id in runner_ids if runner_ids is not None else list(self._kinds):
            kind, address, pin = self._kinds[runner_id]
            health = self._health.get(runner_id, Health())
            info = health.info
            limits = info.limits if info else None
            result.append(
                RunnerView(
                    runner_id=runner_id,
                    kind=kind,
                    address=address,
                    state=health.state,
                    unreachable_since=health.unreachable_since,
                    last_seen=health.last_seen,
                    last_error=health.last_error,
                    version=info.runner_version if info else None,
                    sandbox=info.sandbox if info else None,
                    network=info.network if info else None,
                    limits=limits,
                    running_executions=running.get(runner_id, 0),
                    fingerprint=pin,
                )
            )
        return result

    async def aclose(self) -> None:
        if self._beating is not None:
            self._beating.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._beating
            self._beating = None
        for runner in self._runners.values():
            await runner.aclose()
        self._runners.clear()


def _ssh_files(identity: str | None, known_hosts: str | None) -> tuple[Path, Path]:
    if not identity or not known_hosts:
        raise InvalidInput(
            "an ssh runner needs --identity FILE (the private key to log in with) and "
            "--known-hosts FILE (where its host key is, or is to be, recorded)"
        )
    identity_file = Path(identity).absolute()
    if not identity_file.is_file():
        raise InvalidInput(f"identity file {identity_file} does not exist on this host")
    return identity_file, Path(known_hosts).absolute()


def _request(**fields: Any) -> RunnerAddRequest:
    try:
        return RunnerAddRequest(**fields)
    except ValidationError as e:
        raise InvalidInput(f"bad runner registration: {validation_message(e.errors())}") from e


def _connect(kind: str, address: str, secrets: dict[str, Any]) -> Runner:
    """The Runner object for a recorded runner; nothing is connected until it is asked."""
    from shellyard.runner.transport.client import RemoteRunner

    key = str(secrets["key"])
    if kind == "ssh":
        from shellyard.runner.transport.ssh import ssh_runner

        identity, known_hosts = Path(secrets["identity"]), Path(secrets["known_hosts"])
        return ssh_runner(address, key, identity, known_hosts)
    if secrets.get("tls_cert"):
        from shellyard.runner.transport.tls import pinned_transport

        return RemoteRunner(address, key, transport=pinned_transport(str(secrets["tls_cert"])))
    return RemoteRunner(address, key)
