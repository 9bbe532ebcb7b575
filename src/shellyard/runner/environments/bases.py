"""Base environments (docs/environments.md): read-only prefixes built once per runner host and
shared by every home and workspace there; a command without ``environment_id`` runs in the default
one.

On disk, under :func:`bases_root` (``SHELLYARD_BASES``; ``/var/lib/shellyard/bases`` for root,
``~/.cache/shellyard/bases`` otherwise)::

    <name>/<revision>/prefix/     the prefix, read-only once built (files 0444/0555, folders
                                  0555); built and bound at its neutral path (V4: ``SEEN``,
                                  /base/python, /base/r), whatever its revision
    <name>/<revision>.json        the revision's record: packages, sources, when, ``built_at``
                                  (the path its files name; absent: a revision prepared
                                  before, built and bound at its host path); it exists = the
                                  revision is complete
    <name>/current                the revision commands use now (written last, atomically)
    <name>.lock                   flock'd while a build runs (two homes never build twice)
    cache/uv                      uv's wheel cache, shared by every build (the sandbox uid's
                                  while a build runs, root's between builds)

A base never changes in place: ``shellyard env prepare --upgrade`` builds revision N+1 beside
N and then moves ``current``; running commands keep the prefix they mounted. A venv is not
relocatable, so a revision is built at its final path, and a folder without its ``.json`` is
the leftover of a build cut short (removed by the next build).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import stat
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from shellyard.errors import InvalidInput, ShellyardError
from shellyard.runner.environments.create import find_python
from shellyard.runner.environments.managers.pip import DEFAULT_INDEX, uv_binary
from shellyard.runner.environments.operator_tools import (
    OperatorBuild,
    check_reachable,
    sandbox_group,
    sandboxed_build,
)
from shellyard.runner.environments.seen import prefix_variables
from shellyard.runner.environments.tools import BASE_OWNER, LEGACY_BASE_OWNER
from shellyard.runner.sandbox import tenants
from shellyard.runner.sandbox.bwrap import BASE_PYTHON, BASE_R, Mount

PYTHON_BASE = "python-base"
#: R with tidyverse and data.table (runner/environments/rbase.py); the default's companion.
R_BASE = "r-base"
#: What ``python-base`` holds beyond the interpreter, pip and uv (the seed's scientific stack).
PYTHON_BASE_PACKAGES = ("numpy", "pandas", "scipy", "matplotlib")
#: The bases this runner can build.
KNOWN = (PYTHON_BASE, R_BASE)
#: Where each base is built for and seen in every sandbox (V4, R2: no host path inside).
SEEN = {PYTHON_BASE: BASE_PYTHON, R_BASE: BASE_R}
#: ``SHELLYARD_DEFAULT_ENVIRONMENT`` value meaning "no default" (the behaviour before bases).
NONE = "none"

Progress = Callable[[str], None]


@dataclass(frozen=True)
class BaseRevision:
    name: str
    revision: int
    prefix: Path
    packages: dict[str, str]
    created_at: float
    #: Where its files say it is, where sandboxes bind it: ``SEEN[name]``, or the host
    #: prefix for a revision prepared before (its record has no ``built_at``).
    seen: Path


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


def default_for_command() -> tuple[dict[str, object], Mount | None]:
    """The runner's default environment for a command without one (docs/environments.md):
    what the result reports, and the mount; never a build (a first command does not wait)."""
    name = default_name()
    if name is None:
        return {}, None
    found = mount(name)
    if found is None:
        return {"note": prepare_hint(name)}, None
    base, bound = found
    return {"base_environment": base.name, "base_revision": base.revision}, bound


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
    prefix = folder / str(revision) / "prefix"
    built_at = record.get("built_at")
    return BaseRevision(
        name=name,
        revision=revision,
        prefix=prefix,
        packages=dict(record.get("packages", {})),
        created_at=float(record.get("created_at", 0.0)),
        seen=Path(built_at) if isinstance(built_at, str) and built_at.startswith("/") else prefix,
    )


#: ``_in_use``'s last reading of each base folder: the stamp of its ``current`` file, the
#: revision it named and that revision's prefix variables.
_READ: dict[str, tuple[tuple[int, int, int, int], BaseRevision, dict[str, str]]] = {}


def _in_use(name: str) -> tuple[BaseRevision, dict[str, str]] | None:
    """``current(name)`` and its prefix's variables, for a command's start: read again only
    when the ``current`` file changed. A revision never changes in place and ``current`` is
    replaced whole (a new inode) when it moves, so its stat stands for both; every start
    read four files and two JSON records before (docs/benchmarks.md §67's profile). The
    prefix itself is still looked at on every start (``mount``)."""
    folder = f"{bases_root()}/{name}"  # text, not two Path joins per base per start (§72)
    try:
        info = os.stat(f"{folder}/current")
    except OSError:
        return None
    stamp = (info.st_dev, info.st_ino, info.st_mtime_ns, info.st_size)
    known = _READ.get(folder)
    if known is not None and known[0] == stamp:
        return known[1], dict(known[2])  # the caller's own: a Mount may be added to
    base = current(name)
    if base is None or not base.prefix.is_dir():
        return None  # not kept: a prefix not there yet says nothing of the revision's files
    variables = prefix_variables(base.prefix, base.seen)
    # A move between the stat and the read leaves the newer revision under the older
    # stamp: the next start's stat differs and reads it again.
    _READ[folder] = (stamp, base, variables)
    return base, dict(variables)


def mount(name: str) -> tuple[BaseRevision, Mount] | None:
    """For an execution about to start: the base's revision, the prefix to bind read-only
    and its variables (V4), or None while the base is not prepared.

    ``python-base`` brings ``r-base`` along when that is prepared too (its companion: the
    seed's ``Rscript analysis.R`` then finds tidyverse without an environment_id): both
    prefixes are bound read-only, each where its files say it is (``BaseRevision.seen``),
    python's ``bin`` first on PATH, R's library in ``R_LIBS``. The record names python-base
    and its revision."""
    found = _in_use(name)
    if found is None or not found[0].prefix.is_dir():
        return None
    base, variables = found
    paired = _in_use(R_BASE) if name == PYTHON_BASE else None
    if paired is None or not paired[0].prefix.is_dir():
        return base, Mount(base.prefix, variables, base.seen)
    companion, r_variables = paired
    merged = {**r_variables, **variables, "PATH": f"{variables['PATH']}:{r_variables['PATH']}"}
    return base, Mount(base.prefix, merged, base.seen, ((companion.prefix, companion.seen),))


async def prepare(
    name: str = PYTHON_BASE,
    *,
    upgrade: bool = False,
    root: Path | None = None,
    progress: Progress = lambda _line: None,
    find_links: Sequence[Path] = (),
    extra: Sequence[str] = (),
) -> tuple[BaseRevision, bool]:
    """Build ``name`` unless it is prepared (``upgrade``: build a new revision anyway).
    Returns the current revision and whether this call built it. ``find_links``: local
    folders of wheels and sdists besides the index, ``extra``: more packages (python-base)."""
    _check_name(name)
    if extra and name != PYTHON_BASE:
        raise InvalidInput(f"--with adds Python packages: only to {PYTHON_BASE}, not {name}")
    for folder in find_links:
        if not folder.is_absolute() or not folder.is_dir():
            raise InvalidInput(f"--find-links {folder}: give the absolute path of a folder")
    check_reachable(list(find_links))
    root = root or bases_root()
    _check_owner()
    _make_traversable(root)
    with _locked(root / f"{name}.lock"):
        _reown_legacy(root / name)
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
        prefix = target / "prefix"
        log = folder / f"{revision}.log"  # each tool's whole output; the error shows its tail
        cache = root / "cache" / ("r" if name == R_BASE else "uv")  # the tools' during a build
        try:
            async with sandboxed_build(prefix, cache, log, seen=SEEN[name]) as build:
                if name == R_BASE:
                    from shellyard.runner.environments import rbase

                    packages = await rbase.build(build, prefix, progress)
                    source = rbase.SOURCE
                else:
                    packages = await _build_python(build, prefix, progress, find_links, extra)
                    source = DEFAULT_INDEX
        except BaseException:
            with contextlib.suppress(OSError):
                _make_writable(target)
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
            "built_at": str(SEEN[name]),  # V4: what its files name, where it is bound
        }
        _write_atomic(folder / f"{revision}.json", json.dumps(record, indent=1, sort_keys=True))
        _write_atomic(folder / "current", f"{revision}\n")
        built = current(name, root)
        assert built is not None
        return built, True


async def _build_python(
    build: OperatorBuild,
    prefix: Path,
    progress: Progress,
    find_links: Sequence[Path] = (),
    extra: Sequence[str] = (),
) -> dict[str, str]:
    """uv, sandboxed (operator_tools.py), makes the venv and installs the stack into it."""
    python = find_python()
    uv = str(uv_binary())
    env = {
        "UV_CACHE_DIR": str(build.cache),
        "UV_PYTHON_DOWNLOADS": "never",
        # copies, not hard links into the cache: the prefix is made read-only afterwards
        "UV_LINK_MODE": "copy",
    }
    progress(f"making a virtual environment of {python}")
    venv = [uv, "venv", "--no-config", "--seed", "--python", str(python), str(prefix)]
    await _tool(build, venv, env)
    shutil.copy2(uv, prefix / "bin" / "uv")  # before any package's code ran as the tools' uid
    os.chmod(prefix / "bin" / "uv", 0o755)
    wanted = [*PYTHON_BASE_PACKAGES, *extra]
    progress(f"installing {', '.join(wanted)} from {DEFAULT_INDEX} with uv")
    links = [arg for folder in find_links for arg in ("--find-links", str(folder))]
    # The stack as wheels (a build of scipy from source would take an hour); an operator's
    # extra package may be an sdist, built by its backend in the tools' sandbox.
    binary = [arg for name in PYTHON_BASE_PACKAGES for arg in ("--only-binary", name)]
    install = [uv, "pip", "install", "--no-config", "--python", str(prefix / "bin" / "python")]
    install += ["--index-url", DEFAULT_INDEX, *links, *binary, "--", *wanted]
    await _tool(build, install, env, list(find_links))
    packages: dict[str, str] = {}
    for dist in sorted(prefix.glob("lib/python*/site-packages/*.dist-info")):
        name, _, version = dist.name[: -len(".dist-info")].partition("-")
        packages[name.lower().replace("_", "-")] = version
    for line in _read_own(prefix / "pyvenv.cfg").splitlines():
        key, _, value = line.partition("=")
        if key.strip() in ("version_info", "version"):
            packages["python"] = value.strip()
    return packages


def _read_own(path: Path) -> str:
    """A file the tools wrote, read without following a link they may have put there."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    with os.fdopen(fd, encoding="utf-8", errors="replace") as handle:
        return handle.read(1 << 20)


async def _tool(
    build: OperatorBuild, argv: list[str], env: dict[str, str], binds: list[Path] | None = None
) -> None:
    code, tail = await build.run_tool(argv, env=env, binds=binds)
    if code != 0:
        raise ShellyardError(
            f"building the base failed ({argv[1]} {argv[2]} exited {code}): {tail.strip()}\n"
            f"check that the runner reaches {DEFAULT_INDEX}, then run `shellyard env prepare` "
            f"again"
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
    """The sandbox uids bind the prefix, so they must walk to it. On a root runner the
    bases root is 0750 and the sandbox group's (every workspace uid and the tools' have it):
    a base's files belong to ``BASE_OWNER``, whom nothing runs as, and are read-only; the
    closed root is a second wall: no other local user reaches them (docs/security.md,
    "Attack pass (session 43)", "The bases' owner"). Otherwise 0755 (the bases are public
    packages)."""
    root.mkdir(parents=True, exist_ok=True)
    group = sandbox_group()
    if group is None:
        root.chmod(0o755)
    else:
        os.chown(root, 0, group)
        root.chmod(0o750)
    (root / "cache").mkdir(mode=0o700, exist_ok=True)


def _check_owner() -> None:
    """On a root runner, refuse to seal bases for a uid this host gives to someone."""
    if os.geteuid() == 0 and tenants.held_by_host(BASE_OWNER, tenants.subordinate_ranges()):
        raise ShellyardError(
            f"uid {BASE_OWNER}, which owns the base environments' files so that nothing running "
            f"can change them, belongs to an account of this host (or to /etc/subuid or "
            f"/etc/subgid): give that account another uid, then run `shellyard env prepare` again"
        )


def _reown_legacy(folder: Path) -> None:
    """Files of revisions sealed before for ``nobody`` (65534), who any local process
    running as nobody could be, go to ``BASE_OWNER`` (a walk that follows no link; derived
    environments share these inodes, so they follow)."""
    if os.geteuid() != 0 or not folder.is_dir():
        return
    folders = [str(prefix) for prefix in folder.glob("*/prefix") if not prefix.is_symlink()]
    while folders:
        with os.scandir(folders.pop()) as entries:
            for entry in entries:
                st = entry.stat(follow_symlinks=False)
                if stat.S_ISDIR(st.st_mode):
                    folders.append(entry.path)
                elif stat.S_ISREG(st.st_mode) and st.st_uid == LEGACY_BASE_OWNER:
                    os.lchown(entry.path, BASE_OWNER, 0)


def _make_read_only(top: Path) -> None:
    """Seal a revision the tools built: files to ``BASE_OWNER``, folders and links to root
    (on a root runner), modes 0444/0555 (no set-id bit survives), walked without following a
    link; no tool of the build is alive any more (its sandbox died with it)."""
    owner = os.geteuid() == 0
    folders = [str(top)]
    while folders:
        folder = folders.pop()
        with os.scandir(folder) as entries:
            for entry in entries:
                mode = entry.stat(follow_symlinks=False).st_mode
                if stat.S_ISDIR(mode):
                    folders.append(entry.path)
                elif stat.S_ISREG(mode):
                    if owner:
                        os.lchown(entry.path, BASE_OWNER, 0)
                    os.chmod(entry.path, 0o555 if mode & stat.S_IXUSR else 0o444)
                elif owner:
                    os.lchown(entry.path, 0, 0)  # a link, or what a build left: never followed
        if owner:
            os.lchown(folder, 0, 0)
        os.chmod(folder, 0o555)


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
