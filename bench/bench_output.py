"""Benchmark 4: a command writes 1 GiB to stdout through ``shellyard serve`` (a server process
of its own, reached with ``Client.for_home``), timed from submission until the client holds
the completed result, beside the same command in bare bwrap with stdout redirected to a file;
the server's resident memory is sampled every 20 ms the whole time.
Targets: ≤ 1.5× the redirect's time; service RSS ≤ 150 MiB throughout.

    .venv/bin/python bench/bench_output.py [--quick] [--out PATH] [--profile DIR]
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path
from typing import Any

from common import (
    MIB,
    BareBwrap,
    PySpy,
    RssSampler,
    cli,
    make_home,
    metric,
    remove_home,
    rss_bytes,
    start_server,
    stop_server,
    summarize_collapsed,
)
from shellyard.sdk.client import Client

COMMAND = "python bench/bench_output.py"
GIB = 1 << 30
SHELL = f"head -c {GIB} /dev/zero"


def product_once(client: Client, home: Path) -> tuple[float, dict[str, Any]]:
    os.sync()  # start from clean page cache: earlier runs' dirty GiBs would throttle this one
    start = time.perf_counter()
    result = client.run(SHELL, wait_ms=30_000)
    view: Any = result
    while not view.state.terminal:
        view = client.wait(result.execution_id, 30)
    elapsed = time.perf_counter() - start
    if view.state != "completed" or view.exit_code != 0:
        raise RuntimeError(f"1 GiB command ended {view.state} ({view.exit_code}): {view.error}")
    size = client.logs(result.execution_id, tail=0).size
    # Outside the timing: drop the 1 GiB log, as the baseline drops its file. On this virtual
    # disk, writing into fresh blocks is several times slower than into freed ones, so
    # keeping logs would make each later run (of either kind) slower than the one before.
    (home / "runners" / "local" / "executions" / result.execution_id / "stdout").unlink()
    return elapsed, {
        "stdout_bytes_logged": size,
        "inline_stdout_chars": len(result.stdout),
        "output_truncated": result.output_truncated,
        "finished_within_wait": result.state.terminal,
    }


def bare_once(bare: BareBwrap) -> float:
    target = bare.logs / "big-stdout"
    os.sync()
    try:
        return bare.run(["bash", "-c", SHELL], stdout=target, tag="big")
    finally:
        size = target.stat().st_size
        target.unlink()
        if size != GIB:
            raise RuntimeError(f"bare bwrap wrote {size} bytes, not 1 GiB")


def measure(args: argparse.Namespace) -> dict[str, Any]:
    repeats = 2 if args.quick else 5
    home, bare_home = make_home(), make_home()
    bare = BareBwrap(bare_home)
    profiles: dict[str, Any] = {}
    try:
        pid = start_server(home)
        idle_rss = rss_bytes(pid)
        sampler = RssSampler(pid, 0.02)
        client = Client.for_home(home)
        client.run("true")  # warm: workspace created, first spawn paid
        bare.run()
        product: list[float] = []
        baseline: list[float] = []
        facts: dict[str, Any] = {}
        for index in range(repeats):
            # Alternate which goes first, so page-cache writeback falls on both alike.
            if index % 2 == 0:
                baseline.append(bare_once(bare))
                elapsed, facts = product_once(client, home)
                product.append(elapsed)
            else:
                elapsed, facts = product_once(client, home)
                product.append(elapsed)
                baseline.append(bare_once(bare))
        if args.profile:
            raw = args.profile / "output_server.txt"
            with PySpy(pid, raw):
                product_once(client, home)
            profiles["server_pyspy"] = summarize_collapsed(raw)
        peak = sampler.stop()
        client.close()
    finally:
        stop_server(home)
        remove_home(home)
        remove_home(bare_home)

    product.sort()
    baseline.sort()
    p_med = product[len(product) // 2]
    b_med = baseline[len(baseline) // 2]
    metrics = [
        metric(
            "output.time", "1 GiB to stdout through the server, s (median)", p_med, "s",
            baseline_label="same command, bare bwrap, stdout > file, s (median)",
            baseline_value=b_med, target="≤ 1.5× the redirect", kind="ratio_max", limit=1.5,
        ),
        metric(
            "output.rss", "server peak RSS during the runs (20 ms samples), MiB", peak / MIB,
            "MiB", baseline_label="server RSS when idle after start, MiB",
            baseline_value=idle_rss / MIB, target="≤ 150 MiB", kind="abs_max", limit=150.0,
        ),
    ]  # fmt: skip
    return {
        "name": "output",
        "title": "4. 1 GiB of stdout through the service",
        "command": COMMAND + (" --quick" if args.quick else ""),
        "metrics": metrics,
        "details": {
            "command": SHELL,
            "repeats": repeats,
            "product_s": [round(x, 3) for x in product],
            "bare_bwrap_redirect_s": [round(x, 3) for x in baseline],
            "rss_samples": sampler.samples,
            "last_run": facts,
        },
        "profiles": profiles,
    }


if __name__ == "__main__":
    os.environ.pop("SHELLYARD_HOME", None)
    cli("output", measure, __doc__ or "")
