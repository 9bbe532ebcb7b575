"""Issue 20: a first-time ``shellyard env prepare`` of ``python-base`` beside ``uv venv`` +
``uv pip install`` of the same packages into a fresh venv, in the same run.

Each round both sides start cold (an empty uv cache of their own, so both download every
wheel from PyPI), interleaved so that the network's ups and downs fall on both. The shellyard
side includes what the base adds on top of uv: the lock, copying the uv binary, copies rather
than cache hard links (the prefix is made read-only), the read-only walk and the revision
record. The baseline is uv with its defaults. Target: ≤ 1.3× the baseline.

    .venv/bin/python bench/bench_base_env.py [--rounds N]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from shellyard.runner import bases
from shellyard.runner.env_create import find_python
from shellyard.runner.env_managers.pip import DEFAULT_INDEX, uv_binary


def _prepare(root: Path) -> float:
    start = time.perf_counter()
    _base, built = asyncio.run(bases.prepare(bases.PYTHON_BASE, root=root))
    assert built
    return time.perf_counter() - start


def _plain_uv(root: Path) -> float:
    env = {**os.environ, "UV_CACHE_DIR": str(root / "cache"), "UV_PYTHON_DOWNLOADS": "never"}
    uv = str(uv_binary())
    venv = root / "venv"
    start = time.perf_counter()
    subprocess.run(
        [uv, "venv", "--no-config", "--seed", "--python", str(find_python()), str(venv)],
        env=env,
        check=True,
        capture_output=True,
    )
    subprocess.run(
        [
            uv,
            "pip",
            "install",
            "--no-config",
            "--python",
            str(venv / "bin" / "python"),
            "--index-url",
            DEFAULT_INDEX,
            "--",
            *bases.PYTHON_BASE_PACKAGES,
        ],
        env=env,
        check=True,
        capture_output=True,
    )
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    ours: list[float] = []
    theirs: list[float] = []
    for _ in range(args.rounds):
        for side, into in ((_prepare, ours), (_plain_uv, theirs)):
            root = Path(tempfile.mkdtemp(prefix="bench-base-", dir="/tmp"))
            try:
                into.append(side(root))
            finally:
                bases._make_writable(root)
                shutil.rmtree(root, ignore_errors=True)
    a, b = statistics.median(ours), statistics.median(theirs)
    print(f"env prepare (cold): median {a:.2f}s over {ours}")
    print(f"uv venv + uv pip install (cold): median {b:.2f}s over {theirs}")
    print(f"ratio {a / b:.2f}x (target <= 1.3x)")


if __name__ == "__main__":
    main()
