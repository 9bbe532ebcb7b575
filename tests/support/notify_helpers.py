"""Helpers of the sessions/inbox/wakes/timers tests: a real in-process control plane with short
delays, a wake recorder (the Python callback channel), and polling without wall-clock asserts."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from shellyard.config import NotificationSettings, Settings
from shellyard.contract.executions import RunShellRequest, RunShellResult
from shellyard.contract.sessions import NoticeView, SessionView, WakeView
from shellyard.control.plane import ControlPlane

T = TypeVar("T")

FAST = NotificationSettings(webhook_retry_base_s=0.05, webhook_retry_max_s=0.2)


@asynccontextmanager
async def running_plane(
    home: Path, notifications: NotificationSettings = FAST, **settings: Any
) -> AsyncIterator[ControlPlane]:
    async with ControlPlane.running(
        Settings(home=home, notifications=notifications, **settings)
    ) as plane:
        yield plane


async def until(check: Callable[[], Awaitable[T]], timeout_s: float = 30.0, what: str = "") -> T:
    """Poll ``check`` until it returns something truthy (a generous deadline, never asserted
    as a duration)."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = await check()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out waiting for {what or check}"
        await asyncio.sleep(0.02)


async def settle() -> None:
    """Let callback tasks already scheduled run (wakes are recorded before they are called)."""
    for _ in range(5):
        await asyncio.sleep(0.02)


@dataclass
class Host:
    """A session as an in-process host sees it: its wakes arrive through a Python callback."""

    plane: ControlPlane
    session: SessionView
    wakes: list[WakeView] = field(default_factory=list)

    @classmethod
    async def open(cls, plane: ControlPlane) -> Host:
        host = cls(plane, await plane.sessions.create())
        await plane.wakes.add_callback(host.wakes.append, host.session.session_id)
        return host

    @property
    def main(self) -> str:
        return self.session.main_agent_id

    async def run(self, command: str, agent: str | None = None, **options: Any) -> RunShellResult:
        request = RunShellRequest(command=command, **options)
        return await self.plane.executions.run_shell(request, agent or self.main)

    async def notice(self, subject_id: str, agent: str | None = None) -> NoticeView | None:
        for notice in await self.plane.inbox.notices(agent or self.main):
            if notice.subject_id == subject_id:
                return notice
        return None

    async def wait_notice(self, subject_id: str, agent: str | None = None) -> NoticeView:
        return await until(lambda: self.notice(subject_id, agent), what=f"notice {subject_id}")

    def woken_for(self, subject_id: str) -> list[WakeView]:
        return [w for w in self.wakes if any(n.subject_id == subject_id for n in w.notices)]
