"""HTTP over a raw socket, for the tests that attack the server's framing and time bounds
(imported from tests/support, on sys.path)."""

from __future__ import annotations

import re
import socket
from urllib.parse import urlsplit

from served_server import Served


def connect(served: Served) -> socket.socket:
    """A plain TCP connection to ``served``."""
    where = urlsplit(served.url)
    assert where.hostname is not None and where.port is not None
    return socket.create_connection((where.hostname, where.port), timeout=30)


def received(sock: socket.socket, wait_s: float = 5.0) -> tuple[bytes, bool]:
    """What the server sent within ``wait_s`` and whether it closed the connection."""
    sock.settimeout(wait_s)
    answer = b""
    try:
        while chunk := sock.recv(65536):
            answer += chunk
    except TimeoutError:
        return answer, False
    except (ConnectionResetError, BrokenPipeError):
        pass
    return answer, True


def answers(data: bytes) -> list[bytes]:
    """The status lines in ``data`` (an answer's body has no CRLF before the next one)."""
    return re.findall(rb"HTTP/1\.[01] \d{3} [^\r]*", data)
