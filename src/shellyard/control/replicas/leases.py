"""Leases of ongoing work across control-plane replicas (docs/operations.md, E11 across replicas).

Each ``serve`` process is a replica with an id of its own. Before it watches an execution it
takes that execution's lease (store/leases.py); a loop renews every lease it holds each
``ttl_s / 3`` and, on PostgreSQL, claims the leases other replicas let expire (they died), the
executions nobody holds a lease on, and the workspace queues nobody hands on. What it claims
goes to the adopter its service registered (``register``, e.g. ``ExecutionService.adopt``),
which re-attaches exactly as a restart does. A lease it finds taken from it (it stalled past
the expiry) goes to ``on_lost``: its watcher stops, the new holder finalizes.

Work on the in-process ``local`` runner can only be reached from its own home: its leases carry
the home's scope, which no other home's replica claims; a restarted server of that home takes
them back at once (only one process serves a home).

SQLite means one replica: every lease is trivially its own and no loop runs. There an
execution's lease is held in memory only (``terms`` gives no row to write): the row would be
read by nobody but this home's next start-up, whose claim takes every unleased running or
writer-holding execution and every unleased queued reader anyway (``claim_round``: grace 0 on
SQLite), so it cost two statements per execution for nothing (docs/benchmarks.md, the
section on the server's CPU per call, session 49).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import uuid
from collections.abc import Awaitable, Callable, Mapping

from shellyard.errors import InvalidInput
from shellyard.store import Store
from shellyard.store.leases import EXECUTION, LeaseTerms

log = logging.getLogger(__name__)

#: A lease lives this long without renewal; renewed every third of it.
DEFAULT_TTL_S = 10.0
#: Leases claimed per round (the rest wait a round: a dead replica's work spreads out).
CLAIM_BATCH = 200

#: Rounds between sweeps (a round is a third of the lease time).
SWEEP_EVERY = 3

Adopter = Callable[[str], Awaitable[None]]


def ttl_from_env(environ: Mapping[str, str]) -> float:
    """``SHELLYARD_LEASE_TTL_S``: how long a dead replica's work waits to be taken over."""
    raw = environ.get("SHELLYARD_LEASE_TTL_S")
    if not raw:
        return DEFAULT_TTL_S
    try:
        value = float(raw)
    except ValueError:
        value = 0.0
    if not 0.3 <= value <= 3600:
        raise InvalidInput(
            f"SHELLYARD_LEASE_TTL_S must be a number of seconds from 0.3 to 3600, not {raw!r}"
        )
    return value


def home_scope(local_root: str) -> str:
    """The scope of a home's local-runner work: its host and folder."""
    return f"local:{socket.gethostname()}:{local_root}"


class LeaseKeeper:
    def __init__(
        self,
        store: Store,
        scope: str,
        local_runner_id: str,
        *,
        ttl_s: float = DEFAULT_TTL_S,
    ) -> None:
        self.store = store
        self.replica_id = f"rep_{uuid.uuid4().hex}"
        self.scope = scope
        self.local_runner_id = local_runner_id
        self.ttl_s = ttl_s
        self.shared = not store.is_sqlite
        #: kind → the service that re-attaches a claimed subject (then owns the lease).
        self.adopters: dict[str, Adopter] = {}
        #: kind → called with a subject whose lease another replica took.
        self.on_lost: dict[str, Callable[[str], None]] = {}
        #: Called with a workspace whose queue nobody hands on (the execution service's).
        self.dispatch: Callable[[str], Awaitable[None]] | None = None
        #: Called every few rounds (PostgreSQL), in the order registered: a replica that died
        #: between recording something and acting on it (a notice and its wake) left work no
        #: lease names.
        self.sweeps: list[Callable[[], Awaitable[None]]] = []
        self._rounds = 0
        self._held: set[tuple[str, str]] = set()
        #: Held with no row (SQLite, ``terms``): nothing to delete when they end.
        self._rowless: set[tuple[str, str]] = set()
        self._loop: asyncio.Task[None] | None = None
        self.takeovers = 0

    def register(
        self,
        kind: str,
        adopt: Adopter,
        lost: Callable[[str], None],
        *,
        sweep: Callable[[], Awaitable[None]] | None = None,
        dispatch: Callable[[str], Awaitable[None]] | None = None,
    ) -> None:
        """A service takes the work of ``kind`` (called from its constructor, docs/architecture.md
        "Wiring"): ``adopt`` re-attaches a subject this replica claimed, ``lost`` stops one
        another replica took over; ``sweep`` and ``dispatch`` as the attributes above."""
        self.adopters[kind] = adopt
        self.on_lost[kind] = lost
        if sweep is not None:
            self.sweeps.append(sweep)
        if dispatch is not None:
            self.dispatch = dispatch

    # ------------------------------------------------------------------ one lease

    def _scope_of(self, runner_id: str) -> str | None:
        return self.scope if runner_id == self.local_runner_id else None

    async def acquire(self, kind: str, subject_id: str, runner_id: str) -> bool:
        """Take the lease of a subject this replica is about to work on; False: another live
        replica holds it (and does the work)."""
        if (kind, subject_id) in self._held:
            return True
        ok = await self.store.acquire_lease(
            kind, subject_id, self.replica_id, self._scope_of(runner_id), self.ttl_s
        )
        if ok:
            self._held.add((kind, subject_id))
        return ok

    def terms(self, runner_id: str) -> LeaseTerms | None:
        """This replica's lease for work on ``runner_id``, to be written in the transaction
        that makes the work (``taken`` once it committed). None on SQLite: one replica, held
        in memory only (the module's text says why no row is needed)."""
        if not self.shared:
            return None
        return LeaseTerms(self.replica_id, self._scope_of(runner_id), self.ttl_s)

    def taken(self, kind: str, subject_id: str) -> None:
        """A lease made by ``terms`` committed (a row on PostgreSQL, none on SQLite): renew
        it from now on."""
        self._held.add((kind, subject_id))
        if not self.shared:
            self._rowless.add((kind, subject_id))

    def letting_go(self, kind: str, subject_id: str) -> str | None:
        """Stop renewing a lease the caller deletes in its own transaction (the one that makes
        the work final); the holder id to delete it by, None when it has no row (``terms``).
        Dropped before that transaction, so a renewal meanwhile never reports it lost
        (``renew``)."""
        self._held.discard((kind, subject_id))
        if (kind, subject_id) in self._rowless:
            self._rowless.discard((kind, subject_id))
            return None
        return self.replica_id

    async def release(self, kind: str, subject_id: str) -> None:
        """The work ended (its record is final): nobody needs to watch it any more."""
        self._held.discard((kind, subject_id))
        self._rowless.discard((kind, subject_id))
        await self.store.release_lease(kind, subject_id, self.replica_id)

    def held(self, kind: str | None = None) -> int:
        return sum(1 for k, _s in self._held if kind is None or k == kind)

    def subjects(self, kind: str) -> list[str]:
        return [s for k, s in self._held if k == kind]

    # ------------------------------------------------------------------ the loop

    async def startup(self) -> None:
        """Take back this home's leases (at once: its previous process is gone), then what
        other replicas left; start the renewal loop (PostgreSQL)."""
        await self.claim_round(startup=True)
        if self.shared and self._loop is None:
            self._loop = asyncio.create_task(self._run(), name="lease-keeper")

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.ttl_s / 3)
            try:
                await self.renew()
                await self.claim_round(startup=False)
                self._rounds += 1
                if self._rounds % SWEEP_EVERY == 0:
                    for sweep in self.sweeps:
                        await sweep()
            except asyncio.CancelledError:
                raise
            except Exception:
                # The database may be away for a moment; the next round tries again (a lease
                # not renewed in time is taken over, and on_lost stops its watcher then).
                log.exception("lease round failed", extra={"action": "lease_round"})

    async def renew(self) -> None:
        # Only what was held before the renewal can have been lost by it: a lease acquired
        # while the renewal's transaction ran is not in its answer, and dropping it would stop
        # its work while its row stays ours, renewed by every later round and never taken over
        # (a delivery left pending with no attempt; found by the replicas' kill -9 storm).
        before = set(self._held)
        still = await self.store.renew_leases(self.replica_id, self.ttl_s)
        for kind, subject_id in before - still:
            if (kind, subject_id) not in self._held:
                continue  # released meanwhile
            self._held.discard((kind, subject_id))
            log.warning(
                "lease of %s %s was taken over by another replica",
                kind,
                subject_id,
                extra={"action": "lease_lost", f"{kind}_id": subject_id},
            )
            lost = self.on_lost.get(kind)
            if lost is not None:
                lost(subject_id)

    async def claim_round(self, *, startup: bool) -> None:
        """Claim expired leases, unleased running executions and stalled queues; hand each
        claim to its adopter."""
        claimed: list[tuple[str, str, float]] = []
        mode = "expired" if not startup else "start" if self.shared else "all"
        while True:
            rows = await self.store.claim_leases(
                self.replica_id, self.scope, self.ttl_s, CLAIM_BATCH, mode=mode
            )
            for row in rows:
                self._held.add((row.kind, row.subject_id))
                claimed.append((row.kind, row.subject_id, row.expires_at))
            if len(rows) < CLAIM_BATCH:
                break
        # Unleased work: on SQLite everything at start-up (one replica: as before leases);
        # on PostgreSQL only what has been unleased for a whole lease time.
        grace = 0.0 if (startup and not self.shared) else self.ttl_s
        for execution_id in await self.store.claim_orphans(
            self.replica_id, self.scope if startup else None, self.ttl_s, grace,
            self.local_runner_id, gated=startup,
        ):  # fmt: skip
            self._held.add((EXECUTION, execution_id))
            claimed.append((EXECUTION, execution_id, 0.0))
        for kind, subject_id, _expired in claimed:
            self.takeovers += 1
            log.info(
                "took over %s %s",
                kind,
                subject_id,
                extra={"action": "lease_takeover", f"{kind}_id": subject_id},
            )
            adopter = self.adopters.get(kind)
            if adopter is None:
                await self.release(kind, subject_id)
                continue
            try:
                await adopter(subject_id)
            except Exception:
                # Let go: the next round (here or on another replica) tries again.
                log.exception("re-attaching %s %s failed", kind, subject_id)
                await self.release(kind, subject_id)
        if self.dispatch is not None and (self.shared or startup):
            local = None if startup else self.local_runner_id
            grace = 0.0 if (startup and not self.shared) else self.ttl_s
            for workspace_id in await self.store.stalled_workspaces(grace, local):
                await self.dispatch(workspace_id)

    async def aclose(self) -> None:
        """Stop renewing and hand every lease over: another replica takes them at once."""
        if self._loop is not None:
            self._loop.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._loop
            self._loop = None
        if self._held:
            with contextlib.suppress(Exception):
                await self.store.hand_over_leases(self.replica_id)
        self._held.clear()
        self._rowless.clear()
