"""An environment an older release made ``--from`` a base hard-linked the base's files, whose
link count told every session of the others' environments (docs/security.md, "Environments
share no inode with a base"). The runner's next start gives it copies of its own, once, unless
it shares bases by hard links (``SHELLYARD_BASE_SHARING``)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from shellyard.config import Settings
from shellyard.control.plane import build
from shellyard.runner.environments.tools import BASE_OWNER
from shellyard.runner.policy import SandboxPolicy

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="a base's owner is a root runner's")


@pytest.mark.parametrize("sharing", ["auto", "links"])
async def test_an_environment_an_older_release_linked_gets_copies_at_the_next_start(
    home: Path, sharing: str
) -> None:
    """``auto`` on this root runner is copies (a uid per workspace): the start copies;
    ``SHELLYARD_BASE_SHARING=links`` keeps the links it would make itself."""
    base = home / "bases" / "python-base" / "1" / "prefix"
    (base / "lib").mkdir(parents=True)
    base_file = base / "lib" / "numpy.py"
    base_file.write_text("VERSION = 1\n")
    os.utime(base_file, ns=(1_600_000_000_000_000_000, 1_600_000_000_000_000_000))
    base_file.chmod(0o444)
    os.chown(base_file, BASE_OWNER, 0)
    settings = Settings(home=home / "home", local_policy=SandboxPolicy(base_sharing=sharing))
    plane = await build(settings)
    await plane.aclose()
    env_dir = settings.local_runner_root / "environments" / "env_0123456789abcdef"
    (env_dir / "prefix" / "lib").mkdir(parents=True)
    record = {"manager": "base", "name": "python-base", "source": f"{base} (hard links)"}
    (env_dir / "env.json").write_text(json.dumps({"base": [record]}))
    (env_dir / "tools-own").write_text("")
    linked = env_dir / "prefix" / "lib" / "numpy.py"
    os.link(base_file, linked)
    assert base_file.stat().st_nlink == 2

    plane = await build(settings)  # the start this release's runner makes
    info = await plane.runners.get("local").info()
    await plane.aclose()
    assert info.limits is not None  # what `runner show` prints as `limit base_sharing`
    shown = "hard links" if sharing == "links" else "copies"
    assert info.limits.base_sharing == f"{shown} (SHELLYARD_BASE_SHARING={sharing})"
    if sharing == "links":
        assert (linked.stat().st_ino, base_file.stat().st_nlink) == (base_file.stat().st_ino, 2)
        assert not (env_dir / "base-copies").exists()
        return
    mine, theirs = linked.stat(), base_file.stat()
    assert (mine.st_nlink, theirs.st_nlink) == (1, 1)  # before: 2 and 2
    assert linked.read_text() == "VERSION = 1\n"
    assert mine.st_mtime_ns == theirs.st_mtime_ns
    # done once; the next change gives the runner's copies to the tools' uid
    assert (env_dir / "base-copies").exists() and not (env_dir / "tools-own").exists()
