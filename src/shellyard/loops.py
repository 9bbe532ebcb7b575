"""The event loop of shellyard's long-running processes: ``shellyard serve``, ``shellyard mcp``
and ``shellyard runner serve`` run their main coroutine through :func:`run`, on uvloop when it
is importable, else on asyncio's own loop; ``SHELLYARD_LOOP`` chooses (docs/operations.md).

Why: the server's event-loop thread is its bottleneck under many agents (py-spy: under 1 %
idle); uvloop's loop, transports and timers in C give the same work about a tenth more
executions per second (docs/benchmarks.md, docs/decisions.md "uvloop"). Everything the
product does on the loop goes through asyncio's public API, which uvloop implements; the
choice is made here once, so the benches that measure the product in-process run on the
loop it ships with (:func:`run` there too).

Light (the standard library, ``settings_env`` and ``errors``): uvloop is imported only when it
is chosen, so ``SHELLYARD_LOOP=asyncio`` leaves it out of the process entirely.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from shellyard import settings_env
from shellyard.errors import InvalidInput

VARIABLE = "SHELLYARD_LOOP"

T = TypeVar("T")


def chosen(environ: dict[str, str] | None = None) -> str:
    """``"uvloop"`` or ``"asyncio"``: the loop ``SHELLYARD_LOOP`` asks for (``auto``, the
    default: uvloop when importable). A value it does not take, or ``uvloop`` where uvloop
    cannot be imported, is refused (InvalidInput) naming what it takes: at start, before a
    loop exists, not by falling back quietly to another loop."""
    raw = settings_env.get(VARIABLE, environ)
    variable = settings_env.VARIABLES[VARIABLE]
    if raw is None:
        wanted = "auto"
    elif variable.check is not None and variable.check(raw):
        wanted = raw.lower()
    else:
        raise InvalidInput(
            f"{VARIABLE}={raw!r} is not valid: use {variable.allowed} "
            "(docs/operations.md, Environment variables)"
        )
    if wanted == "asyncio":
        return "asyncio"
    try:
        import uvloop  # noqa: F401  (only whether it imports)
    except ImportError as exc:
        if wanted == "uvloop":
            raise InvalidInput(
                f"{VARIABLE}=uvloop but uvloop cannot be imported ({exc}): install it "
                f"(pip install uvloop) or set {VARIABLE}=auto or asyncio"
            ) from None
        return "asyncio"
    return "uvloop"


def factory(
    environ: dict[str, str] | None = None,
) -> Callable[[], asyncio.AbstractEventLoop] | None:
    """What makes the chosen loop (``asyncio.Runner``'s ``loop_factory``); None for asyncio's,
    so that the Runner does exactly what ``asyncio.run`` does (it also sets the loop as the
    thread's current one, which only its default factory does)."""
    if chosen(environ) == "uvloop":
        import uvloop

        return uvloop.new_event_loop
    return None


def run(main: Coroutine[Any, Any, T]) -> T:
    """``asyncio.run(main)`` on the chosen loop: the same Runner, so the same SIGINT handling
    (the main task cancelled), and async generators and the default executor shut down at
    the end. A bad ``SHELLYARD_LOOP`` raises before any loop exists."""
    try:
        make = factory()
    except BaseException:
        main.close()  # never awaited: no "coroutine was never awaited" warning on top
        raise
    with asyncio.Runner(loop_factory=make) as runner:
        return runner.run(main)


def name(loop: asyncio.AbstractEventLoop) -> str:
    """``"uvloop"`` or ``"asyncio"``: which loop ``loop`` is (for /metrics)."""
    return "uvloop" if type(loop).__module__.partition(".")[0] == "uvloop" else "asyncio"


__all__ = ["VARIABLE", "chosen", "factory", "name", "run"]
