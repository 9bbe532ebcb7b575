"""runner/sandbox/folder_access.py: a private folder lets the sandbox uid (and nobody else) search
it through one ACL entry, keeping the entries already there (R2 with a 0700 home,
docs/decisions.md)."""

from __future__ import annotations

import os
import stat
import subprocess
from pathlib import Path

import pytest

from shellyard.errors import SandboxUnavailable
from shellyard.runner.sandbox.folder_access import can_search, grant_search, make_reachable

SANDBOX, OTHER = 61000, 61001

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to set another uid's ACL")


def _acl_supported(folder: Path) -> bool:
    try:
        os.getxattr(folder, "system.posix_acl_access")
    except OSError as exc:
        return exc.errno != 95  # EOPNOTSUPP: the file system keeps no ACLs
    return True


def _stat_as(uid: int, path: Path) -> bool:
    done = subprocess.run(
        ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "stat", str(path)],
        capture_output=True,
    )
    return done.returncode == 0


def test_only_the_sandbox_uid_gets_through_and_other_entries_stay(tmp_path: Path) -> None:
    if not _acl_supported(tmp_path):
        pytest.skip("the file system of the temporary folder keeps no POSIX ACLs")
    private = tmp_path / "home"
    private.mkdir(mode=0o700)
    inner = private / "runners"
    inner.mkdir(mode=0o711)
    assert not can_search(private, SANDBOX, SANDBOX)

    grant_search(private, OTHER)  # an entry someone made before shellyard
    granted = make_reachable(inner, SANDBOX, SANDBOX)

    assert private in granted and inner not in granted  # 0711 already lets it through
    assert can_search(private, SANDBOX, SANDBOX) and can_search(private, OTHER, OTHER)
    assert not can_search(private, 61002, 61002)
    assert not private.stat().st_mode & stat.S_IXOTH  # not opened to everyone
    assert _stat_as(SANDBOX, inner) and not _stat_as(61002, inner)
    # Listing stays refused: search only.
    listing = subprocess.run(
        ["setpriv", f"--reuid={SANDBOX}", f"--regid={SANDBOX}", "--clear-groups", "ls", private],
        capture_output=True,
    )
    assert listing.returncode != 0
    assert make_reachable(inner, SANDBOX, SANDBOX) == []  # found again, nothing added twice


def test_a_folder_that_cannot_take_an_entry_is_a_clear_refusal() -> None:
    target = Path("/proc/self/map_files")  # procfs, mode 0500: takes no ACL entry
    if not target.is_dir() or can_search(target, SANDBOX, SANDBOX):
        pytest.skip("no /proc/self/map_files (0500 on procfs) on this kernel")
    with pytest.raises(SandboxUnavailable, match="could not be added") as refused:
        make_reachable(target, SANDBOX, SANDBOX)
    assert "setfacl -m u:61000:x" in refused.value.message
