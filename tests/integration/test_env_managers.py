"""The conda, cran and bioconductor managers on a temp prefix (V2, V8).

The managers run for real: rattler solves and links from a local channel the tests build,
``Rscript`` installs from a local CRAN-like repository the tests build. The tool runner here
is a plain subprocess (it runs the real tool, without the environment store's sandbox).
"""

from __future__ import annotations

import asyncio
import hashlib
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from conda_channel import CondaPackage, PackageFile, build_test_channel_sync, script
from cran_repo import build_test_repo, r_available

from shellyard.runner.environments.managers import MANAGERS
from shellyard.runner.environments.managers.base import ManagerContext, ManagerError
from shellyard.runner.environments.managers.conda import CondaManager
from shellyard.runner.environments.managers.cran import BioconductorManager, CranManager
from shellyard.runner.protocol import EnvironmentChangeRequest

needs_r = pytest.mark.skipif(not r_available(), reason="R (Rscript) is not installed here")


async def subprocess_tool(
    argv: list[str],
    *,
    env: dict[str, str] | None = None,
    binds: list[Path] | None = None,
    network: bool = True,
    stdin: bytes | None = None,
    lines: Callable[[str], None] | None = None,
    mounts: dict[Path, Path] | None = None,
) -> tuple[int, str]:
    # no sandbox here: the tool reads a local channel at its own path, not the runner's copy
    process = await asyncio.create_subprocess_exec(
        *argv,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE if lines else asyncio.subprocess.STDOUT,
    )
    assert process.stdin is not None and process.stdout is not None
    process.stdin.write(stdin or b"")
    process.stdin.close()
    if lines is None:
        output, _ = await process.communicate()
        return process.returncode or 0, output.decode(errors="replace")[-20000:]
    async for raw in process.stdout:
        lines(raw.decode(errors="replace"))
    _, errors = await process.communicate()
    return process.returncode or 0, errors.decode(errors="replace")[-20000:]


class Env:
    """A prefix, its cache and scratch under one temp root, plus the progress lines seen."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.progress: list[str] = []
        self.ctx = ManagerContext(
            prefix=root / "prefix",
            scratch=root / "scratch",
            cache=root / "cache",
            progress=self.progress.append,
            run_tool=subprocess_tool,
        )
        for path in (self.ctx.prefix, self.ctx.scratch, self.ctx.cache):
            path.mkdir()

    async def change(self, manager: str, action: str, *specs: str, **options: object) -> None:
        request = EnvironmentChangeRequest(
            change_id=f"c{time.monotonic_ns()}",
            environment_id="env1",
            action=action,  # type: ignore[arg-type]
            manager=manager,  # type: ignore[arg-type]
            specs=list(specs),
            **options,  # type: ignore[arg-type]
        )
        await MANAGERS[manager].apply(self.ctx, request)

    async def failure(
        self, manager: str, action: str, *specs: str, **options: object
    ) -> ManagerError:
        with pytest.raises(ManagerError) as caught:
            await self.change(manager, action, *specs, **options)
        return caught.value

    async def versions(self, manager: str) -> dict[str, str]:
        return {p.name: p.version for p in await MANAGERS[manager].packages(self.ctx)}

    def run(self, *argv: str) -> str:
        return subprocess.run(argv, check=True, capture_output=True, text=True).stdout


@pytest.fixture
def env() -> Iterator[Env]:
    root = Path(tempfile.mkdtemp(prefix="shellyard-envmgr-", dir="/tmp"))
    yield Env(root)
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="module")
def channel() -> Iterator[str]:
    root = Path(tempfile.mkdtemp(prefix="shellyard-channel-", dir="/tmp"))
    build_test_channel_sync(root / "chan")
    yield (root / "chan").as_uri()
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="module")
def repo() -> Iterator[str]:
    if not r_available():
        pytest.skip("R (Rscript) is not installed here")
    root = Path(tempfile.mkdtemp(prefix="shellyard-cran-", dir="/tmp"))
    build_test_repo(root / "repo")
    yield (root / "repo").as_uri()
    shutil.rmtree(root, ignore_errors=True)


def test_registry_names_the_managers() -> None:
    """V2: the managers are found by the names requests use."""
    assert isinstance(MANAGERS["conda"], CondaManager)
    assert isinstance(MANAGERS["cran"], CranManager)
    assert isinstance(MANAGERS["bioconductor"], BioconductorManager)
    assert {name: m.name for name, m in MANAGERS.items()} == {n: n for n in MANAGERS}


# --- conda ---


async def test_conda_install_links_the_package_and_lists_it(env: Env, channel: str) -> None:
    """V2: a conda package from a local channel lands in the prefix, with its record."""
    started = time.monotonic()
    await env.change("conda", "install", "shellyard-hello ==1.0", channels=[channel])
    print(f"conda install from the local channel: {time.monotonic() - started:.3f}s")
    assert env.run(str(env.ctx.prefix / "bin" / "shellyard-hello")) == "hello 1.0\n"
    [record] = await MANAGERS["conda"].packages(env.ctx)
    archive = Path(channel.removeprefix("file://")) / "noarch" / "shellyard-hello-1.0-0.tar.bz2"
    assert (record.manager, record.name, record.version, record.build) == (
        "conda",
        "shellyard-hello",
        "1.0",
        "0",
    )
    assert record.source == channel + "/"
    assert record.sha256 == hashlib.sha256(archive.read_bytes()).hexdigest()
    assert env.progress[:2] == ["copying the local channels", "solving"]
    assert env.progress[-1] == "linking 1/1"
    # rattler wrote only into the prefix and the cache it was given (the runner's copy of the
    # channel is in the scratch).
    assert sorted(p.name for p in env.root.iterdir()) == ["cache", "prefix", "scratch"]
    assert list((env.ctx.cache / "rattler" / "pkgs").glob("shellyard-hello-1.0-0*"))


async def test_conda_upgrade_changes_only_what_it_must(env: Env, channel: str) -> None:
    """V2: installing a newer version moves that package alone; the others stay as they were."""
    await env.change(
        "conda", "install", "shellyard-hello 1.*", "shellyard-words", channels=[channel]
    )
    words_record = next((env.ctx.prefix / "conda-meta").glob("shellyard-words-*.json"))
    before = words_record.stat().st_mtime_ns
    env.progress.clear()
    await env.change("conda", "install", "shellyard-hello >=2", channels=[channel])
    assert await env.versions("conda") == {"shellyard-hello": "2.0", "shellyard-words": "1.0"}
    assert env.run(str(env.ctx.prefix / "bin" / "shellyard-hello")) == "hello 2.0\n"
    assert words_record.stat().st_mtime_ns == before
    assert env.progress[-1] == "linking 1/1"
    # A later install that does not name hello keeps it where it is.
    await env.change("conda", "install", "shellyard-placeholder", channels=[channel])
    assert (await env.versions("conda"))["shellyard-hello"] == "2.0"


async def test_conda_resolves_dependencies_and_uninstalls(env: Env, channel: str) -> None:
    """V2: dependencies come along; uninstall removes a leaf and refuses a needed package."""
    await env.change("conda", "install", "shellyard-greeter", channels=[channel])
    assert await env.versions("conda") == {
        "shellyard-greeter": "1.0",
        "shellyard-hello": "2.0",
        "shellyard-words": "1.0",
    }
    greeter = str(env.ctx.prefix / "bin" / "shellyard-greeter")
    out = subprocess.run(
        [greeter, "you"],
        env={"PATH": f"{env.ctx.prefix / 'bin'}:/usr/bin:/bin"},
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert out == "hello 2.0\ngreeted you\n"

    error = await env.failure("conda", "uninstall", "shellyard-hello")
    assert error.kind == "conflict"
    assert "shellyard-hello is needed by shellyard-greeter" in error.message
    error = await env.failure("conda", "uninstall", "shellyard-nothing")
    assert error.kind == "not_found" and "shellyard-nothing" in error.message
    error = await env.failure("conda", "uninstall", "shellyard-greeter >=1")
    assert error.kind == "invalid_spec"

    # Uninstall needs no channel: it only unlinks.
    await env.change("conda", "uninstall", "shellyard-greeter", "shellyard-words")
    assert await env.versions("conda") == {"shellyard-hello": "2.0"}
    assert not Path(greeter).exists()
    assert not (env.ctx.prefix / "share" / "shellyard-words").exists()


async def test_conda_errors_have_the_right_kind(env: Env, channel: str) -> None:
    """V8: unknown package, bad spec, unreachable channels and conflicts are told apart."""
    error = await env.failure("conda", "install", "shellyard-nope", channels=[channel])
    assert error.kind == "not_found" and "shellyard-nope" in error.message
    error = await env.failure("conda", "install", "shellyard-hello >=5", channels=[channel])
    assert error.kind == "not_found" and "shellyard-hello >=5" in error.message
    error = await env.failure("conda", "install", "shellyard-hello >=>1", channels=[channel])
    assert error.kind == "invalid_spec" and "shellyard-hello >=>1" in error.message
    error = await env.failure("conda", "install", channels=[channel])
    assert error.kind == "invalid_spec"
    error = await env.failure(
        "conda", "install", "shellyard-hello", channels=["file:///nonexistent"]
    )
    assert error.kind == "unreachable" and "file:///nonexistent" in error.message
    error = await env.failure(
        "conda", "install", "shellyard-hello", channels=["https://127.0.0.1:9/x"]
    )
    assert error.kind == "unreachable" and "https://127.0.0.1:9/x" in error.message
    assert "check the channel url" in error.message.lower()
    error = await env.failure(
        "conda", "install", "shellyard-greeter", "shellyard-hello <2", channels=[channel]
    )
    assert error.kind == "conflict" and "shellyard-greeter" in error.message
    error = await env.failure("conda", "install", "shellyard-hello", channels=["./relative"])
    assert error.kind == "invalid_spec"
    # Nothing was linked by any of them.
    assert not (env.ctx.prefix / "bin").exists()


async def test_conda_never_runs_link_scripts_and_relocates(env: Env, channel: str) -> None:
    """V2: a post-link script is not run (rattler runs in-process); prefix placeholders in
    text files are replaced with the prefix."""
    marker = Path("/tmp/shellyard-post-link-ran")
    marker.unlink(missing_ok=True)
    await env.change(
        "conda", "install", "shellyard-sneaky", "shellyard-placeholder", channels=[channel]
    )
    assert (env.ctx.prefix / "share" / "shellyard-sneaky" / "readme.txt").exists()
    assert not (env.ctx.prefix / "post-link-ran").exists()
    assert not marker.exists()
    conf = env.ctx.prefix / "etc" / "shellyard-placeholder.conf"
    assert conf.read_text() == f"prefix={env.ctx.prefix}\n"


async def test_conda_refuses_paths_outside_the_prefix(env: Env) -> None:
    """V8: a package whose paths leave the prefix is refused before rattler links it (rattler
    itself would abort the process on an absolute path)."""
    target = env.root / "outside"
    packages = [
        CondaPackage("escape-dotdot", "1.0", {"../../outside/x": PackageFile(b"x")}),
        CondaPackage("escape-absolute", "1.0", {f"{target}/y": PackageFile(b"y")}),
        CondaPackage("fine", "1.0", {"bin/fine": script("echo fine")}),
    ]
    chan = build_test_channel_sync(env.root / "evil", packages).as_uri()
    for name in ("escape-dotdot", "escape-absolute"):
        error = await env.failure("conda", "install", name, "fine", channels=[chan])
        assert error.kind == "failed" and "outside the prefix" in error.message
        assert name in error.message
    assert not target.exists()
    assert not (env.ctx.prefix / "bin").exists()


# --- cran and bioconductor ---


def r_library(env: Env) -> Path:
    return env.ctx.prefix / "lib" / "R" / "library"


@needs_r
async def test_cran_install_into_the_prefix_library(env: Env, repo: str) -> None:
    """V2: install.packages from a local repository puts the package into the prefix's
    library, where R loads it; dependencies come along."""
    await env.change("cran", "install", "shellyardgreet", repos=[repo])
    lib = r_library(env)
    out = env.run(
        "Rscript",
        "-e",
        f'library(shellyardgreet, lib.loc = "{lib}"); cat(shellyard_greet())',
    )
    assert out == "hello from R and greetings"
    records = {p.name: p for p in await MANAGERS["cran"].packages(env.ctx)}
    assert set(records) == {"shellyardgreet", "shellyardhello"}
    assert records["shellyardhello"].version == "1.0"
    assert records["shellyardgreet"].source == f"{repo}/src/contrib"
    assert await MANAGERS["bioconductor"].packages(env.ctx) == []

    error = await env.failure("cran", "uninstall", "shellyardhello")
    assert error.kind == "conflict" and "needed by shellyardgreet" in error.message
    await env.change("cran", "uninstall", "shellyardgreet", "shellyardhello")
    assert await env.versions("cran") == {}
    assert not (lib / "shellyardhello").exists()


@needs_r
async def test_cran_errors_have_the_right_kind(env: Env, repo: str) -> None:
    """V8: unknown package, missing version, bad spec, unreachable repository, and a package
    that fails to install are told apart; a failed install leaves no package behind."""
    error = await env.failure("cran", "install", "shellyardnope", repos=[repo])
    assert error.kind == "not_found" and "shellyardnope" in error.message
    error = await env.failure("cran", "install", "shellyardhello==9.9", repos=[repo])
    assert error.kind == "not_found" and "shellyardhello 1.0" in error.message
    error = await env.failure("cran", "install", "shellyardhello>=1", repos=[repo])
    assert error.kind == "invalid_spec" and "name==version" in error.message
    error = await env.failure("cran", "install", "shellyardhello", repos=["file:///nonexistent"])
    assert error.kind == "unreachable" and "file:///nonexistent" in error.message
    error = await env.failure("cran", "install", "shellyardhello", repos=["https://127.0.0.1:9/x"])
    assert error.kind == "unreachable" and "127.0.0.1:9/x" in error.message
    error = await env.failure("cran", "install", "shellyardbroken", repos=[repo])
    assert error.kind == "failed" and "shellyardbroken refuses to install" in error.message
    assert await env.versions("cran") == {}
    error = await env.failure("cran", "uninstall", "shellyardhello")
    assert error.kind == "not_found"


@needs_r
async def test_bioconductor_uses_the_given_repos(env: Env, repo: str) -> None:
    """V2: the bioconductor manager installs the same way from the repositories passed, and
    its packages are listed under its own name."""
    await env.change("bioconductor", "install", "shellyardhello==1.0", repos=[repo])
    [record] = await MANAGERS["bioconductor"].packages(env.ctx)
    assert (record.manager, record.name, record.version) == (
        "bioconductor",
        "shellyardhello",
        "1.0",
    )
    assert await MANAGERS["cran"].packages(env.ctx) == []
    error = await env.failure("cran", "uninstall", "shellyardhello")
    assert error.kind == "conflict" and "bioconductor" in error.message
    await env.change("bioconductor", "uninstall", "shellyardhello")
    assert await env.versions("bioconductor") == {}


async def test_r_packages_from_conda_belong_to_conda(env: Env, channel: str) -> None:
    """V2: an R package a conda package put into the prefix library is listed by conda only,
    and the cran manager refuses to remove it."""
    description = b"Package: shellyardconda\nVersion: 2.1\nPriority: optional\n"
    package = CondaPackage(
        "r-shellyardconda",
        "2.1",
        {"lib/R/library/shellyardconda/DESCRIPTION": PackageFile(description)},
    )
    chan = build_test_channel_sync(env.root / "rchan", [package]).as_uri()
    await env.change("conda", "install", "r-shellyardconda", channels=[chan])
    assert await env.versions("conda") == {"r-shellyardconda": "2.1"}
    assert await env.versions("cran") == {}
    error = await env.failure("cran", "uninstall", "shellyardconda")
    assert error.kind == "conflict" and "conda" in error.message


def tree(root: Path) -> list[tuple[str, int]]:
    return sorted((str(p.relative_to(root)), p.stat().st_size) for p in root.rglob("*"))


async def test_conda_cancel_waits_for_the_link_to_end(env: Env) -> None:
    """V8: a change cancelled while rattler links returns only once rattler has stopped
    writing, so the caller's rollback never races it."""
    files = {f"share/many/f{i:04d}.txt": PackageFile(b"x" * 64) for i in range(3000)}
    chan = build_test_channel_sync(env.root / "big", [CondaPackage("many", "1.0", files)])
    task = asyncio.create_task(env.change("conda", "install", "many", channels=[chan.as_uri()]))
    while not any(line.startswith(("downloading", "linking")) for line in env.progress):
        assert not task.done()
        await asyncio.sleep(0.001)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    settled = tree(env.ctx.prefix)
    await asyncio.sleep(0.3)
    assert tree(env.ctx.prefix) == settled
    assert len(list((env.ctx.prefix / "share" / "many").iterdir())) == 3000


async def test_conda_refuses_to_link_below_a_symbolic_link_a_build_left(
    env: Env, channel: str
) -> None:
    """R2 with V2: a pip build (the sandbox uid owns the prefix) can leave ``share`` as a link
    to a folder outside; rattler links as the runner's root, so shellyard-words (which puts
    share/shellyard-words/words.txt) is refused and nothing is written through the link."""
    outside = env.root / "outside"
    outside.mkdir()
    (env.ctx.prefix / "share").symlink_to(outside)
    error = await env.failure("conda", "install", "shellyard-words", channels=[channel])
    assert "below the symbolic link share" in error.message, error.message
    assert list(outside.iterdir()) == []
