"""The reader processes of one environment change (``wheels.py``'s reader, run as the
workspace's uid): bounded in time by progress, and killed with the change.

A reader copies what the agent named, so the agent decides what it reads: a file whose reads
block (a FUSE mount of its own, a device, a stopped process's pipe swapped in) would hold the
change, its thread of the runner and the environment's lock for ever. The runner waits on a
reader's pipe only ``stall_s`` at a time: a reader that sends no byte for that long is killed
and the change fails naming the source (docs/environments.md "Local package files").
A slow reader that keeps sending is never stopped (the tree's size bounds it); time the
runner spends writing what it got is not counted. ``kill_all`` (the change abandoned or
failed) kills every reader still running and refuses new ones, as ``SandboxedTools.kill_all``
does for the tools.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import signal
import subprocess
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import IO

#: How long a reader may send nothing before it is killed (``SandboxPolicy``'s
#: ``source_stall_s``, ``SHELLYARD_SOURCE_STALL_S``): a local disk sends a package file's
#: next MiB in milliseconds, a loaded NFS mount in seconds.
DEFAULT_STALL_S = 60.0


#: The reader's pipe, as large as an unprivileged process may make one (``pipe-max-size``):
#: each read of the runner then takes up to this much at once, as ``read`` did before reads
#: became ``read1`` (which must return as soon as any byte is there, for the stall bound).
PIPE_BYTES = 1 << 20


class Stalled(Exception):
    """The reader sent nothing for ``stall_s`` and was killed."""


class Stopped(Exception):
    """The change was abandoned: no reader starts."""


@dataclass
class Readers:
    """How one change runs its readers: ``front`` drops to the workspace's uid
    (``launch.prefix``; empty on a non-root runner)."""

    front: Sequence[str] = ()
    stall_s: float = DEFAULT_STALL_S
    _live: set[subprocess.Popen[bytes]] = field(default_factory=set)
    _stopped: bool = False
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @contextlib.contextmanager
    def run(self, argv: list[str]) -> Iterator[Pipe]:
        """Start ``argv`` (in a process group of its own: the front and the reader die
        together) and give its watched stdout; killed and reaped when the block ends."""
        with self._lock:
            if self._stopped:
                raise Stopped("the change was stopped before the reader could start")
            popen = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                cwd="/",
                start_new_session=True,
            )
            self._live.add(popen)
        assert popen.stdout is not None
        with contextlib.suppress(OSError):  # a larger pipe: fewer, larger reads of 1 MiB
            fcntl.fcntl(popen.stdout.fileno(), fcntl.F_SETPIPE_SZ, PIPE_BYTES)
        pipe = Pipe(popen, popen.stdout, self.stall_s)
        watch = threading.Thread(target=pipe.watch, name="reader-watch", daemon=True)
        watch.start()
        try:
            yield pipe
        finally:
            pipe.done.set()
            watch.join()
            with self._lock:
                # a reader that ended is gone already; one we stopped reading must not linger
                _kill(popen)
                self._live.discard(popen)  # before it is reaped: its pid names it until then
            popen.stdout.close()
            pipe.stderr = _tail(popen.stderr)
            popen.wait()

    def kill_all(self) -> None:
        """Kill every running reader (their pipes end, so whatever waits on them returns)
        and start no other."""
        with self._lock:
            self._stopped = True
            for popen in self._live:
                _kill(popen)


class Pipe:
    """A reader's stdout; each wait for bytes is timed by ``watch``."""

    def __init__(self, popen: subprocess.Popen[bytes], raw: IO[bytes], stall_s: float) -> None:
        self._popen = popen
        self._raw = raw
        self._stall_s = stall_s
        self._waiting_since: float | None = None
        self.done = threading.Event()
        self.stalled = False
        #: the end of the reader's stderr, once it ended
        self.stderr = ""

    @property
    def pid(self) -> int:
        """The reader's process group (its front's pid)."""
        return self._popen.pid

    @contextlib.contextmanager
    def _waiting(self) -> Iterator[None]:
        self._waiting_since = time.monotonic()
        try:
            yield
        finally:
            self._waiting_since = None
        if self.stalled:
            raise Stalled(f"sent nothing for {self._stall_s:g} s")

    def readline(self) -> bytes:
        with self._waiting():
            return self._raw.readline()

    def read(self, size: int) -> bytes:
        """Up to ``size`` bytes, as soon as any arrive (b"" at the end)."""
        with self._waiting():
            read1 = getattr(self._raw, "read1", self._raw.read)
            data: bytes = read1(size)
            return data

    def watch(self) -> None:
        """Kill the reader once a wait for its bytes outlasts ``stall_s``."""
        tick = min(self._stall_s / 4, 1.0)
        while not self.done.wait(tick):
            since = self._waiting_since
            if since is not None and time.monotonic() - since > self._stall_s:
                self.stalled = True
                _kill(self._popen)
                return


def _kill(popen: subprocess.Popen[bytes]) -> None:
    """SIGKILL the reader's process group (the front and the reader; never reaped yet here,
    so its id names no other process)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(popen.pid, signal.SIGKILL)


def _tail(stream: IO[bytes] | None) -> str:
    if stream is None:
        return ""
    with stream:
        return stream.read().decode("utf-8", "replace")[-500:]


__all__ = ["DEFAULT_STALL_S", "Pipe", "Readers", "Stalled", "Stopped"]
