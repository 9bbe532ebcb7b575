"""A local CRAN-like repository of small pure-R packages the tests build themselves.

``build_test_repo(root)`` makes ``root/src/contrib`` with ``shellyardhello`` 1.0 (one
function), ``shellyardgreet`` (imports shellyardhello, to exercise dependencies) and
``shellyardbroken`` (fails while installing), built with ``R CMD build`` and indexed with
``tools::write_PACKAGES``. Pass ``root.as_uri()`` as a repository of an install request.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class RPackage:
    name: str
    version: str
    #: R source files under R/, by file name.
    code: dict[str, str]
    exports: list[str] = field(default_factory=list)
    imports: list[str] = field(default_factory=list)


def standard_packages() -> list[RPackage]:
    return [
        RPackage(
            "shellyardhello",
            "1.0",
            {"hello.R": 'shellyard_hello <- function() "hello from R"\n'},
            exports=["shellyard_hello"],
        ),
        RPackage(
            "shellyardgreet",
            "0.5",
            {
                "greet.R": "shellyard_greet <- function()\n"
                "  paste(shellyardhello::shellyard_hello(), 'and greetings')\n"
            },
            exports=["shellyard_greet"],
            imports=["shellyardhello"],
        ),
        RPackage(
            "shellyardbroken",
            "0.1",
            {"zzz.R": 'stop("shellyardbroken refuses to install")\n'},
        ),
    ]


def r_available() -> bool:
    return shutil.which("Rscript") is not None and shutil.which("R") is not None


def _write_source(folder: Path, package: RPackage) -> None:
    (folder / "R").mkdir(parents=True)
    lines = [
        f"Package: {package.name}",
        f"Version: {package.version}",
        "Title: A Tiny Package for Shellyard Tests",
        "Description: Exists so tests can install a real package from a local repository.",
        "Author: Shellyard",
        "Maintainer: Shellyard <shellyard@example.invalid>",
        "License: MIT",
    ]
    if package.imports:
        lines.append("Imports: " + ", ".join(package.imports))
    (folder / "DESCRIPTION").write_text("\n".join(lines) + "\n")
    namespace = [f"export({name})" for name in package.exports]
    namespace += [f"import({name})" for name in package.imports]
    (folder / "NAMESPACE").write_text("\n".join(namespace) + "\n")
    for name, code in package.code.items():
        (folder / "R" / name).write_text(code)


def build_r_package(contrib: Path, package: RPackage) -> Path:
    """``R CMD build`` one package into ``contrib`` and return the tarball."""
    with tempfile.TemporaryDirectory(prefix="shellyard-rpkg-") as tmp:
        source = Path(tmp) / package.name
        _write_source(source, package)
        subprocess.run(
            ["R", "CMD", "build", "--no-build-vignettes", "--no-manual", package.name],
            cwd=tmp,
            check=True,
            capture_output=True,
        )
        tarball = f"{package.name}_{package.version}.tar.gz"
        contrib.mkdir(parents=True, exist_ok=True)
        shutil.move(str(Path(tmp) / tarball), contrib / tarball)
    return contrib / tarball


def index_repo(root: Path) -> None:
    contrib = root / "src" / "contrib"
    subprocess.run(
        ["Rscript", "-e", f'tools::write_PACKAGES("{contrib}", type = "source")'],
        check=True,
        capture_output=True,
    )


def build_test_repo(root: Path, packages: list[RPackage] | None = None) -> Path:
    """Build and index a repository at ``root`` (the standard packages by default)."""
    contrib = root / "src" / "contrib"
    for package in standard_packages() if packages is None else packages:
        build_r_package(contrib, package)
    index_repo(root)
    return root
