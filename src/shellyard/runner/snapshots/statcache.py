"""The stat cache: what each folder looked like when it was last walked, kept on disk.

The stat cache keeps, per folder, its entry names and each entry's (mode, mtime_ns,
ctime_ns, size, inode) as scanned, the latest mtime/ctime of its files and links, the
racy-clean clock of the walk that scanned it, and its tree (format.py) with its digest.
Folders whose record changed are appended to ``statcache.log``; the whole cache is rewritten
once the log grows past a share of it, so a commit writes what changed, amortised. A bad
cache means every file is read again, never a wrong snapshot.

Version 3 records hold entry names and tree digests; version 2 (before format 2) held full
paths and no digests: its records are read with the paths cut back to names, and the first
commit (always a full walk after a load) seals every folder again.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import struct
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from shellyard.paths import StrPath
from shellyard.runner.protocol import SnapshotInfo
from shellyard.runner.snapshots.format import (
    O_CLOEXEC,
    DirRecord,
    atomic_write,
    decode_text,
    encode_text,
    pack_ints,
    split_names,
    unpack_ints,
    write_all,
)

log = logging.getLogger(__name__)

_STATCACHE_VERSION = 3
_STATCACHE_VERSION_PATHS = 2
_STATCACHE_MAGIC = b"SYSC"
#: magic, version, number of folder records
_STATCACHE_HEADER = struct.Struct("<4sIQ")
_LOG_MAGIC = b"SYSL"
#: magic, payload length, sha256 of the payload; the payload is "<QQQ" (removed folders,
#: len(their NUL-joined paths), records), those paths, then records as in the base file
_LOG_FRAME = struct.Struct("<4sQ32s")
#: per folder record: len(path), len(scan names), len(scan stats), max_time, clock,
#: len(subdirs), n, files, total, len(names), len(targets), then (version 3) sub_files,
#: sub_total, sub_entries; version 3 adds the tree digest after the targets
_RECORD_FIELDS = {_STATCACHE_VERSION_PATHS: 11, _STATCACHE_VERSION: 14}
#: The log is folded into the stat cache once it grows past this share of it.
_LOG_MAX_SHARE = 0.25

#: A file's identity and change stamps: (inode, mtime_ns, ctime_ns, size).
Sig = tuple[int, int, int, int]


def file_sig(path: StrPath) -> Sig | None:
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    return (st.st_ino, st.st_mtime_ns, st.st_ctime_ns, st.st_size)


@dataclass
class WorkspaceState:
    """What a commit needs from disk, kept in memory between commits of a workspace."""

    head_info: SnapshotInfo
    head_sig: Sig | None
    dirs: dict[str, DirRecord]
    cache_sig: tuple[Sig | None, Sig | None]
    #: Size of the statcache base file and of its log (to decide when to fold the log).
    base_size: int = 0
    log_size: int = 0
    #: For change hints (changes.py), known only after a commit of this process: folders
    #: racily clean in the last walk (None: unknown, walk everything), folders holding
    #: hard-linked files.
    racy: set[str] | None = None
    linked: set[str] = field(default_factory=set)


def encode_records(records: Iterable[DirRecord]) -> tuple[int, bytes]:
    table: list[int] = []
    blobs: list[bytes] = []
    count = 0
    for r in records:
        count += 1
        path = encode_text(r.path)
        names = encode_text(r.scan_names)
        subdirs = encode_text("\0".join(r.subdirs))
        table += (
            len(path),
            len(names),
            len(r.scan_stats),
            r.max_time,
            r.clock,
            len(subdirs),
            r.n,
            r.files,
            r.total,
            len(r.names),
            len(r.targets),
            r.sub_files,
            r.sub_total,
            r.sub_entries,
        )
        blobs += (path, names, r.scan_stats, subdirs, r.names, r.kinds, r.modes, r.sizes)
        blobs += (r.digests, r.targets, r.digest)
    return count, pack_ints("q", table) + b"".join(blobs)


def decode_records(
    raw: bytes, off: int, count: int, end: int, version: int = _STATCACHE_VERSION
) -> Iterator[DirRecord]:
    fields = _RECORD_FIELDS[version]
    table = unpack_ints("q", raw[off : off + 8 * fields * count])
    if len(table) != fields * count:
        raise ValueError("stat cache is truncated")
    off += 8 * fields * count

    def take(size: int) -> bytes:
        nonlocal off
        if size < 0 or off + size > end:
            raise ValueError("stat cache is truncated")
        off += size
        return raw[off - size : off]

    for k in range(count):
        row = table[fields * k : fields * (k + 1)]
        plen, snlen, sslen, max_time, clock, sdlen, n, files, total, nlen, tlen = row[:11]
        path = decode_text(take(plen))
        scan_names = decode_text(take(snlen))
        scan_stats = take(sslen)
        subdirs = decode_text(take(sdlen))
        names = take(nlen)
        if version == _STATCACHE_VERSION_PATHS and n and path:
            cut = len(encode_text(path)) + 1  # full paths, as version 2 kept them
            names = b"\0".join(full[cut:] for full in names.split(b"\0"))
        kinds, modes, sizes, digests, targets = (
            take(n),
            take(4 * n),
            take(8 * n),
            take(32 * n),
            take(tlen),
        )
        extra: dict[str, Any] = {}
        if version == _STATCACHE_VERSION:
            extra = dict(sub_files=row[11], sub_total=row[12], sub_entries=row[13], digest=take(32))
        yield DirRecord(
            path=path,
            scan_names=scan_names,
            scan_stats=scan_stats,
            max_time=max_time,
            clock=clock,
            subdirs=tuple(subdirs.split("\0")) if subdirs else (),
            n=n,
            files=files,
            total=total,
            names=names,
            kinds=kinds,
            modes=modes,
            sizes=sizes,
            digests=digests,
            targets=targets,
            **extra,
        )
    if off != end:
        raise ValueError("stat cache has trailing bytes")


def apply_delta(
    state: WorkspaceState, changed: dict[str, DirRecord], removed: Iterable[str]
) -> None:
    """Bring the records in memory to the tree a walk found (in place: what changed)."""
    dirs = state.dirs
    for path in removed:
        dirs.pop(path, None)
    dirs.update(changed)


def save_statcache(
    wdir: Path, state: WorkspaceState, changed: dict[str, DirRecord], removed: set[str]
) -> int:
    """Record the folders whose record changed (``state.dirs`` already holds them):
    appended to the log, or the whole cache rewritten when the log has grown past a share
    of it. The bytes written."""
    if not changed and not removed:
        return 0
    count, records = encode_records(changed.values())
    gone = encode_text("\0".join(sorted(removed)))
    payload = struct.pack("<QQQ", len(removed), len(gone), count) + gone + records
    frame_size = _LOG_FRAME.size + len(payload)
    if state.base_size and state.log_size + frame_size <= _LOG_MAX_SHARE * state.base_size:
        frame = _LOG_FRAME.pack(_LOG_MAGIC, len(payload), hashlib.sha256(payload).digest())
        fd = os.open(
            wdir / "statcache.log", os.O_WRONLY | os.O_APPEND | os.O_CREAT | O_CLOEXEC, 0o600
        )
        try:
            write_all(fd, frame + payload)
        finally:
            os.close(fd)
        state.log_size += frame_size
        written = frame_size
    else:
        count, records = encode_records(state.dirs.values())
        header = _STATCACHE_HEADER.pack(_STATCACHE_MAGIC, _STATCACHE_VERSION, count)
        atomic_write(wdir / "statcache", header, records)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(wdir / "statcache.log")
        state.base_size = len(header) + len(records)
        state.log_size = 0
        written = state.base_size
    state.cache_sig = (file_sig(wdir / "statcache"), file_sig(wdir / "statcache.log"))
    return written


def load_statcache(wdir: Path, state: WorkspaceState) -> None:
    """Load the stat cache and replay its log into ``state`` (a bad cache means every
    file is read again, never a wrong snapshot)."""
    try:
        raw = (wdir / "statcache").read_bytes()
    except FileNotFoundError:
        return
    dirs: dict[str, DirRecord] = {}
    try:
        magic, version, count = _STATCACHE_HEADER.unpack_from(raw)
        if magic != _STATCACHE_MAGIC or version not in _RECORD_FIELDS:
            raise ValueError("unknown stat cache format")
        for r in decode_records(raw, _STATCACHE_HEADER.size, count, len(raw), version):
            dirs[r.path] = r
    except (ValueError, struct.error, UnicodeDecodeError) as exc:
        log.warning("ignoring unreadable stat cache %s: %s", wdir / "statcache", exc)
        return
    state.dirs = dirs
    # an older version's cache is rewritten whole by the next save (its log is of that
    # version too, and new frames must not follow old ones)
    state.base_size = len(raw) if version == _STATCACHE_VERSION else 0
    try:
        logged = (wdir / "statcache.log").read_bytes()
    except FileNotFoundError:
        return
    off = 0
    while off + _LOG_FRAME.size <= len(logged):
        magic, length, digest = _LOG_FRAME.unpack_from(logged, off)
        start = off + _LOG_FRAME.size
        payload = logged[start : start + length]
        if (
            magic != _LOG_MAGIC
            or len(payload) != length
            or hashlib.sha256(payload).digest() != digest
        ):
            break  # a torn last append: what follows is ignored
        try:
            nremoved, glen, count = struct.unpack_from("<QQQ", payload)
            gone = split_names(payload[24 : 24 + glen], nremoved)
            records = list(decode_records(payload, 24 + glen, count, len(payload), version))
        except (ValueError, struct.error, UnicodeDecodeError):
            break
        for path in gone:
            dirs.pop(path, None)
        for r in records:
            dirs[r.path] = r
        off = start + length
    if off < len(logged):  # drop a torn tail so later appends stay readable
        os.truncate(wdir / "statcache.log", off)
    state.log_size = off
