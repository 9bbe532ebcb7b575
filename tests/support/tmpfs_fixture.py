"""A tmpfs of a given size mounted for one test (the full-disk and reserve cases, R2): the
whole home lives on it, so filling it fills nothing else. Skipped, saying why, where a tmpfs
cannot be mounted (no root / CAP_SYS_ADMIN). ``yard_on`` opens a control plane and runner
whose home is on such a volume."""

from __future__ import annotations

import contextlib
import subprocess
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from conftest import Yard, open_yard
from shellyard.runner.protocol import SandboxPolicy


@contextlib.contextmanager
def mounted_tmpfs(size: str, prefix: str, options: str = "") -> Iterator[Path]:
    """``options``: more mount options (``nr_inodes=20000``: a volume only files can fill)."""
    path = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
    every = ",".join(filter(None, [f"size={size}", "mode=0711", options]))
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", every, "tmpfs", str(path)],
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        path.rmdir()
        pytest.skip(f"cannot mount a tmpfs here (needs root / CAP_SYS_ADMIN): {done.stderr}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)
        with contextlib.suppress(OSError):
            path.rmdir()


@contextlib.asynccontextmanager
async def yard_on(volume: Path, kind: str, policy: SandboxPolicy) -> AsyncIterator[Yard]:
    """A control plane and a ``kind`` runner (``local``, ``direct``) with their home on
    ``volume``, closed after."""
    home = volume / "y"
    home.mkdir(mode=0o711)
    plane, runner_id, daemon = await open_yard(home, kind, policy)
    try:
        yield Yard(plane, runner_id, home, daemon)
    finally:
        await plane.aclose()
        if daemon is not None:
            await daemon.stop()
