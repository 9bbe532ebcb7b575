"""An environment made ``--from python-base``: ``SHELLYARD_BASE_SHARING=copies`` against
``links`` (hard links, what every create did before), each beside ``cp -a`` of the same base
prefix in the same run (docs/environments.md, "Starting from a
base"; docs/security.md, "Environments share no inode with a base").

1. ``clone``: the prefix alone, rounds interleaved: ``cp -a`` (the baseline), ``derive.clone``
   hard-linking (``link``), copying on one thread and on ``COPY_WORKERS``.
2. ``create``: ``environment_create --from python-base`` through the control plane (in-process,
   local runner) until revision 1 is answered, on a home set to ``links`` (``before``) and one
   set to ``copies`` (``after``), interleaved with ``cp -a`` of the base prefix.

Disk is what a new prefix adds: the blocks of its inodes the base does not hold (``du`` would
count a hard-linked file once, in whichever tree it met first). The base is prepared once, in
/tmp, from PyPI (uv's cache makes that fast after the first time).

    .venv/bin/python bench/bench_derive_copies.py [--quick] [--out PATH]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from common import cli, make_home, metric, remove_home
from shellyard.config import Settings
from shellyard.contract.environments import EnvironmentCreateRequest
from shellyard.control.plane import ControlPlane
from shellyard.runner.environments import bases, derive
from shellyard.runner.policy import SandboxPolicy

COMMAND = ".venv/bin/python bench/bench_derive_copies.py"


def _inodes(tree: Path) -> set[tuple[int, int]]:
    out: set[tuple[int, int]] = set()
    for folder, _dirs, names in os.walk(tree):
        for name in names:
            st = os.lstat(os.path.join(folder, name))
            out.add((st.st_dev, st.st_ino))
    return out


def added_bytes(tree: Path, base_inodes: set[tuple[int, int]]) -> int:
    """Allocated bytes of ``tree``'s inodes that the base does not hold (each counted once)."""
    seen: set[tuple[int, int]] = set()
    total = 0
    for folder, dirs, names in os.walk(tree):
        for name in [*dirs, *names]:
            st = os.lstat(os.path.join(folder, name))
            key = (st.st_dev, st.st_ino)
            if key not in base_inodes and key not in seen:
                seen.add(key)
                total += st.st_blocks * 512
    return total


def _timed(work: Callable[[Path], None], into: Path) -> float:
    start = time.perf_counter()
    work(into)
    return time.perf_counter() - start


def clone_rounds(base: Path, rounds: int, scratch: Path) -> dict[str, dict[str, list[float]]]:
    base_inodes = _inodes(base)
    ways: dict[str, Callable[[Path], None]] = {
        "cp_a": lambda to: subprocess.run(["cp", "-a", f"{base}/.", str(to)], check=True),
        "link": lambda to: derive.clone(base, to, linking=True),
        "copies_1": lambda to: derive.clone(base, to, workers=1),
        f"copies_{derive.COPY_WORKERS}": lambda to: derive.clone(base, to),
    }
    out: dict[str, dict[str, list[float]]] = {k: {"s": [], "bytes": []} for k in ways}
    for n in range(rounds):
        for name, work in ways.items():
            into = scratch / f"{name}-{n}"
            into.mkdir()
            out[name]["s"].append(_timed(work, into))
            out[name]["bytes"].append(added_bytes(into, base_inodes))
            shutil.rmtree(into)
    return out


async def create_rounds(base: bases.BaseRevision, rounds: int) -> dict[str, list[float]]:
    """``before``: ``SHELLYARD_BASE_SHARING=links``; ``after``: ``copies`` (a home each)."""
    home = make_home()
    base_inodes = _inodes(base.prefix)
    out: dict[str, list[float]] = {
        k: [] for k in ("before", "after", "cp_a", "before_b", "after_b")
    }
    homes = {
        side: Settings(home=home / side, local_policy=SandboxPolicy(base_sharing=mode))
        for side, mode in (("before", "links"), ("after", "copies"))
    }
    try:
        async with (
            ControlPlane.running(homes["before"]) as linking,
            ControlPlane.running(homes["after"]) as copying,
        ):
            planes = {"before": linking, "after": copying}
            for n in range(rounds):
                for side, plane in planes.items():
                    start = time.perf_counter()
                    env = await plane.environments.create(
                        EnvironmentCreateRequest(
                            name=f"{side}-{n}", base=bases.PYTHON_BASE, wait_ms=30_000
                        )
                    )
                    change_id = env.change_id
                    while env.state not in ("ready", "failed") and change_id:
                        await plane.environments.wait(change_id, 30)
                        env = await plane.environments.show(env.environment_id)
                    assert env.state == "ready", env.error
                    out[side].append(time.perf_counter() - start)
                    runner_root = homes[side].local_runner_root
                    prefix = runner_root / "environments" / env.environment_id / "prefix"
                    out[f"{side}_b"].append(added_bytes(prefix, base_inodes))
                into = home / f"cp-{n}"
                into.mkdir()
                out["cp_a"].append(
                    _timed(
                        lambda to: subprocess.run(
                            ["cp", "-a", f"{base.prefix}/.", str(to)], check=True
                        ),
                        into,
                    )
                )
                shutil.rmtree(into)
    finally:
        remove_home(home)
    return out


def run(args: argparse.Namespace) -> dict[str, Any]:
    rounds = 2 if args.quick else 5
    root = Path(tempfile.mkdtemp(prefix="bench-derive-", dir="/tmp"))
    root.chmod(0o755)
    try:
        base, _built = asyncio.run(bases.prepare(bases.PYTHON_BASE, root=root))
        os.environ["SHELLYARD_BASES"] = str(root)
        os.environ.pop("SHELLYARD_DEFAULT_ENVIRONMENT", None)
        scratch = Path(tempfile.mkdtemp(prefix="bench-derive-into-", dir="/tmp"))
        try:
            clones = clone_rounds(base.prefix, rounds, scratch)
            print({k: v["s"] for k, v in clones.items()}, file=sys.stderr, flush=True)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
        creates = asyncio.run(create_rounds(base, rounds))
        files = sum(len(names) for _f, _d, names in os.walk(base.prefix))
    finally:
        bases._make_writable(root)
        shutil.rmtree(root, ignore_errors=True)
    med = statistics.median
    cp_s = med(clones["cp_a"]["s"]) * 1000
    mib = 1 << 20
    metrics = [
        metric(
            f"clone_{name}",
            f"the prefix alone: {name}, median of {rounds}",
            med(v["s"]) * 1000,
            "ms",
            target="info",
            kind="info",
            baseline_label="cp -a of the base prefix, same run",
            baseline_value=cp_s,
        )
        for name, v in clones.items()
        if name != "cp_a"
    ]
    for side in ("before", "after"):
        metrics.append(
            metric(
                f"create_{side}",
                f"environment_create --from python-base until revision 1 ({side}: "
                f"{'hard links' if side == 'before' else 'copies'}), median of {rounds}",
                med(creates[side]) * 1000,
                "ms",
                target="info",
                kind="info",
                baseline_label="cp -a of the base prefix, same run",
                baseline_value=med(creates["cp_a"]) * 1000,
            )
        )
    return {
        "title": "Environments from a base: copies against hard links",
        "command": COMMAND,
        "metrics": metrics,
        "details": {
            "base_files": files,
            "clone_s": {k: [round(x, 3) for x in v["s"]] for k, v in clones.items()},
            "clone_added_mib": {k: round(med(v["bytes"]) / mib, 1) for k, v in clones.items()},
            "create_s": {k: [round(x, 3) for x in creates[k]] for k in ("before", "after", "cp_a")},
            "create_added_mib": {
                k: round(med(creates[f"{k}_b"]) / mib, 1) for k in ("before", "after")
            },
            "load_avg": os.getloadavg(),
        },
    }


if __name__ == "__main__":
    cli("derive_copies", run, __doc__ or "")
