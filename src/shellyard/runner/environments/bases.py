"""Base environments (docs/environments.md): read-only prefixes built once per runner host and
shared by every home and workspace there; a command without ``environment_id`` runs in the default
one.

On disk, under :func:`bases_root` (``SHELLYARD_BASES``; ``/var/lib/shellyard/bases`` for root,
``~/.cache/shellyard/bases`` otherwise)::

    <name>/<revision>/prefix/     the prefix, read-only once built (files 0444/0555, folders
                                  0555); executions mount it read-only at this same path
    <name>/<revision>.json        the revision's record: packages, sources, when; it exists =
                                  the revision is complete
    <name>/current                the revision commands use now (written last, atomically)
    <name>.lock                   flock'd while a build runs (two homes never build twice)
    cache/uv                      uv's wheel cache, shared by every build

A base never changes in place: ``shellyard env prepare --upgrade`` builds revision N+1 beside
N and then moves ``current``; running commands keep the prefix they mounted. A venv is not
relocatable, so a revision is built at its final path, and a folder without its ``.json`` is
the leftover of a build cut short (removed by the next build).
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import os
import shutil
import stat
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from shellyard.errors import InvalidInput, ShellyardError
from shellyard.runner.environments.create import find_python, prefix_variables
from shellyard.runner.environments.managers.pip import DEFAULT_INDEX, uv_binary

PYTHON_BASE = "python-base"
#: R with tidyverse and data.table (runner/environments/rbase.py); the default's companion.
R_BASE = "r-base"
#: What ``python-base`` holds beyond the interpreter, pip and uv (the seed's scientific stack).
PYTHON_BASE_PACKAGES = ("numpy", "pandas", "scipy", "matplotlib")
#: The bases this runner can build.
KNOWN = (PYTHON_BASE, R_BASE)
#: ``SHELLYARD_DEFAULT_ENVIRONMENT`` value meaning "no default" (the behaviour before bases).
NONE = "none"
#: On a root runner a finished base belongs to this uid/gid (nobody): the package tools run as
#: root with every capability dropped, so they can neither write nor chmod a base file that an
#: environment made ``--from`` the base shares by hard link (runner/environments/derive.py).
BASE_OWNER = 65534

Progress = Callable[[str], None]


@dataclass(frozen=True)
class BaseRevision:
    name: str
    revision: int
    prefix: Path
    packages: dict[str, str]
    created_at: float


def bases_root() -> Path:
    configured = os.environ.get("SHELLYARD_BASES")
    if configured:
        return Path(configured)
    if os.geteuid() == 0:
        return Path("/var/lib/shellyard/bases")
    return Path.home() / ".cache" / "shellyard" / "bases"


def default_name() -> str | None:
    """The runner's default environment for commands without ``environment_id``."""
    name = os.environ.get("SHELLYARD_DEFAULT_ENVIRONMENT", PYTHON_BASE).strip() or PYTHON_BASE
    if name == NONE:
        return None
    _check_name(name)
    return name


def prepare_hint(name: str) -> str:
    return (
        f"no default environment: {name} is not prepared on this runner, so the command ran "
        f"with the host's tools only; run `shellyard env prepare` once on the runner's host "
        f"(or pass an environment_id)"
    )


def _check_name(name: str) -> None:
    if name not in KNOWN:
        raise InvalidInput(
            f"unknown base environment {name!r}; the bases are {', '.join(KNOWN)} (or set "
            f"SHELLYARD_DEFAULT_ENVIRONMENT={NONE} for no default)"
        )


def current(name: str, root: Path | None = None) -> BaseRevision | None:
    """The revision of ``name`` commands use now, or None while it is not prepared."""
    folder = (root or bases_root()) / name
    try:
        revision = int((folder / "current").read_text().strip())
        record = json.loads((folder / f"{revision}.json").read_text())
    except (OSError, ValueError):
        return None
    return BaseRevision(
        name=name,
        revision=revision,
        prefix=folder / str(revision) / "prefix",
        packages=dict(record.get("packages", {})),
        created_at=float(record.get("created_at", 0.0)),
    )


def mount(name: str) -> tuple[BaseRevision, tuple[Path, dict[str, str]]] | None:
    """For an execution about to start: the base's revision, the prefix to bind read-only
    and its variables (V4), or None while the base is not prepared.

    ``python-base`` brings ``r-base`` along when that is prepared too (its companion: the
    seed's ``Rscript analysis.R`` then finds tidyverse without an environment_id): both
    prefixes are seen through one read-only bind of the bases folder, python's ``bin`` first
    on PATH, R's library in ``R_LIBS``. The record names python-base and its revision."""
    base = current(name)
    if base is None or not base.prefix.is_dir():
        return None
    variables = prefix_variables(base.prefix)
    companion = current(R_BASE) if name == PYTHON_BASE else None
    if companion is None or not companion.prefix.is_dir():
        return base, (base.prefix, variables)
    r_variables = prefix_variables(companion.prefix)
    merged = {**r_variables, **variables, "PATH": f"{variables['PATH']}:{r_variables['PATH']}"}
    # the bases folder is the prefixes' common parent: public, read-only (its uv cache is 0700)
    return base, (base.prefix.parents[2], merged)


async def prepare(
    name: str = PYTHON_BASE,
    *,
    upgrade: bool = False,
    root: Path | None = None,
    progress: Progress = lambda _line: None,
) -> tuple[BaseRevision, bool]:
    """Build ``name`` unless it is prepared (``upgrade``: build a new revision anyway).
    Returns the current revision and whether this call built it."""
    _check_name(name)
    root = root or bases_root()
    _make_traversable(root)
    with _locked(root / f"{name}.lock"):
        existing = current(name, root)
        if existing is not None and not upgrade:
            return existing, False
        folder = root / name
        folder.mkdir(exist_ok=True)
        folder.chmod(0o755)
        revision = (existing.revision if existing else 0) + 1
        while (folder / f"{revision}.json").exists():
            revision += 1
        target = folder / str(revision)
        if target.exists():  # a build cut short
            _make_writable(target)
            shutil.rmtree(target)
        target.mkdir(mode=0o755)
        try:
            if name == R_BASE:
                from shellyard.runner.environments import rbase

                packages = await rbase.build(target / "prefix", root / "cache", progress)
                source = rbase.SOURCE
            else:
                packages = await _build_python(target / "prefix", root / "cache" / "uv", progress)
                source = DEFAULT_INDEX
        except BaseException:
            with contextlib.suppress(OSError):
                shutil.rmtree(target)
            raise
        progress("making the prefix read-only")
        _make_read_only(target)
        record = {
            "name": name,
            "revision": revision,
            "packages": packages,
            "source": source,
            "created_at": time.time(),
        }
        _write_atomic(folder / f"{revision}.json", json.dumps(record, indent=1, sort_keys=True))
        _write_atomic(folder / "current", f"{revision}\n")
        built = current(name, root)
        assert built is not None
        return built, True


async def _build_python(prefix: Path, cache: Path, progress: Progress) -> dict[str, str]:
    python = find_python()
    uv = str(uv_binary())
    cache.mkdir(parents=True, exist_ok=True)
    env = {
        **os.environ,
        "UV_CACHE_DIR": str(cache),
        "UV_PYTHON_DOWNLOADS": "never",
        # copies, not hard links into the cache: the prefix is made read-only afterwards
        "UV_LINK_MODE": "copy",
    }
    progress(f"making a virtual environment of {python}")
    await _run([uv, "venv", "--no-config", "--seed", "--python", str(python), str(prefix)], env)
    shutil.copy2(uv, prefix / "bin" / "uv")
    progress(f"installing {', '.join(PYTHON_BASE_PACKAGES)} from {DEFAULT_INDEX} with uv")
    await _run(
        [
            uv,
            "pip",
            "install",
            "--no-config",
            "--python",
            str(prefix / "bin" / "python"),
            "--index-url",
            DEFAULT_INDEX,
            "--",
            *PYTHON_BASE_PACKAGES,
        ],
        env,
        progress,
    )
    packages: dict[str, str] = {}
    for dist in sorted(prefix.glob("lib/python*/site-packages/*.dist-info")):
        name, _, version = dist.name[: -len(".dist-info")].partition("-")
        packages[name.lower().replace("_", "-")] = version
    version = (prefix / "pyvenv.cfg").read_text()
    for line in version.splitlines():
        key, _, value = line.partition("=")
        if key.strip() in ("version_info", "version"):
            packages["python"] = value.strip()
    return packages


async def _run(argv: list[str], env: dict[str, str], progress: Progress | None = None) -> None:
    process = await asyncio.create_subprocess_exec(
        *argv,
        env=env,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    assert process.stdout is not None
    tail: list[str] = []
    async for raw in process.stdout:  # streamed: only the last lines are kept
        line = raw.decode("utf-8", "replace").rstrip()
        tail = [*tail[-19:], line]
        if progress is not None and line:
            progress(line)
    code = await process.wait()
    if code != 0:
        raise ShellyardError(
            f"building the base failed ({argv[1]} {argv[2]} exited {code}): "
            + "\n".join(tail)
            + "\ncheck that the runner reaches "
            + DEFAULT_INDEX
            + ", then run "
            "`shellyard env prepare` again"
        )


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    with path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _make_traversable(root: Path) -> None:
    """The sandbox uid binds the prefix, so it must walk to it (0755: the bases are public)."""
    root.mkdir(parents=True, exist_ok=True)
    root.chmod(0o755)
    (root / "cache").mkdir(mode=0o700, exist_ok=True)


def _make_read_only(top: Path) -> None:
    owner = os.geteuid() == 0
    for folder, dirs, files in os.walk(top):
        for entry in files:
            path = os.path.join(folder, entry)
            mode = os.lstat(path).st_mode
            if stat.S_ISREG(mode):
                if owner:
                    os.chown(path, BASE_OWNER, BASE_OWNER)
                os.chmod(path, 0o555 if mode & stat.S_IXUSR else 0o444)
        for entry in dirs:
            path = os.path.join(folder, entry)
            if not os.path.islink(path):
                os.chmod(path, 0o555)
    os.chmod(top, 0o555)


def _make_writable(top: Path) -> None:
    for folder, dirs, _files in os.walk(top):
        os.chmod(folder, 0o755)
        for entry in dirs:
            path = os.path.join(folder, entry)
            if not os.path.islink(path):
                os.chmod(path, 0o755)


def _write_atomic(path: Path, text: str) -> None:
    temp = path.with_name(path.name + ".tmp")
    temp.write_text(text)
    temp.chmod(0o644)
    os.replace(temp, path)
