"""``/mcp`` on the server, built on its first request.

The mcp SDK, the in-process client and the tool server cost about 0.5 s of start-up and
25 MiB of resident memory (measured: importing ``mcp/http.py`` takes a fresh interpreter to
118 MiB, the REST server alone to 96 MiB). Every CLI verb may start a server on demand, and
most never serve MCP over HTTP, so the endpoint is made when a request first reaches it.
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


class LazyMcp:
    def __init__(self, app: FastAPI, path: str = MCP_PATH) -> None:
        self._app = app
        self.path = path
        self._endpoint: McpHttp | None = None
        self._lock = asyncio.Lock()
        self._stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

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


def mount_mcp(app: FastAPI, path: str = MCP_PATH) -> LazyMcp:
    endpoint = LazyMcp(app, path)
    app.router.routes.append(Route(path, endpoint=endpoint, methods=["GET", "POST", "DELETE"]))
    return endpoint


__all__ = ["MCP_PATH", "LazyMcp", "mount_mcp"]
