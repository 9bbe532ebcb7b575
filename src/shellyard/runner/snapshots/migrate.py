"""Converting a workspace's format 1 manifests (one flat listing each) to format 2 (trees).

Run by the store, under the workspace's lock, the first time it opens a workspace that still
has a format 1 manifest. Each manifest is converted on its own: its trees are written first,
then the manifest is replaced (temp + rename) by a format 2 header naming the root tree, with
the same number, creation time, files and bytes. A crash in between leaves either the old
manifest (converted again next time) or the new one (its trees are already there), never a
manifest naming a missing tree.

The converted snapshot's ``root_hash`` becomes its root tree's digest (format 1's was the
sha256 of the flat listing): equal trees keep equal root hashes across the upgrade, so the
first commit after it of an unchanged tree makes no new snapshot, and a restore of an old
snapshot gives the root hash it has now. A version from before format 2 cannot read a
converted store (no downgrade).
"""

from __future__ import annotations

import hashlib
import logging
import os
from dataclasses import replace
from pathlib import Path

from shellyard.runner.snapshots.format import (
    KIND_DIR,
    KIND_FILE,
    MANIFEST_HEADER,
    MANIFEST_VERSION_FLAT,
    DirRecord,
    Manifest,
    atomic_write,
    decode_flat_manifest,
    encode_text,
    encode_tree,
    pack_header,
    pack_ints,
)
from shellyard.runner.snapshots.trees import write_tree

log = logging.getLogger(__name__)


def trees_of(m: Manifest) -> tuple[bytes, dict[bytes, bytes]]:
    """(root tree digest, blobs by digest) of a flat manifest."""
    groups: dict[str, list[int]] = {"": []}
    for i, path in enumerate(m.paths):
        groups.setdefault(path.rpartition("/")[0], []).append(i)
        if m.kinds[i] == KIND_DIR:
            groups.setdefault(path, [])
    sealed: dict[str, DirRecord] = {}
    blobs: dict[bytes, bytes] = {}
    for folder in sorted(groups, key=lambda p: p.count("/") + 1 if p else 0, reverse=True):
        cut = len(folder) + 1 if folder else 0
        members = sorted(groups[folder], key=lambda i: m.paths[i][cut:])
        digests: list[bytes] = []
        files = total = 0
        sub_files = sub_total = sub_entries = 0
        for i in members:
            kind = m.kinds[i]
            if kind == KIND_DIR:
                child = sealed[m.paths[i]]
                digests.append(child.digest)
                sub_files += child.sub_files
                sub_total += child.sub_total
                sub_entries += child.sub_entries
            else:
                digests.append(m.digests[32 * i : 32 * i + 32])
                if kind == KIND_FILE:
                    files += 1
                    total += m.sizes[i]
        rec = DirRecord(
            path=folder,
            scan_names="",
            scan_stats=b"",
            max_time=0,
            clock=0,
            subdirs=(),
            n=len(members),
            files=files,
            total=total,
            names=encode_text("\0".join(m.paths[i][cut:] for i in members)),
            kinds=bytes(m.kinds[i] for i in members),
            modes=pack_ints("I", (m.modes[i] for i in members)),
            sizes=pack_ints("q", (m.sizes[i] for i in members)),
            digests=b"".join(digests),
            targets=encode_text("\0".join(m.targets[i] for i in members)),
            sub_files=files + sub_files,
            sub_total=total + sub_total,
            sub_entries=len(members) + sub_entries,
        )
        blob = encode_tree(rec)
        digest = hashlib.sha256(blob).digest()
        blobs[digest] = blob
        sealed[folder] = replace(rec, digest=digest)
    return sealed[""].digest, blobs


def flat_manifests(wdir: Path) -> list[int]:
    """The seqs of the workspace's manifests still in format 1."""
    seqs: list[int] = []
    folder = wdir / "manifests"
    if not folder.is_dir():
        return seqs
    for name in os.listdir(folder):
        if not name.isdigit():
            continue
        try:
            with open(folder / name, "rb") as f:
                raw = f.read(MANIFEST_HEADER.size)
        except FileNotFoundError:
            continue
        if len(raw) == MANIFEST_HEADER.size and MANIFEST_HEADER.unpack(raw)[1] == (
            MANIFEST_VERSION_FLAT
        ):
            seqs.append(int(name))
    return sorted(seqs)


def migrate_workspace(wdir: Path, workspace_id: str) -> int:
    """Convert every format 1 manifest of the workspace; how many were converted. The
    stat cache is left as it is (statcache.py reads the older records)."""
    seqs = flat_manifests(wdir)
    for seq in seqs:
        path = wdir / "manifests" / str(seq)
        m = decode_flat_manifest(workspace_id, seq, path.read_bytes())
        root, blobs = trees_of(m)
        for digest, blob in blobs.items():
            write_tree(wdir, digest, blob)
        header = pack_header(m.info.created_at, m.info.files, m.info.bytes, root)
        atomic_write(path, header)
    if seqs:
        log.info(
            "converted %d snapshot manifests of workspace %s to folder trees",
            len(seqs),
            workspace_id,
        )
    return len(seqs)


__all__ = ["flat_manifests", "migrate_workspace", "trees_of"]
