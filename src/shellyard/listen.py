"""Listening sockets for the HTTP servers (control plane and runner daemon)."""

from __future__ import annotations

import socket


def bind_socket(host: str, port: int) -> socket.socket:
    """Bind and listen first, so port 0 gives a known free port before the server starts."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # proto must say TCP: asyncio sets TCP_NODELAY only on sockets whose proto is
    # IPPROTO_TCP, and without it Nagle plus delayed ACKs add ~40 ms to every answer.
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
        sock.listen(2048)
    except OSError:
        sock.close()
        raise
    sock.set_inheritable(True)
    return sock


def socket_url(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"
