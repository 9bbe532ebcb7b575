"""The bases' owner (docs/security.md, "The bases' owner"; R2, R6): a sealed base's files
belong to ``BASE_OWNER``, a uid nothing runs as, read-only, so a local user (``nobody``,
65534) cannot chmod or rewrite one even when handed a way past the closed bases root (a
descriptor of its folder: what a leaked fd or a bind mount would give); bases sealed for
65534 before are re-owned by the next ``env prepare``."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
import test_base_environment
from test_attack_pass_43 import _as_nobody

from shellyard.runner.environments import bases

python_base = test_base_environment.python_base

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="a base's owner is a root runner's")

NOBODY = 65534
#: Run as nobody with the folder's descriptor FD: make the file writable, append to it.
POISON = (
    "import os\n"
    "try:\n"
    "    os.chmod('target', 0o666, dir_fd=FD)\n"
    "except OSError as exc:\n"
    "    print('chmod', exc.errno)\n"
    "fd = os.open('target', os.O_WRONLY | os.O_APPEND, dir_fd=FD)\n"
    "os.write(fd, b'POISONED = True\\n')\n"
)


def _poison_as_nobody(target: Path) -> subprocess.CompletedProcess[str]:
    """``nobody`` holding an ``O_PATH`` descriptor of ``target``'s folder (past every closed
    folder above it) tries to rewrite ``target``."""
    folder = os.open(target.parent, os.O_PATH | os.O_DIRECTORY)
    script = POISON.replace("target", target.name).replace("FD", str(folder))
    try:
        return subprocess.run(
            ["/usr/bin/python3", "-I", "-c", script],
            preexec_fn=_as_nobody,
            pass_fds=(folder,),
            capture_output=True,
            text=True,
            check=False,
            cwd="/",
        )
    finally:
        os.close(folder)


def _sealed_tree(tmp_path: Path) -> Path:
    """A revision as the tools leave it (their uid's files), sealed as ``prepare`` seals."""
    prefix = tmp_path / "python-base" / "1" / "prefix"
    (prefix / "lib").mkdir(parents=True)
    module = prefix / "lib" / "module.py"
    module.write_text("VALUE = 1\n")
    os.chown(module, 61000, 61000)
    bases._make_read_only(prefix.parent)
    return module


def test_nobody_cannot_rewrite_a_sealed_base_file_past_the_closed_root(tmp_path: Path) -> None:
    module = _sealed_tree(tmp_path)
    st = module.stat()
    assert (st.st_uid, st.st_mode & 0o7777) == (bases.BASE_OWNER, 0o444)
    assert st.st_uid != NOBODY
    done = _poison_as_nobody(module)
    assert done.returncode != 0, done
    assert module.read_text() == "VALUE = 1\n"
    assert module.stat().st_mode & 0o7777 == 0o444


def test_a_base_sealed_for_nobody_before_is_re_owned(tmp_path: Path) -> None:
    """A revision sealed by an earlier runner (files 65534's): the next ``prepare`` walks it
    (``_reown_legacy``) and nobody's rewrite then fails as for a new one."""
    module = _sealed_tree(tmp_path)
    os.lchown(module, NOBODY, NOBODY)
    assert _poison_as_nobody(module).returncode == 0  # what nobody could do before
    module.write_text("VALUE = 1\n")
    module.chmod(0o444)
    bases._reown_legacy(tmp_path / "python-base")
    assert module.stat().st_uid == bases.BASE_OWNER
    before = module.read_text()
    assert _poison_as_nobody(module).returncode != 0
    assert module.read_text() == before


@pytest.mark.timeout(900)
def test_nobody_cannot_rewrite_a_prepared_python_base_file(
    python_base: bases.BaseRevision,
) -> None:
    """The same on a real ``prepare`` of python-base: numpy's ``__init__.py``, which every
    environment made ``--from`` the base shares by hard link."""
    target = next(python_base.prefix.glob("lib/python3*/site-packages/numpy/__init__.py"))
    before = target.read_bytes()
    done = _poison_as_nobody(target)
    after = target.read_bytes()
    if after != before:  # put the shared fixture back before failing
        target.write_bytes(before)
        os.chmod(target, 0o444)
    assert done.returncode != 0, done
    assert after == before
    assert target.stat().st_uid == bases.BASE_OWNER
