"""By hand (docs/cli.md "attach"): a key typed into ``shellyard attach`` (on a pseudo-terminal)
until its echo from a tty execution's ``cat`` shows there, p50/p90 of 40 keys at a person's
pace; beside it, in the same run, the floor of the same echo through the SDK alone (input,
then read the stdout log in a busy loop until the byte is there).

    .venv/bin/python bench/attach_echo.py
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "tests" / "support"), str(REPO / "tests")]

from pty_terminal import Terminal  # noqa: E402

from conftest import make_home  # noqa: E402
from shellyard.home import ensure_server  # noqa: E402
from shellyard.sdk.client import Client  # noqa: E402

KEYS = 40


def spread(samples: list[float]) -> str:
    ordered = sorted(samples)
    p50, p90 = statistics.median(ordered) * 1000, ordered[int(len(ordered) * 0.9)] * 1000
    return f"p50 {p50:.1f} ms, p90 {p90:.1f} ms"


def main() -> None:
    home = make_home()
    info = ensure_server(home)
    client = Client(info.url, info.token)
    execution_id = client.run("cat", tty=True, background=True, wait_ms=0).execution_id
    time.sleep(2)
    floor: list[float] = []
    offset = client.logs(execution_id, "stdout", 0, 1, raw=True).size
    for index in range(KEYS):
        start = time.perf_counter()
        client.input(execution_id, text=chr(ord("a") + index % 26))
        while not (page := client.logs(execution_id, "stdout", offset, 65536, raw=True)).raw():
            pass
        offset = page.next_offset
        floor.append(time.perf_counter() - start)
    term = Terminal(
        [sys.executable, "-m", "shellyard", "attach", execution_id],
        {**os.environ, "SHELLYARD_HOME": str(home)},
    )
    time.sleep(3)
    attached: list[float] = []
    for index in range(KEYS):
        key = chr(ord("A") + index % 26).encode()
        before = len(term.seen)
        start = time.perf_counter()
        term.type(key)
        while key not in term.seen[before:]:
            assert term._read(1.0), term.seen
        attached.append(time.perf_counter() - start)
        time.sleep(0.3)  # a person's pace: the follower's pause has grown again
    term.type(b"\x1dd")
    term.wait()
    client.cancel(execution_id, 5)
    print(f"SDK input -> log byte (floor): {spread(floor)}")
    print(f"attach key -> echo on its pty: {spread(attached)}")


if __name__ == "__main__":
    main()
