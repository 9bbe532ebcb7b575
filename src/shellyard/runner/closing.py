"""Closing a runner (``LocalRunner.aclose``): every step is taken even when one before it
failed. Each step ends threads, mounts or files of its own, so one raising must not leave the
rest open for the life of the process; the first failure is raised once all were tried."""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import Callable, Iterable
from pathlib import Path

from shellyard.runner.network.egress_proxy import EgressProxy

log = logging.getLogger(__name__)

#: One step of a close: it returns None, or what is awaited to finish it.
Step = Callable[[], object]


def egress(proxy: EgressProxy | None, unmount: Callable[[Path], None], socket: Path) -> Step:
    """The step that stops the egress proxy, then unmounts its socket's folder (none to take
    where the policy has no proxy)."""

    async def close() -> None:
        if proxy is not None:
            await proxy.close()
            await asyncio.to_thread(unmount, socket)

    return close


async def take_every(steps: Iterable[Step]) -> None:
    """Take each step in order, a failure logged and the rest taken; then raise the first."""
    first: Exception | None = None
    for step in steps:
        try:
            done = step()
            if inspect.isawaitable(done):
                await done
        except Exception as exc:
            log.exception("closing the runner: a step failed, the rest go on")
            first = first or exc
    if first is not None:
        raise first


__all__ = ["Step", "egress", "take_every"]
