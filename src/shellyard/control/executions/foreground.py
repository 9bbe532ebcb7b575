"""Foreground waits another replica can see (N3 across replicas; docs/architecture.md).

A caller waiting for an execution that another replica watches records the wait
(``foreground_waits``: execution, waiter, expiry), renews it every third of its lifetime
while it waits, and removes it before its final read of the record. The finalizer deletes
the execution's rows in its finishing transaction and posts the notice read when one is live
(store/executions.py); its DELETE holds the rows until it commits, so a waiter removing its
row meanwhile returns only after that commit and then reads the terminal record. A waiter
killed -9 stops renewing: its row counts for at most ``ttl_s``."""

from __future__ import annotations

import asyncio
import time

from shellyard.store import Store
from shellyard.store.db import new_id


class ForegroundWaits:
    def __init__(self, store: Store, ttl_s: float) -> None:
        self.store = store
        #: How long a recorded wait counts without renewal: the lease time (a killed waiter
        #: counts as long as a killed watcher's lease).
        self.ttl_s = ttl_s

    async def begin(self, execution_id: str) -> str:
        """Record a wait; returns the waiter's id."""
        waiter = new_id("fgw")
        await self.store.add_foreground_wait(execution_id, waiter, time.time() + self.ttl_s)
        return waiter

    async def wait(
        self, event: asyncio.Event, execution_id: str, waiter: str | None, timeout_s: float
    ) -> None:
        """Wait for the end's signal up to ``timeout_s``; a recorded wait (``waiter``) is
        renewed every third of its lifetime meanwhile."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + max(0.0, timeout_s)
        while True:
            remaining = deadline - loop.time()
            step = remaining if waiter is None else min(remaining, self.ttl_s / 3)
            try:
                await asyncio.wait_for(event.wait(), timeout=max(0.0, step))
                return
            except TimeoutError:
                if waiter is None or step >= remaining:
                    return
            assert waiter is not None
            expires_at = time.time() + self.ttl_s
            if not await self.store.renew_foreground_wait(execution_id, waiter, expires_at):
                return  # its finalizer took the row: it ended (even if its signal was lost)

    async def end(self, execution_id: str, waiter: str) -> None:
        """Before the caller's final read of the record: a finalizer that saw the row (and
        posted the notice read) holds it locked until it commits, so this returns after that
        commit and the read shows the end. Shielded: a caller that went away still removes
        its row."""
        await asyncio.shield(self.store.drop_foreground_wait(execution_id, waiter))
