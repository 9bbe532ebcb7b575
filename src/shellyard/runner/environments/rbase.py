"""Building ``r-base`` (docs/environments.md): the runner's R with tidyverse and data.table in a
library inside the prefix (``lib/R/library``, where a ``language: r`` environment keeps its own).

Which sources give what, measured on this runner's network (docs/environments.md "r-base"):
CRAN, Bioconductor, Posit's package manager and conda-forge are not reachable; PyPI and the
Debian archive are. So the interpreter is Debian's ``r-base-core`` (the host's ``Rscript``),
and the packages are Debian's builds of the CRAN packages (``r-cran-*``): the ``.deb`` files
of tidyverse's and data.table's closure are fetched with ``apt-get download`` (no root, no
change to the host's installed packages), unpacked with ``dpkg-deb -x`` into a scratch folder,
and their R library folders moved into the prefix. Debian built them for its own R, so they
load in the host's R; the shared libraries they link are the host's (the build checks that
both packages load, and fails naming what is missing otherwise).

The builder runs the operator's tools directly, like ``_build_python`` (an operator command
on the host, not an agent's change).
"""

from __future__ import annotations

import asyncio
import os
import re
import shutil
from collections.abc import Callable
from pathlib import Path

from shellyard.errors import ShellyardError

#: What ``r-base`` holds beyond R itself, as R names them.
R_BASE_PACKAGES = ("tidyverse", "data.table")
#: Their Debian source, as Debian names them.
DEBIAN_PACKAGES = ("r-cran-tidyverse", "r-cran-data.table")
SOURCE = "the Debian archive (r-cran-* packages, apt-get download)"
R_LIBRARY = Path("lib/R/library")
#: The library folders a Debian R package installs into.
_DEB_LIBRARIES = ("usr/lib/R/site-library", "usr/lib/R/library")

Progress = Callable[[str], None]


async def build(prefix: Path, cache: Path, progress: Progress) -> dict[str, str]:
    """Fill ``prefix``; returns {package: version} (``r`` the interpreter)."""
    rscript = shutil.which("Rscript")
    if rscript is None:
        raise ShellyardError(
            "R is not installed on this runner (no Rscript on its PATH); install r-base-core "
            "(apt-get install r-base-core), then run `shellyard env prepare --name r-base` again"
        )
    for tool in ("apt-cache", "apt-get", "dpkg-deb", "dpkg-query"):
        if shutil.which(tool) is None:
            raise ShellyardError(
                f"building r-base needs {tool} (Debian's package tools) on the runner's host"
            )
    library = prefix / R_LIBRARY
    library.mkdir(parents=True, mode=0o755)
    (prefix / "bin").mkdir(mode=0o755)
    for name in ("R", "Rscript"):
        found = shutil.which(name)
        if found is not None:
            os.symlink(os.path.realpath(found), prefix / "bin" / name)
    progress(f"resolving {', '.join(DEBIAN_PACKAGES)} and their R dependencies with apt-cache")
    wanted = await _closure()
    progress(f"downloading {len(wanted)} Debian R packages with apt-get download")
    debs = cache / "apt"
    debs.mkdir(parents=True, exist_ok=True)
    await _run(["apt-get", "download", "-q", *wanted], cwd=debs)
    scratch = prefix.parent / "unpack"
    try:
        for n, deb in enumerate(_debs(debs, wanted), 1):
            if n % 20 == 0:
                progress(f"unpacking {n}/{len(wanted)}")
            await _run(["dpkg-deb", "-x", str(deb), str(scratch)])
        for where in _DEB_LIBRARIES:
            folder = scratch / where
            if not folder.is_dir():
                continue
            for package in sorted(folder.iterdir()):
                if not (library / package.name).exists():
                    shutil.move(str(package), library / package.name)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    progress("checking that R loads " + " and ".join(R_BASE_PACKAGES))
    script = (
        "suppressPackageStartupMessages({"
        + "; ".join(f"library({p})" for p in R_BASE_PACKAGES)
        + '}); cat("R_VERSION=", as.character(getRversion()), "\\n", sep="")'
    )
    out = await _run(
        [rscript, "-e", script],
        env={**os.environ, "R_LIBS": str(library), "R_LIBS_USER": str(library), "TZ": "UTC"},
    )
    match = re.search(r"R_VERSION=(\S+)", out)
    packages = {"r": match.group(1) if match else "unknown"}
    packages.update(library_versions(library))
    return packages


def library_versions(library: Path) -> dict[str, str]:
    """{R package: version} from each ``<library>/<package>/DESCRIPTION``."""
    out: dict[str, str] = {}
    for description in sorted(library.glob("*/DESCRIPTION")):
        with description.open(encoding="utf-8", errors="replace") as handle:
            for line in handle:
                if line.startswith("Version:"):
                    out[description.parent.name] = line.split(":", 1)[1].strip()
                    break
    return out


async def _closure() -> list[str]:
    """The ``r-cran-*`` packages tidyverse and data.table need, minus those the host has."""
    out = await _run(
        [
            "apt-cache",
            "depends",
            "--recurse",
            "--no-recommends",
            "--no-suggests",
            "--no-conflicts",
            "--no-breaks",
            "--no-replaces",
            "--no-enhances",
            *DEBIAN_PACKAGES,
        ]
    )
    names = sorted({line.strip() for line in out.splitlines() if line.startswith("r-cran-")})
    installed = await _run(
        ["dpkg-query", "-W", "-f", "${Package} ${db:Status-Status}\\n", *names], check=False
    )
    present = {
        line.split()[0]
        for line in installed.splitlines()
        if line.endswith(" installed") and line.split()
    }
    return [name for name in names if name not in present]


def _debs(folder: Path, names: list[str]) -> list[Path]:
    """The newest downloaded ``.deb`` of each name (the cache may hold older ones)."""
    out: list[Path] = []
    for name in names:
        found = sorted(folder.glob(f"{name}_*.deb"), key=lambda p: p.stat().st_mtime)
        if not found:
            raise ShellyardError(f"apt-get download did not fetch {name}")
        out.append(found[-1])
    return out


async def _run(
    argv: list[str],
    *,
    cwd: Path | None = None,
    env: dict[str, str] | None = None,
    check: bool = True,
) -> str:
    """Run a tool; its output (bounded: these tools print little) or a clear error."""
    process = await asyncio.create_subprocess_exec(
        *argv,
        cwd=cwd,
        env=env,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    data, _ = await process.communicate()
    text = data[-(1 << 20) :].decode("utf-8", "replace")
    if check and process.returncode != 0:
        tail = "\n".join(text.strip().splitlines()[-15:])
        raise ShellyardError(
            f"building r-base failed ({' '.join(argv[:2])} exited {process.returncode}): "
            f"{tail}\ncheck that the runner reaches the Debian archive (apt-get update), then "
            f"run `shellyard env prepare --name r-base` again"
        )
    return text
