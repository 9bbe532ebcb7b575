"""Content ids (runner/snapshots/contentid.py; W3, T2–T4): a function of the content alone,
equal to the plain sha256 for content without a whole aligned MiB of zeros, a chunk list
otherwise; the same id whichever way the bytes are fed (data, holes, read back), and the
store names a committed file by it without hashing its holes."""

from __future__ import annotations

import hashlib
import os
import struct
from pathlib import Path

import pytest

from shellyard.runner import workspace_paths
from shellyard.runner.snapshots import contentid
from shellyard.runner.snapshots.blobs import ObjectStore
from shellyard.runner.snapshots.contentid import CHUNK, ContentId

MiB = 1 << 20


def reference(data: bytes) -> bytes:
    """The rule written out on whole bytes."""
    chunks = [data[i : i + CHUNK] for i in range(0, len(data), CHUNK)]
    if not any(len(c) == CHUNK and not c.strip(b"\0") for c in chunks):
        return hashlib.sha256(data).digest()
    outer = hashlib.blake2b(digest_size=32, person=contentid.PERSON)
    for i, c in enumerate(chunks):
        if c.strip(b"\0"):
            outer.update(struct.pack("<Q", i) + hashlib.sha256(c).digest())
    outer.update(struct.pack("<QQ", (1 << 64) - 1, len(data)))
    return outer.digest()


def layouts() -> list[tuple[str, list[tuple[int, bytes]], int]]:
    """(name, data pieces at offsets, size); what is not written is a hole."""
    x = b"x" * 1000
    return [
        ("empty", [], 0),
        ("small", [(0, b"hello")], 5),
        ("dense 3 MiB + 7", [(0, os.urandom(3 * MiB + 7))], 3 * MiB + 7),
        ("all hole", [], 5 * MiB),
        ("hole then tail", [(5 * MiB - 3, b"end")], 5 * MiB),
        ("data, hole, data", [(0, x), (4 * MiB + 17, x)], 6 * MiB + 1),
        ("hole just short of a chunk", [(0, x), (CHUNK + 999, x)], 3 * MiB - 1),
        ("written zero chunk after data", [(0, os.urandom(2 * MiB) + bytes(MiB) + b"y")], 0),
        ("zeros unaligned", [(0, b"a" + bytes(MiB + 10) + b"b")], 0),
        ("data at chunk edges", [(CHUNK - 1, b"ab"), (3 * CHUNK - 1, b"cd")], 3 * CHUNK + 1),
    ]


def _write(path: Path, pieces: list[tuple[int, bytes]], size: int) -> bytes:
    with open(path, "wb") as f:
        for offset, data in pieces:
            f.seek(offset)
            f.write(data)
        end = max([size, *(o + len(d) for o, d in pieces)])
        f.truncate(end)
    return path.read_bytes()


@pytest.mark.parametrize("layout", layouts(), ids=lambda t: t[0])
def test_a_committed_file_is_named_by_the_rule_whatever_its_holes(
    tmp_path: Path, layout: tuple[str, list[tuple[int, bytes]], int]
) -> None:
    _, pieces, size = layout
    content = _write(tmp_path / "f", pieces, size)
    blobs = ObjectStore(tmp_path / "objects", workers=1)
    dfd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        stored = blobs.store_file(dfd, "f")
    finally:
        os.close(dfd)
        blobs.close()
    assert stored is not None
    assert stored[0] == reference(content)
    assert stored[1] == len(content)
    with blobs.open_object(stored[0].hex()) as obj:
        assert obj.read() == content
    # fed as plain bytes in odd pieces (a pack of version 1, an upload), the same id
    fed = ContentId(reread=lambda off, n: content[off : off + n])
    for i in range(0, len(content), 333_333):
        fed.update(content[i : i + 333_333])
    assert fed.digest() == reference(content)


def test_a_chunk_list_begun_for_a_hole_that_was_filled_falls_back_to_sha256() -> None:
    """A commit sees a hole covering a MiB and begins a chunk list; the file is written
    meanwhile and what is copied holds no zero MiB: its id is still its sha256 (the rule,
    so a pack importer, which recomputes it, accepts the object)."""
    content = os.urandom(3 * MiB + 5)
    fed = ContentId(reread=lambda off, n: content[off : off + n])
    fed.chunked()
    fed.update(content)
    assert fed.digest() == hashlib.sha256(content).digest()
    empty = ContentId()
    empty.chunked()
    assert empty.digest() == hashlib.sha256(b"").digest()


def test_a_hole_is_never_hashed(tmp_path: Path) -> None:
    """The cost of a commit is its data: a 64 GiB `truncate` and a few bytes hash only
    those bytes (before: all 64 GiB, minutes of a runner's CPU)."""
    path = tmp_path / "big"
    with open(path, "wb") as f:
        f.truncate(64 << 30)
        f.seek(40 << 30)
        f.write(b"needle")
    if not workspace_paths.has_holes(path.stat()):
        pytest.skip("this file system keeps no holes")
    blobs = ObjectStore(tmp_path / "objects", workers=1)
    dfd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        stored = blobs.store_file(dfd, "big")
    finally:
        os.close(dfd)
        blobs.close()
    assert stored is not None
    assert stored[1] == 64 << 30
    # only the chunk holding data: its zeros before the needle, the needle, zeros after
    assert stored[3] <= CHUNK
    expected = ContentId()
    expected.chunked()
    expected.zeros(40 << 30)
    expected.update(b"needle")
    expected.zeros((24 << 30) - 6)
    assert stored[0] == expected.digest()


def test_the_chunk_list_is_not_a_sha256_a_file_could_have(tmp_path: Path) -> None:
    """A file whose bytes are another file's chunk list does not share its object."""
    sparse = bytes(CHUNK) + b"payload"
    listing = (
        struct.pack("<Q", 1)
        + hashlib.sha256(b"payload").digest()
        + struct.pack("<QQ", (1 << 64) - 1, len(sparse))
    )
    assert reference(sparse) != hashlib.sha256(listing).digest()
    assert reference(listing) == hashlib.sha256(listing).digest()


def test_an_object_named_before_chunk_lists_is_still_recognised(tmp_path: Path) -> None:
    content = b"a" * 10 + bytes(2 * MiB) + b"z"
    path = tmp_path / "obj"
    path.write_bytes(content)
    fd = os.open(path, os.O_RDONLY)
    try:
        assert contentid.legacy_sha256(fd, len(content)) == hashlib.sha256(content).digest()
    finally:
        os.close(fd)
    assert reference(content) != hashlib.sha256(content).digest()
