"""E13 on the runner: an interactive execution's input channel, its terminal's screen and
whether it waits for input.

At the spawn (``open_channel``) the execution's folder gets a FIFO ``input`` and, for
``tty``, a pseudo-terminal whose slave becomes the sandbox's stdin, stdout and stderr; without
``tty`` a pipe becomes its stdin. The other end goes to a detached holder process
(``terminal_holder.py``) that outlives this runner process: it reads the FIFO and feeds the
program, and copies the terminal's output into the ``stdout`` log. So the control plane (and
this runner, which lives in it) may be killed and restarted: the FIFO in the folder still
reaches the same holder, and the holder the same program. Inside the sandbox the command
runs under ``setsid --ctty``, so the terminal is its controlling terminal (C-c interrupts the
foreground program, as at a keyboard; bwrap's own ``--new-session`` keeps the host's terminal
out of reach, docs/security.md).

``screen`` replays the ``stdout`` log into a pyte terminal emulator kept per execution and fed
only the bytes added since the last look. A look feeds at most ``REPLAY_BYTES``: the first
after a restart, or one after more than that was printed since the last, rebuilds the screen
from the log's last ``REPLAY_BYTES``, as does a look once the screen was fed ``REBUILD_BYTES``
since it was built (pyte is pure Python, about a second a megabyte on this project's machines,
and keeps an unterminated OSC string whole: a program printing without end must not cost the
control plane a CPU or its memory; docs/security.md "Attack pass on the batch's new doors")."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import fcntl
import os
import shutil
import struct
import subprocess
import sys
import termios
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path

import pyte

from shellyard.contract.interactive import MAX_STDIN_LOG_BYTES, Cursor, ScreenView
from shellyard.errors import Conflict
from shellyard.runner import processes

HOLDER = Path(__file__).with_name("terminal_holder.py")
INPUT = "input"
#: The terminal's size now, "ROWS COLS" (resize rewrites it; the screen follows it).
SIZE = "tty_size"
#: The holder's pid (the end waits for it to copy the last output: ``drained``).
HOLDER_PID = "holder.pid"
#: Data bytes per FIFO frame: a frame is one write of at most PIPE_BUF bytes (atomic).
FRAME_DATA = 4096 - 5
#: The most bytes one write to a FIFO delivers whole (POSIX PIPE_BUF on Linux).
PIPE_BUF = 4096
#: How long a send waits for the holder to take input the program does not read yet.
SEND_WAIT_S = 5.0
#: The first look at a screen (after a restart) replays at most this much of the log's end.
REPLAY_BYTES = 1 << 20
#: A screen fed this much since it was built is rebuilt from the log's last REPLAY_BYTES.
REBUILD_BYTES = 8 * REPLAY_BYTES
#: A look at the screen this soon after input waits for the terminal's answer to it.
ECHO_WAIT_S = 0.05
#: Screens kept in memory (an LRU: a forgotten one is replayed again).
SCREENS = 64
#: What a blocked read of a terminal or pipe (or a poll/select on it) shows in wchan.
READ_WAITS = ("wait_woken", "n_tty_read", "pipe_read", "anon_pipe_read", "pipe_wait_readable")
POLL_WAITS = ("poll_schedule_timeout", "do_select", "do_sys_poll", "ep_poll", "core_sys_select")


@dataclass
class Channel:
    """The descriptors of one interactive spawn: the sandbox's three, the holder's one."""

    mode: str  # "tty" | "pipe"
    stdin: int
    holder_end: int
    fifo: int
    stdout: int | None = None  # the terminal (tty), else the log files stay
    own: list[int] = field(default_factory=list)

    def close(self) -> None:
        for fd in self.own:
            with contextlib.suppress(OSError):
                os.close(fd)
        self.own.clear()


def open_channel(directory: Path, tty: bool, rows: int, cols: int) -> Channel:
    """The FIFO, the empty ``stdin`` log and the terminal or pipe of a new execution."""
    os.mkfifo(directory / INPUT, 0o600)
    # Opened here and handed to the holder: the FIFO has a reader from the spawn on, so
    # input sent before the holder runs waits in it instead of being refused.
    fifo = os.open(directory / INPUT, os.O_RDWR | os.O_NONBLOCK | os.O_CLOEXEC)
    os.close(os.open(directory / "stdin", os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o600))
    if tty:
        master, slave = os.openpty()
        set_size(master, rows, cols)
        (directory / SIZE).write_text(f"{rows} {cols}")
        return Channel("tty", slave, master, fifo, slave, own=[master, slave, fifo])
    read_end, write_end = os.pipe()
    return Channel("pipe", read_end, write_end, fifo, own=[read_end, write_end, fifo])


def in_terminal(command: list[str]) -> list[str]:
    """``command`` as the session leader of the terminal inside the sandbox (util-linux
    ``setsid --ctty``: no fork, as the command is not a group leader under bwrap's init)."""
    return [shutil.which("setsid") or "/usr/bin/setsid", "--ctty", *command]


def start_holder(directory: Path, channel: Channel, pid: int) -> int:
    """The detached holder of ``channel`` for the sandbox ``pid``; its pid."""
    holder = subprocess.Popen(
        [sys.executable, "-I", "-S", str(HOLDER), str(directory), channel.mode, str(pid),
         str(channel.holder_end), str(channel.fifo)],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        pass_fds=(channel.holder_end, channel.fifo),
        cwd="/",
        start_new_session=True,
    )  # fmt: skip
    # with its start time: a pid reused after a restart is not taken for the holder
    (directory / HOLDER_PID).write_text(f"{holder.pid} {processes.start_time(holder.pid) or 0}")
    return holder.pid


def set_size(fd: int, rows: int, cols: int) -> None:
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))


def frames(data: bytes, eof: bool) -> list[bytes]:
    """``data`` (and the end of input) as FIFO writes of at most PIPE_BUF bytes each, each
    write whole frames: the end of input rides in the last data's write when it fits. Written
    apart, the holder could take the data, its program read it and exit, and the holder go
    (it ends with its program) before the end of input was written."""
    parts = [
        b"D" + struct.pack(">I", len(piece)) + piece
        for piece in (data[i : i + FRAME_DATA] for i in range(0, len(data), FRAME_DATA))
    ]
    if eof:
        end = b"E" + struct.pack(">I", 0)
        if parts and len(parts[-1]) + len(end) <= PIPE_BUF:
            parts[-1] += end
        else:
            parts.append(end)
    return parts


async def send(directory: Path, execution_id: str, data: bytes, eof: bool) -> int:
    """Write ``data`` (then the end of input) to the holder; the bytes it accepted."""
    if not (directory / INPUT).exists():
        raise Conflict(
            f"execution {execution_id} did not ask for input: only a command started with "
            "interactive: true (or tty: true) takes execution_input"
        )
    try:
        fd = os.open(directory / INPUT, os.O_WRONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno != errno.ENXIO:
            raise
        raise Conflict(
            f"execution {execution_id} has ended: its input is closed; its output stays in "
            "execution_logs"
        ) from None
    accepted = 0
    deadline = time.monotonic() + SEND_WAIT_S
    try:
        for frame in frames(data, eof):
            while True:
                try:
                    os.write(fd, frame)
                    break
                except BlockingIOError:
                    if time.monotonic() > deadline:
                        return _logged(directory, data[:accepted])
                    await asyncio.sleep(0.01)
                except BrokenPipeError:
                    if frame[:1] == b"E":
                        # all the data was taken; the program ended, so its input is closed
                        # already: what the end of input asks for is done
                        return _logged(directory, data[:accepted])
                    raise Conflict(f"execution {execution_id} ended while input was sent") from None
            if frame[:1] == b"D":
                accepted += min(FRAME_DATA, len(data) - accepted)
    finally:
        os.close(fd)
    return _logged(directory, data[:accepted])


def _logged(directory: Path, data: bytes) -> int:
    """E13: what was sent goes into the ``stdin`` log stream, up to its cap."""
    path = directory / "stdin"
    with contextlib.suppress(OSError):
        size = path.stat().st_size
        room = MAX_STDIN_LOG_BYTES - size
        if room > 0 and data:
            with path.open("ab") as handle:
                handle.write(data[:room])
    return len(data)


def read_size(directory: Path) -> tuple[int, int]:
    try:
        rows, cols = (directory / SIZE).read_text().split()
        return int(rows), int(cols)
    except (OSError, ValueError):
        return 24, 80


def resize(directory: Path, execution_id: str, rows: int, cols: int) -> None:
    """Tell the holder the new size (the program gets SIGWINCH) and record it."""
    try:
        fd = os.open(directory / INPUT, os.O_WRONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise Conflict(f"execution {execution_id} has ended: its terminal is gone") from exc
    try:
        os.write(fd, b"W" + struct.pack(">IHH", 4, rows, cols))
    finally:
        os.close(fd)
    tmp = directory / (SIZE + ".tmp")
    tmp.write_text(f"{rows} {cols}")
    os.replace(tmp, directory / SIZE)


@dataclass
class _Screen:
    screen: pyte.Screen
    stream: pyte.ByteStream
    offset: int
    #: where in the log this screen was built from
    start: int


class Screens:
    """The emulated screens of tty executions, fed incrementally from their logs."""

    def __init__(self) -> None:
        self._screens: OrderedDict[Path, _Screen] = OrderedDict()
        #: terminal → (when input was last sent, the log's size then)
        self._typed: OrderedDict[Path, tuple[float, int]] = OrderedDict()

    def typed(self, directory: Path) -> None:
        """Input is being sent: a look soon after waits for the terminal's answer."""
        with contextlib.suppress(OSError):
            size = (directory / "stdout").stat().st_size
            self._typed[directory] = (time.monotonic(), size)
            self._typed.move_to_end(directory)
            while len(self._typed) > SCREENS:
                self._typed.popitem(last=False)

    async def echoed(self, directory: Path) -> None:
        """Right after input (``ECHO_WAIT_S``), wait (bounded) until the terminal wrote
        something since: a look then shows what typing did (its echo at least), instead of
        the screen from just before it."""
        sent = self._typed.get(directory)
        if sent is None:
            return
        deadline = sent[0] + ECHO_WAIT_S
        log = directory / "stdout"
        while time.monotonic() < deadline and log.stat().st_size == sent[1]:
            await asyncio.sleep(0.001)
        if time.monotonic() >= deadline or log.stat().st_size != sent[1]:
            self._typed.pop(directory, None)

    def view(self, directory: Path) -> ScreenView:
        rows, cols = read_size(directory)
        log = directory / "stdout"
        size = log.stat().st_size
        kept = self._screens.pop(directory, None)
        if (
            kept is None  # the first look
            or kept.offset > size  # the log was cut meanwhile
            or size - kept.offset > REPLAY_BYTES  # more was printed than a look replays
            or size - kept.start > REBUILD_BYTES  # a long-fed screen (an endless OSC string)
        ):
            screen = pyte.Screen(cols, rows)
            start = max(0, size - REPLAY_BYTES)
            kept = _Screen(screen, pyte.ByteStream(screen), start, start)
        if (kept.screen.lines, kept.screen.columns) != (rows, cols):
            kept.screen.resize(rows, cols)
        with log.open("rb") as handle:
            handle.seek(kept.offset)
            while kept.offset < size:
                chunk = handle.read(min(1 << 16, size - kept.offset))
                if not chunk:
                    break
                kept.stream.feed(chunk)
                kept.offset += len(chunk)
        self._screens[directory] = kept
        while len(self._screens) > SCREENS:
            self._screens.popitem(last=False)
        lines = [line.rstrip() for line in kept.screen.display]
        cursor = Cursor(row=kept.screen.cursor.y, col=kept.screen.cursor.x)
        return ScreenView(rows=rows, cols=cols, text="\n".join(lines), cursor=cursor)

    def forget(self, directory: Path) -> None:
        self._screens.pop(directory, None)


async def drained(directory: Path, timeout_s: float = 1.0) -> None:
    """Wait (bounded) for the holder to end, so a terminal's last output is in the log
    before the execution's end is recorded."""
    try:
        pid, started = (int(word) for word in (directory / HOLDER_PID).read_text().split())
    except (OSError, ValueError):
        return
    deadline = time.monotonic() + timeout_s
    while processes.is_same_process(pid, started) and time.monotonic() < deadline:
        await asyncio.sleep(0.005)
    processes.reap_if_child(pid)  # ours when this runner started it: no zombie stays


def awaiting_input(pid: int, tty: bool) -> bool | None:
    """Whether the sandbox ``pid`` (bwrap) waits for input: the processes reading its stdin
    (on a terminal: those of the foreground group) are all asleep, one of them in a read or
    poll of it. None when the kernel does not say (wchan hidden)."""
    try:
        stdin = _identity(pid)
    except OSError:
        return None
    seen = False
    waiting = False
    for proc in _descendants(pid):
        try:
            if _identity(proc) != stdin:
                continue
            raw = Path(f"/proc/{proc}/stat").read_bytes()
            wchan = Path(f"/proc/{proc}/wchan").read_text().strip()
        except OSError:
            continue
        fields = raw[raw.rindex(b")") + 2 :].split()
        state, pgrp, tpgid = fields[0], int(fields[2]), int(fields[5])
        if tty and pgrp != tpgid:
            continue  # in the background of its terminal
        if state in (b"R", b"D"):
            return False
        if wchan and wchan != "0":
            seen = True
        if wchan.startswith(READ_WAITS + POLL_WAITS):
            waiting = True
    if not seen:
        return None
    return waiting


def _identity(pid: int) -> tuple[int, int]:
    """The file a process reads as stdin (a terminal or pipe, whatever mount shows it)."""
    info = os.stat(f"/proc/{pid}/fd/0")
    return info.st_dev, info.st_ino


def _descendants(pid: int, limit: int = 512) -> list[int]:
    found: list[int] = []
    queue = [pid]
    while queue and len(found) < limit:
        current = queue.pop()
        for child in processes.children(current):
            found.append(child)
            queue.append(child)
    return found
