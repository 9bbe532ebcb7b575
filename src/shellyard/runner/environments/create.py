"""The ``create`` action (V1): a language's initial tools in an empty prefix, and the
variables a prefix offers to the commands that use it (V4).

``python``: a virtual environment of a Python found on the runner, outside folders the sandbox
uid cannot enter (``/root/.pyenv`` is behind the 0700 ``/root``), seeded with pip, plus a copy
of the ``uv`` binary in ``bin/`` so ``pip install`` and ``uv pip install`` both run inside a
command and both fail on the read-only prefix (V7). ``r``: R stays the runner's (``Rscript``);
the prefix holds the library packages go to, ``lib/R/library`` (where a conda R keeps its own).
"""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import stat
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from shellyard.runner.environments.managers.base import ManagerContext, ManagerError, tools_folder
from shellyard.runner.environments.managers.pip import DEFAULT_INDEX, record_origin, uv_binary
from shellyard.runner.environments.seen import R_LIBRARY
from shellyard.runner.protocol import EnvironmentChangeRequest, PackageRecord

#: Interpreters tried for a ``python`` environment, first usable wins. Debian's own first: it
#: lives in world-readable folders and keeps its ensurepip wheels for offline seeding.
PYTHON_CANDIDATES = (Path("/usr/bin/python3"), Path("/usr/local/bin/python3"))


def _reachable_by_others(path: Path) -> bool:
    """The sandbox uid can run ``path``: every folder above it is searchable by others and the
    file itself (links resolved) is executable by others."""
    real = path.resolve()
    try:
        if not real.stat().st_mode & stat.S_IXOTH:
            return False
        return all(folder.stat().st_mode & stat.S_IXOTH for folder in real.parents)
    except OSError:
        return False


def find_python() -> Path:
    for candidate in PYTHON_CANDIDATES:
        if candidate.exists() and _reachable_by_others(candidate):
            return candidate
    raise ManagerError(
        "failed",
        "no Python the sandbox can run was found on this runner (looked for "
        + ", ".join(str(c) for c in PYTHON_CANDIDATES)
        + "); install python3 there (apt-get install python3 python3-venv), or create the "
        "environment with language 'r' and add Python with conda",
    )


async def create(ctx: ManagerContext, request: EnvironmentChangeRequest) -> list[PackageRecord]:
    """Fill the empty ``ctx.prefix``; returns the ``base`` records of revision 1."""
    if request.language == "python":
        return await _create_python(ctx)
    if request.language == "r":
        return await _create_r(ctx)
    raise ManagerError(
        "invalid_spec", f"unknown language {request.language!r}; use 'python' or 'r'"
    )


async def _create_python(ctx: ManagerContext) -> list[PackageRecord]:
    python = find_python()
    uv = uv_binary()
    prefix = ctx.prefix
    ctx.progress(f"making a virtual environment of {python}")
    uv_env = {
        "UV_CACHE_DIR": str(ctx.cache / "uv"),
        "UV_PYTHON_DOWNLOADS": "never",
        "UV_LINK_MODE": "copy",  # see managers/pip.py
    }
    venv = [str(uv), "venv", "--no-config", "--python", str(python)]
    code, tail = await ctx.run_tool([*venv, "--seed", str(prefix)], env=uv_env)
    seeded_from = DEFAULT_INDEX
    if code != 0:
        # Seeding downloads pip unless it is in uv's cache; with no index reachable (or the
        # network off) the interpreter's own bundled pip does, offline.
        ctx.progress("seeding pip from the interpreter's bundled wheels")
        # Emptied here, not by ``uv venv --clear``: the tools see the prefix as a mount
        # point (/env, V4) on a read-only root, which uv cannot remove and make again.
        await asyncio.to_thread(_empty, prefix)
        code, tail = await ctx.run_tool([*venv, str(prefix)], env=uv_env)
        if code == 0:
            code, tail = await ctx.run_tool(
                [str(prefix / "bin" / "python"), "-m", "ensurepip", "--default-pip"],
                network=False,
            )
        if code != 0:
            raise ManagerError("failed", f"could not make the virtual environment: {tail}")
        seeded_from = f"ensurepip of {python.resolve()}"
    record_origin(prefix, seeded_from)
    (prefix / "bin").chmod(0o755)
    shutil.copy2(uv, prefix / "bin" / "uv")
    os.chmod(prefix / "bin" / "uv", 0o755)
    records = [
        PackageRecord(
            manager="base",
            name="python",
            version=_venv_python_version(prefix),
            source=str(python.resolve()),
        )
    ]
    pip_version = _dist_version(prefix, "pip")
    if pip_version is not None:
        records.append(
            PackageRecord(manager="base", name="pip", version=pip_version, source=seeded_from)
        )
    records.append(PackageRecord(manager="base", name="uv", version=_uv_version(), source=str(uv)))
    return records


async def _create_r(ctx: ManagerContext) -> list[PackageRecord]:
    found = shutil.which("Rscript")
    if found is None:
        raise ManagerError(
            "failed",
            "R is not installed on this runner (no Rscript on its PATH); install r-base-core "
            "there, or create a python environment and add R with conda",
        )
    rscript = Path(found)
    for folder in (ctx.prefix / "bin", ctx.prefix / R_LIBRARY):
        tools_folder(folder, ctx.prefix)
    for folder in (
        ctx.prefix / "bin",
        ctx.prefix / "lib",
        ctx.prefix / "lib/R",
        ctx.prefix / R_LIBRARY,
    ):
        folder.chmod(0o755)
    ctx.progress("checking R")
    code, tail = await ctx.run_tool(
        [str(rscript), "-e", 'cat("R_VERSION=", as.character(getRversion()), "\\n", sep="")'],
        network=False,
    )
    match = re.search(r"R_VERSION=(\d+\.\d+[.\d]*)", tail)
    if code != 0 or match is None:
        raise ManagerError("failed", f"R on this runner does not run: {tail}")
    return [
        PackageRecord(
            manager="base", name="r", version=match.group(1), source=str(rscript.resolve())
        )
    ]


def _empty(folder: Path) -> None:
    """Remove what ``folder`` holds (no link followed), keeping the folder itself."""
    with os.scandir(folder) as entries:
        for entry in entries:
            if entry.is_dir(follow_symlinks=False):
                shutil.rmtree(entry.path)
            else:
                os.unlink(entry.path)


def _venv_python_version(prefix: Path) -> str:
    for line in (prefix / "pyvenv.cfg").read_text().splitlines():
        key, _, value = line.partition("=")
        if key.strip() in ("version_info", "version"):
            return value.strip()
    return "unknown"


def _dist_version(prefix: Path, name: str) -> str | None:
    for dist in prefix.glob(f"lib/python*/site-packages/{name}-*.dist-info"):
        return dist.name[len(name) + 1 : -len(".dist-info")]
    return None


def _uv_version() -> str:
    """The uv package's version: the binary copied is the one that package ships."""
    try:
        return version("uv")
    except PackageNotFoundError:
        return "unknown"
