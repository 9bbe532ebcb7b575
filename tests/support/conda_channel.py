"""A local conda channel of small real packages the tests build themselves (no network).

The packages use the ``.tar.bz2`` format (``info/index.json``, ``info/paths.json``,
``info/files`` and the payload) and are indexed with ``rattler.index.index_fs``, so the
conda manager reads the channel exactly as it would read a published one. Reusable by any
test: ``build_test_channel(root)`` returns the channel folder; pass ``channel.as_uri()`` as a
channel of an install request.
"""

from __future__ import annotations

import asyncio
import hashlib
import io
import json
import tarfile
import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from rattler.index import index_fs


@dataclass
class PackageFile:
    data: bytes
    mode: int = 0o644
    #: Marks a text file that carries ``prefix_placeholder`` (replaced with the prefix at link).
    prefix_placeholder: str | None = None


@dataclass
class CondaPackage:
    name: str
    version: str
    files: Mapping[str, PackageFile]
    depends: list[str] = field(default_factory=list)
    build_number: int = 0
    subdir: str = "noarch"


#: A placeholder long enough for any test prefix (conda's rule: as long as a real prefix).
PLACEHOLDER = "/opt/shellyard-placeholder-prefix-" + "p" * 60


def _tar_add(tar: tarfile.TarFile, path: str, data: bytes, mode: int) -> None:
    info = tarfile.TarInfo(path)
    info.size = len(data)
    info.mode = mode
    info.mtime = 1_700_000_000
    tar.addfile(info, io.BytesIO(data))


def build_conda_package(channel: Path, package: CondaPackage) -> Path:
    """Write one package into ``channel/<subdir>/`` and return the archive's path."""
    build = f"{package.build_number}"
    index: dict[str, object] = {
        "name": package.name,
        "version": package.version,
        "build": build,
        "build_number": package.build_number,
        "depends": package.depends,
        "license": "MIT",
        "subdir": package.subdir,
        "timestamp": int(time.time() * 1000),
    }
    if package.subdir == "noarch":
        index["noarch"] = "generic"
    else:
        index["arch"] = "x86_64"
        index["platform"] = "linux"
    paths = []
    for rel, file in sorted(package.files.items()):
        entry: dict[str, object] = {
            "_path": rel,
            "path_type": "hardlink",
            "sha256": hashlib.sha256(file.data).hexdigest(),
            "size_in_bytes": len(file.data),
        }
        if file.prefix_placeholder is not None:
            entry["prefix_placeholder"] = file.prefix_placeholder
            entry["file_mode"] = "text"
        paths.append(entry)
    subdir = channel / package.subdir
    subdir.mkdir(parents=True, exist_ok=True)
    archive = subdir / f"{package.name}-{package.version}-{build}.tar.bz2"
    with tarfile.open(archive, "w:bz2") as tar:
        meta = {
            "info/index.json": json.dumps(index, indent=2).encode(),
            "info/paths.json": json.dumps({"paths": paths, "paths_version": 1}).encode(),
            "info/files": "".join(f"{rel}\n" for rel in sorted(package.files)).encode(),
        }
        for path, data in meta.items():
            _tar_add(tar, path, data, 0o644)
        for rel, file in sorted(package.files.items()):
            _tar_add(tar, rel, file.data, file.mode)
    return archive


def script(text: str) -> PackageFile:
    return PackageFile(f"#!/bin/sh\n{text}\n".encode(), 0o755)


def standard_packages() -> list[CondaPackage]:
    """``shellyard-hello`` 1.0 and 2.0 (a script), ``shellyard-greeter`` needing hello >=2
    and ``shellyard-words``; ``shellyard-sneaky`` carries a post-link script that must not run;
    ``shellyard-placeholder`` has a text file whose prefix placeholder is replaced at link."""
    return [
        CondaPackage("shellyard-hello", "1.0", {"bin/shellyard-hello": script("echo hello 1.0")}),
        CondaPackage("shellyard-hello", "2.0", {"bin/shellyard-hello": script("echo hello 2.0")}),
        CondaPackage(
            "shellyard-words",
            "1.0",
            {"share/shellyard-words/words.txt": PackageFile(b"hello\nworld\n")},
        ),
        CondaPackage(
            "shellyard-greeter",
            "1.0",
            {"bin/shellyard-greeter": script('shellyard-hello && echo "greeted $1"')},
            depends=["shellyard-hello >=2", "shellyard-words"],
        ),
        CondaPackage(
            "shellyard-sneaky",
            "1.0",
            {
                "bin/.shellyard-sneaky-post-link.sh": script(
                    'touch "$PREFIX/post-link-ran"; touch /tmp/shellyard-post-link-ran'
                ),
                "share/shellyard-sneaky/readme.txt": PackageFile(b"sneaky\n"),
            },
        ),
        CondaPackage(
            "shellyard-placeholder",
            "1.0",
            {
                "etc/shellyard-placeholder.conf": PackageFile(
                    f"prefix={PLACEHOLDER}\n".encode(), prefix_placeholder=PLACEHOLDER
                )
            },
        ),
    ]


async def index_channel(channel: Path) -> None:
    (channel / "noarch").mkdir(parents=True, exist_ok=True)
    await index_fs(channel, write_zst=False, write_shards=False, force=True)


async def build_test_channel(root: Path, packages: Iterable[CondaPackage] | None = None) -> Path:
    """Build and index a channel folder at ``root`` (the standard packages by default)."""
    root.mkdir(parents=True, exist_ok=True)
    for package in standard_packages() if packages is None else packages:
        build_conda_package(root, package)
    await index_channel(root)
    return root


def build_test_channel_sync(root: Path, packages: Iterable[CondaPackage] | None = None) -> Path:
    """The same, from synchronous code or from inside a running event loop."""
    result: list[Path] = []
    errors: list[BaseException] = []

    def target() -> None:
        try:
            result.append(asyncio.run(build_test_channel(root, packages)))
        except BaseException as exc:  # handed to the caller's thread below
            errors.append(exc)

    thread = threading.Thread(target=target)
    thread.start()
    thread.join()
    if errors:
        raise errors[0]
    return result[0]
