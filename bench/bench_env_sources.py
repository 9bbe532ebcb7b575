"""What reading a workspace's project folder costs an install (docs/security.md, "Attack pass
(session 43)"): the runner copies a folder a change names (``name @ file:///workspace/proj``,
a local index, a CRAN repository) through the reader as the workspace's uid
(``wheels.copy_tree``) before the tool builds the copy, where it bound the folder before.

Each round, interleaved, the same project folder (an in-tree PEP 517 backend and ``FILES``
source files of ``FILE_BYTES`` each, a small package's size):

- ``bind`` (the baseline, what the tool does after either way): ``uv pip install --reinstall
  --no-index`` of the folder into a venv, uv's cache warm.
- ``copy``: ``copy_tree`` of the folder into a fresh folder (as uid 61000 through the reader
  when this runs as root, as the runner does), then the same install of the copy.

Result: the medians, their ratio (copy / bind) and the copy alone. Target: ≤ 1.3×.

    .venv/bin/python bench/bench_env_sources.py [--quick] [--out PATH]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from common import REPO, cli, metric

sys.path.insert(0, str(REPO / "tests" / "support"))

from env_fixtures import backend_sdist
from uv import find_uv_bin

from shellyard.runner.environments.managers import wheels
from shellyard.runner.sandbox import launch

COMMAND = "python bench/bench_env_sources.py"
UV = find_uv_bin()
FILES = 200
FILE_BYTES = 8192
#: The reader's uid on a root runner (the shared sandbox uid; a workspace's is alike).
READER_IDS = (61000, 61000)


def project(root: Path) -> Path:
    """An unpacked sdist with an in-tree backend plus ``FILES`` files under ``src/``."""
    sdist = root / "p.tar.gz"
    sdist.write_bytes(backend_sdist("sy-bench", "1.0", "RESULT = 1\n"))
    folder = root / "proj"
    folder.mkdir()
    subprocess.run(
        ["tar", "-xzf", str(sdist), "-C", str(folder), "--strip-components=1"], check=True
    )
    for i in range(FILES):
        sub = folder / "src" / f"m{i % 10}"
        sub.mkdir(parents=True, exist_ok=True)
        (sub / f"f{i}.py").write_bytes(os.urandom(FILE_BYTES // 2).hex().encode())
    for path in [root, *root.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)
    return folder


def install(venv: Path, folder: Path, cache: Path) -> float:
    start = time.perf_counter()
    subprocess.run(
        [UV, "pip", "install", "--no-config", "--no-index", "--reinstall", "-q",
         "--python", str(venv / "bin" / "python"), "--cache-dir", str(cache), str(folder)],
        check=True, env={**os.environ, "UV_LINK_MODE": "copy"},
    )  # fmt: skip
    return time.perf_counter() - start


def run(args: argparse.Namespace) -> dict[str, Any]:
    rounds = 5 if args.quick else 15
    front = (
        launch.prefix(None, network=None, ids=READER_IDS, limits=()) if os.geteuid() == 0 else []
    )
    with tempfile.TemporaryDirectory(prefix="sy-bench-sources-") as tmp:
        root = Path(tmp)
        root.chmod(0o755)
        folder = project(root)
        venv = root / "venv"
        subprocess.run([UV, "venv", "-q", str(venv)], check=True)
        cache = root / "cache"
        install(venv, folder, cache)  # warm uv's cache, untimed
        bind: list[float] = []
        copy: list[float] = []
        copy_only: list[float] = []
        for n in range(rounds):
            for side in ("bind", "copy") if n % 2 == 0 else ("copy", "bind"):
                if side == "bind":
                    bind.append(install(venv, folder, cache))
                    continue
                target = root / f"copy-{n}"
                start = time.perf_counter()
                wheels.copy_tree(folder, target, front)
                copied = time.perf_counter() - start
                copy_only.append(copied)
                copy.append(copied + install(venv, target, cache))
                shutil.rmtree(target)
    b, c, o = (statistics.median(x) * 1000 for x in (bind, copy, copy_only))
    metrics = [
        metric(
            "env_sources.install",
            f"install of a project folder ({FILES} files of {FILE_BYTES} B) with its copy, ms",
            c,
            "ms",
            baseline_label="the same install of the folder itself (bound, before), same run",
            baseline_value=b,
            target="≤ 1.3×",
            kind="ratio_max",
            limit=1.3,
        ),
        metric(
            "env_sources.copy",
            "the reader's copy alone, ms",
            o,
            "ms",
            baseline_label="the install of the folder itself",
            baseline_value=b,
            target="info",
            kind="info",
        ),
    ]
    return {
        "name": "env_sources",
        "title": "A workspace project folder copied by the reader before uv builds it",
        "command": COMMAND + (" --quick" if args.quick else ""),
        "metrics": metrics,
        "details": {
            "bind_s": bind,
            "copy_s": copy,
            "copy_only_s": copy_only,
            "as_root": os.geteuid() == 0,
            "load_average": os.getloadavg(),
        },
    }


if __name__ == "__main__":
    cli("env_sources", run, __doc__ or "")
