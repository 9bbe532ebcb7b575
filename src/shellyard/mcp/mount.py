"""``/mcp`` on the server, built during the server's start-up, before it is published.

The mcp SDK, the in-process client and the tool server cost about 0.5 s of CPU and 29 MiB
of resident memory (a fresh ``shellyard serve``: 110 MiB without them, 139 MiB with). They
were made on the first request to reach /mcp, which put that cost on the clock of a
client's first message: the SDK's clients (``mode="auto"``, as the other SDKs') send
``server/discover`` first and give it 10 s, then fall back to the older ``initialize``
handshake, whose capabilities cannot carry ``extensions``: that session never has the tasks
extension. On 2 shared cores the build took 1.4-3.3 s at a load of 8, more under heavier
load; a server stopped for 11 s during its first connect gives the same downgrade. So
``start`` builds the endpoint in the app's start-up, before ``serve`` publishes the server
(``server.json``, the ready fd), and its route comes first (``mount_mcp``): no client's
message waits for either (docs/decisions.md). An app whose start-up did not run (tests
that call it in-process) builds it on its first request.

The session manager's lifespan runs in a task of its own from then until the server stops,
since the SDK's task group must be entered and left by the same task.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from fastapi import FastAPI
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

if TYPE_CHECKING:
    from shellyard.mcp.http import McpHttp

MCP_PATH = "/mcp"


class McpMount:
    def __init__(self, app: FastAPI, path: str = MCP_PATH) -> None:
        self._app = app
        self.path = path
        self._endpoint: McpHttp | None = None
        self._lock = asyncio.Lock()
        self._stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    @property
    def built(self) -> bool:
        return self._endpoint is not None

    async def start(self) -> None:
        """Build the endpoint and start its session manager (the app's start-up)."""
        await self._ensure()

    async def _ensure(self) -> McpHttp:
        async with self._lock:
            if self._endpoint is not None:
                return self._endpoint
            from shellyard.mcp.http import McpHttp

            endpoint = McpHttp(self._app, self.path)
            ready = asyncio.Event()

            async def serve() -> None:
                async with endpoint.lifespan():
                    ready.set()
                    await self._stop.wait()

            self._task = asyncio.create_task(serve(), name="mcp-http")
            waiting = asyncio.create_task(ready.wait())
            await asyncio.wait([waiting, self._task], return_when=asyncio.FIRST_COMPLETED)
            if not ready.is_set():
                waiting.cancel()
                await self._task  # raises what stopped the session manager
            self._endpoint = endpoint
            return endpoint

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        endpoint = await self._ensure()
        await endpoint(scope, receive, send)

    async def aclose(self) -> None:
        self._stop.set()
        if self._task is not None:
            await self._task


def mount_mcp(app: FastAPI, path: str = MCP_PATH) -> McpMount:
    endpoint = McpMount(app, path)
    # First, not last: FastAPI builds each included router's matching context on the first
    # request that gets as far as that router, so /mcp behind every REST router paid ~0.4 s
    # on its first request (py-spy), on the clock of that client's server/discover too.
    app.router.routes.insert(0, Route(path, endpoint=endpoint, methods=["GET", "POST", "DELETE"]))
    return endpoint


__all__ = ["MCP_PATH", "McpMount", "mount_mcp"]
