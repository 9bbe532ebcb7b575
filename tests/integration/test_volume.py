"""The volume under a runner's folder (runner/volume.py): ext4 with and without a journal and a
tmpfs, each a real file system mounted here for the test; and the runner's start-up saying it
when its folder is on ext4 without one (docs/operations.md "The volume under the home",
docs/benchmarks.md §76)."""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from shellyard.runner import volume
from shellyard.runner.local import LocalRunner

pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="mounting a file system needs root"),
    pytest.mark.skipif(shutil.which("mkfs.ext4") is None, reason="no mkfs.ext4 (e2fsprogs)"),
]


def _mount(args: list[str], target: Path) -> None:
    done = subprocess.run(["mount", *args, str(target)], capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"this machine cannot mount it ({done.stderr.strip()}): no loop device")


@pytest.fixture
def ext4(tmp_path: Path) -> Iterator[dict[bool, Path]]:
    """Two ext4 volumes on loop devices: {True: with a journal, False: without}."""
    mounted: dict[bool, Path] = {}
    try:
        for journaled in (True, False):
            image = tmp_path / f"journal-{journaled}.img"
            with image.open("wb") as handle:
                handle.truncate(64 << 20)
            features = [] if journaled else ["-O", "^has_journal"]
            subprocess.run(["mkfs.ext4", "-q", "-F", *features, str(image)], check=True)
            target = tmp_path / f"mnt-{journaled}"
            target.mkdir()
            _mount(["-o", "loop", str(image)], target)
            mounted[journaled] = target
        yield mounted
    finally:
        for target in mounted.values():
            subprocess.run(["umount", str(target)], check=False)


def test_ext4_with_and_without_a_journal_is_told_apart(ext4: dict[bool, Path]) -> None:
    with_journal, without = volume.of(ext4[True]), volume.of(ext4[False] / ".")
    assert with_journal is not None and without is not None
    assert (with_journal.fstype, with_journal.journaled) == ("ext4", True)
    assert (without.fstype, without.journaled) == ("ext4", False)
    assert with_journal.device is not None and with_journal.device.startswith("loop")
    assert with_journal.device != without.device
    assert volume.warning(ext4[True]) is None
    message = volume.warning(ext4[False])
    assert message is not None
    assert str(ext4[False]) in message and "without a journal" in message
    assert "SHELLYARD_HOME" in message  # what to do about it


def test_a_volume_without_a_block_device_is_not_ext4(tmp_path: Path) -> None:
    target = tmp_path / "tmpfs"
    target.mkdir()
    _mount(["-t", "tmpfs", "-o", "size=1m", "tmpfs"], target)
    try:
        found = volume.of(target)
        assert found == volume.Volume(fstype="tmpfs", device=None, journaled=None)
        assert volume.warning(target) is None
    finally:
        subprocess.run(["umount", str(target)], check=False)


async def test_the_runner_says_it_at_start_up_on_ext4_without_a_journal(
    ext4: dict[bool, Path], caplog: pytest.LogCaptureFixture
) -> None:
    for journaled, root in ext4.items():
        root.chmod(0o711)  # the sandbox uid traverses to its workspaces
        runner = LocalRunner(root / "runner")
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="shellyard.runner.local"):
            await runner.startup()
        try:
            said = [r.getMessage() for r in caplog.records if "without a journal" in r.getMessage()]
            assert said == ([] if journaled else [volume.warning(root / "runner")])
        finally:
            await runner.aclose()
