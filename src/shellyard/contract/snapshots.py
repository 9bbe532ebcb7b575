"""What a runner answers about a workspace's committed files, and hands to the caller
unchanged: path entries, folder listings, diffs of two snapshots, transfer outcomes, retention
results (W2, W5, T2). The runner protocol re-exports them."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, model_validator

#: A file's content id is its plain sha256 under this size; from it on it may be a chunk list
#: (runner/snapshots/contentid.py), so a ``sha256`` field is told apart from it by size first.
CONTENT_CHUNK = 1 << 20


def _not_utf8(text: str) -> bool:
    """Whether ``text`` holds a byte of a name that is not UTF-8 (a lone surrogate, PEP 383;
    shellyard.paths.not_utf8, which this layer may not import)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


class PathEntry(BaseModel):
    path: str
    kind: Literal["file", "dir", "symlink"]
    size: int
    mode: int
    #: The real SHA-256 of a file's bytes (what ``sha256sum`` prints), or None where the
    #: runner does not know it without hashing holes (content with a whole zero MiB).
    sha256: str | None = None
    #: A file's content id in the snapshot store (always set for a file): equal content has
    #: equal ids, sparse or not; the sha256 itself unless the content holds a zero MiB.
    content_id: str | None = None
    target: str | None = None
    #: The path (or the link's target) holds bytes that are not UTF-8: in JSON each is the
    #: escape ``\udcNN`` for byte NN (docs/files-and-transfers.md, "Names that are not
    #: UTF-8"); send the same string back to name the entry.
    not_utf8: bool = False

    @model_validator(mode="after")
    def _flag(self) -> PathEntry:
        if not self.not_utf8 and (_not_utf8(self.path) or _not_utf8(self.target or "")):
            self.not_utf8 = True
        return self


class DirListing(BaseModel):
    """Entries below ``path`` in snapshot ``seq``, in the manifest's order (by folder, names
    sorted). ``next_after``: pass it as ``after`` for the next page; None on the last one."""

    workspace_id: str
    seq: int
    path: str
    entries: list[PathEntry]
    next_after: str | None = None


class DiffEntry(BaseModel):
    path: str
    change: Literal["added", "removed", "changed"]
    kind: Literal["file", "dir", "symlink"]
    old_kind: Literal["file", "dir", "symlink"] | None = None
    old_size: int | None = None
    new_size: int | None = None
    old_sha256: str | None = None
    new_sha256: str | None = None
    #: Content ids (always set for a file): compare these, not the sha256s, for equality.
    old_content_id: str | None = None
    new_content_id: str | None = None


class DiffResult(BaseModel):
    workspace_id: str
    from_seq: int
    to_seq: int
    changes: list[DiffEntry]
    next_after: str | None = None


TransferOutcome = Literal["copied", "unchanged", "skipped", "failed"]


class PruneResult(BaseModel):
    workspace_id: str
    removed: list[int]
    retained: list[int]


class GcResult(BaseModel):
    objects_seen: int
    objects_removed: int
    bytes_removed: int
    #: Unreferenced objects younger than the grace period, kept for a writer in flight.
    objects_young: int
