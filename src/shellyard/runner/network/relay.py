"""A byte relay the runner starts detached, one per forwarded port or egress namespace
(runner/network/ports.py). Run by path with the standard library only (``python3 -I relay.py``),
so it starts in tens of milliseconds and outlives a restart of the runner process (E11).

It accepts on an inherited listening socket (``--listen-fd``), made by the runner in the
network it should listen in, and for each connection connects to ``--tcp-port`` on
127.0.0.1 of the network it runs in (started under ``nsenter --net``) or to the Unix socket
``--unix``. Bytes are copied both ways by two threads per connection; at most
``MAX_CONNECTIONS`` at once, so its memory stays bounded (a further client waits in the
listen backlog).

``--run-as UID:GID`` drops to that user once its sockets are set up (a runner running as root
starts it): the network a new connection is made in is fixed when it entered it, so copying
bytes needs no privilege, and a relay that a client could subvert holds none.

``--hold`` makes it the holder of a workspace network on a runner that is not root
(holder.py): started by ``unshare --user --net --keep-caps``, it brings the new
namespace's loopback up, optionally listens on ``--listen-port`` there (the egress relay),
prints ``ready`` and stays, so sandboxes can join the namespace through its /proc entry.
"""

from __future__ import annotations

import argparse
import contextlib
import encodings.idna  # noqa: F401  getaddrinfo needs it, and after --run-as it cannot load
import fcntl
import os
import signal
import socket
import struct
import sys
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
        upstream.connect(args.unix_path)
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


def _loopback_up() -> None:
    """``lo`` starts down in a new namespace (SIOCGIFFLAGS / SIOCSIFFLAGS, IFF_UP)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        request = struct.pack("16sH14x", b"lo", 0)
        flags = struct.unpack("16sH", fcntl.ioctl(sock, 0x8913, request)[:18])[1]
        if flags & 0x1:
            return  # up already: a holder that replaces a killed one (it kept no capability)
        fcntl.ioctl(sock, 0x8914, struct.pack("16sH14x", b"lo", flags | 0x1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--hold", action="store_true")
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--listen-fd", type=int)
    where.add_argument("--listen-port", type=int)
    target = parser.add_mutually_exclusive_group()
    target.add_argument("--tcp-port", type=int)
    target.add_argument("--unix")
    parser.add_argument("--run-as", help="UID:GID to switch to before accepting")
    parser.add_argument(
        "--close-fd", type=int, action="append", default=[], help="inherited, not to keep"
    )
    args = parser.parse_args()
    for fd in args.close_fd:  # the namespace descriptors it was started into (ports.py)
        os.close(fd)
    if args.hold:
        _loopback_up()
    if args.listen_fd is not None:
        listener = socket.socket(fileno=args.listen_fd)
    elif args.listen_port is not None:
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", args.listen_port))
        listener.listen(128)
    else:
        listener = None
    if args.hold:
        print("ready", flush=True)
        sys.stdout.close()
    if listener is None:
        while True:
            signal.pause()
    if args.tcp_port is None and args.unix is None:
        parser.error("a listener needs --tcp-port or --unix")
    args.unix_path = args.unix
    if args.run_as is not None:
        if args.unix is not None:
            # The socket's folder, opened now: after the drop its path from / may not be
            # traversable (the runner's home), but a path through this descriptor checks only
            # the folder itself and the socket (both open to every user).
            folder, _, name = args.unix.rpartition("/")
            held = os.open(folder or "/", os.O_PATH | os.O_DIRECTORY)
            args.unix_path = f"/proc/self/fd/{held}/{name}"
        uid, gid = (int(part) for part in args.run_as.split(":"))
        os.setgroups([])
        os.setgid(gid)
        os.setuid(uid)
    slots = threading.Semaphore(MAX_CONNECTIONS)
    while True:
        slots.acquire()
        client, _ = listener.accept()
        threading.Thread(target=_serve, args=(client, args, slots), daemon=True).start()


if __name__ == "__main__":
    main()
