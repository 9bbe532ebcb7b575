"""Issue 17's benchmark: a read-only ``true`` round trip beside a writer one, same run, same
workspace, interleaved (writer, reader, reader, writer, …). Target: reader ≤ 1.0× writer
(no commit to make). Readers share one committed view per snapshot content (one hard link
per file, built once, runner/snapshots/views.py), so the ratio is measured at two workspace sizes,
and so is a *cold* reader: the first one after a writer changed a file, which builds the
view of the new head.

    .venv/bin/python bench/bench_read_only.py [--quick] [--out PATH]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from typing import Any

from common import cli, make_home, metric, remove_home
from shellyard.config import Settings
from shellyard.contract.executions import RunShellRequest
from shellyard.control.plane import ControlPlane, build


async def round_trip(plane: ControlPlane, read_only: bool) -> float:
    started = time.perf_counter()
    result = await plane.executions.run_shell(
        RunShellRequest(command="true", read_only=read_only, wait_ms=30_000)
    )
    assert result.state == "completed", result
    return time.perf_counter() - started


COMMAND = "python bench/bench_read_only.py"


async def measure_sizes(rounds: int) -> dict[str, dict[str, float]]:
    sizes: dict[str, dict[str, float]] = {}
    home = make_home()
    try:
        plane = await build(Settings(home=home / "home"))
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
                # Each round's reader over its own writer: load that drifts across the run (a
                # shared machine) cancels out of each pair.
                paired = statistics.median(
                    r / w for r, w in zip(times[True], times[False], strict=True)
                )
                sizes[str(files)] = {
                    "writer_ms": round(statistics.median(times[False]) * 1000, 2),
                    "reader_ms": round(statistics.median(times[True]) * 1000, 2),
                    "cold_reader_ms": round(statistics.median(cold) * 1000, 2),
                    "paired_ratio": round(paired, 3),
                }
                print(files, sizes[str(files)], file=sys.stderr, flush=True)
        finally:
            await plane.aclose()
    finally:
        remove_home(home)
    return sizes


def run(args: argparse.Namespace) -> dict[str, Any]:
    rounds = 10 if args.quick else 30
    sizes = asyncio.run(measure_sizes(rounds))
    metrics = []
    for files, row in sizes.items():
        metrics.append(
            metric(
                f"read_only.warm_{files}",
                f"read-only run_shell(true) beside a writer, {files} files, p50 ms",
                row["reader_ms"],
                "ms",
                baseline_label="writer run_shell(true), same rounds, p50 ms",
                baseline_value=row["writer_ms"],
                target="≤ 1.0× the writer",
                kind="ratio_max",
                limit=1.0,
            )
        )
        metrics.append(
            metric(
                f"read_only.cold_{files}",
                f"first reader after a writer changed a file, {files} files, p50 ms",
                row["cold_reader_ms"],
                "ms",
                baseline_label="writer run_shell(true), p50 ms",
                baseline_value=row["writer_ms"],
                target="— (info: builds the new head's view)",
                kind="info",
            )
        )
    return {
        "name": "read_only",
        "title": "Read-only executions beside a writer (issue 17)",
        "command": COMMAND + (" --quick" if args.quick else ""),
        "metrics": metrics,
        "details": {"rounds": rounds, "sizes": sizes},
    }


if __name__ == "__main__":
    cli("read_only", run, __doc__ or "")
