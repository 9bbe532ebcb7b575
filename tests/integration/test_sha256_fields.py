"""A field named ``sha256`` is a SHA-256 (contract: "Artifact … workspace, snapshot, path,
sha256, size"; docs/files-and-transfers.md "Snapshots", "Artifacts"): for a file whose
content id is a chunk list (it holds a whole zero MiB: runner/snapshots/contentid.py) stat,
listings, diffs, reads and upload answers show ``sha256: null`` and the id as ``content_id``;
an artifact of it records the real SHA-256, hashed from its bytes; a dense file shows
``sha256 == content_id == hashlib.sha256`` everywhere."""

from __future__ import annotations

import hashlib
import os

import pytest
from files_helpers import chunks_of, object_file, read_all, run, runner_root, tree

from conftest import Yard
from shellyard.contract.files import FileDiffQuery, FileReadTextQuery, FileStatQuery
from shellyard.control.files.artifacts import MAX_SPARSE_ARTIFACT_BYTES
from shellyard.errors import InvalidInput

MiB = 1 << 20
#: data, a whole zero MiB as a hole (at 2 MiB), data: a chunk-list content id
SPARSE = (
    "head -c 2097152 /dev/urandom > sparse.bin && truncate -s 4M sparse.bin"
    " && printf tail >> sparse.bin"
)
#: 3 MiB of random bytes: no zero MiB, its content id is its sha256
DENSE = "head -c 3145728 /dev/urandom > dense.bin"


async def _sha256_of(yard: Yard, workspace_id: str, path: str, **where: object) -> str:
    return hashlib.sha256(
        await read_all(yard.plane, path, workspace_id=workspace_id, **where)
    ).hexdigest()


async def test_a_sparse_files_sha256_is_null_or_real_and_its_content_id_is_set(
    yard: Yard,
) -> None:
    """Stat, listing, diff and a text read of a file with a zero MiB: ``sha256`` is None
    (before: the chunk-list id, which no ``sha256sum`` prints) and ``content_id`` is set; a
    dense file beside it: ``sha256 == content_id == hashlib.sha256(bytes)``."""
    plane = yard.plane
    first = await run(plane, "true", yard.runner_id)
    ws = first.workspace_id
    made = await run(plane, f"{SPARSE} && {DENSE}", yard.runner_id)
    real = await _sha256_of(yard, ws, "sparse.bin")
    dense_real = await _sha256_of(yard, ws, "dense.bin")

    sparse = await plane.files.stat(FileStatQuery(path="sparse.bin", workspace_id=ws))
    assert sparse.size == 4 * MiB + 4
    assert sparse.sha256 in (None, real), sparse
    assert sparse.sha256 is None and sparse.content_id is not None
    assert sparse.content_id != real  # a chunk list: the case the field must not carry
    dense = await plane.files.stat(FileStatQuery(path="dense.bin", workspace_id=ws))
    assert dense.sha256 == dense.content_id == dense_real

    listed = await tree(plane, ws)
    assert (listed["sparse.bin"].sha256, listed["sparse.bin"].content_id) == (
        None,
        sparse.content_id,
    )
    assert listed["dense.bin"].sha256 == listed["dense.bin"].content_id == dense_real

    diff = await plane.files.diff(FileDiffQuery(from_seq=0, workspace_id=ws))
    changes = {c.path: c for c in diff.changes}
    assert changes["sparse.bin"].new_sha256 is None
    assert changes["sparse.bin"].new_content_id == sparse.content_id
    assert changes["dense.bin"].new_sha256 == changes["dense.bin"].new_content_id == dense_real

    text = await plane.files.read_text(
        FileReadTextQuery(path="sparse.bin", workspace_id=ws, limit=16)
    )
    assert (text.sha256, text.content_id) == (None, sparse.content_id)
    stream = await plane.files.open("sparse.bin", workspace_id=ws)
    assert (stream.entry.sha256, stream.entry.content_id) == (None, sparse.content_id)
    async for _ in stream.chunks:
        pass
    assert made.workspace_id == ws


async def test_an_upload_answer_never_carries_a_chunk_list_as_its_sha256(yard: Yard) -> None:
    """W3: an upload of content holding a zero MiB answers ``sha256: null`` and the content
    id its snapshot names it by; a dense upload of 2 MiB answers its real sha256 as both."""
    plane = yard.plane
    holey = os.urandom(MiB) + bytes(2 * MiB) + b"end"
    edit = await plane.files.write("up.bin", chunks_of(holey), runner_id=yard.runner_id)
    ws = edit.workspace_id
    entry = await plane.files.stat(FileStatQuery(path="up.bin", workspace_id=ws))
    assert edit.written[0].sha256 is None
    assert edit.written[0].content_id == entry.content_id is not None
    dense = os.urandom(2 * MiB)
    edit = await plane.files.write("dense.bin", chunks_of(dense), workspace_id=ws)
    real = hashlib.sha256(dense).hexdigest()
    assert edit.written[0].sha256 == edit.written[0].content_id == real


@pytest.mark.runner_kinds("local")
async def test_an_artifact_of_a_sparse_file_records_its_real_sha256(yard: Yard) -> None:
    """T5: the artifact's ``sha256`` is hashlib's over the bytes read back (before: the
    chunk-list id), its ``content_id`` the snapshot's; a dense artifact reuses its id."""
    plane = yard.plane
    made = await run(plane, f"{SPARSE} && {DENSE}")
    ws = made.workspace_id
    entry = await plane.files.stat(FileStatQuery(path="sparse.bin", workspace_id=ws))
    artifact = await plane.artifacts.declare("sparse.bin")
    stream = await plane.artifacts.open(artifact.artifact_id)
    data = b"".join([c async for c in stream.chunks])
    assert artifact.sha256 == hashlib.sha256(data).hexdigest() != entry.content_id
    assert stream.entry.sha256 == artifact.sha256  # its download's X-Shellyard-Sha256
    assert artifact.content_id == entry.content_id
    assert (await plane.artifacts.get(artifact.artifact_id)).sha256 == artifact.sha256
    dense = await plane.artifacts.declare("dense.bin")
    real = await _sha256_of(yard, ws, "dense.bin")
    assert dense.sha256 == dense.content_id == real


@pytest.mark.runner_kinds("local")
async def test_a_sparse_artifact_too_big_to_hash_is_refused_saying_what_to_do(
    yard: Yard,
) -> None:
    """A file of holes above ``MAX_SPARSE_ARTIFACT_BYTES`` (its SHA-256 would cost hashing
    all of it) is refused before any hashing, with the sparse-aware archive to declare
    instead; nothing is recorded."""
    size = MAX_SPARSE_ARTIFACT_BYTES + MiB
    await run(plane := yard.plane, f"truncate -s {size} disk.img")
    with pytest.raises(InvalidInput, match=r"tar -cSzf disk\.img\.tar\.gz disk\.img"):
        await plane.artifacts.declare("disk.img")
    assert await plane.artifacts.list() == []


async def test_the_store_marks_a_chunk_list_until_gc_collects_its_object(yard: Yard) -> None:
    """The runner tells a chunk-list id from a sha256 by a marker its store makes with the
    object; GC removes the marker with the object (else one empty file per sparse file ever
    committed would stay forever)."""
    plane = yard.plane
    holey = os.urandom(MiB) + bytes(2 * MiB) + b"end"
    edit = await plane.files.write("up.bin", chunks_of(holey), runner_id=yard.runner_id)
    ws = edit.workspace_id
    entry = await plane.files.stat(FileStatQuery(path="up.bin", workspace_id=ws))
    assert entry.content_id is not None and entry.sha256 is None
    marker = runner_root(yard) / "snapshots" / "objects" / "chunk-lists" / entry.content_id
    assert marker.exists()
    await plane.files.delete("up.bin", workspace_id=ws)
    result = await plane.files.collect(keep_last=1, grace_s=0)
    assert not result.errors and result.collected[yard.runner_id].objects_removed >= 1
    assert not object_file(runner_root(yard), entry.content_id).exists()
    assert not marker.exists()
