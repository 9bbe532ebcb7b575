"""What the ``shell_call`` adapter needs from shellyard, as a Protocol, and its implementation
over the async REST client. An in-process backend (the ControlPlane itself) can be plugged in
later by implementing the same six operations."""

from __future__ import annotations

from typing import Any, Protocol

from shellyard.contract.executions import ExecutionView, LogsResult, RunShellResult
from shellyard.contract.files import WorkspaceView
from shellyard.sdk.client import AsyncClient

#: The REST wait endpoint's longest single wait.
MAX_WAIT_S = 30.0


class ShellBackend(Protocol):
    async def run(self, command: str | None = None, **options: Any) -> RunShellResult: ...

    async def wait(self, execution_id: str, timeout_s: float = 10.0) -> ExecutionView: ...

    async def logs(
        self,
        execution_id: str,
        stream: str = "stdout",
        offset: int = 0,
        limit: int = 65536,
        tail: int | None = None,
    ) -> LogsResult: ...

    async def cancel(self, execution_id: str, wait_s: float = 0.0) -> ExecutionView: ...

    async def runner_ids(self) -> list[str]: ...

    async def workspaces(self) -> list[WorkspaceView]: ...


class ClientBackend:
    """``ShellBackend`` over ``AsyncClient`` (the agent is the client's ``agent_id``)."""

    def __init__(self, client: AsyncClient) -> None:
        self.client = client

    async def run(self, command: str | None = None, **options: Any) -> RunShellResult:
        return await self.client.run(command, **options)

    async def wait(self, execution_id: str, timeout_s: float = 10.0) -> ExecutionView:
        return await self.client.wait(execution_id, min(timeout_s, MAX_WAIT_S))

    async def logs(
        self,
        execution_id: str,
        stream: str = "stdout",
        offset: int = 0,
        limit: int = 65536,
        tail: int | None = None,
    ) -> LogsResult:
        return await self.client.logs(execution_id, stream, offset, limit, tail)

    async def cancel(self, execution_id: str, wait_s: float = 0.0) -> ExecutionView:
        return await self.client.cancel(execution_id, wait_s)

    async def runner_ids(self) -> list[str]:
        return [runner.runner_id for runner in await self.client.runners()]

    async def workspaces(self) -> list[WorkspaceView]:
        return await self.client.workspaces()


def as_backend(backend: ShellBackend | AsyncClient) -> ShellBackend:
    return ClientBackend(backend) if isinstance(backend, AsyncClient) else backend
