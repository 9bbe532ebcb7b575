"""Attack pass on the kept help pages (cli/helppage/cache.py; docs/security.md "Attack pass on
the batch's new doors"): a page planted in a cache folder another local user controls (``su``
without ``-`` or ``sudo -E`` keep that user's ``XDG_CACHE_HOME``) is never printed to root's
terminal, and nothing is written into such a folder (its owner could point the scratch file
at any path). Each case runs the real console entry (``python -m shellyard``)."""

from __future__ import annotations

import json
import os
import pwd
from pathlib import Path

import pytest
from test_help_cache import _cli, _kept

PLANTED = "\x1b]0;owned\x07\x1b[2J planted page\n"


def _plant(cache: Path) -> Path:
    """A real kept page for ``--help``, its text replaced by terminal escapes."""
    assert _cli(cache, "--help").returncode == 0
    (entry,) = _kept(cache)
    kept = json.loads(entry.read_text())
    kept["page"] = PLANTED
    entry.write_text(json.dumps(kept))
    assert _cli(cache, "--help").stdout == PLANTED  # as planted, it would be printed
    return entry


def test_a_page_in_another_users_folder_is_not_printed(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root to give the folder to another user")
    nobody = pwd.getpwnam("nobody")
    entry = _plant(tmp_path)
    for path in (entry.parent, entry):
        os.chown(path, nobody.pw_uid, nobody.pw_gid)
    shown = _cli(tmp_path, "--help")
    assert shown.returncode == 0 and "Usage:" in shown.stdout
    assert PLANTED not in shown.stdout and "\x1b]0;" not in shown.stdout
    assert sorted(p.name for p in entry.parent.iterdir()) == [entry.name]  # nothing written


@pytest.mark.parametrize("what", ["folder", "file"])
def test_a_page_others_may_write_is_not_printed(tmp_path: Path, what: str) -> None:
    entry = _plant(tmp_path)
    target = entry.parent if what == "folder" else entry
    target.chmod(target.stat().st_mode | 0o002)
    shown = _cli(tmp_path, "--help")
    assert shown.returncode == 0 and "Usage:" in shown.stdout
    assert PLANTED not in shown.stdout


def test_a_symlinked_page_is_not_followed(tmp_path: Path) -> None:
    entry = _plant(tmp_path)
    elsewhere = tmp_path / "elsewhere.json"
    entry.rename(elsewhere)
    entry.symlink_to(elsewhere)
    assert PLANTED not in _cli(tmp_path, "--help").stdout


def test_a_new_folder_is_the_users_alone(tmp_path: Path) -> None:
    assert _cli(tmp_path, "--help").returncode == 0
    (entry,) = _kept(tmp_path)
    assert entry.parent.stat().st_mode & 0o777 == 0o700
    assert entry.stat().st_mode & 0o777 == 0o600
