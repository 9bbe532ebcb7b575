"""The runner host's base environment (issue 20; V4, V6, V7): a command without
``environment_id`` runs in the prepared ``python-base`` (numpy, pandas, scipy, matplotlib on a
Python with pip and uv), its record and ``execution_status`` name the base and its revision,
the prefix stays read-only, a home made after the build uses it at once, and before any base
is prepared a command runs as before with a note that says how to prepare it.

The base is built ONCE per test session in a folder of its own (it downloads ~100 MB of
wheels): the ``python_base`` fixture."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from shellyard.contract.environments import EnvironmentRevisionsQuery
from shellyard.contract.executions import ExecutionLogsQuery, ExecutionState
from shellyard.runner.environments import bases
from shellyard.runner.environments.create import find_python
from shellyard.runner.environments.managers.pip import uv_binary

pytestmark = pytest.mark.timeout(600)

STACK = "import numpy, pandas, scipy, matplotlib; print(numpy.__version__, pandas.__version__)"


@pytest.fixture(scope="session")
def python_base() -> Iterator[bases.BaseRevision]:
    root = Path(tempfile.mkdtemp(prefix="shellyard-bases-", dir="/tmp"))
    root.chmod(0o755)  # the sandbox uid walks to the prefix to bind it
    base, built = asyncio.run(bases.prepare(bases.PYTHON_BASE, root=root))
    assert built and base.revision == 1
    yield base
    bases._make_writable(root)
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def use_base(python_base: bases.BaseRevision, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = python_base.prefix.parents[2]
    monkeypatch.setenv("SHELLYARD_BASES", str(root))
    monkeypatch.delenv("SHELLYARD_DEFAULT_ENVIRONMENT", raising=False)
    return root


async def test_default_base_has_the_scientific_stack(
    yard_factory: Any, use_base: Path, python_base: bases.BaseRevision
) -> None:
    """Issue 20 + V6: no environment_id, and the seed's stack imports; the record and
    execution_status show python-base and its revision; python, pip, uv on PATH."""
    yard = await yard_factory()
    result = await yard.run(f'python -c "{STACK}" && pip --version && uv --version && which python')
    assert result.state == ExecutionState.completed, (result.stdout, result.stderr)
    assert result.exit_code == 0
    assert result.stdout.splitlines()[0].split()[0] == python_base.packages["numpy"]
    assert result.stdout.strip().endswith("/base/python/bin/python")  # V4: its neutral path
    assert result.environment_id == "python-base"
    assert result.environment_revision == python_base.revision
    assert result.note is None
    status = await yard.plane.executions.status(result.execution_id)
    assert (status.environment_id, status.environment_revision) == ("python-base", 1)


async def test_pip_inside_hits_the_read_only_base(
    yard_factory: Any, use_base: Path, python_base: bases.BaseRevision
) -> None:
    """V7: pip inside a command fails on the read-only prefix as it normally would; the base
    (its files and its revision record) is unchanged."""
    yard = await yard_factory()
    record = (python_base.prefix.parents[1] / "1.json").read_bytes()
    tzdata = sorted(python_base.prefix.glob("lib/python*/site-packages/tzdata"))
    assert tzdata, "tzdata (a pandas dependency) should be in the base"
    result = await yard.run("pip uninstall -y tzdata; echo rc=$?; touch $VIRTUAL_ENV/x")
    assert result.exit_code != 0  # touch into the prefix fails
    assert "rc=0" not in result.stdout, result.stdout
    assert "Read-only file system" in result.stderr + result.stdout
    assert tzdata[0].is_dir()
    assert not (python_base.prefix / "x").exists()
    assert (python_base.prefix.parents[1] / "1.json").read_bytes() == record
    assert bases.current("python-base", use_base) == python_base


async def test_a_home_made_after_the_build_uses_it_at_once(
    yard_factory: Any, use_base: Path, python_base: bases.BaseRevision
) -> None:
    """Issue 20: a base is built once per runner host; a new home's first command uses it,
    and preparing again builds nothing (the revision list stays one)."""
    first = await yard_factory()
    second = await yard_factory()  # another home on the same host
    assert first.home != second.home
    result = await second.run(f'python -c "{STACK}"')
    assert result.exit_code == 0, result.stderr
    assert (result.environment_id, result.environment_revision) == ("python-base", 1)
    again, built = await bases.prepare(bases.PYTHON_BASE, root=use_base)
    assert not built and again == python_base
    assert sorted(p.name for p in (use_base / "python-base").glob("*.json")) == ["1.json"]


def test_cli_prepare_is_quick_when_built(use_base: Path) -> None:
    """``shellyard env prepare`` on a prepared host says so and builds nothing."""
    done = subprocess.run(
        [sys.executable, "-m", "shellyard", "env", "prepare", "--json"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "SHELLYARD_BASES": str(use_base)},
    )
    assert done.returncode == 0, done.stderr
    answer = json.loads(done.stdout)
    assert answer["built"] is False and answer["revision"] == 1
    assert answer["packages"]["numpy"]


async def test_without_a_prepared_base_a_command_runs_and_says_how(
    yard_factory: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 20: before the base is prepared a command never waits for a build: it runs with
    the host's tools (today's behaviour) and its result names the command that prepares it."""
    empty = Path(tempfile.mkdtemp(prefix="shellyard-bases-none-", dir="/tmp"))
    monkeypatch.setenv("SHELLYARD_BASES", str(empty))
    monkeypatch.delenv("SHELLYARD_DEFAULT_ENVIRONMENT", raising=False)
    yard = await yard_factory()
    result = await yard.run("echo hello")
    assert (result.exit_code, result.stdout) == (0, "hello\n")
    assert result.environment_id is None and result.environment_revision is None
    assert result.note is not None and "shellyard env prepare" in result.note
    assert list(empty.iterdir()) == []  # nothing was built
    shutil.rmtree(empty)


async def test_default_none_is_todays_behaviour(
    yard_factory: Any, use_base: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SHELLYARD_DEFAULT_ENVIRONMENT=none: no base even though one is prepared, no note."""
    monkeypatch.setenv("SHELLYARD_DEFAULT_ENVIRONMENT", "none")
    yard = await yard_factory()
    result = await yard.run("command -v python || echo no-python")
    assert result.exit_code == 0
    assert "python-base" not in result.stdout
    assert result.environment_id is None and result.note is None


async def test_upgrade_makes_a_new_revision_beside_the_old() -> None:
    """A base never changes in place: ``--upgrade`` builds revision N+1 beside N (whose files
    and record stay), then moves ``current``. Uses a root of its own (a copy of the session's
    record is not enough: a venv is not relocatable)."""
    root = Path(tempfile.mkdtemp(prefix="shellyard-bases-up-", dir="/tmp"))
    root.chmod(0o755)
    try:
        first, built = await bases.prepare(bases.PYTHON_BASE, root=root)
        assert built and first.revision == 1
        record = (root / "python-base" / "1.json").read_bytes()
        second, built = await bases.prepare(bases.PYTHON_BASE, root=root, upgrade=True)
        assert built and second.revision == 2
        assert bases.current(bases.PYTHON_BASE, root) == second
        assert (root / "python-base" / "1.json").read_bytes() == record
        assert (first.prefix / "bin" / "python").exists()
        assert second.prefix != first.prefix
    finally:
        bases._make_writable(root)
        shutil.rmtree(root, ignore_errors=True)


async def test_an_unknown_default_is_a_clear_error(
    yard_factory: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An operator's typo in SHELLYARD_DEFAULT_ENVIRONMENT fails the command with a message
    naming the bases and the value for no default."""
    monkeypatch.setenv("SHELLYARD_DEFAULT_ENVIRONMENT", "pyhton-base")
    yard = await yard_factory()
    result = await yard.run("echo hi")
    assert result.state == ExecutionState.failed
    assert result.error is not None
    assert "pyhton-base" in result.error and "python-base" in result.error
    assert "SHELLYARD_DEFAULT_ENVIRONMENT=none" in result.error


def _base_state(base: bases.BaseRevision) -> tuple[str, list[str]]:
    """The base's tree hash (paths, kinds, modes, contents, link targets) and revision list."""
    from env_fixtures import prefix_hash

    records = sorted(p.name for p in base.prefix.parents[1].glob("*.json"))
    return prefix_hash(base.prefix), records


async def test_environment_from_python_base_changes_never_reach_the_base(
    yard_factory: Any, use_base: Path, python_base: bases.BaseRevision, tmp_path: Path
) -> None:
    """Issue 20 item 3 (V1, V2, V8): ``environment_create --from python-base`` starts with the
    base's packages (numpy imports at once, revision 1 records them and where they came
    from), its files are copies of the base's (an inode of their own), pip installs
    another package into it and uninstalls a base package from it, and the base's tree hash
    and revision list are exactly what they were."""
    from env_fixtures import host_prefix, make_wheel

    from shellyard.contract.environments import EnvironmentChangeBody, EnvironmentCreateRequest

    before = _base_state(python_base)
    yard = await yard_factory()
    env = await yard.plane.environments.create(
        EnvironmentCreateRequest(
            name="sci", base="python-base", runner_id=yard.runner_id, wait_ms=30_000
        )
    )
    assert (env.state, env.revision) == ("ready", 1), env.error
    first = (
        await yard.plane.environments.revisions(
            env.environment_id, EnvironmentRevisionsQuery(revision=1)
        )
    )[0]
    pip = {p.name: p for p in first.packages if p.manager == "pip"}
    assert pip["numpy"].version == python_base.packages["numpy"]
    assert pip["numpy"].source == "python-base revision 1"
    assert any(p.manager == "base" and p.name == "python-base" for p in first.packages)
    assert (await yard.plane.environments.show(env.environment_id)).prefix == "/env"  # V4
    prefix = host_prefix(yard.runner_root, env.environment_id)
    numpy_init = next(prefix.glob("lib/python*/site-packages/numpy/__init__.py"))
    base_init = next(python_base.prefix.glob("lib/python*/site-packages/numpy/__init__.py"))
    # copies, never hard links (docs/security.md "Environments share no inode with a base"),
    # with the mtime kept (a .pyc checks its source's)
    mine, theirs = numpy_init.stat(), base_init.stat()
    assert mine.st_ino != theirs.st_ino
    assert (mine.st_nlink, theirs.st_nlink, mine.st_mtime_ns) == (1, 1, theirs.st_mtime_ns)
    assert numpy_init.read_bytes() == base_init.read_bytes()
    # the operator's folder: read as the sandbox uid (docs/environments.md), so not below
    # pytest's 0700 tmp_path
    wheels = yard.home / "wheels"
    make_wheel(wheels, "sy-extra", "1.0")
    wheels.chmod(0o755)
    installed = await yard.plane.environments.install(
        env.environment_id,
        EnvironmentChangeBody(
            manager="pip", specs=["sy-extra"], find_links=[str(wheels)], wait_ms=30_000
        ),
    )
    assert installed.state == "succeeded", installed.error
    removed = await yard.plane.environments.uninstall(
        env.environment_id, EnvironmentChangeBody(manager="pip", specs=["tzdata"], wait_ms=30_000)
    )
    assert removed.state == "succeeded", removed.error
    result = await yard.run(
        "python -c 'import numpy, sy_extra; print(numpy.__file__, sy_extra.VERSION)' && "
        'head -1 "$(command -v pip)" >&2',
        environment_id=env.environment_id,
    )
    assert result.exit_code == 0, result.stderr
    # V4: bin/'s scripts were rewritten from the base's built_at (/base/python) to /env
    assert result.stderr == "#!/env/bin/python\n", result.stderr
    where, version = result.stdout.split()
    assert where.startswith("/env/") and version == "1.0"  # V4: seen at /env, not its host path
    assert (result.environment_id, result.environment_revision) == (env.environment_id, 3)
    assert not list(prefix.glob("lib/python*/site-packages/tzdata"))
    assert _base_state(python_base) == before
    # the base itself still runs the stack, tzdata included
    plain = await yard.run("python -c 'import tzdata, pandas'")
    assert (plain.exit_code, plain.environment_id) == (0, "python-base"), plain.stderr


@pytest.mark.runner_kinds("local")
@pytest.mark.parametrize("mode", ["links", "copies", "auto"])
async def test_base_sharing_hard_links_or_copies_the_bases_files(
    yard_factory: Any, use_base: Path, python_base: bases.BaseRevision, mode: str
) -> None:
    """``SHELLYARD_BASE_SHARING`` (docs/environments.md "Starting from a base"): ``links``
    makes the new prefix's files the base's inodes, ``copies`` inodes of their own, ``auto``
    copies on this root runner (a uid per workspace by default); the revision's base record
    says which, and the environment runs numpy either way."""
    from env_fixtures import host_prefix

    from shellyard.contract.environments import EnvironmentCreateRequest
    from shellyard.runner.policy import SandboxPolicy

    if mode == "auto" and os.geteuid() != 0:
        pytest.skip("auto copies only where workspaces have uids of their own (root)")
    yard = await yard_factory(SandboxPolicy(base_sharing=mode))
    env = await yard.plane.environments.create(
        EnvironmentCreateRequest(
            name="shared", base="python-base", runner_id=yard.runner_id, wait_ms=30_000
        )
    )
    assert (env.state, env.revision) == ("ready", 1), env.error
    linked = mode == "links"
    first = (
        await yard.plane.environments.revisions(
            env.environment_id, EnvironmentRevisionsQuery(revision=1)
        )
    )[0]
    record = next(p for p in first.packages if p.manager == "base" and p.name == "python-base")
    assert record.source.endswith("(hard links)" if linked else "(copies)"), record.source
    prefix = host_prefix(yard.runner_root, env.environment_id)
    mine = next(prefix.glob("lib/python*/site-packages/numpy/__init__.py")).stat()
    theirs = next(python_base.prefix.glob("lib/python*/site-packages/numpy/__init__.py")).stat()
    assert ((mine.st_dev, mine.st_ino) == (theirs.st_dev, theirs.st_ino)) is linked
    assert (mine.st_nlink, theirs.st_nlink) == ((2, 2) if linked else (1, 1))
    result = await yard.run(
        "python -c 'import numpy; print(numpy.__file__)'", environment_id=env.environment_id
    )
    assert result.exit_code == 0 and result.stdout.startswith("/env/"), result.stderr


async def test_from_an_unprepared_base_is_refused(
    yard_factory: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 20: --from python-base before the base is prepared fails with the command that
    prepares it; no environment is usable."""
    from shellyard.contract.environments import EnvironmentCreateRequest
    from shellyard.errors import ShellyardError

    empty = Path(tempfile.mkdtemp(prefix="shellyard-bases-none-", dir="/tmp"))
    monkeypatch.setenv("SHELLYARD_BASES", str(empty))
    yard = await yard_factory()
    with pytest.raises(ShellyardError) as caught:
        await yard.plane.environments.create(
            EnvironmentCreateRequest(
                name="sci", base="python-base", runner_id=yard.runner_id, wait_ms=30_000
            )
        )
    assert "shellyard env prepare" in caught.value.message
    shutil.rmtree(empty)


@pytest.fixture(scope="session")
def r_base(python_base: bases.BaseRevision) -> bases.BaseRevision:
    """r-base beside the session's python-base (same bases folder), built once."""
    if shutil.which("Rscript") is None or shutil.which("apt-get") is None:
        pytest.skip("no R (r-base-core) or apt on this machine: r-base is built from them")
    root = python_base.prefix.parents[2]
    try:
        base, _built = asyncio.run(bases.prepare(bases.R_BASE, root=root))
    except Exception as exc:  # only the archive's reachability is a machine capability
        if "reaches the Debian archive" in str(exc) and "apt-get download" in str(exc):
            pytest.skip(f"the Debian archive is not reachable from this machine: {exc}")
        raise
    return base


async def test_default_runs_rscript_with_tidyverse_from_r_base(
    yard_factory: Any, use_base: Path, r_base: bases.BaseRevision
) -> None:
    """Issue 20: a fresh home runs the seed's ``Rscript`` examples without environment_id:
    R.version.string, and tidyverse and data.table load from r-base's library (the default
    python-base brings its companion along); python's stack is still there, the record names
    python-base, and R's library is read-only (V7)."""
    assert {"tidyverse", "data.table", "r"} <= set(r_base.packages)
    yard = await yard_factory()
    result = await yard.run("Rscript -e 'cat(R.version.string)'")
    assert result.exit_code == 0, result.stderr
    assert result.stdout.startswith("R version ")
    assert (result.environment_id, result.environment_revision) == ("python-base", 1)
    loads = await yard.run(
        "TZ=UTC Rscript -e 'suppressPackageStartupMessages({library(data.table); "
        'library(tidyverse)}); cat(as.character(packageVersion("data.table")), '
        "dirname(find.package(\"tidyverse\")))' && python -c 'import numpy'"
    )
    assert loads.exit_code == 0, loads.stderr
    version, library = loads.stdout.split()
    assert version == r_base.packages["data.table"]
    assert library == "/base/r/lib/R/library"  # V4: its neutral path
    write = await yard.run('Rscript -e \'install.packages("x", repos=NULL)\' ; touch "$R_LIBS/x"')
    assert write.exit_code != 0
    assert "Read-only file system" in write.stderr + write.stdout
    assert not (r_base.prefix / "lib/R/library/x").exists()


async def test_bases_show_no_host_path_of_their_folder(
    yard_factory: Any, use_base: Path, python_base: bases.BaseRevision, r_base: bases.BaseRevision
) -> None:
    """V4, R2 (docs/security.md "Host paths"): python-base and its companion r-base are built
    and bound at /base/python and /base/r, so inside a command neither mountinfo (each is an
    overlay of its own), PATH, R_LIBS, pip's shebang nor any file of either prefix names the bases
    folder; their records say where they were built for."""
    assert (python_base.seen, r_base.seen) == (Path("/base/python"), Path("/base/r"))
    for base in (python_base, r_base):
        record = json.loads((base.prefix.parents[1] / f"{base.revision}.json").read_text())
        assert record["built_at"] == str(base.seen)
    needles = [str(use_base), str(use_base.resolve())]
    yard = await yard_factory()
    result = await yard.run(
        'cat /proc/self/mountinfo /proc/self/mounts; echo "PATH=$PATH"; echo "R_LIBS=$R_LIBS"; '
        'head -1 "$(command -v pip)"; tr "\\0" " " </proc/1/cmdline; echo; '
        'echo "GREP=$(grep -rlF -e "$SY_A" -e "$SY_B" /base)"',
        env={"SY_A": needles[0], "SY_B": needles[1]},
        wait_ms=30_000,
    )
    if not result.state.terminal:  # the grep reads both bases whole: longer on a loaded CI
        ended = await yard.ended(result.execution_id, timeout_s=300)
        assert ended.exit_code == 0, ended
        query = ExecutionLogsQuery(limit=1 << 20)
        out = (await yard.plane.executions.logs(result.execution_id, query)).data
    else:
        assert result.exit_code == 0, result.stderr
        out = result.stdout
    leaks = [line for line in out.splitlines() if any(n in line for n in needles)]
    assert leaks == []
    # R2: each an overlay of its own (runner/prefix_mounts.py): root "/", layers descriptors
    seen_at = (["/base/python"], ["/base/r"])
    lines = [line.split() for line in out.splitlines() if line.split()[4:5] in seen_at]
    assert sorted((f[3], f[4], f[f.index("-") + 1]) for f in lines) == [
        ("/", "/base/python", "overlay"),
        ("/", "/base/r", "overlay"),
    ], lines
    assert "PATH=/base/python/bin:/base/r/bin:" in out
    assert "R_LIBS=/base/r/lib/R/library\n" in out
    assert "#!/base/python/bin/python" in out
    assert "GREP=\n" in out


async def test_a_base_prepared_before_keeps_its_host_path(
    yard_factory: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """V4 compatibility: a base revision whose record has no ``built_at`` (prepared before the
    neutral paths; its files name its host path) is bound at that path and still runs."""
    root = Path(tempfile.mkdtemp(prefix="shellyard-oldbase-", dir="/tmp"))
    try:
        root.chmod(0o755)
        prefix = root / bases.PYTHON_BASE / "1" / "prefix"
        prefix.parent.mkdir(parents=True)
        for folder in (root / bases.PYTHON_BASE, prefix.parent):
            folder.chmod(0o755)
        made = subprocess.run(
            [str(uv_binary()), "venv", "--no-config", "--python", str(find_python()), str(prefix)],
            capture_output=True, text=True, env={**os.environ, "UV_PYTHON_DOWNLOADS": "never"},
        )  # fmt: skip
        assert made.returncode == 0, made.stderr
        (prefix / "bin" / "sy-old").write_text(f"#!{prefix}/bin/python\nprint('old ran')\n")
        (prefix / "bin" / "sy-old").chmod(0o755)
        record = {"name": bases.PYTHON_BASE, "revision": 1, "packages": {}, "created_at": 0.0}
        (root / bases.PYTHON_BASE / "1.json").write_text(json.dumps(record))
        (root / bases.PYTHON_BASE / "current").write_text("1\n")
        monkeypatch.setenv("SHELLYARD_BASES", str(root))
        monkeypatch.setenv("SHELLYARD_DEFAULT_ENVIRONMENT", bases.PYTHON_BASE)
        base = bases.current(bases.PYTHON_BASE)
        assert base is not None and base.seen == prefix
        yard = await yard_factory()
        result = await yard.run("sy-old && python -c 'import sys; print(sys.prefix)'")
        assert result.exit_code == 0, result.stderr
        assert result.stdout == f"old ran\n{prefix}\n"
        assert result.environment_id == bases.PYTHON_BASE
    finally:
        shutil.rmtree(root, ignore_errors=True)
