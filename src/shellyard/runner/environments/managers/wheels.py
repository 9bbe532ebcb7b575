"""Local package files (wheels, sdists) copied into the environments' content-addressed store
before pip installs them (docs/environments.md).

A file named by ``find_links`` or ``name @ file://…`` may be in the caller's workspace, where
it can change or vanish right after the install. So it is read once, streamed into
``<store>/<sha256>`` (hashed on the way), and the install reads a copy of that in the change's
scratch folder: what uv installs is exactly the bytes whose sha256 the revision records, and
the store keeps them for as long as the runner keeps its environments.

The runner never opens a path the caller named as root (docs/environments.md, "Package tools
run as the sandbox uid"): a small reader process, dropped to the tools' uid by ``front``
(``launch.prefix``), walks the path one component at a time with ``O_NOFOLLOW`` and streams
the files' bytes to the runner through a pipe. A symbolic link anywhere on the way, or in a
``find_links`` folder, is refused: a link to the runner's token or a host key yields nothing,
and even a link the reader could follow runs into what the sandbox uid may read. The store
is 0700 and its files 0400 (root's): no other local user reads another session's packages.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from shellyard.runner.environments.managers.base import ManagerError

#: The files of a find_links folder pip may use (what uv's flat index reads).
PACKAGE_SUFFIXES = (".whl", ".tar.gz", ".zip", ".tar.bz2", ".tgz")

#: Interpreters the reader may run with once dropped to the tools' uid.
READER_PYTHONS = ("/usr/bin/python3", "/usr/local/bin/python3")

#: The reader, run as the tools' uid with ``python -I -c``: argv[1] is ``file`` or
#: ``folder``, argv[2] the path. It writes one JSON header line per file ({"name", "size"})
#: followed by exactly ``size`` bytes, then {"end": true}; or {"error": …} and stops.
_READER = r"""
import json, os, stat, sys
out = sys.stdout.buffer
def fail(text):
    out.write((json.dumps({"error": text}) + "\n").encode()); out.flush(); sys.exit(0)
def walk(path):
    fd = os.open("/", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    parts = [p for p in path.split("/") if p]
    for i, part in enumerate(parts):
        last = i == len(parts) - 1
        # folders on the way need only search rights (O_PATH): a 0711 home is crossed; the
        # last is opened O_NONBLOCK: a FIFO there would block the open for ever (send then
        # refuses what is not a regular file)
        way = os.O_RDONLY | os.O_NONBLOCK if last else os.O_PATH | os.O_DIRECTORY
        flags = way | os.O_NOFOLLOW | os.O_CLOEXEC
        try:
            nxt = os.open(part, flags, dir_fd=fd)
        except OSError as exc:
            fail(f"{'/' + '/'.join(parts[:i + 1])}: {exc.strerror}")
        os.close(fd)
        fd = nxt
    return fd
def send(name, fd):
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        fail(f"{name} is not a regular file")
    if st.st_size > 65536 and st.st_blocks * 512 < st.st_size // 2:
        # holes: a package file is compressed, never sparse; its zeros would be copied by
        # root at their apparent size, past the free-space reserve (docs/security.md)
        fail(f"{name} is a sparse file ({st.st_size} bytes, {st.st_blocks * 512} on disk)")
    out.write((json.dumps({"name": name, "size": st.st_size}) + "\n").encode())
    left = st.st_size
    while left:
        chunk = os.read(fd, min(left, 1 << 20))
        if not chunk:
            fail(f"{name} shrank while it was read")
        out.write(chunk)
        left -= len(chunk)
    os.close(fd)
kind, path = sys.argv[1], sys.argv[2]
fd = walk(path)
if kind == "file":
    send(os.path.basename(path), fd)
else:
    suffixes = tuple(sys.argv[3].split(","))
    for name in sorted(os.listdir(fd)):
        if not name.endswith(suffixes):
            continue
        st = os.stat(name, dir_fd=fd, follow_symlinks=False)
        if stat.S_ISLNK(st.st_mode):
            fail(f"{path}/{name} is a symbolic link")
        if stat.S_ISREG(st.st_mode):
            # O_NONBLOCK: a FIFO swapped in since the stat would block the open for ever
            flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
            send(name, os.open(name, flags, dir_fd=fd))
out.write(b'{"end": true}\n'); out.flush()
"""


@dataclass(frozen=True)
class Stashed:
    name: str
    sha256: str
    copy: Path


def stash(source: Path, store: Path, into: Path, front: Sequence[str] = ()) -> tuple[Path, str]:
    """Copy the file ``source`` into ``store`` under its sha256 (once), and as ``into/<its
    name>``; returns that copy and the sha256."""
    files = _read(["file", str(source)], store, into, front)
    if len(files) != 1:
        raise ManagerError("failed", f"reading {source} gave {len(files)} files, not one")
    return files[0].copy, files[0].sha256


def stash_folder(
    folder: Path,
    store: Path,
    into: Path,
    front: Sequence[str] = (),
    suffixes: Sequence[str] = PACKAGE_SUFFIXES,
) -> dict[str, str]:
    """Every package file directly in ``folder`` (names ending in ``suffixes``), stashed
    into ``into``; returns {file name: sha256}. A symbolic link among them is refused, not
    followed."""
    into.mkdir(mode=0o755, parents=True, exist_ok=True)  # uv reads it even when empty
    files = _read(["folder", str(folder), ",".join(suffixes)], store, into, front)
    return {f.name: f.sha256 for f in files}


def _read(args: list[str], store: Path, into: Path, front: Sequence[str]) -> list[Stashed]:
    store.mkdir(mode=0o700, parents=True, exist_ok=True)
    store.chmod(0o700)
    into.mkdir(mode=0o755, parents=True, exist_ok=True)
    argv = [*front, _interpreter(bool(front)), "-I", "-c", _READER, *args]
    reader = subprocess.Popen(
        argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd="/"
    )
    assert reader.stdout is not None and reader.stderr is not None
    out: list[Stashed] = []
    error: str | None = None
    try:
        while True:
            line = reader.stdout.readline()
            if not line:
                error = "the reader stopped early"
                break
            header = json.loads(line)
            if "error" in header:
                error = str(header["error"])
                break
            if header.get("end"):
                break
            name = os.path.basename(str(header["name"]))
            out.append(_store_one(reader.stdout, name, int(header["size"]), store, into))
    finally:
        reader.stdout.close()
        stderr = reader.stderr.read().decode("utf-8", "replace")[-500:]
        reader.stderr.close()
        reader.wait()
    if error is not None:
        detail = error if error != "the reader stopped early" else f"{error}: {stderr.strip()}"
        raise ManagerError(
            "not_found" if "No such file" in detail else "invalid_spec",
            f"local package source {args[1]} could not be read as the sandbox user ({detail}); "
            f"local sources are read without following symbolic links: put the files "
            f"themselves in your workspace",
        )
    return out


def _interpreter(dropped: bool) -> str:
    """A Python the tools' uid can run: the runner's own may live where only root reaches
    (a pyenv under /root); the system's is world-readable."""
    if dropped:
        for candidate in READER_PYTHONS:
            if os.access(candidate, os.X_OK):
                return candidate
    return sys.executable


def _store_one(pipe: IO[bytes], name: str, size: int, store: Path, into: Path) -> Stashed:
    digest = hashlib.sha256()
    temp = store / f".tmp-{os.getpid()}-{name}"
    left = size
    with temp.open("wb") as writer:
        while left:
            chunk = pipe.read(min(left, 1 << 20))
            if not chunk:
                temp.unlink()
                raise ManagerError("failed", f"{name}: the reader stopped in the middle")
            digest.update(chunk)
            writer.write(chunk)
            left -= len(chunk)
    sha = digest.hexdigest()
    stored = store / sha
    if stored.exists():
        temp.unlink()
    else:
        os.chmod(temp, 0o400)
        os.replace(temp, stored)
    target = into / name
    # a copy the tool may read (the store stays root's alone), made read-only for it
    temp_copy = into / f".{name}.tmp"
    shutil.copyfile(stored, temp_copy)
    os.chmod(temp_copy, 0o444)
    os.replace(temp_copy, target)
    return Stashed(name, sha, target)
