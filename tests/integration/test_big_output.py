"""A command writes 1 GiB to stdout: the service's memory stays bounded and execution_logs
pages through all of it (E6, E12). The server runs as its own process so its RSS is its own."""

from __future__ import annotations

import os
import shutil
import signal
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from proc_memory import resident

from conftest import make_home
from shellyard.contract.executions import ExecutionState
from shellyard.home import ensure_server, is_served
from shellyard.sdk.client import Client

GIB = 1 << 30
#: Bound on the control plane's resident memory (the benchmark target is 150 MiB).
RSS_BOUND = 200 << 20


class RssSampler:
    def __init__(self, pid: int) -> None:
        self.pid, self.peak = pid, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.02):
            self.peak = max(self.peak, resident(self.pid))

    def stop(self) -> int:
        self._stop.set()
        self._thread.join()
        return self.peak


@pytest.fixture
def served() -> Iterator[Path]:
    home = make_home()
    yield home
    if is_served(home):
        os.kill(ensure_server(home).pid, signal.SIGTERM)
    shutil.rmtree(home, ignore_errors=True)


def test_one_gib_of_output_bounded_memory_and_paged_logs(served: Path) -> None:
    client = Client.for_home(served)
    sampler = RssSampler(ensure_server(served).pid)
    result = client.run(
        f"yes abcdefghijklmnopqrstuvwxyz012345678901234567890123456789 | head -c {GIB}",
        wait_ms=30000,
    )
    view = client.wait(result.execution_id, 120) if not result.state.terminal else result
    assert view.state == ExecutionState.completed and view.exit_code == 0
    assert result.state != ExecutionState.completed or (
        result.output_truncated and len(result.stdout) < 31_000
    )
    offset, pages, total = 0, 0, 0
    while True:
        page = client.logs(result.execution_id, "stdout", offset, 1 << 20)
        assert page.offset == offset
        assert page.data.startswith("abcdefghij") or pages > 0
        total += len(page.data)
        offset = page.next_offset
        pages += 1
        if page.complete:
            break
    assert offset == GIB and total == GIB
    assert pages == 1024
    tail = client.logs(result.execution_id, tail=100)
    assert tail.next_offset == GIB and len(tail.data) == 100
    peak = sampler.stop()
    assert peak < RSS_BOUND, f"control plane RSS peaked at {peak / 2**20:.0f} MiB"
