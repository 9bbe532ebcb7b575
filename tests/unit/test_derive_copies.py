"""An environment made ``--from`` a base copies the base's files (runner/environments/derive.py;
docs/security.md "Environments share no inode with a base"): no inode of the new prefix is one
of the base's, so no link count seen in a command counts another session's environments. With
``SHELLYARD_BASE_SHARING=links`` (or ``auto`` and one uid for every workspace) it hard-links
them instead (docs/environments.md "Starting from a base")."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from shellyard.errors import InvalidInput, LowOnSpace
from shellyard.runner.environments import derive
from shellyard.runner.limits.settings import limits_from_env
from shellyard.runner.policy import SandboxPolicy

OLD_MTIME_NS = 1_600_000_000_123_456_789


def _base(root: Path) -> Path:
    base = root / "base"
    site = base / "lib" / "python3.11" / "site-packages" / "pkg"
    site.mkdir(parents=True)
    (base / "bin").mkdir()
    (base / "pyvenv.cfg").write_text("home = /usr/bin\n")
    (site / "__init__.py").write_text("X = 1\n")
    (site / "big.bin").write_bytes(os.urandom(3 << 20))  # past the one-read small copy
    (base / "bin" / "pip").write_bytes(f"#!{base}/bin/python\nimport pip\n".encode())
    (base / "bin" / "tool").write_bytes(b"\x7fELF no path here")
    (base / "bin" / "python").symlink_to(base / "bin" / "tool")
    (base / "bin" / "python3").symlink_to("python")
    for path in [*base.rglob("*")]:
        if path.is_file() and not path.is_symlink():
            path.chmod(0o555 if path.parent.name == "bin" else 0o444)
            os.utime(path, ns=(OLD_MTIME_NS, OLD_MTIME_NS))
    return base


def _files(tree: Path) -> dict[str, os.stat_result]:
    return {
        str(p.relative_to(tree)): p.lstat()
        for p in tree.rglob("*")
        if p.is_file() and not p.is_symlink()
    }


@pytest.mark.parametrize("workers", [1, derive.COPY_WORKERS])
def test_clone_copies_every_file_into_an_inode_of_its_own(tmp_path: Path, workers: int) -> None:
    """Before: every file but bin/'s scripts was a hard link of the base's (``st_nlink`` 2,
    the base's inode)."""
    base = _base(tmp_path)
    prefix = tmp_path / "prefix"
    prefix.mkdir()
    derive.clone(base, prefix, Path("/env"), workers=workers)
    theirs, mine = _files(base), _files(prefix)
    assert sorted(mine) == sorted(theirs)
    base_inodes = {(s.st_dev, s.st_ino) for s in theirs.values()}
    for rel, st in mine.items():
        assert (st.st_dev, st.st_ino) not in base_inodes, rel
        assert (st.st_nlink, theirs[rel].st_nlink) == (1, 1), rel
        assert st.st_mode & 0o777 == (0o755 if rel.startswith("bin/") else 0o644), rel
    for rel in mine:
        if rel != "bin/pip":
            assert (prefix / rel).read_bytes() == (base / rel).read_bytes(), rel
            # a .pyc records its source's mtime: a copy that changed it would be recompiled
            assert mine[rel].st_mtime_ns == OLD_MTIME_NS, rel
    assert (prefix / "bin" / "pip").read_bytes() == b"#!/env/bin/python\nimport pip\n"
    assert os.readlink(prefix / "bin" / "python") == "/env/bin/tool"
    assert os.readlink(prefix / "bin" / "python3") == "python"


@pytest.mark.skipif(os.geteuid() != 0, reason="gives the tools' files another owner")
def test_unshare_copies_only_a_bases_hard_links(tmp_path: Path) -> None:
    """An environment an older release made by hard links: the base's links become copies
    (the base's link count back to 1), a pair of the tools' own hard links (rattler links from
    the environment's own cache) stays as it is."""
    base = _base(tmp_path)
    owner = os.stat(base / "pyvenv.cfg").st_uid
    prefix = tmp_path / "prefix"
    (prefix / "lib").mkdir(parents=True)
    os.link(base / "pyvenv.cfg", prefix / "pyvenv.cfg")
    os.link(base / "bin" / "tool", prefix / "lib" / "tool")
    (prefix / "lib" / "own").write_text("mine")
    os.link(prefix / "lib" / "own", prefix / "lib" / "own2")
    os.chown(prefix / "lib" / "own", owner + 1, 0)  # the tools' uid, not the base's
    base_owners = frozenset({owner})
    assert derive.unshare(prefix, base_owners) == 2
    assert (prefix / "pyvenv.cfg").stat().st_nlink == 1
    assert (base / "pyvenv.cfg").stat().st_nlink == 1
    assert (base / "bin" / "tool").stat().st_nlink == 1
    assert (prefix / "lib" / "tool").read_bytes() == (base / "bin" / "tool").read_bytes()
    assert (prefix / "lib" / "tool").stat().st_mtime_ns == OLD_MTIME_NS
    assert (prefix / "lib" / "own").stat().st_ino == (prefix / "lib" / "own2").stat().st_ino
    assert derive.unshare(prefix, base_owners) == 0
    assert sorted(p.name for p in prefix.rglob("*")) == ["lib", "own", "own2", "pyvenv.cfg", "tool"]


def test_clone_stops_at_the_free_space_reserve(tmp_path: Path) -> None:
    """R2 (docs/limits.md): a base's copy is hundreds of MB; it stops, with the reserve's
    error, once the volume is below the reserve (the ``room`` check), as a package tool does."""
    base = tmp_path / "base"
    (base / "lib").mkdir(parents=True)
    files = 20 * derive.ROOM_EVERY  # more than the copies queued at once
    assert files > derive.COPY_WORKERS * derive.QUEUED_PER_WORKER + 2 * derive.ROOM_EVERY
    for n in range(files):
        (base / "lib" / f"m{n}.py").write_text(f"N = {n}\n")
    prefix = tmp_path / "prefix"
    prefix.mkdir()
    checks: list[int] = []

    def room() -> None:
        checks.append(1)
        if len(checks) == 12:  # past the queue's bound: checked all along, not only at first
            raise LowOnSpace("copying the base into the environment refused: below its reserve")

    with pytest.raises(LowOnSpace, match="below its reserve"):
        derive.clone(base, prefix, room=room)
    assert len(list((prefix / "lib").iterdir())) < files


def test_clone_leaves_the_bases_access_times_alone(tmp_path: Path) -> None:
    """A create reads every file of the base, which every session sees: under ``relatime`` a
    read moves an access time older than the mtime, and ``stat -c %X`` in any command would
    show that some session made an environment. The copies open with ``O_NOATIME``."""
    base = _base(tmp_path)
    old = OLD_MTIME_NS - 10**12  # atime before mtime: the next plain read would move it
    for path in base.rglob("*"):
        if path.is_file() and not path.is_symlink():
            os.utime(path, ns=(old, OLD_MTIME_NS))
    prefix = tmp_path / "prefix"
    prefix.mkdir()
    derive.clone(base, prefix, Path("/env"))
    assert {st.st_atime_ns for st in _files(base).values()} == {old}


def test_clone_linking_hard_links_every_file_but_the_scripts_naming_the_base(
    tmp_path: Path,
) -> None:
    """``SHELLYARD_BASE_SHARING=links``: every file is the base's inode (no byte copied),
    except bin/'s scripts naming the base's path, written with the new one."""
    base = _base(tmp_path)
    prefix = tmp_path / "prefix"
    prefix.mkdir()
    derive.clone(base, prefix, Path("/env"), linking=True)
    theirs, mine = _files(base), _files(prefix)
    assert sorted(mine) == sorted(theirs)
    for rel, st in mine.items():
        shared = (st.st_dev, st.st_ino) == (theirs[rel].st_dev, theirs[rel].st_ino)
        assert shared is (rel != "bin/pip"), rel
    assert (prefix / "bin" / "pip").read_bytes() == b"#!/env/bin/python\nimport pip\n"
    assert os.stat(base / "pyvenv.cfg").st_nlink == 2  # what copies mode closes
    assert os.readlink(prefix / "bin" / "python") == "/env/bin/tool"


@pytest.mark.parametrize(
    ("policy", "root", "expected"),
    [
        (SandboxPolicy(), True, "copies"),  # a uid per workspace: tenants kept apart
        (SandboxPolicy(uid_range="61001-61999"), True, "copies"),
        (SandboxPolicy(uid_range="off"), True, "links"),  # one uid for all
        (SandboxPolicy(sandbox_uid=61000), True, "links"),
        (SandboxPolicy(), False, "links"),  # not root: the runner's own uid for all
        (SandboxPolicy(base_sharing="links"), True, "links"),
        (SandboxPolicy(base_sharing="copies", uid_range="off"), True, "copies"),
    ],
)
def test_sharing_auto_copies_only_where_workspaces_have_uids_of_their_own(
    policy: SandboxPolicy, root: bool, expected: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 0 if root else 1000)
    assert derive.sharing(policy) == expected


def test_base_sharing_setting_is_read_and_a_wrong_value_says_the_choices() -> None:
    policy = limits_from_env(SandboxPolicy(), {"SHELLYARD_BASE_SHARING": " Links "})
    assert policy.base_sharing == "links"
    with pytest.raises(InvalidInput, match=r"must be auto, copies or links.*'hardlinks'"):
        limits_from_env(SandboxPolicy(), {"SHELLYARD_BASE_SHARING": "hardlinks"})
