"""What the package tools' overlays cost an install (docs/security.md "A package tool's
folders", runner/tool_mounts.py): a root runner binds each tool run's prefix, cache and
scratch as a writable overlay of its own (mounted before the spawn, detached after), where
it bound the folders themselves.

Each round, interleaved, the same pip wheel (``FILES`` modules of ``FILE_BYTES`` each) from a
local find-links folder:

- ``direct`` (the baseline): ``uv pip install --no-index --find-links`` into a venv it was
  uninstalled from (untimed), uv's cache warm, ``UV_LINK_MODE=copy`` as the tools use.
- ``plain``: an environment change (``ControlPlane.environments.install``, in-process local
  runner) with the tools' overlays turned off for the run (the folders bound themselves).
- ``overlay``: the same change with the overlays (the default on a root runner).

Each side's environment is uninstalled again after its timed install (untimed). Result: the
medians and the ratios overlay / plain (target ≤ 1.05×) and each against direct (info),
and one tool run's three overlays mounted and detached alone (50 times, after the rounds).

    .venv/bin/python bench/bench_tool_mounts.py [--quick] [--out PATH]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from common import REPO, cli, make_home, metric, remove_home

sys.path.insert(0, str(REPO / "tests" / "support"))

from env_fixtures import make_wheel
from uv import find_uv_bin

from shellyard.config import Settings
from shellyard.contract.environments import EnvironmentChangeBody, EnvironmentCreateRequest
from shellyard.control.plane import ControlPlane
from shellyard.runner.tool_mounts import ToolMounts

COMMAND = "python bench/bench_tool_mounts.py"
UV = find_uv_bin()
FILES = 300
FILE_BYTES = 4096
NAME = "sy-bench-mounts"


def wheel_folder(root: Path) -> Path:
    folder = root / "links"
    modules = {
        f"sy_bench_mounts/m{i}.py": f"X = {os.urandom(FILE_BYTES // 2).hex()!r}\n"
        for i in range(FILES)
    }
    make_wheel(folder, NAME, "1.0", modules)
    for path in [root, *root.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)
    return folder


def direct(venv: Path, links: Path, cache: Path) -> float:
    """An install into a venv the wheel was just uninstalled from (untimed), as each
    shellyard side does."""
    python = ["--python", str(venv / "bin" / "python")]
    env = {**os.environ, "UV_LINK_MODE": "copy"}
    subprocess.run([UV, "pip", "uninstall", "-q", *python, NAME], check=False, env=env)
    start = time.perf_counter()
    subprocess.run(
        [UV, "pip", "install", "--no-config", "--no-index", "-q", "--find-links", str(links),
         *python, "--cache-dir", str(cache), NAME],
        check=True, env=env,
    )  # fmt: skip
    return time.perf_counter() - start


def mount_cycle(mounts: ToolMounts, root: Path, rounds: int) -> list[float]:
    """What one tool run adds: its three overlays mounted and detached, seconds each."""
    folders = [root / "cycle" / name for name in ("prefix", "cache", "scratch")]
    for folder in folders:
        folder.mkdir(parents=True)
    binds = [(folder, Path("/" + folder.name)) for folder in folders]
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        with mounts.mounted(binds):
            pass
        times.append(time.perf_counter() - start)
    return times


async def change(plane: ControlPlane, env_id: str, body: EnvironmentChangeBody, act: str) -> None:
    call = plane.environments.install if act == "install" else plane.environments.uninstall
    done = await call(env_id, body)
    while done.state not in ("succeeded", "failed"):
        done = await plane.environments.wait(done.change_id, 60)
    assert done.state == "succeeded", done


async def measure(args: argparse.Namespace) -> dict[str, Any]:
    rounds = 5 if args.quick else 21
    home = make_home()
    work = make_home("shellyard-bench-toolmounts-")
    try:
        links = wheel_folder(work)
        venv = work / "venv"
        cache = work / "uv-cache"
        subprocess.run([UV, "venv", "-q", str(venv)], check=True)
        direct(venv, links, cache)  # warm, untimed
        os.environ["SHELLYARD_AGENT_LOCAL_SOURCES"] = str(work)  # the operator's folder
        install = EnvironmentChangeBody(
            manager="pip", specs=[NAME], index_url="none", find_links=[str(links)]
        )
        remove = EnvironmentChangeBody(manager="pip", specs=[NAME])
        times: dict[str, list[float]] = {"direct": [], "plain": [], "overlay": []}
        async with ControlPlane.running(Settings(home=home / "home")) as plane:
            box = plane.runners.get("local")._sandboxes
            mounts = box.tool_mounts
            assert mounts is not None, "the tools' overlays are off (not root?)"
            envs: dict[str, str] = {}
            for side in ("plain", "overlay"):
                env = await plane.environments.create(
                    EnvironmentCreateRequest(name=f"b-{side}", language="python", wait_ms=30_000)
                )
                if env.state != "ready" and env.change_id is not None:
                    await plane.environments.wait(env.change_id, 300)
                envs[side] = env.environment_id
                box.tool_mounts = mounts if side == "overlay" else None
                await change(plane, envs[side], install, "install")  # warm its cache
                await change(plane, envs[side], remove, "uninstall")
            for n in range(rounds):
                order = ("direct", "plain", "overlay")
                for side in order if n % 2 == 0 else order[::-1]:
                    if side == "direct":
                        times[side].append(direct(venv, links, cache))
                        continue
                    box.tool_mounts = mounts if side == "overlay" else None
                    start = time.perf_counter()
                    await change(plane, envs[side], install, "install")
                    times[side].append(time.perf_counter() - start)
                    await change(plane, envs[side], remove, "uninstall")
            box.tool_mounts = mounts
            cycles = mount_cycle(mounts, work, 50)
    finally:
        remove_home(home)
        remove_home(work)
    d, p, o = (statistics.median(times[k]) * 1000 for k in ("direct", "plain", "overlay"))
    what = f"pip install of one wheel ({FILES} modules of {FILE_BYTES} B), ms"
    metrics = [
        metric(
            "tool_mounts.overlay_vs_plain",
            f"{what}, tools' folders as overlays",
            o,
            "ms",
            baseline_label="the same change with the folders bound themselves, same run",
            baseline_value=p,
            target="≤ 1.05×",
            kind="ratio_max",
            limit=1.05,
        ),
        metric(
            "tool_mounts.overlay_vs_direct",
            f"{what}, tools' folders as overlays",
            o,
            "ms",
            baseline_label="uv pip install of the same wheel, same run",
            baseline_value=d,
            target="info",
            kind="info",
        ),
        metric(
            "tool_mounts.plain_vs_direct",
            f"{what}, folders bound themselves (before)",
            p,
            "ms",
            baseline_label="uv pip install of the same wheel, same run",
            baseline_value=d,
            target="info",
            kind="info",
        ),
        metric(
            "tool_mounts.cycle",
            "one tool run's three overlays mounted and detached (volatile), ms",
            statistics.median(cycles) * 1000,
            "ms",
            baseline_label="the install with the folders bound themselves",
            baseline_value=p,
            target="info",
            kind="info",
        ),
    ]
    return {
        "name": "tool_mounts",
        "title": "An install with the package tools' folders as overlays of their own",
        "command": COMMAND + (" --quick" if args.quick else ""),
        "metrics": metrics,
        "details": {
            **{f"{k}_s": [round(x, 4) for x in v] for k, v in times.items()},
            "cycle_s": [round(x, 5) for x in cycles],
            "load_average": os.getloadavg(),
        },
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    return asyncio.run(measure(args))


if __name__ == "__main__":
    cli("tool_mounts", run, __doc__ or "")
