"""E13: ``terminal.send`` against a real FIFO, its reader played by the test as the holder.

The holder of a pipe execution ends as soon as its program ends; a program that reads one
line and exits may end between the frame of that line and the end-of-input frame. The
input was taken whole then; the send must say so, not "ended while input was sent"."""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
from pathlib import Path

import pytest

from shellyard.runner.sandbox import terminal

#: F_SETPIPE_SZ (Linux): the pipe's size, at least a page.
_F_SETPIPE_SZ = 1031


@pytest.mark.parametrize("data", [b"done\n", b"x" * terminal.FRAME_DATA], ids=["line", "frame"])
async def test_input_taken_before_its_program_ends_is_accepted_whole(
    tmp_path: Path, data: bytes
) -> None:
    """The holder reads the data and goes (its program read it and exited) while the end of
    input is still to be written: the send accepted all of it. A line's end of input goes in
    its write; a whole frame's cannot, and finds the FIFO without a reader."""
    fifo = tmp_path / terminal.INPUT
    os.mkfifo(fifo, 0o600)
    (tmp_path / "stdin").touch()  # the log stream, made at the spawn as the FIFO is
    holder = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
    filler = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
    page = fcntl.fcntl(filler, _F_SETPIPE_SZ, 4096)
    # room for the data's frame and no more: the end of input waits behind it
    os.write(filler, b"W" * (page - len(data) - 5))
    os.close(filler)
    sending = asyncio.create_task(terminal.send(tmp_path, "x1", data, eof=True))
    await asyncio.sleep(0.05)
    taken = b""
    for _ in range(1000):  # the holder reads until the program got its line, then ends
        with contextlib.suppress(BlockingIOError):
            taken += os.read(holder, 1 << 16)
        if data in taken:
            break
        await asyncio.sleep(0.005)
    os.close(holder)
    assert data in taken
    assert await sending == len(data)
    assert (tmp_path / "stdin").read_bytes() == data
