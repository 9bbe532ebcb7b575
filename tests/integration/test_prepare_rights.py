"""``shellyard env prepare`` runs the package tools with no more than a sandbox's rights (R2
with V4; docs/security.md, "Operator builds").

Real components: the CLI verb as an operator runs it (a process of its own, as root here),
bubblewrap, the seccomp filter, the build's own egress proxy to this machine's PyPI, and uv
building an sdist from a local ``--find-links`` folder whose in-tree build backend is the
attack: it records ``id -u``, tries to read a root-only 0600 file it can see (in that very
folder) and ``/etc/shadow``, lists the variables it was given and reads its mountinfo.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from env_fixtures import backend_sdist

from shellyard.errors import InvalidInput
from shellyard.runner.environments import bases
from shellyard.runner.policy import SandboxPolicy
from shellyard.runner.sandbox import bwrap as sandbox

pytestmark = pytest.mark.timeout(900)

CANARY = "operator-root-only-canary-51c2"
SECRET = "sy-operator-token-not-for-builds"


@pytest.fixture
def bases_root() -> Iterator[Path]:
    root = Path("/tmp") / f"shellyard-prepare-{os.getpid()}"
    root.mkdir(mode=0o755)
    root.chmod(0o755)  # the sandbox uid walks to the prefix to bind it
    yield root
    bases._make_writable(root)
    shutil.rmtree(root, ignore_errors=True)


def _links_with_probe(folder: Path) -> Path:
    """A find-links folder (0755) holding the probe sdist and a root-only canary."""
    folder.mkdir(mode=0o755)
    folder.chmod(0o755)
    canary = folder / "canary"
    canary.write_text(CANARY)
    canary.chmod(0o600)
    body = f"""
    import subprocess
    RESULT = {{
        "uid": os.getuid(),
        "id_u": subprocess.run(["id", "-u"], capture_output=True, text=True).stdout.strip(),
        "env": sorted(os.environ),
        "secret_seen": {SECRET!r} in json.dumps(dict(os.environ)),
        "read": {{}},
        "mountinfo": open("/proc/self/mountinfo").read().splitlines(),
    }}
    for path in [{str(canary)!r}, "/etc/shadow"]:
        try:
            with open(path) as f:
                RESULT["read"][path] = f.read()
        except OSError as exc:
            RESULT["read"][path] = "error: " + type(exc).__name__
    """
    sdist = folder / "sy_prepare_probe-1.0.tar.gz"
    sdist.write_bytes(backend_sdist("sy-prepare-probe", "1.0", body))
    sdist.chmod(0o644)
    return canary


@pytest.mark.skipif(os.geteuid() != 0, reason="the sandbox uid exists only for a root runner")
def test_env_prepare_builds_as_the_sandbox_uid_and_reads_no_root_file(
    bases_root: Path,
) -> None:
    """R2/V4: the operator's ``env prepare --find-links DIR --with PKG`` builds the sdist's
    in-tree backend as the sandbox uid (``id -u``), which cannot read a root-only 0600 file
    next to the sdist nor /etc/shadow, and sees none of the operator's variables; the stack
    still comes from this machine's PyPI through the build's egress proxy (pypi.org resolves
    into 203.0.113.0/24 here: a default package registry); the sealed prefix is the base
    owner's and read-only, and the operator's log of the build is private."""
    links = bases_root.with_name(bases_root.name + "-links")  # the tools' uid walks there
    canary = _links_with_probe(links)
    env = {
        **os.environ,
        "SHELLYARD_BASES": str(bases_root),
        "SHELLYARD_TOKEN": SECRET,
        "SHELLYARD_TOOL_NETWORK": "egress",
    }
    env.pop("SHELLYARD_PACKAGE_REGISTRIES", None)
    verb = [sys.executable, "-m", "shellyard", "env", "prepare", "--json"]
    try:
        done = subprocess.run(
            [*verb, "--find-links", str(links), "--with", "sy-prepare-probe"],
            env=env,
            capture_output=True,
            text=True,
            timeout=840,
            check=False,
        )
    finally:
        shutil.rmtree(links, ignore_errors=True)
    assert done.returncode == 0, (done.stdout[-2000:], done.stderr[-4000:])
    record = json.loads(done.stdout)
    assert record["built"] and "sy-prepare-probe" in record["packages"]
    prefix = Path(record["prefix"])
    [module] = prefix.glob("lib/python*/site-packages/sy_prepare_probe.py")
    namespace: dict[str, object] = {}
    exec(module.read_text(), namespace)
    seen = json.loads(str(namespace["RESULT"]))

    sandbox_uid = sandbox.sandbox_ids(SandboxPolicy())
    assert sandbox_uid is not None
    assert seen["uid"] == sandbox_uid[0] != 0, seen
    assert seen["id_u"] == str(sandbox_uid[0]), seen
    assert seen["read"][str(canary)] == "error: PermissionError", seen
    shadow = seen["read"]["/etc/shadow"]
    assert shadow == "" or shadow.startswith("error: "), seen  # unreadable, or covered
    assert not seen["secret_seen"] and "SHELLYARD_TOKEN" not in seen["env"], seen
    assert CANARY not in module.read_text() and CANARY not in done.stdout
    # R2: the prefix, the bases' cache and the scratch are overlays of their own: no line of
    # the build's mountinfo names the bases folder (field 4 root, field 5 mount point)
    under = str(bases_root) + "/"
    named = [
        line
        for line in seen["mountinfo"]
        if any(f == str(bases_root) or f.startswith(under) for f in line.split()[3:5])
    ]
    assert not named, named
    assert not list(bases_root.rglob("*.tool-work")), "an overlay's work folder was left"

    # sealed: every file the base owner's, every folder root's, nothing writable or set-id
    for path in [prefix, *prefix.rglob("*")]:
        st = path.lstat()
        if path.is_symlink():
            assert st.st_uid == 0, path
        elif path.is_dir():
            assert (st.st_uid, st.st_mode & 0o7777) == (0, 0o555), path
        else:
            assert st.st_uid == bases.BASE_OWNER, path
            assert st.st_mode & 0o7222 == 0, path
    log = bases_root / "python-base" / "1.log"
    assert log.stat().st_mode & 0o077 == 0 and "sy-prepare-probe" in log.read_text()
    # between builds the cache is root's alone again
    cache = bases_root / "cache" / "uv"
    assert (cache.stat().st_uid, cache.stat().st_mode & 0o777) == (0, 0o700)


@pytest.mark.skipif(os.geteuid() != 0, reason="the sandbox uid exists only for a root runner")
async def test_a_find_links_folder_the_tools_cannot_reach_is_refused_first(
    bases_root: Path, tmp_path: Path
) -> None:
    """V8: a folder behind a 0700 parent (the tools' uid cannot enter it) is refused before
    anything is built, naming the folder that stops them and what to do."""
    hidden = tmp_path / "private"
    hidden.mkdir(mode=0o700)
    links = hidden / "links"
    links.mkdir(mode=0o755)
    with pytest.raises(InvalidInput, match=f"cannot enter {hidden}; name a folder"):
        await bases.prepare(root=bases_root, find_links=[links], extra=["anything"])
    assert not (bases_root / "python-base").exists()
