"""Async tests run again on each event loop the product runs on: pytest runs them on
asyncio's, ``shellyard mcp`` (and the servers) on uvloop's (shellyard/loops.py)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine, Iterable
from typing import Any


def run_each_on(loop: str, tests: Iterable[Callable[[], Coroutine[Any, Any, Any]]]) -> None:
    """Each of ``tests`` to its end on a loop of its own of the kind ``loop`` names
    (``uvloop`` or ``asyncio``), checked to be that kind."""
    import uvloop

    factory = uvloop.new_event_loop if loop == "uvloop" else asyncio.new_event_loop
    for test in tests:
        with asyncio.Runner(loop_factory=factory) as runner:
            runner.run(test())
            assert type(runner.get_loop()).__module__.startswith(loop)
