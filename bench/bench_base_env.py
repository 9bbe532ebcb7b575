"""Issue 20: base environments, each figure beside its baseline in the same run.

1. ``base_prepare``: a first-time ``shellyard env prepare`` of ``python-base`` beside ``uv
   venv`` + ``uv pip install`` of the same packages into a fresh venv. Each round both sides
   start cold (an empty uv cache of their own, so both download every wheel from PyPI),
   interleaved so that the network's ups and downs fall on both. The shellyard side includes
   what the base adds on top of uv: the lock, copying the uv binary, copies rather than cache
   hard links (the prefix is made read-only), the read-only walk and the revision record.
   Target: ≤ 1.3×.
2. ``env_from_base``: ``environment_create --from python-base`` through the control plane
   (in-process, local runner) beside a fresh install of the same packages the way an agent
   would without a base: ``environment_create`` + ``environment_install pip numpy pandas scipy
   matplotlib`` (warm uv cache: the runner's own, filled by an untimed round). Each is timed
   from the call until the revision is recorded. Target: ≤ 0.2×. The commit that makes later
   changes roll back runs after the answer (docs/environments.md) and is reported beside it.

    .venv/bin/python bench/bench_base_env.py [--quick] [--out PATH]
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
from typing import Any

from common import cli, make_home, metric, remove_home
from shellyard.config import Settings
from shellyard.contract.environments import EnvironmentChangeBody, EnvironmentCreateRequest
from shellyard.control.plane import ControlPlane
from shellyard.runner.environments import bases
from shellyard.runner.environments.create import find_python
from shellyard.runner.environments.managers.pip import DEFAULT_INDEX, uv_binary

COMMAND = "python bench/bench_base_env.py"


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


def prepare_rounds(rounds: int) -> tuple[list[float], list[float]]:
    ours: list[float] = []
    theirs: list[float] = []
    for _ in range(rounds):
        for side, into in ((_prepare, ours), (_plain_uv, theirs)):
            root = Path(tempfile.mkdtemp(prefix="bench-base-", dir="/tmp"))
            root.chmod(0o755)
            try:
                into.append(side(root))
            finally:
                bases._make_writable(root)
                shutil.rmtree(root, ignore_errors=True)
    return ours, theirs


async def _until_done(plane: ControlPlane, change_id: str) -> None:
    change = await plane.environments.wait(change_id, 30)
    while change.state not in ("succeeded", "failed"):
        change = await plane.environments.wait(change_id, 30)
    assert change.state == "succeeded", change.error


async def _fresh(plane: ControlPlane, n: int) -> float:
    start = time.perf_counter()
    env = await plane.environments.create(
        EnvironmentCreateRequest(name=f"fresh-{n}", wait_ms=30_000)
    )
    assert env.state == "ready", env.error
    change = await plane.environments.install(
        env.environment_id,
        EnvironmentChangeBody(
            manager="pip", specs=list(bases.PYTHON_BASE_PACKAGES), wait_ms=30_000
        ),
    )
    await _until_done(plane, change.change_id)
    return time.perf_counter() - start


async def _from_base(plane: ControlPlane, n: int) -> tuple[float, float]:
    """Seconds until the revision is recorded, and until the background commit is done."""
    start = time.perf_counter()
    env = await plane.environments.create(
        EnvironmentCreateRequest(name=f"derived-{n}", base=bases.PYTHON_BASE, wait_ms=30_000)
    )
    assert env.state == "ready", env.error
    answered = time.perf_counter() - start
    store = plane.runners.get("local")._environments
    settling = store._settling.get(env.environment_id)
    if settling is not None:
        await settling
    return answered, time.perf_counter() - start


async def from_base_rounds(rounds: int, root: Path) -> dict[str, list[float]]:
    home = make_home()
    os.environ["SHELLYARD_BASES"] = str(root)
    try:
        out: dict[str, list[float]] = {"fresh": [], "from_base": [], "committed": []}
        async with ControlPlane.running(Settings(home=home / "home")) as plane:
            await _fresh(plane, -1)  # fills the runner's uv cache: the baseline is warm
            for n in range(rounds):
                out["fresh"].append(await _fresh(plane, n))
                answered, committed = await _from_base(plane, n)
                out["from_base"].append(answered)
                out["committed"].append(committed)
        return out
    finally:
        remove_home(home)


def run(args: argparse.Namespace) -> dict[str, Any]:
    rounds = 1 if args.quick else 3
    ours, theirs = prepare_rounds(rounds)
    root = Path(tempfile.mkdtemp(prefix="bench-base-from-", dir="/tmp"))
    root.chmod(0o755)
    try:
        _prepare(root)
        derived = asyncio.run(from_base_rounds(rounds, root))
    finally:
        bases._make_writable(root)
        shutil.rmtree(root, ignore_errors=True)
    med = statistics.median
    return {
        "title": "Base environments (issue 20)",
        "command": COMMAND,
        "metrics": [
            metric(
                "base_prepare",
                f"first-time env prepare of python-base (cold), median of {rounds}",
                med(ours) * 1000,
                "ms",
                target="≤ 1.3× uv venv + uv pip install, cold",
                kind="ratio_max",
                limit=1.3,
                baseline_label="uv venv --seed + uv pip install of the same packages, same run",
                baseline_value=med(theirs) * 1000,
            ),
            metric(
                "env_from_base",
                f"environment_create --from python-base until revision 1, median of {rounds}",
                med(derived["from_base"]) * 1000,
                "ms",
                target="≤ 0.2× a fresh install of the same packages",
                kind="ratio_max",
                limit=0.2,
                baseline_label="environment_create + environment_install pip (warm uv cache)",
                baseline_value=med(derived["fresh"]) * 1000,
            ),
            metric(
                "env_from_base_committed",
                "the same, until its rollback snapshot is committed (after the answer)",
                med(derived["committed"]) * 1000,
                "ms",
                target="info",
                kind="info",
                baseline_label="environment_create + environment_install pip (warm uv cache)",
                baseline_value=med(derived["fresh"]) * 1000,
            ),
        ],
        "details": {
            "prepare_s": [round(x, 3) for x in ours],
            "plain_uv_s": [round(x, 3) for x in theirs],
            **{f"{k}_s": [round(x, 3) for x in v] for k, v in derived.items()},
        },
    }


if __name__ == "__main__":
    cli("base_env", run, __doc__ or "")
