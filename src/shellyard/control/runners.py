"""Runner registry: runner id → a Runner protocol object. The control plane asks only this."""

from __future__ import annotations

from shellyard.errors import InvalidInput, NotFound
from shellyard.runner.protocol import Runner
from shellyard.store import Store

LOCAL_RUNNER_ID = "local"


class RunnerRegistry:
    def __init__(self, store: Store) -> None:
        self._store = store
        self._runners: dict[str, Runner] = {}

    async def add_local(self, runner: Runner) -> None:
        await self._store.upsert_runner(LOCAL_RUNNER_ID, "local", None, None)
        self._runners[LOCAL_RUNNER_ID] = runner

    async def add_direct(self, runner_id: str, address: str, token: str) -> Runner:
        """A runner daemon reached over HTTP with a token (R1)."""
        from shellyard.runner.remote import RemoteRunner

        if not runner_id or runner_id == LOCAL_RUNNER_ID:
            raise InvalidInput(f"runner id {runner_id!r} is reserved or empty; pick another")
        await self._store.upsert_runner(runner_id, "direct", address, token)
        old = self._runners.pop(runner_id, None)
        if old is not None:
            await old.aclose()
        runner = RemoteRunner(address, token)
        self._runners[runner_id] = runner
        return runner

    async def load_registered(self) -> None:
        """Reconnect to every direct runner recorded in the store."""
        from shellyard.runner.remote import RemoteRunner

        for row in await self._store.list_runners():
            if row["kind"] == "direct" and row["id"] not in self._runners:
                self._runners[row["id"]] = RemoteRunner(str(row["address"]), str(row["token"]))

    def get(self, runner_id: str) -> Runner:
        runner = self._runners.get(runner_id)
        if runner is None:
            known = ", ".join(sorted(self._runners)) or "none"
            raise NotFound(f"unknown runner {runner_id!r}; registered runners: {known}")
        return runner

    def ids(self) -> list[str]:
        return sorted(self._runners)

    async def aclose(self) -> None:
        for runner in self._runners.values():
            await runner.aclose()
        self._runners.clear()
