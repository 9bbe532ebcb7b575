"""Attack pass (session 57) on the launcher built with musl (docs/security.md "Attack pass
(session 57)", docs/benchmarks.md §81). A second engineer compared the musl and glibc
builds of launch.c as root; each finding's test failed on 4112e6c:

- A host ``--keep`` reached through exactly 40 links: musl's ``realpath`` gives up (ELOOP)
  where glibc's and the kernel still follow, and ``host_prunable`` took the refusal for "no
  such path": the host mount under it was unmounted and the sandbox saw what it hides (the
  same class as sessions 55/56's links). Now only ENOENT/ENOTDIR count as absent.
- ``--ids`` wider than ``uid_t`` (``4294967296:61000``, ``-4294967296:…``) was cut down to 0
  after the "not 0" check: the program ran as root. Old, both builds; reachable only from an
  operator's ``SHELLYARD_SANDBOX_UID``, now bounded there too.
- ``--rlimit`` with a resource past ``RLIM_NLIMITS`` was cut down to a known one.

The warm waiter stays glibc's (musl's ``execvp`` has no ``/bin/sh`` fallback for a file
without a shebang, bwrap's has: E1), and musl's compiler is taken only from the folder of
the host's ``cc``: both in tests/integration/test_launch_build.py."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from shellyard.runner.policy import SandboxPolicy
from shellyard.runner.sandbox import launch

pytestmark = [
    pytest.mark.timeout(120),
    pytest.mark.skipif(os.geteuid() != 0, reason="mounts and mount namespaces are root's"),
    pytest.mark.skipif(shutil.which("unshare") is None, reason="util-linux unshare is missing"),
    pytest.mark.skipif(
        shutil.which("cc") is None and shutil.which("gcc") is None, reason="no C compiler here"
    ),
]

#: the kernel follows up to 40 links in a path (``MAXSYMLINKS``)
LINKS = 40


@pytest.fixture(scope="module")
def launcher(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The runner's own launcher build (musl's where the host has it)."""
    built = launch.build(tmp_path_factory.mktemp("bin"))
    assert built is not None
    return built


def test_a_host_keep_through_forty_links_keeps_the_mount_it_reaches(
    tmp_path: Path, launcher: Path
) -> None:
    root = tmp_path / "runner"
    hidden = tmp_path / "hide"
    for folder in (root / "workspaces" / "ws_0", hidden):
        folder.mkdir(parents=True)
    (hidden / "HIDDEN-UNDER-THE-MOUNT").write_text("")
    chain = tmp_path / "chain"
    chain.mkdir()
    previous = hidden
    for n in range(1, LINKS + 1):
        (chain / f"c{n}").symlink_to(previous)
        previous = chain / f"c{n}"
    script = f"""
        set -e
        mount -t tmpfs top {hidden}
        touch {hidden}/tmpfs-top
        for n in 1 2 3 4 5; do mkdir -p {root}/busy$n; mount -t tmpfs busy {root}/busy$n; done
        exec {launcher} --detach {root} --keep {root}/workspaces/ws_0 --keep {previous} \
            -- /bin/ls {previous}/
    """
    done = subprocess.run(
        ["unshare", "-m", "--propagation", "private", "sh", "-c", script],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["tmpfs-top"], (
        "the host mount a 40-link keep reaches was unmounted: the program saw what it hides",
        done.stdout,
    )


@pytest.mark.parametrize(
    "ids",
    ["4294967296:61000", "-4294967296:61000", "61010:4294967296", "61010:-1", "4294967295:1"],
)
def test_ids_wider_than_a_uid_are_refused_before_anything_runs(launcher: Path, ids: str) -> None:
    done = subprocess.run(
        [str(launcher), "--ids", ids, "--", "/bin/sh", "-c", "id -u; id -g"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 127, (done.stdout, "ran as", ids)
    assert done.stdout == "" and "--ids wants UID:GID" in done.stderr, done.stderr


def test_an_unknown_rlimit_resource_is_refused_not_cut_down(launcher: Path) -> None:
    done = subprocess.run(
        [str(launcher), "--rlimit", f"{(1 << 32) + 7}:64:64", "--", "/bin/true"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 127 and "a known RESOURCE" in done.stderr, done.stderr


def test_the_operators_sandbox_uid_is_bounded_to_a_uid() -> None:
    for field in ("sandbox_uid", "sandbox_gid"):
        with pytest.raises(ValueError, match="4294967294"):
            SandboxPolicy.model_validate({field: 1 << 32})
        with pytest.raises(ValueError, match="greater than or equal to 1"):
            SandboxPolicy.model_validate({field: 0})
        assert getattr(SandboxPolicy.model_validate({field: 61000}), field) == 61000
