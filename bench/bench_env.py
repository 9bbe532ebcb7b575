"""Benchmark 7: installing packages into a fresh environment (V2) through shellyard, beside
calling rattler and uv directly, in the same run.

The same package set goes into a fresh prefix each round, interleaved:

- shellyard: ``ControlPlane.environments.install`` (in-process control plane, local runner):
  a conda install from a local channel, then a pip install of real PyPI packages, each timed
  from the call until the new revision is recorded. That includes the waiting rule's records
  (V5), the journal and the commit that makes a failed change roll back (V8), the tools'
  sandbox, and reading the package state for the revision.
- direct: ``rattler.solve`` + ``rattler.install`` into an empty prefix, then ``uv pip install
  --python <venv>`` into a venv made the way shellyard makes one.

Both sides have warm caches (an untimed first round fills them): the figure is what a change
costs on top of the package managers' own work. Target: ≤ 1.2× the direct time.

The conda channel is built here (the tests' channel builder: real ``.tar.bz2`` packages indexed
with ``rattler.index``; no conda-forge on this network): 40 packages of 50 files each.

    .venv/bin/python bench/bench_env.py [--quick] [--out PATH]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from common import REPO, cli, make_home, metric, remove_home

sys.path.insert(0, str(REPO / "tests" / "support"))

from conda_channel import CondaPackage, PackageFile, build_test_channel
from uv import find_uv_bin

from shellyard.config import Settings
from shellyard.contract.environments import (
    EnvironmentChangeBody,
    EnvironmentCreateRequest,
)
from shellyard.control.plane import ControlPlane

COMMAND = "python bench/bench_env.py"
UV = find_uv_bin()
#: Real packages from PyPI (reachable here): a typical small dependency tree.
PIP_SPECS = ["requests==2.32.3", "rich==13.9.4"]
#: Per-phase seconds of every round (conda, pip on each side), for the profile in the doc.
PHASES: dict[str, list[float]] = {}
#: ``--conda-only``: the conda phase alone on both sides (no PyPI needed).
CONDA_ONLY = False
CONDA_PACKAGES = 40
FILES_PER_PACKAGE = 50


def bench_packages() -> list[CondaPackage]:
    packages = []
    for i in range(CONDA_PACKAGES):
        files = {
            f"share/bench-{i}/file-{j}.txt": PackageFile((f"package {i} file {j}\n" * 40).encode())
            for j in range(FILES_PER_PACKAGE)
        }
        depends = [f"bench-{i - 1}"] if i else []
        packages.append(CondaPackage(f"bench-{i}", "1.0", files, depends=depends))
    return packages


def conda_specs() -> list[str]:
    return [f"bench-{CONDA_PACKAGES - 1}"]  # pulls in the whole chain


async def direct_round(
    channel: Path, work: Path, python: str, uv_cache: Path, cold: bool = False
) -> float:
    """rattler + uv straight into a fresh prefix; returns seconds for the two installs.
    ``cold``: with caches of their own, as each shellyard environment has (its first
    install fills them: docs/environments.md, "Caches")."""
    import rattler
    from rattler import Channel, Gateway, MatchSpec, Platform, VirtualPackage

    prefix = work / f"direct-{time.monotonic_ns()}"
    rattler_cache = work / "rattler-cache"
    if cold:
        uv_cache = work / f"cold-uv-{time.monotonic_ns()}"
        rattler_cache = work / f"cold-rattler-{time.monotonic_ns()}"
    subprocess.run(
        [UV, "venv", "--quiet", "--seed", "--python", python, str(prefix)],
        check=True,
        env={**os.environ, "UV_CACHE_DIR": str(uv_cache)},
    )
    started = time.perf_counter()
    gateway = Gateway(cache_dir=rattler_cache / "repodata")
    records = await rattler.solve(
        [Channel(channel.as_uri())],
        [MatchSpec(s) for s in conda_specs()],
        gateway=gateway,
        platforms=[Platform.current(), Platform("noarch")],
        virtual_packages=[v.into_generic() for v in VirtualPackage.detect()],
    )
    await rattler.install(
        records,
        target_prefix=prefix,
        cache_dir=rattler_cache / "pkgs",
        execute_link_scripts=False,
        show_progress=False,
    )
    label = "direct_cold" if cold else "direct"
    PHASES.setdefault(f"{label}_conda_s", []).append(time.perf_counter() - started)
    if not CONDA_ONLY:
        subprocess.run(
            [
                UV,
                "pip",
                "install",
                "--quiet",
                "--python",
                str(prefix / "bin" / "python"),
                *PIP_SPECS,
            ],
            check=True,
            env={**os.environ, "UV_CACHE_DIR": str(uv_cache)},
        )
    elapsed = time.perf_counter() - started
    PHASES.setdefault(f"{label}_pip_s", []).append(elapsed - PHASES[f"{label}_conda_s"][-1])
    shutil.rmtree(prefix, ignore_errors=True)
    if cold:
        shutil.rmtree(uv_cache, ignore_errors=True)
        shutil.rmtree(rattler_cache, ignore_errors=True)
    return elapsed


async def shellyard_round(plane: ControlPlane, channel: Path, n: int) -> float:
    env = await plane.environments.create(
        EnvironmentCreateRequest(name=f"bench-{n}", language="python", wait_ms=30_000)
    )
    if env.state != "ready" and env.change_id is not None:  # a loaded machine
        await plane.environments.wait(env.change_id, 300)
        env = await plane.environments.show(env.environment_id)
    assert env.state == "ready", env
    started = time.perf_counter()
    bodies = [
        EnvironmentChangeBody(
            manager="conda", specs=conda_specs(), channels=[channel.as_uri()], wait_ms=30_000
        ),
        EnvironmentChangeBody(manager="pip", specs=PIP_SPECS, wait_ms=30_000),
    ]
    for body in bodies[:1] if CONDA_ONLY else bodies:
        phase = time.perf_counter()
        change = await plane.environments.install(env.environment_id, body)
        while change.state not in ("succeeded", "failed"):
            change = await plane.environments.wait(change.change_id, 30)
        assert change.state == "succeeded", change
        PHASES.setdefault(f"shellyard_{body.manager}_s", []).append(time.perf_counter() - phase)
    return time.perf_counter() - started


async def measure(args: argparse.Namespace) -> dict[str, Any]:
    rounds = 3 if args.quick else 7
    home = make_home()
    work = make_home("shellyard-bench-env-")
    try:
        channel = await build_test_channel(work / "channel", bench_packages())
        from shellyard.runner.environments.create import find_python

        python = str(find_python())
        uv_cache = work / "uv-cache"
        direct: list[float] = []
        cold: list[float] = []
        through: list[float] = []
        # the channel is the operator's folder: agents may name it (docs/environments.md)
        os.environ["SHELLYARD_AGENT_LOCAL_SOURCES"] = str(work)
        async with ControlPlane.running(Settings(home=home / "home")) as plane:
            await shellyard_round(plane, channel, -1)  # warm the runner's caches
            await direct_round(channel, work, python, uv_cache)  # warm the direct caches
            for n in range(rounds):
                direct.append(await direct_round(channel, work, python, uv_cache))
                cold.append(await direct_round(channel, work, python, uv_cache, cold=True))
                through.append(await shellyard_round(plane, channel, n))
        d, s = statistics.median(direct), statistics.median(through)
        c = statistics.median(cold)
        for values in PHASES.values():
            del values[: len(values) - rounds]  # the warm-up rounds are not counted
        return {
            "title": "Installing packages into a fresh environment",
            "command": COMMAND,
            "metrics": [
                metric(
                    "env_install",
                    f"conda ({CONDA_PACKAGES} packages × {FILES_PER_PACKAGE} files, local "
                    f"channel) + pip ({', '.join(PIP_SPECS)}), median of {rounds}",
                    s * 1000,
                    "ms",
                    target="≤ 1.2× direct rattler + uv",
                    kind="ratio_max",
                    limit=1.2,
                    baseline_label="rattler.solve/install + uv pip install, same run",
                    baseline_value=d * 1000,
                ),
                metric(
                    "env_install_cold_baseline",
                    f"the same, against rattler + uv with caches of their own (cold), as each "
                    f"environment has, median of {rounds}",
                    s * 1000,
                    "ms",
                    target="info",
                    kind="info",
                    baseline_label="rattler.solve/install + uv pip install, cold caches",
                    baseline_value=c * 1000,
                ),
            ],
            "details": {
                "direct_s": [round(x, 4) for x in direct],
                "direct_cold_s": [round(x, 4) for x in cold],
                "shellyard_s": [round(x, 4) for x in through],
                **{k: [round(x, 4) for x in v] for k, v in sorted(PHASES.items())},
            },
        }
    finally:
        remove_home(home)
        remove_home(work)


def run(args: argparse.Namespace) -> dict[str, Any]:
    global CONDA_ONLY
    CONDA_ONLY = bool(getattr(args, "conda_only", False))
    return asyncio.run(measure(args))


def options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--conda-only", action="store_true", help="the conda phase only (no PyPI needed)"
    )


if __name__ == "__main__":
    cli("env", run, __doc__ or "", options)
