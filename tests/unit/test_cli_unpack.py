"""``cli/unpack.py``: a workspace folder's tar unpacked on the operator's machine never writes,
nor leaves a link, outside its target (docs/security.md "Attack pass (session 45)")."""

from __future__ import annotations

import io
import os
import tarfile
from pathlib import Path

import pytest

from shellyard.cli.unpack import UnsafeMember, unpack

D = "d" * 247
STEPS = "abcdefghijklmnop"


def _tar(members: list[tuple[str, str, str | bytes]]) -> io.BytesIO:
    """(kind, name, link target or content) in order: ``dir``, ``sym``, ``file``."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for kind, name, what in members:
            info = tarfile.TarInfo(name)
            if kind == "dir":
                info.type, info.mode = tarfile.DIRTYPE, 0o755
                tar.addfile(info)
            elif kind == "sym":
                info.type, info.linkname = tarfile.SYMTYPE, str(what)
                tar.addfile(info)
            else:
                data = what if isinstance(what, bytes) else what.encode()
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    buf.seek(0)
    return buf


def _unpack(buf: io.BytesIO, target: Path) -> list[str]:
    target.mkdir(exist_ok=True)
    with tarfile.open(fileobj=buf, mode="r|") as tar:
        return unpack(tar, tar, target)


def _deep_escape(tail: int) -> list[tuple[str, str, str | bytes]]:
    """The tree of the CLI test, in the export's path order: folders of 247-byte names 16
    deep with a link per level, a link at the bottom back to the top, ``escape`` past it."""
    members: list[tuple[str, str, str | bytes]] = []
    path = ""
    for step in STEPS:
        members += [("dir", f"{path}{D}", ""), ("sym", f"{path}{step}", D)]
        path += D + "/"
    members.append(("sym", f"{path}{'l' * tail}", "/".join([".."] * len(STEPS))))
    members.append(("sym", "escape", "/".join(STEPS) + "/" + "l" * tail + "/../victim"))
    members.sort(key=lambda m: m[1])
    return members


def test_a_link_past_path_max_never_leads_out_and_nothing_is_written_through_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """CVE-2025-4517's shape from real paths: tarfile's ``data`` filter (Python < 3.11.13)
    passes ``escape``, which the kernel resolves above the target; a second archive's file
    ``escape`` must not be written through it. The target is relative (``files get``'s
    default) so every member's path fits PATH_MAX while realpath's absolute one does not."""
    monkeypatch.chdir(tmp_path)
    victim = tmp_path / "victim"
    victim.write_text("intact\n")
    tail = 4096 - len(str(tmp_path / "out")) - len(D * 16) + 40
    left = _unpack(_tar(_deep_escape(tail)), Path("out"))
    escape = tmp_path / "out" / "escape"
    assert "escape" in left and not escape.is_symlink(), left
    _unpack(_tar([("file", "escape", "PWNED\n")]), Path("out"))
    assert victim.read_text() == "intact\n"
    assert escape.read_text() == "PWNED\n"


def test_a_link_left_by_an_earlier_download_is_replaced_not_written_through(
    tmp_path: Path,
) -> None:
    """A link in the target (an earlier download's, or the operator's) where a member goes is
    replaced by the member; one on a member's way refuses the member, naming it."""
    victim = tmp_path / "victim"
    victim.write_text("intact\n")
    out = tmp_path / "out"
    out.mkdir()
    (out / "f").symlink_to(victim)
    (out / "d").symlink_to(tmp_path)
    _unpack(_tar([("file", "f", "PWNED\n")]), out)
    assert victim.read_text() == "intact\n" and (out / "f").read_text() == "PWNED\n"
    with pytest.raises(UnsafeMember, match="'d'"):
        _unpack(_tar([("file", "d/victim", "PWNED\n")]), out)
    assert victim.read_text() == "intact\n"


def test_links_are_judged_once_all_are_made(tmp_path: Path) -> None:
    """``x -> y/../q`` reads inside while ``y`` is missing; ``y -> .`` then makes ``x`` lead
    above the target. Judged after all links are made, ``x`` is left out; links inside stay."""
    out = tmp_path / "out"
    members: list[tuple[str, str, str | bytes]] = [
        ("file", "q", "inside\n"),
        ("sym", "ok", "q"),
        ("sym", "x", "y/../q"),
        ("sym", "y", "."),
    ]
    left = _unpack(_tar(members), out)
    assert left == ["x"], left
    assert os.readlink(out / "ok") == "q" and os.readlink(out / "y") == "."
    assert not (out / "x").is_symlink()
