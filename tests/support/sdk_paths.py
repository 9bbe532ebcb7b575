"""The SDK's three ways to send a JSON call, driven side by side against one loopback server,
for the tests of its bounds on an answer (test_sdk_lean.py, the attack pass of session 49)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from shellyard.sdk.client import AsyncClient, Client


def _as_made(client: Any) -> None:
    """A client left as made."""


async def on_every_path(
    url: str, request: Any, configure: Callable[[Any], None] = _as_made
) -> list[Any]:
    """The outcome (the answer or the exception raised) of ``request`` on each of the SDK's
    three ways to send a JSON call: the lean client, the async httpx path, the blocking
    ``Client`` (in a thread). ``configure`` sets each client up (e.g. ``max_json_bytes``)."""
    outcomes: list[Any] = []
    for use_lean in (True, False):
        async with AsyncClient(url, "tok") as client:
            if not use_lean:
                client._lean = None
            configure(client)
            try:
                outcomes.append(await client._send(request))
            except Exception as exc:
                outcomes.append(exc)

    def blocking() -> Any:
        with Client(url, "tok") as client:
            configure(client)
            try:
                return client._send(request)
            except Exception as exc:
                return exc

    outcomes.append(await asyncio.to_thread(blocking))
    return outcomes


def chunked(data: bytes) -> bytes:
    """``data`` as one chunk of a chunked body."""
    return b"%x\r\n%s\r\n" % (len(data), data)
