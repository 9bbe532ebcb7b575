"""The runner's C programs (the launcher, the warm waiter) are built with the host's compiler:
with musl's static libc where the host has musl-gcc (its start-up asks the CPU nothing,
glibc's cpuid reads of the cache sizes trap to the hypervisor: docs/benchmarks.md §81), else
linked statically with glibc where the host has libc.a (each exec skips the dynamic loader's
relocations, §79), and a host without either still gets a dynamic build rather than none."""

from __future__ import annotations

import shutil
import struct
import subprocess
from pathlib import Path

import pytest

from shellyard.runner.sandbox import launch
from shellyard.runner.sandbox.warm import SOURCE as WARM

pytestmark = pytest.mark.skipif(
    shutil.which("cc") is None and shutil.which("gcc") is None, reason="no C compiler here"
)

_PT_INTERP = 3


def interpreter(binary: Path) -> bool:
    """Whether an ELF64 little-endian executable names a dynamic loader (a PT_INTERP
    program header)."""
    data = binary.read_bytes()
    assert data[:4] == b"\x7fELF" and data[4] == 2 and data[5] == 1, "not an ELF64 LE file"
    (phoff,) = struct.unpack_from("<Q", data, 0x20)
    phentsize, phnum = struct.unpack_from("<HH", data, 0x36)
    return any(
        struct.unpack_from("<I", data, phoff + k * phentsize)[0] == _PT_INTERP for k in range(phnum)
    )


def static_libc() -> bool:
    return any(Path(p).is_file() for p in ("/usr/lib/x86_64-linux-gnu/libc.a",
                                            "/usr/lib/aarch64-linux-gnu/libc.a",
                                            "/usr/lib/libc.a", "/usr/lib64/libc.a"))  # fmt: skip


@pytest.mark.skipif(not static_libc(), reason="no static libc (libc.a) on this host")
@pytest.mark.parametrize("program", ["launcher", "waiter"])
def test_the_c_programs_are_linked_statically_where_libc_a_exists(
    tmp_path: Path, program: str
) -> None:
    built = (
        launch.build(tmp_path / "bin")
        if program == "launcher"
        else launch.compile_c(tmp_path / "bin", WARM)
    )
    assert built is not None, "the host's compiler built nothing"
    assert not interpreter(built), f"{built.name} still asks for a dynamic loader"


def test_without_a_static_libc_the_build_falls_back_to_a_dynamic_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A compiler that refuses ``-static`` (as one without libc.a does) still gives a
    launcher that runs."""
    real = shutil.which("cc") or shutil.which("gcc")
    assert real is not None
    wrapper = tmp_path / "cc"
    wrapper.write_text(
        '#!/bin/sh\nfor a in "$@"; do [ "$a" = -static ] && { echo "no libc.a" >&2; exit 1; }; '
        f'done\nexec {real} "$@"\n'
    )
    wrapper.chmod(0o755)
    no_musl = tmp_path / "musl-gcc"  # nor musl's (a host without musl-tools)
    no_musl.write_text('#!/bin/sh\necho "musl-gcc: not installed" >&2\nexit 1\n')
    no_musl.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:/usr/bin:/bin")
    built = launch.build(tmp_path / "bin")
    assert built is not None
    assert interpreter(built)
    done = subprocess.run([str(built), "--", "/bin/echo", "ran"],
                                        capture_output=True, text=True, check=True)  # fmt: skip
    assert done.stdout == "ran\n"


@pytest.mark.skipif(shutil.which("musl-gcc") is None, reason="no musl-gcc (musl-tools) here")
def test_with_musl_the_launcher_carries_no_glibc_and_the_waiter_does(tmp_path: Path) -> None:
    """The launcher is built with musl where the host has it: nothing of glibc's start-up
    in it. The waiter stays glibc's: musl's execvp runs no file without a shebang through
    /bin/sh as bwrap's (glibc's) does for a cold start (E1, attack pass session 57)."""
    launcher = launch.build(tmp_path / "bin")
    waiter = launch.compile_c(tmp_path / "bin", WARM)
    assert launcher is not None and waiter is not None
    assert not interpreter(launcher)
    assert b"GLIBC_TUNABLES" not in launcher.read_bytes(), f"{launcher.name} is glibc's"
    assert b"GLIBC_TUNABLES" in waiter.read_bytes(), f"{waiter.name} is not glibc's"


def test_musl_gcc_is_taken_only_beside_the_hosts_cc(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A musl-gcc on a later PATH entry than the host's cc does not win over cc (attack
    pass, session 57: before, one anywhere on PATH was taken first)."""
    real = shutil.which("cc") or shutil.which("gcc")
    assert real is not None
    ccdir, later = tmp_path / "ccdir", tmp_path / "later"
    ccdir.mkdir()
    later.mkdir()
    (ccdir / "cc").symlink_to(real)
    planted = later / "musl-gcc"
    planted.write_text(f"#!/bin/sh\ntouch {tmp_path}/planted-ran\nexit 1\n")
    planted.chmod(0o755)
    monkeypatch.setenv("PATH", f"{ccdir}:{later}:/usr/bin:/bin")  # as, ld: /usr/bin
    built = launch.build(tmp_path / "bin")
    assert built is not None
    assert not (tmp_path / "planted-ran").exists(), "a musl-gcc off cc's folder ran"


@pytest.mark.skipif(shutil.which("musl-gcc") is None, reason="no musl-gcc (musl-tools) here")
def test_the_musl_launcher_still_makes_the_sandbox_sched_batch(tmp_path: Path) -> None:
    """musl's sched_setscheduler always fails by design: the launcher makes the system call
    itself, and the program it runs is SCHED_BATCH (policy 3)."""
    built = launch.build(tmp_path / "bin")
    assert built is not None
    done = subprocess.run(
        [str(built), "--sched", "batch", "--", "/bin/sh", "-c", "grep '^policy' /proc/self/sched"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert done.stdout.split()[-1] == "3", done.stdout
