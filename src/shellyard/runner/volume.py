"""The file system under a runner's folder, as far as it changes what an execution costs.

Every execution makes its folder and files (logs, bwrap's status, meta.json, result.json).
On ext4 **without a journal** the kernel skips, for each new inode, every free inode of the
group deleted in the last ~30 seconds, looking each one's inode-table block up
(``find_inode_bit`` → ``recently_deleted``): a new file then costs 30–600 µs of CPU instead of
a few, and more the more files anything on the volume deleted lately (a retention pass, another
program, a previous run's clean-up). With a journal ext4 makes no such check. Measured in
docs/benchmarks.md §76 (16 agents: 155 falling to 128 executions a second run after run on
this machine's journal-less root volume, steady on a journaled ext4); what to do about it is
in docs/operations.md ("The volume under the home")."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from shellyard.paths import StrPath

MOUNT_TABLE = Path("/proc/self/mountinfo")
JOURNALS = Path("/proc/fs/jbd2")  # one entry per mounted journal: "<device>-<inode>"
BLOCK_DEVICES = Path("/sys/dev/block")


@dataclass(frozen=True)
class Volume:
    #: The file system's type as the mount table names it ("ext4", "xfs", "tmpfs", ...).
    fstype: str
    #: The block device's kernel name ("vda", "loop0"); None when not on a block device.
    device: str | None
    #: Whether an ext4 volume has a journal; None for any other file system.
    journaled: bool | None

    @property
    def churn_sensitive(self) -> bool:
        """ext4 without a journal: a new file's cost grows with recent deletions."""
        return self.fstype == "ext4" and self.journaled is False


def of(path: StrPath) -> Volume | None:
    """The volume ``path`` is on; None when the mount table does not say (not Linux)."""
    dev = os.stat(path).st_dev
    number = f"{os.major(dev)}:{os.minor(dev)}"
    try:
        table = MOUNT_TABLE.read_text()
    except OSError:
        return None
    fstype = _fstype(table, number)
    if fstype is None:
        return None
    device = _device_name(number)
    journaled = None
    if fstype == "ext4":
        journaled = device is not None and _has_journal(device)
    return Volume(fstype=fstype, device=device, journaled=journaled)


def _fstype(table: str, number: str) -> str | None:
    """The type of the mount whose device is ``number`` (major:minor, mountinfo field 3):
    the first field after the `` - `` that ends the optional fields (as host_groups.mounts
    reads it)."""
    for line in table.splitlines():
        left, _, right = line.partition(" - ")
        fields = left.split()
        if len(fields) > 2 and fields[2] == number and right:
            return right.split()[0]
    return None


def _device_name(number: str) -> str | None:
    try:
        return os.path.basename(os.readlink(BLOCK_DEVICES / number))
    except OSError:
        return None  # no block device behind it (tmpfs, overlay, a network file system)


def _has_journal(device: str) -> bool:
    try:
        return any(name.rsplit("-", 1)[0] == device for name in os.listdir(JOURNALS))
    except OSError:
        return False  # no jbd2 at all: no ext4 volume here has a journal


def warning(root: StrPath) -> str | None:
    """What an operator should hear at start-up about the volume under ``root``, if anything."""
    volume = of(root)
    if volume is None or not volume.churn_sensitive:
        return None
    return (
        f"the runner's folder {root} is on ext4 without a journal ({volume.device}): each new "
        "file an execution makes costs 30-600 us of CPU there, more after files were deleted "
        "on the volume (16 agents' rate fell by up to 17% run after run on such a volume, "
        "steady on ext4 with a journal); put SHELLYARD_HOME on a journaled file system "
        '(docs/operations.md "The volume under the home")'
    )
