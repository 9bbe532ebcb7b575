"""``shellyard serve``: the control plane for one home, with its REST API, in this process."""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets

import uvicorn

from shellyard.config import Settings
from shellyard.control.service import ControlPlane
from shellyard.interfaces.api import create_app
from shellyard.interfaces.home import INFO_NAME, ServerInfo, lock_home, write_info
from shellyard.listen import bind_socket, socket_url


def serve(settings: Settings, host: str = "127.0.0.1", port: int = 0) -> None:
    """Run the control plane in this process until SIGINT/SIGTERM."""
    settings.home.mkdir(parents=True, exist_ok=True)
    lock_fd = lock_home(settings.home)
    sock = bind_socket(host, port)
    token = secrets.token_urlsafe(32)
    plane = ControlPlane(settings)
    info = ServerInfo(pid=os.getpid(), url=socket_url(sock), token=token)

    async def on_start() -> None:
        await plane.start()
        write_info(settings.home, info)  # published only once requests can be served

    async def on_stop() -> None:
        with contextlib.suppress(FileNotFoundError):
            (settings.home / INFO_NAME).unlink()
        await plane.aclose()

    app = create_app(plane, token, lifespan_hooks=(on_start, on_stop))
    # Open wake streams (server-sent events) never end on their own: give them a few seconds.
    config = uvicorn.Config(
        app, log_level="warning", lifespan="on", access_log=False, timeout_graceful_shutdown=3
    )
    server = uvicorn.Server(config)
    try:
        asyncio.run(server.serve(sockets=[sock]))
    finally:
        os.close(lock_fd)
