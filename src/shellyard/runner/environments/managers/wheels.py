"""Local package files (wheels, sdists) copied into the environments' content-addressed store
before pip installs them (docs/environments.md).

A file named by ``find_links`` or ``name @ file://…`` may be in the caller's workspace, where
it can change or vanish right after the install. So it is read once, streamed into
``<store>/<sha256>`` (hashed on the way), and the install reads a link of that copy in the
change's scratch folder: what uv installs is exactly the bytes whose sha256 the revision
records, and the store keeps them for as long as the runner keeps its environments.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

#: The files of a find_links folder pip may use (what uv's flat index reads).
PACKAGE_SUFFIXES = (".whl", ".tar.gz", ".zip", ".tar.bz2", ".tgz")


def stash(source: Path, store: Path, into: Path) -> tuple[Path, str]:
    """Copy ``source`` into ``store`` under its sha256 (once), and link it as
    ``into/<its name>``; returns that link and the sha256."""
    store.mkdir(mode=0o755, parents=True, exist_ok=True)
    digest = hashlib.sha256()
    temp = store / f".tmp-{os.getpid()}-{source.name}"
    with source.open("rb") as reader, temp.open("wb") as writer:
        for chunk in iter(lambda: reader.read(1 << 20), b""):
            digest.update(chunk)
            writer.write(chunk)
    sha = digest.hexdigest()
    stored = store / sha
    if stored.exists():
        temp.unlink()
    else:
        os.chmod(temp, 0o444)
        os.replace(temp, stored)
    into.mkdir(mode=0o700, parents=True, exist_ok=True)
    target = into / source.name
    try:
        os.link(stored, target)
    except OSError:  # another filesystem: a copy is as good (the store holds the original)
        shutil.copyfile(stored, target)
    return target, sha


def stash_folder(folder: Path, store: Path, into: Path) -> dict[str, str]:
    """Every package file directly in ``folder`` (links to files included), stashed into
    ``into``; returns {file name: sha256}."""
    hashes: dict[str, str] = {}
    into.mkdir(mode=0o700, parents=True, exist_ok=True)  # uv reads it even when empty
    for entry in sorted(folder.iterdir()):
        if entry.name.endswith(PACKAGE_SUFFIXES) and entry.is_file():
            _link, sha = stash(entry, store, into)
            hashes[entry.name] = sha
    return hashes
