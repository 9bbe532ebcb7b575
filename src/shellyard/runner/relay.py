"""A byte relay the runner starts detached, one per forwarded port or egress namespace
(runner/ports.py). Run by path with the standard library only (``python3 -I relay.py``), so it
starts in tens of milliseconds and outlives a restart of the runner process (E11).

It accepts on an inherited listening socket (``--listen-fd``), made by the runner in the
network it should listen in, and for each connection connects to ``--tcp-port`` on
127.0.0.1 of the network it runs in (started under ``nsenter --net``) or to the Unix socket
``--unix``. Bytes are copied both ways by two threads per connection; at most
``MAX_CONNECTIONS`` at once, so its memory stays bounded (a further client waits in the
listen backlog).
"""

from __future__ import annotations

import argparse
import contextlib
import socket
import threading

MAX_CONNECTIONS = 64
CHUNK = 64 << 10
CONNECT_TIMEOUT_S = 10.0


def _pipe(source: socket.socket, sink: socket.socket) -> None:
    try:
        while data := source.recv(CHUNK):
            sink.sendall(data)
    except OSError:
        pass
    finally:
        with contextlib.suppress(OSError):
            sink.shutdown(socket.SHUT_WR)


def _connect(args: argparse.Namespace) -> socket.socket:
    if args.unix is not None:
        upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        upstream.settimeout(CONNECT_TIMEOUT_S)
        upstream.connect(args.unix)
    else:
        upstream = socket.create_connection(("127.0.0.1", args.tcp_port), CONNECT_TIMEOUT_S)
    upstream.settimeout(None)
    return upstream


def _serve(client: socket.socket, args: argparse.Namespace, slots: threading.Semaphore) -> None:
    try:
        try:
            upstream = _connect(args)
        except OSError:
            return  # nothing listens there (yet): the client sees its connection closed
        with upstream:
            back = threading.Thread(target=_pipe, args=(upstream, client), daemon=True)
            back.start()
            _pipe(client, upstream)
            back.join()
    finally:
        client.close()
        slots.release()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--listen-fd", type=int, required=True)
    target = parser.add_mutually_exclusive_group(required=True)
    target.add_argument("--tcp-port", type=int)
    target.add_argument("--unix")
    args = parser.parse_args()
    listener = socket.socket(fileno=args.listen_fd)
    slots = threading.Semaphore(MAX_CONNECTIONS)
    while True:
        slots.acquire()
        client, _ = listener.accept()
        threading.Thread(target=_serve, args=(client, args, slots), daemon=True).start()


if __name__ == "__main__":
    main()
