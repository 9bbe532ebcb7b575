"""The holder of one interactive execution's input (E13): a small detached process, run by
path (``python3 -I -S terminal_holder.py``, the standard library only, so it starts fast and
outlives the runner that started it: the control plane can be killed and restarted and the
program keeps its terminal and its stdin).

    terminal_holder.py DIRECTORY tty|pipe PID FD FIFO_FD   (FD: the pty master or stdin's
                                                       write end; FIFO_FD: ``input``)

It reads frames from the FIFO ``DIRECTORY/input`` (written by ``terminal.py``, whole frames
in each ``write`` of at most PIPE_BUF bytes, so writers never interleave):

    b"D" + length (4 bytes, big-endian) + data     bytes for the program's input
    b"E" + b"\\0\\0\\0\\0"                              end of input (the pipe is closed)
    b"W" + b"\\0\\0\\0\\4" + rows (2) + cols (2)       the terminal's new size

In ``tty`` mode it also copies the terminal's output into ``DIRECTORY/stdout`` (the log the
runner reads and the screen replays). Input waits in a bounded buffer while the program does
not read it, and the FIFO is not read meanwhile: a program that neither reads nor stops
writing never blocks its output. It ends once process ``PID`` (bwrap) has ended and the
terminal is drained.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import select
import struct
import sys
import termios

HEADER = 5
#: Input read from the FIFO but not yet taken by the program, at most (then the FIFO waits).
PENDING_CAP = 1 << 16
#: After the program ended: how long the last output may take to arrive (ms).
DRAIN_MS = 200


class Poller:
    """``select.poll`` that changes or forgets a descriptor's events without an error."""

    def __init__(self) -> None:
        self._poll = select.poll()
        self._fds: set[int] = set()

    def watch(self, fd: int, events: int) -> None:
        if not events:
            self.forget(fd)
        elif fd in self._fds:
            self._poll.modify(fd, events)
        else:
            self._poll.register(fd, events)
            self._fds.add(fd)

    def forget(self, fd: int) -> None:
        if fd in self._fds:
            self._poll.unregister(fd)
            self._fds.discard(fd)

    def poll(self, timeout: int | None) -> dict[int, int]:
        return dict(self._poll.poll(timeout))


def apply(frames: bytes, target: int, tty: bool) -> tuple[bytes, bytes, bool]:
    """The complete frames of ``frames``: (input bytes, the rest, end of input asked)."""
    data = b""
    closing = False
    while len(frames) >= HEADER:
        (length,) = struct.unpack(">I", frames[1:HEADER])
        if len(frames) < HEADER + length:
            break
        kind, body = frames[:1], frames[HEADER : HEADER + length]
        frames = frames[HEADER + length :]
        if kind == b"D":
            data += body
        elif kind == b"E":
            closing = True
        elif kind == b"W" and tty and len(body) == 4:
            rows, cols = struct.unpack(">HH", body)
            fcntl.ioctl(target, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))
    return data, frames, closing


def main(argv: list[str]) -> int:
    directory, tty, pid = argv[1], argv[2] == "tty", int(argv[3])
    target, fifo = int(argv[4]), int(argv[5])  # the FIFO opened read-write by the runner
    log = -1
    if tty:
        log = os.open(os.path.join(directory, "stdout"), os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC)
    os.set_blocking(target, False)
    os.set_blocking(fifo, False)
    try:
        process = os.pidfd_open(pid)
    except ProcessLookupError:
        if not tty:
            return 0
        process = -1  # a terminal ends with its last reader anyway (EIO below)
    frames = pending = b""
    closing = ended = False
    poller = Poller()
    if process >= 0:
        poller.watch(process, select.POLLIN)
    while True:
        if target >= 0:
            poller.watch(target, (select.POLLIN if tty else 0) | (select.POLLOUT if pending else 0))
        taking = len(pending) < PENDING_CAP and not closing
        poller.watch(fifo, select.POLLIN if taking else 0)
        ready = poller.poll(DRAIN_MS if ended else None)
        if not ready and ended:
            return 0
        if process in ready:
            poller.forget(process)
            os.close(process)
            process = -1
            ended = True
            if not tty:
                return 0
        if fifo in ready:
            with contextlib.suppress(BlockingIOError):
                frames += os.read(fifo, PENDING_CAP)
            data, frames, close = apply(frames, target, tty)
            pending += data
            closing = closing or close
        events = ready.get(target, 0) if target >= 0 else 0
        if pending and events & select.POLLOUT:
            try:
                pending = pending[os.write(target, pending) :]
            except BlockingIOError:
                pass
            except OSError:  # the program closed its end: what it did not read is dropped
                pending = b""
        if tty and events & (select.POLLIN | select.POLLHUP | select.POLLERR):
            try:
                output = os.read(target, 1 << 16)
            except BlockingIOError:
                output = b""
            except OSError as exc:  # EIO: every slave closed (the program ended)
                if exc.errno == errno.EIO:
                    return 0
                raise
            if output:
                os.write(log, output)
        if closing and not pending and target >= 0 and not tty:
            poller.forget(target)
            os.close(target)  # end of input: the program reads EOF
            target = -1
        if closing and tty:
            closing = False  # a terminal's end of input is C-d, sent as data


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv))
    except KeyboardInterrupt:
        sys.exit(1)
