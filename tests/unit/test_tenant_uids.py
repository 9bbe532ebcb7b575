"""A uid per workspace (R2 tenants; runner/sandbox/tenants.py, docs/security.md): the map is
durable, never gives a uid an account of the host has, and degrades to sharing when the range
is full."""

from __future__ import annotations

import pwd
from pathlib import Path

import pytest

from shellyard.errors import InvalidInput
from shellyard.runner.sandbox import tenants


def test_range_parsing_and_errors() -> None:
    assert tenants.parse_range(None) == tenants.DEFAULT_RANGE
    assert tenants.parse_range("62000-62009") == (62000, 62009)
    assert tenants.parse_range("off") is None
    for bad in ("0-10", "62010-62000", "abc", "61000-70000"):
        with pytest.raises(InvalidInput, match="SHELLYARD_UID_RANGE"):
            tenants.parse_range(bad)


def test_the_default_range_holds_no_account_of_this_host() -> None:
    first, last = tenants.DEFAULT_RANGE
    assert not [p.pw_uid for p in pwd.getpwall() if first <= p.pw_uid <= last]


def test_map_is_durable_and_skips_accounts(tmp_path: Path) -> None:
    accounts = sorted(p.pw_uid for p in pwd.getpwall() if 1000 <= p.pw_uid < 65534)
    if not accounts:
        pytest.skip("no account with a uid of 1000 or more on this host")
    taken = accounts[0]
    uids = tenants.UidMap(tmp_path / "uids.json", taken, taken + 2)
    a, b = uids.uid("ws_a"), uids.uid("ws_b")
    assert taken not in (a, b) and a != b
    again = tenants.UidMap(tmp_path / "uids.json", taken, taken + 2)
    assert again.uid("ws_a") == a and again.uid("ws_b") == b  # after a restart
    # full: the third shares the least shared uid instead of being refused
    c = again.uid("ws_c")
    assert c in (a, b)
    uids.release("ws_a")
    assert "ws_a" not in tenants.UidMap(tmp_path / "uids.json", taken, taken + 2).known()


def test_chown_tree_follows_no_link(tmp_path: Path) -> None:
    if not hasattr(__import__("os"), "lchown") or __import__("os").geteuid() != 0:
        pytest.skip("changing owners needs root")
    import os

    outside = tmp_path / "outside"
    outside.write_text("x")
    tree = tmp_path / "tree"
    (tree / "sub").mkdir(parents=True)
    (tree / "sub" / "f").write_text("y")
    (tree / "link").symlink_to(outside)
    tenants.chown_tree(tree, 62999, 62999)
    assert (tree / "sub" / "f").stat().st_uid == 62999
    assert os.lstat(tree / "link").st_uid == 62999
    assert outside.stat().st_uid == 0


def test_the_bases_owner_is_never_a_workspaces_uid(tmp_path: Path) -> None:
    """The bases' files belong to ``BASES_UID`` so that nothing running can change them
    (docs/security.md, "The bases' owner"): a range that holds it never gives it, even full,
    and no account of this host has it."""
    owner = tenants.BASES_UID
    assert owner not in range(tenants.DEFAULT_RANGE[0], tenants.DEFAULT_RANGE[1] + 1)
    assert not tenants.held_by_host(owner, tenants.subordinate_ranges())
    uids = tenants.UidMap(tmp_path / "uids.json", owner, owner + 1)
    given = {uids.uid(f"ws_{i}") for i in range(4)}  # the range is full after the first
    assert owner not in given and given == {owner + 1}


@pytest.mark.parametrize("kind", ["tree", "home"])
def test_give_and_close_gives_a_root_and_closes_it(tmp_path: Path, kind: str) -> None:
    """R2 tenants: a root not the workspace uid's is given to it, entries and all, and left
    0700; one already its own but opened (0755 from inside) is closed again, its entries'
    modes untouched; a missing root is nothing to do."""
    import os

    if os.geteuid() != 0:
        pytest.skip("changing owners needs root")
    root = tmp_path / kind
    (root / "sub").mkdir(parents=True)
    (root / "sub" / "f").write_text("y")
    os.chmod(root, 0o755)
    assert tenants.give_and_close(root, 62999, 62998) == 2
    assert (os.stat(root).st_uid, os.stat(root).st_gid) == (62999, 62998)
    assert os.stat(root / "sub" / "f").st_uid == 62999
    assert os.stat(root).st_mode & 0o7777 == 0o700
    os.chmod(root, 0o777)
    os.chmod(root / "sub", 0o777)
    assert tenants.give_and_close(root, 62999, 62998) is None
    assert os.stat(root).st_mode & 0o7777 == 0o700
    assert os.stat(root / "sub").st_mode & 0o7777 == 0o777  # the agent's own choice
    # another group (a sandbox group changed): given again
    assert tenants.give_and_close(root, 62999, 62997) == 2
    assert os.stat(root).st_gid == 62997
    assert tenants.give_and_close(tmp_path / "absent", 62999, 62998) is None
