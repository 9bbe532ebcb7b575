"""A command on a pseudo-terminal of its own, as a person at a terminal runs it: what the CLI
tests drive ``run``'s Ctrl-C and ``attach`` with."""

from __future__ import annotations

import fcntl
import os
import pty
import select
import struct
import subprocess
import termios
import time


class Terminal:
    """A command on a pseudo-terminal of its own (its controlling terminal), as a person's."""

    def __init__(self, argv: list[str], env: dict[str, str]) -> None:
        self.master, slave = pty.openpty()

        def controlling() -> None:
            os.setsid()
            fcntl.ioctl(0, termios.TIOCSCTTY, 0)

        self.process = subprocess.Popen(
            argv, stdin=slave, stdout=slave, stderr=slave, env=env, preexec_fn=controlling
        )
        os.close(slave)
        self.seen = b""

    def _read(self, wait_s: float) -> bool:
        """Add what the terminal shows within ``wait_s``; False once it is closed (EOF, EIO)."""
        if not select.select([self.master], [], [], wait_s)[0]:
            return True
        try:
            chunk = os.read(self.master, 4096)
        except OSError:
            return False
        self.seen += chunk
        return bool(chunk)

    def read_until(self, needle: bytes, timeout_s: float = 120) -> bytes:
        deadline = time.monotonic() + timeout_s
        while needle not in self.seen:
            left = deadline - time.monotonic()
            assert left > 0, f"{needle!r} not seen in {self.seen!r}"
            assert self._read(min(left, 1.0)), f"closed before {needle!r}: {self.seen!r}"
        return self.seen

    def ctrl_c(self) -> None:
        os.write(self.master, b"\x03")

    def wait(self, timeout_s: float = 120) -> int:
        deadline = time.monotonic() + timeout_s
        while self.process.poll() is None:
            assert time.monotonic() < deadline, self.seen
            self._read(0.2)
        # What it wrote last is still in the terminal's buffer: read it to the end.
        while select.select([self.master], [], [], 0.5)[0] and self._read(0):
            pass
        os.close(self.master)
        return self.process.returncode

    def type(self, data: bytes) -> None:
        os.write(self.master, data)

    def resize(self, rows: int, cols: int) -> None:
        """Set the terminal's size; the kernel sends the foreground process SIGWINCH."""
        fcntl.ioctl(self.master, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))
