"""``shellyard serve``: the control plane for one home, with its REST API and MCP over
streamable HTTP (/mcp), in this process.

Loopback by default. Bearer tokens are on unless ``--no-auth`` is given, which is allowed only
on a loopback address: anyone who can reach a non-loopback port must present a token."""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import os

import uvicorn

from shellyard.api.app import create_app
from shellyard.config import Settings
from shellyard.control.service import ControlPlane
from shellyard.control.tokens import ADMIN_TOKEN_NAME
from shellyard.errors import InvalidInput
from shellyard.home import INFO_NAME, ServerInfo, lock_home, write_info
from shellyard.listen import bind_socket, socket_url

DEFAULT_HOST = "127.0.0.1"


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a host name: it may resolve to anything


def check_bind(host: str, auth: bool) -> None:
    """Refuse to serve without tokens on an address other machines can reach."""
    if not auth and not is_loopback(host):
        raise InvalidInput(
            f"--no-auth is allowed only on a loopback address (127.0.0.1, ::1), not {host!r}: "
            "without tokens anyone who reaches the port could run commands. Drop --no-auth "
            f"(clients then use the admin token in <home>/{ADMIN_TOKEN_NAME}, or tokens made "
            "with 'shellyard token create'), or bind to 127.0.0.1"
        )


def serve(
    settings: Settings, host: str = DEFAULT_HOST, port: int = 0, *, auth: bool = True
) -> None:
    """Run the control plane in this process until SIGINT/SIGTERM."""
    check_bind(host, auth)
    settings.home.mkdir(parents=True, exist_ok=True)
    lock_fd = lock_home(settings.home)
    sock = bind_socket(host, port)
    plane = ControlPlane(settings)

    async def on_start() -> None:
        await plane.start()
        # The admin token exists from the first start on, even with --no-auth, so that
        # restarting with tokens on needs no extra step.
        token = await plane.tokens.ensure_admin_file(settings.home)
        info = ServerInfo(
            pid=os.getpid(),
            url=socket_url(sock),
            token=token if auth else "",
            token_file=str(settings.home / ADMIN_TOKEN_NAME) if auth else None,
        )
        write_info(settings.home, info)  # published only once requests can be served

    async def on_stop() -> None:
        with contextlib.suppress(FileNotFoundError):
            (settings.home / INFO_NAME).unlink()
        await plane.aclose()

    app = create_app(plane, auth_required=auth, lifespan_hooks=(on_start, on_stop))
    # Open wake streams (server-sent events) never end on their own: give them a few seconds.
    config = uvicorn.Config(
        app, log_level="warning", lifespan="on", access_log=False, timeout_graceful_shutdown=3
    )
    server = uvicorn.Server(config)
    try:
        asyncio.run(server.serve(sockets=[sock]))
    finally:
        os.close(lock_fd)
