"""File-tree operations never follow a link they did not make; refused uploads change
nothing; names that are not UTF-8 are listed and copied (W6, W2; docs/security.md, "File
trees never follow a link"; docs/files-and-transfers.md, "Names that are not UTF-8").

Each case runs against the local runner and a runner daemon (the ``yard`` fixture).
"""

from __future__ import annotations

import io
import tarfile

import pytest
from files_helpers import child_workspace, chunks_of, read_all, run, tree

from conftest import Yard
from shellyard.errors import InvalidInput, PathRefused


def archive(members: list[tuple[str, bytes | None, str | None]]) -> bytes:
    """A tar of (name, content or None for a folder, link target or None)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, content, link in members:
            info = tarfile.TarInfo(name)
            if link is not None:
                info.type, info.linkname = tarfile.SYMTYPE, link
                tar.addfile(info)
            elif content is None:
                info.type = tarfile.DIRTYPE
                tar.addfile(info)
            else:
                info.size = len(content)
                tar.addfile(info, io.BytesIO(content))
    return buf.getvalue()


async def test_refused_tar_upload_changes_no_existing_file(yard: Yard) -> None:
    """W6: an archive whose folder ``a`` is later replaced by a link (``a/b`` then ``a`` →
    a link) is refused, and the existing file it also carries is left as it was: the
    members to place are the staged tree's, checked whole before the first one moves."""
    plane, runner_id = yard.plane, yard.runner_id
    await run(plane, "echo old > 0.txt", runner_id)
    head = (await plane.files.history(runner_id=runner_id)).head_seq
    bad = archive([("0.txt", b"new\n", None), ("a/b", b"x", None), ("a", None, "0.txt")])
    try:
        done = await plane.files.upload_archive(chunks_of(bad), "", runner_id=runner_id)
    except PathRefused:
        assert await read_all(plane, "0.txt", runner_id=runner_id) == b"old\n"
        assert (await plane.files.history(runner_id=runner_id)).head_seq == head
        listing = await run(plane, "cat 0.txt; ls -A", runner_id)
        logs = (await plane.executions.logs(listing.execution_id)).data
        assert logs == "old\n0.txt\n", logs
    else:  # unpacked as tar -x would: the link is last, so `a/b` went with the folder
        files = await tree(plane, done.workspace_id)
        assert files["a"].target == "0.txt" and "a/b" not in files
        assert await read_all(plane, "0.txt", runner_id=runner_id) == b"new\n"


@pytest.mark.parametrize(
    "members",
    [
        [("0.txt", b"new\n", None), ("d", b"file where a folder is", None)],
        [("0.txt", b"new\n", None), ("out", None, "../../../etc")],
        [("0.txt", b"new\n", None), ("f/x", b"below a file", None)],
    ],
    ids=["folder-kind", "link-out", "below-file"],
)
async def test_each_refused_tar_upload_changes_nothing(
    yard: Yard, members: list[tuple[str, bytes | None, str | None]]
) -> None:
    """Every refusal of a tar upload (a kind conflict, a link out, a member below a file)
    leaves the existing files and the head as they were."""
    plane, runner_id = yard.plane, yard.runner_id
    await run(plane, "echo old > 0.txt; mkdir d; echo f > f", runner_id)
    head = (await plane.files.history(runner_id=runner_id)).head_seq
    with pytest.raises(InvalidInput):
        await plane.files.upload_archive(chunks_of(archive(members)), "", runner_id=runner_id)
    assert await read_all(plane, "0.txt", runner_id=runner_id) == b"old\n"
    assert (await plane.files.history(runner_id=runner_id)).head_seq == head


# ---------------------------------------------------------------------- names not UTF-8

#: A name with a byte that is not UTF-8 (Latin-1 "é"), as a shell makes it.
BAD_NAME = "caf\\351.txt"


async def test_names_that_are_not_utf8_are_listed_moved_and_transferred(yard: Yard) -> None:
    """docs/files-and-transfers.md, "Names that are not UTF-8": a file whose name holds a
    byte that is not UTF-8 is listed (its name escaped, flagged), moved and transferred
    with its bytes kept; never a 500."""
    plane, runner_id = yard.plane, yard.runner_id
    made = await run(plane, f"mkdir -p n && printf data > n/$(printf '{BAD_NAME}')", runner_id)
    listing = await plane.files.list("n", runner_id=runner_id)
    [entry] = listing.entries
    assert entry.path == "n/caf\udce9.txt"
    moved = await plane.files.move("n/caf\udce9.txt", "m/caf\udce9.txt", runner_id=runner_id)
    assert moved.snapshot_seq > made.snapshot_seq
    child, target = await child_workspace(plane, runner_id)
    started = await plane.transfers.start(
        {
            "source_workspace_id": made.workspace_id,
            "paths": ["m"],
            "target_workspace_id": target,
            "target_folder": "in",
        }
    )
    view = await plane.transfers.wait(started.transfer_id, 120)
    assert view.state == "completed", view
    copied = await read_all(plane, "in/m/caf\udce9.txt", workspace_id=target, agent_id=child["id"])
    assert copied == b"data"
    outcomes = await plane.transfers.files(started.transfer_id, limit=100)
    assert [f.target_path for f in outcomes.files if f.kind == "file"] == ["in/m/caf\udce9.txt"]
