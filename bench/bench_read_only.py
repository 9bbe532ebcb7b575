"""Issue 17's benchmark: a read-only ``true`` round trip beside a writer one, same run, same
workspace, interleaved (writer, reader, reader, writer, …). Target: reader ≤ 1.0× writer
(no commit to make). Readers share one committed view per snapshot content (one hard link
per file, built once, runner/readview.py), so the ratio is measured at two workspace sizes,
and so is a *cold* reader: the first one after a writer changed a file, which builds the
view of the new head.

    .venv/bin/python bench/bench_read_only.py [--rounds N]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time

from common import make_home, remove_home
from shellyard.config import Settings
from shellyard.contract.executions import RunShellRequest
from shellyard.control.service import ControlPlane


async def round_trip(plane: ControlPlane, read_only: bool) -> float:
    started = time.perf_counter()
    result = await plane.executions.run_shell(
        RunShellRequest(command="true", read_only=read_only, wait_ms=30_000)
    )
    assert result.state == "completed", result
    return time.perf_counter() - started


async def main(rounds: int) -> None:
    home = make_home()
    try:
        plane = ControlPlane(Settings(home=home / "home"))
        await plane.start()
        try:
            for files in (10, 1000):
                make = f"mkdir -p t && for i in $(seq {files}); do echo $i > t/f$i; done"
                await plane.executions.run_shell(RunShellRequest(command=make, wait_ms=30_000))
                times: dict[bool, list[float]] = {False: [], True: []}
                for i in range(rounds):
                    order = (False, True) if i % 2 == 0 else (True, False)
                    for read_only in order:
                        times[read_only].append(await round_trip(plane, read_only))
                cold: list[float] = []
                for i in range(max(3, rounds // 4)):
                    change = RunShellRequest(command=f"echo {i} > t/f1", wait_ms=30_000)
                    await plane.executions.run_shell(change)
                    cold.append(await round_trip(plane, True))
                writer = statistics.median(times[False])
                reader = statistics.median(times[True])
                first = statistics.median(cold)
                # Each round's reader over its own writer: load that drifts across the run (a
                # shared machine) cancels out of each pair.
                paired = statistics.median(
                    r / w for r, w in zip(times[True], times[False], strict=True)
                )
                print(
                    f"files={files} writer {writer * 1000:.1f} ms reader {reader * 1000:.1f} ms "
                    f"ratio {reader / writer:.2f} (paired {paired:.2f}); cold reader "
                    f"{first * 1000:.1f} ms ratio {first / writer:.2f}"
                )
        finally:
            await plane.aclose()
    finally:
        remove_home(home)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=20)
    asyncio.run(main(parser.parse_args().rounds))
