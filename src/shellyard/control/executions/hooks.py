"""What the execution service needs of other services, as protocols: the control plane gives
it the environment service and the lease keeper when it builds it, so
control/executions/service.py imports neither."""

from __future__ import annotations

from typing import Protocol

from shellyard.store.executions import Execution
from shellyard.store.leases import LeaseHolder, LeaseTerms


class EnvironmentGate(Protocol):
    """What executions need of managed environments (V4–V6); the control plane gives the
    environment service to ``ExecutionService`` when it builds it, so this module never imports
    it."""

    async def check_usable(self, environment_id: str, agent_id: str, runner_id: str | None) -> str:
        """The runner the environment lives on, after checking the agent may use it (V4)."""
        ...

    async def gate(self, execution_id: str, environment_id: str) -> tuple[str, Execution]:
        """V5/V6: ``go``, ``wait`` or ``failed`` for a queued execution, and its fresh record."""
        ...


class WatchLeases(LeaseHolder, Protocol):
    """Who watches a piece of ongoing work (an execution, a transfer, an environment change)
    when several replicas share the database (docs/operations.md); the control plane gives its
    lease keeper to ``ExecutionService``, ``TransferService`` and ``EnvironmentService`` when it
    builds them, and each registers the work it takes over (``register``)."""

    #: Whether other replicas may share the database (PostgreSQL; SQLite is one replica).
    shared: bool
    #: This replica's id: the holder its lease rows name (a transfer's batches are fenced by it).
    replica_id: str

    # Leases written in the work's own transactions (one transaction fewer each way):
    def terms(self, runner_id: str) -> LeaseTerms | None: ...

    def taken(self, kind: str, subject_id: str) -> None: ...

    def letting_go(self, kind: str, subject_id: str) -> str | None: ...


LEASE_KIND = "execution"  # the lease kind of an execution's watch
