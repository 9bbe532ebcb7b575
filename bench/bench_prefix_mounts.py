"""Benchmark: what binding a prefix's overlay of its own costs (runner/prefix_mounts.py; V4,
R2, docs/security.md "Host paths").

One LocalRunner (root), one workspace, one environment whose prefix is a stand-in: a venv of
the system's python with this checkout's ``.venv`` site-packages hard-linked in (fastapi,
pydantic, cryptography, asyncssh, psycopg: ~18,000 files), bound at /env. Two modes,
alternated run by run (A B, B A, …) so both see the same machine load:

* ``bind``: the prefix bound itself (``Sandboxes.prefixes`` None: a runner that is not
  root, or ``SHELLYARD_OWN_MOUNTS=off``);
* ``overlay``: bound through its overlay (the default on a root runner), held per spawn.

Measured per mode: start → wait of ``true`` (cold: no warm sandbox, so each is a bwrap
spawn; the overlay is mounted by the first and reused while held or lingering) and of a
heavy import (``python -c 'import fastapi, cryptography, asyncssh, psycopg'``: every lookup
through the overlay). Ratios are overlay / bind (target: ≤ 1.1×). Needs root.

    .venv/bin/python bench/bench_prefix_mounts.py [--runs 40]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from shellyard.runner.environments import seen
from shellyard.runner.local import LocalRunner
from shellyard.runner.protocol import StartRequest
from shellyard.runner.sandbox.bwrap import ENV

COMMAND = "python bench/bench_prefix_mounts.py"
IMPORT = "python -c 'import fastapi, cryptography, asyncssh, psycopg'"
#: the sandbox sees /usr, not this checkout's interpreter (pyenv's, under /root)
SYSTEM_PYTHON = "/usr/bin/python3"


async def _run(runner: LocalRunner, command: str, execution_id: str) -> float:
    start = time.perf_counter()
    await runner.start(
        StartRequest(
            execution_id=execution_id, workspace_id="ws", command=command, environment_id="bench"
        )
    )
    result = await runner.wait(execution_id, 120)
    took = time.perf_counter() - start
    if result.exit_code != 0:
        raise RuntimeError(f"{command!r} ended {result.state}: {result.error}")
    return took


async def amain(args: argparse.Namespace) -> dict[str, Any]:
    os.environ["SHELLYARD_WARM_SANDBOXES"] = "0"  # every start a bwrap spawn
    os.environ["SHELLYARD_OWN_MOUNTS"] = "on"
    work = Path(tempfile.mkdtemp(prefix="shellyard-bench-prefixes-"))
    work.chmod(0o711)
    prefix = work / "prefix"
    subprocess.run([SYSTEM_PYTHON, "-m", "venv", "--without-pip", str(prefix)], check=True)
    version = f"python{sys.version_info[0]}.{sys.version_info[1]}"
    packages = prefix / "lib" / version / "site-packages"
    packages.rmdir()
    # hard links: the same files, no copy (the checkout and /tmp share a file system here)
    subprocess.run(
        ["cp", "-al", str(Path(sys.prefix, "lib", version, "site-packages")), str(packages)],
        check=True,
    )
    runner = LocalRunner(work / "runner")
    await runner.startup()
    overlays = runner._sandboxes.prefixes
    if overlays is None:
        await runner.aclose()  # its egress tmpfs and the rest, as below
        shutil.rmtree(work, ignore_errors=True)
        raise SystemExit("no overlays here (not root, or the kernel refused one)")
    # the stand-in environment: bound at /env with its variables (environments/seen.py)
    mount = seen.Mount(prefix, seen.prefix_variables(prefix, ENV), ENV)
    runner._environments.mount = lambda _environment_id: mount  # type: ignore[method-assign]
    await runner.ensure_workspace("ws")
    samples: dict[str, dict[str, list[float]]] = {
        name: {"bind": [], "overlay": []} for name in ("true", "import")
    }
    try:
        for name, command in (("true", "true"), ("import", IMPORT)):
            for mode in ("bind", "overlay"):  # caches warmed, the overlay mounted: not counted
                runner._sandboxes.prefixes = overlays if mode == "overlay" else None
                await _run(runner, command, f"{name}-{mode}-warm")
            for run in range(args.runs):
                # A and B alternate run by run (their order too), so load swings hit both
                for mode in ("bind", "overlay") if run % 2 == 0 else ("overlay", "bind"):
                    runner._sandboxes.prefixes = overlays if mode == "overlay" else None
                    took = await _run(runner, command, f"{name}-{mode}-{run}")
                    samples[name][mode].append(took)
    finally:
        runner._sandboxes.prefixes = overlays
        await runner.aclose()
        shutil.rmtree(work, ignore_errors=True)
    results: dict[str, Any] = {"command": f"{COMMAND} --runs {args.runs}"}
    for name, modes in samples.items():
        medians = {mode: statistics.median(values) * 1000 for mode, values in modes.items()}
        results[name] = {
            **{f"{mode}_median_ms": round(ms, 2) for mode, ms in medians.items()},
            "ratio": round(medians["overlay"] / medians["bind"], 3),
            "samples_per_mode": len(modes["bind"]),
        }
    results["load_avg_1m"] = os.getloadavg()[0]
    return results


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=40)
    results = asyncio.run(amain(parser.parse_args(argv)))
    print(json.dumps(results, indent=2))
    return results


if __name__ == "__main__":
    main()
