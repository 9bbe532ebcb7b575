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

Which steps run where (docs/security.md, "Operator builds"): ``apt-cache`` and ``apt-get
download`` run on the host as the operator (they run no package's code: apt checks every
``.deb`` against the archive's signed index, and drops to its ``_apt`` user to fetch); the
unpacking and R, which loads the packages' code, run sandboxed as the tools' uid
(operator_tools.py), with the downloads read-only and the network off.
"""

from __future__ import annotations

import asyncio
import os
import re
import shutil
from collections.abc import Callable
from pathlib import Path

from shellyard.errors import ShellyardError
from shellyard.runner.environments.operator_tools import OperatorBuild
from shellyard.runner.environments.tools import give_to_tools

#: What ``r-base`` holds beyond R itself, as R names them.
R_BASE_PACKAGES = ("tidyverse", "data.table")
#: Their Debian source, as Debian names them.
DEBIAN_PACKAGES = ("r-cran-tidyverse", "r-cran-data.table")
SOURCE = "the Debian archive (r-cran-* packages, apt-get download)"
R_LIBRARY = Path("lib/R/library")

Progress = Callable[[str], None]


async def build(tools: OperatorBuild, prefix: Path, progress: Progress) -> dict[str, str]:
    """Fill ``prefix`` (empty, the tools'); returns {package: version} (``r`` the interpreter)."""
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
    give_to_tools(prefix, tools.ids)
    progress(f"resolving {', '.join(DEBIAN_PACKAGES)} and their R dependencies with apt-cache")
    wanted = await _closure()
    progress(f"downloading {len(wanted)} Debian R packages with apt-get download")
    debs = tools.cache.parent / "apt"  # the operator's: the tools read it, never write it
    debs.mkdir(mode=0o755, parents=True, exist_ok=True)
    debs.chmod(0o755)  # the tools read the downloads through a descriptor of this folder
    await _run(["apt-get", "download", "-q", *wanted], cwd=debs)
    progress(f"unpacking {len(wanted)} packages into the library (sandboxed)")
    unpack = tools.scratch / "unpack"
    code, tail = await tools.run_tool(
        ["/bin/sh", "-c", _UNPACK, "unpack", *(str(deb) for deb in _debs(debs, wanted))],
        env={"UNPACK": str(unpack), "LIBRARY": str(library)},
        binds=[debs],
        network=False,
    )
    if code != 0:
        raise ShellyardError(f"building r-base failed: unpacking exited {code}: {tail.strip()}")
    progress("checking that R loads " + " and ".join(R_BASE_PACKAGES))
    script = (
        "suppressPackageStartupMessages({"
        + "; ".join(f"library({p})" for p in R_BASE_PACKAGES)
        + '}); cat("R_VERSION=", as.character(getRversion()), "\\n", sep="")'
    )
    code, out = await tools.run_tool(
        [rscript, "-e", script],
        env={"R_LIBS": str(library), "R_LIBS_USER": str(library), "TZ": "UTC"},
        network=False,
    )
    if code != 0:
        raise ShellyardError(f"building r-base failed: R could not load the packages: {out}")
    match = re.search(r"R_VERSION=(\d\S*)", out)
    packages = {"r": match.group(1) if match else "unknown"}
    packages.update(library_versions(library))
    return packages


#: Unpack each ``.deb`` (the arguments) and move its R packages into ``$LIBRARY`` (the first
#: of a name wins): run by the tools' uid, so nothing a package holds is written as root.
_UNPACK = """set -e
for deb in "$@"; do dpkg-deb -x "$deb" "$UNPACK"; done
for where in usr/lib/R/site-library usr/lib/R/library; do
  [ -d "$UNPACK/$where" ] || continue
  for package in "$UNPACK/$where"/*; do
    name=${package##*/}
    [ -e "$LIBRARY/$name" ] || [ -L "$LIBRARY/$name" ] || mv "$package" "$LIBRARY/$name"
  done
done
"""


def library_versions(library: Path) -> dict[str, str]:
    """{R package: version} from each ``<library>/<package>/DESCRIPTION``."""
    out: dict[str, str] = {}
    for description in sorted(library.glob("*/DESCRIPTION")):
        try:  # written by the tools: never follow a link they may have left
            fd = os.open(description, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            continue
        with os.fdopen(fd, encoding="utf-8", errors="replace") as handle:
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
