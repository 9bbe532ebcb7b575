"""A tiny HTTP listener on this host's 127.0.0.1, for tests of what a sandbox can (egress's
operator exceptions) or must not (a relay in the host's network) reach there: it answers
every connection with one fixed 200 body."""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Iterator


@contextlib.contextmanager
def host_listener(body: bytes, port: int = 0) -> Iterator[int]:
    """Serve ``body`` on 127.0.0.1:``port`` (0: any free port) until the block ends; yields
    the port."""
    server = socket.socket()
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind(("127.0.0.1", port))
    server.listen(8)
    server.settimeout(0.2)
    stop = threading.Event()
    answer = b"HTTP/1.0 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except OSError:
                continue
            with conn, contextlib.suppress(OSError):
                conn.settimeout(2)
                conn.recv(4096)
                conn.sendall(answer)

    thread = threading.Thread(target=serve)
    thread.start()
    try:
        yield server.getsockname()[1]
    finally:
        stop.set()
        thread.join()
        server.close()
