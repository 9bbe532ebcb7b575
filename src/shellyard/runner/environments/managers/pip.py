"""The ``pip`` manager: uv installs into the prefix's own interpreter (V2).

``uv pip install|uninstall --python <prefix>/bin/python``, sandboxed by the environment
store. Specs are checked before uv runs (PEP 508, and nothing that looks like an option), and
uv's answer is sorted into the error kinds of V8 from its message. ``index_url`` replaces the
default index and ``"none"`` means no index at all (``--no-index``: only ``find_links``);
``extra_index_urls`` and ``find_links`` are honoured; the workspace's local folders reach the
tool as the reader's copies shown where the request named them (``wheels.FolderCopies``), an
operator's are bound read-only, and a change that uses no remote source runs with the network
off.

Where each installed distribution came from (the index, or the ``find_links`` folder and the
wheel's sha256) is kept in ``<prefix>/.shellyard/pip-sources.json``: inside the prefix, so a
rolled-back change rolls it back too.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote, urlparse

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from shellyard.runner.environments.managers import prefix_files, wheels
from shellyard.runner.environments.managers.base import ManagerContext, ManagerError
from shellyard.runner.protocol import EnvironmentChangeRequest, PackageRecord

DEFAULT_INDEX = "https://pypi.org/simple"
#: ``index_url`` values meaning "no index" (pip's and uv's ``--no-index``).
NO_INDEX = frozenset({"none", "no-index"})
SOURCES_FILE = Path(".shellyard/pip-sources.json")
#: A dist-info that conda linked (its INSTALLER says so) belongs to the conda manager.
FOREIGN_INSTALLERS = frozenset({"conda", "rattler", "pixi"})

_NOT_FOUND = (
    re.compile(r"was not found in the (package registry|provided package locations)"),
    re.compile(r"there is no version of"),
    re.compile(r"not found in the package registry"),
    re.compile(r"\bHTTP status client error \(404"),
)
_UNREACHABLE = (
    re.compile(r"Failed to fetch"),
    re.compile(r"error sending request"),
    re.compile(r"dns error|failed to lookup address|Connection refused|tcp connect error"),
    re.compile(r"Could not connect|timed out|network is unreachable", re.IGNORECASE),
)
_INVALID = (re.compile(r"Failed to parse"), re.compile(r"invalid (requirement|version)"))


def uv_binary() -> Path:
    """The uv this runner was installed with (the ``uv`` wheel ships the binary)."""
    import uv

    return Path(uv.find_uv_bin())


@dataclass
class _Dist:
    name: str
    version: str
    path: Path
    installer: str


class PipManager:
    name = "pip"

    async def apply(self, ctx: ManagerContext, request: EnvironmentChangeRequest) -> None:
        python = _interpreter(ctx.prefix)
        if python is None:
            raise ManagerError(
                "failed",
                "this environment has no Python for pip to install into; create it with "
                "language 'python', or install python with the conda manager first",
            )
        if not request.specs:
            raise ManagerError("invalid_spec", "give at least one package spec")
        requirements = [_parse(spec) for spec in request.specs]
        if request.action == "uninstall":
            await self._uninstall(ctx, python, requirements)
        else:
            await self._install(ctx, python, request, requirements)

    async def _install(
        self,
        ctx: ManagerContext,
        python: Path,
        request: EnvironmentChangeRequest,
        requirements: list[Requirement],
    ) -> None:
        sources = _Sources.of(request)
        for requirement in requirements:
            if requirement.url:
                sources.add_location(requirement.url, what=f"the URL of {requirement.name}")
        if ctx.wheels is not None:
            ctx.progress("copying local packages into the environment store")
            requirements = await asyncio.to_thread(sources.stash, ctx, ctx.wheels, requirements)
        before = {(d.name, d.version) for d in _dists(ctx.prefix)}
        argv = [str(uv_binary()), "pip", "install", "--no-config", "--python", str(python)]
        argv += sources.options()
        argv += ["--", *(str(r) for r in requirements)]
        ctx.progress(f"installing {', '.join(str(r) for r in requirements)} with uv")
        code, tail = await ctx.run_tool(
            argv,
            env=_uv_env(ctx),
            binds=sources.local,
            network=sources.remote,
            mounts=sources.mounts,
        )
        if code != 0:
            raise _classify(tail, "install")
        ctx.progress("recording where the packages came from")
        recorded = _load_sources(ctx.prefix)
        for dist in _dists(ctx.prefix):
            if (dist.name, dist.version) in before or dist.installer in FOREIGN_INSTALLERS:
                continue
            recorded[_key(dist.name, dist.version)] = sources.origin_of(dist)
        _save_sources(ctx.prefix, recorded)

    async def _uninstall(
        self, ctx: ManagerContext, python: Path, requirements: list[Requirement]
    ) -> None:
        installed = {d.name: d for d in _dists(ctx.prefix)}
        names: list[str] = []
        for requirement in requirements:
            if requirement.specifier or requirement.url or requirement.extras:
                raise ManagerError(
                    "invalid_spec",
                    f"uninstall takes package names only, not {str(requirement)!r}; "
                    f"give {requirement.name!r}",
                )
            name = canonicalize_name(requirement.name)
            dist = installed.get(name)
            if dist is None:
                raise ManagerError(
                    "not_found",
                    f"{requirement.name} is not installed in this environment by pip; list "
                    f"the environment's packages to see what is",
                )
            if dist.installer in FOREIGN_INSTALLERS:
                raise ManagerError(
                    "conflict",
                    f"{requirement.name} was installed by {dist.installer}, not pip; "
                    f"uninstall it with the conda manager",
                )
            names.append(requirement.name)
        argv = [str(uv_binary()), "pip", "uninstall", "--no-config", "--python", str(python)]
        ctx.progress(f"uninstalling {', '.join(names)} with uv")
        code, tail = await ctx.run_tool([*argv, "--", *names], env=_uv_env(ctx), network=False)
        if code != 0:
            raise _classify(tail, "uninstall")

    async def packages(self, ctx: ManagerContext) -> list[PackageRecord]:
        recorded = _load_sources(ctx.prefix)
        out: list[PackageRecord] = []
        for dist in sorted(_dists(ctx.prefix), key=lambda d: d.name):
            if dist.installer in FOREIGN_INSTALLERS:
                continue
            origin = recorded.get(_key(dist.name, dist.version)) or _direct_url(dist.path)
            out.append(
                PackageRecord(
                    manager="pip",
                    name=dist.name,
                    version=dist.version,
                    source=origin.get("source"),
                    sha256=origin.get("sha256"),
                )
            )
        return out


def record_origin(prefix: Path, source: str) -> None:
    """Name ``source`` as the origin of every pip-visible distribution that has none yet
    (``create`` seeds pip through uv or ensurepip, not through this manager)."""
    recorded = _load_sources(prefix)
    for dist in _dists(prefix):
        if dist.installer not in FOREIGN_INSTALLERS:
            recorded.setdefault(_key(dist.name, dist.version), {"source": source, "sha256": None})
    _save_sources(prefix, recorded)


# ---------------------------------------------------------------------- sources


class _Sources:
    """Where one install may look: uv's options, the local folders to bind, whether the
    network is needed, and which of them a distribution came from."""

    def __init__(self) -> None:
        self.index: str | None = DEFAULT_INDEX
        self.extra: list[str] = []
        self.find_links: list[str] = []
        self.local: list[Path] = []
        self.remote = False
        #: find_links folder (as uv sees it) → what the request called it
        self.names: dict[str, str] = {}
        #: stashed find_links folder → {file name: sha256}
        self.hashes: dict[str, dict[str, str]] = {}
        #: distribution name → origin, for ``name @ file://…`` installs from the store
        self.direct: dict[str, dict[str, str | None]] = {}
        #: where the tool sees a copied folder of the workspace → the copy (``copy_folders``)
        self.mounts: dict[Path, Path] = {}

    @classmethod
    def of(cls, request: EnvironmentChangeRequest) -> _Sources:
        s = cls()
        if request.index_url is not None and request.index_url.strip().lower() in NO_INDEX:
            s.index = None
        elif request.index_url is not None:
            s.index = s.add_location(request.index_url, what="index_url")
        else:
            s.remote = True
        s.extra = [s.add_location(u, what="extra_index_urls") for u in request.extra_index_urls]
        s.find_links = [s.add_location(u, what="find_links") for u in request.find_links]
        return s

    def add_location(self, value: str, *, what: str) -> str:
        """Check a URL or absolute path; remember a local one for binding. Returns it."""
        text = value.strip()
        if not text or text.startswith("-"):
            raise ManagerError("invalid_spec", f"{what} {value!r} is not a URL or a folder")
        parsed = urlparse(text)
        if parsed.scheme in ("http", "https"):
            if not parsed.netloc:
                raise ManagerError("invalid_spec", f"{what} {value!r} has no host")
            self.remote = True
            return text
        if parsed.scheme == "file":
            path = Path(unquote(parsed.path))
        elif parsed.scheme == "" and text.startswith("/"):
            path = Path(text)
        else:
            raise ManagerError(
                "invalid_spec",
                f"{what} {value!r} must be an http(s):// or file:// URL or an absolute path "
                f"on the runner",
            )
        if not path.exists():
            raise ManagerError(
                "not_found", f"{what} {value!r}: {path} does not exist on this runner"
            )
        self.local.append(path if path.is_dir() else path.parent)
        return text

    def stash(
        self, ctx: ManagerContext, store: Path, requirements: list[Requirement]
    ) -> list[Requirement]:
        """Local find_links folders and ``file://`` requirements read through the content-
        addressed store (``wheels.py``); returns the requirements pointing at the copies."""
        stashed: set[Path] = set()
        budget = wheels.TreeBudget.fresh(ctx.room)  # every copy of this change's sources
        for i, link in enumerate(self.find_links):
            folder = _local_folder(link)
            if folder is None or not folder.is_dir():
                continue
            into = ctx.scratch / f"links-{i}"
            self.hashes[str(into)] = wheels.stash_folder(
                folder, store, into, ctx.read_as, budget=budget
            )
            self.names[str(into)] = ctx.origins.get(link, link)
            self.find_links[i] = str(into)
            stashed.add(folder)
        out: list[Requirement] = []
        for requirement in requirements:
            path = _local_folder(requirement.url) if requirement.url else None
            if path is None or path.is_dir() or not os.path.lexists(path):
                out.append(requirement)
                continue
            copy, sha = wheels.stash(path, store, ctx.scratch / "files", ctx.read_as, budget)
            stashed.add(path.parent)
            assert requirement.url is not None
            self.direct[canonicalize_name(requirement.name)] = {
                "source": ctx.origins.get(str(path), requirement.url),
                "sha256": sha,
            }
            extras = f"[{','.join(sorted(requirement.extras))}]" if requirement.extras else ""
            marker = f" ; {requirement.marker}" if requirement.marker else ""
            out.append(Requirement(f"{requirement.name}{extras} @ {copy.as_uri()}{marker}"))
        out = self.copy_folders(ctx, out, stashed, budget)
        # the tool reads the copies in its scratch folder, not the caller's files
        self.local = [p for p in self.local if p not in stashed]
        return out

    def copy_folders(
        self,
        ctx: ManagerContext,
        requirements: list[Requirement],
        stashed: set[Path],
        budget: wheels.TreeBudget | None = None,
    ) -> list[Requirement]:
        """The workspace's index and project folders among the sources read into copies
        the tool sees where the request named them (``wheels.FolderCopies``); returns the
        requirements naming them so."""
        copies = wheels.FolderCopies(ctx, budget)

        def named(text: str) -> str:
            seen = copies.shown(text)
            if seen is None:
                return text
            return seen.as_uri() if text.startswith("file:") else str(seen)

        if self.index is not None:
            self.index = named(self.index)
        self.extra = [named(url) for url in self.extra]
        # a page of links (a file): copied with its folder (stashed folders name the scratch)
        self.find_links = [named(link) for link in self.find_links]
        out: list[Requirement] = []
        for requirement in requirements:
            seen = copies.shown(requirement.url) if requirement.url else None
            if seen is not None:
                extras = f"[{','.join(sorted(requirement.extras))}]" if requirement.extras else ""
                marker = f" ; {requirement.marker}" if requirement.marker else ""
                requirement = Requirement(f"{requirement.name}{extras} @ {seen.as_uri()}{marker}")
            out.append(requirement)
        self.mounts = copies.mounts
        stashed.update(copies.copied)
        return out

    def options(self) -> list[str]:
        argv = ["--no-index"] if self.index is None else ["--index-url", self.index]
        for url in self.extra:
            argv += ["--extra-index-url", url]
        for link in self.find_links:
            argv += ["--find-links", link]
        return argv

    def origin_of(self, dist: _Dist) -> dict[str, str | None]:
        if dist.name in self.direct:
            return self.direct[dist.name]
        direct = _direct_url(dist.path)
        if direct:
            return direct
        for link in self.find_links:
            folder = _local_folder(link)
            if folder is None:
                continue
            wheel = _matching_wheel(folder, dist)
            if wheel is not None:
                known = self.hashes.get(link, {}).get(wheel.name)
                name = self.names.get(link, link)
                return {"source": name, "sha256": known or _sha256(wheel)}
        indexes = ([self.index] if self.index else []) + self.extra
        if not indexes and self.find_links:
            named = (self.names.get(link, link) for link in self.find_links)
            return {"source": " ".join(named), "sha256": None}
        return {"source": " ".join(indexes) or None, "sha256": None}


def _local_folder(link: str) -> Path | None:
    parsed = urlparse(link)
    if parsed.scheme == "file":
        return Path(unquote(parsed.path))
    if parsed.scheme == "" and link.startswith("/"):
        return Path(link)
    return None


def _matching_wheel(folder: Path, dist: _Dist) -> Path | None:
    """The wheel in ``folder`` named like ``dist`` (``<name>-<version>-<tags>.whl``)."""
    if not folder.is_dir():
        return None
    for entry in sorted(folder.iterdir()):
        parts = entry.name.split("-")
        if (
            entry.name.endswith(".whl")
            and len(parts) >= 5
            and canonicalize_name(parts[0]) == dist.name
            and _same_version(parts[1], dist.version)
        ):
            return entry
    return None


def _same_version(a: str, b: str) -> bool:
    try:
        return Version(a) == Version(b)
    except InvalidVersion:
        return a == b


def _sha256(path: Path) -> str | None:
    """A wheel's sha256, or None when it is not a regular file: the find_links copies are in
    the scratch folder the tool could write, so never a link's target, nor a FIFO that would
    block the runner's loop (docs/security.md, session 43)."""
    digest = hashlib.sha256()
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as handle:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _direct_url(dist_info: Path) -> dict[str, str | None]:
    """PEP 610 ``direct_url.json``: a distribution installed from a URL or a file."""
    try:
        data = json.loads(_read_record(dist_info / "direct_url.json"))
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict) or not isinstance(data.get("url"), str):
        return {}
    sha = None
    archive = data.get("archive_info")
    if isinstance(archive, dict):
        hashes = archive.get("hashes")
        if isinstance(hashes, dict) and isinstance(hashes.get("sha256"), str):
            sha = hashes["sha256"]
        elif isinstance(archive.get("hash"), str) and archive["hash"].startswith("sha256="):
            sha = archive["hash"][len("sha256=") :]
    return {"source": data["url"], "sha256": sha}


def _read_header(path: Path) -> str:
    """The first ``HEADER_BYTES`` of a header file a build may have left (METADATA,
    INSTALLER): its folder and itself opened without following a link, and bounded, so a
    sparse METADATA of 64 GiB (no room taken) is not read whole into the runner's memory
    (docs/security.md, "Attack pass (session 43)")."""
    return _read_bounded(path, prefix_files.HEADER_BYTES, whole=False)


def _read_record(path: Path) -> str:
    """A JSON record in the prefix (pip-sources.json, direct_url.json): as ``_read_header``,
    OSError when longer than ``RECORD_BYTES``."""
    return _read_bounded(path, prefix_files.RECORD_BYTES, whole=True)


def _read_bounded(path: Path, limit: int, whole: bool) -> str:
    folder = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        return prefix_files.read_at(folder, path.name, limit, whole=whole)
    finally:
        os.close(folder)


def _key(name: str, version: str) -> str:
    return f"{canonicalize_name(name)}=={version}"


def _load_sources(prefix: Path) -> dict[str, dict[str, str | None]]:
    try:
        data = json.loads(_read_record(prefix / SOURCES_FILE))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _save_sources(prefix: Path, recorded: dict[str, dict[str, str | None]]) -> None:
    """Written by the runner (root) into a prefix the tools' uid owns: through the folder's
    descriptor, never following a link a build left (``.shellyard`` or the temp file)."""
    folder = prefix / SOURCES_FILE.parent
    if folder.is_symlink():  # a build's (no tool runs any more): the runner's folder again
        folder.unlink()
    with contextlib.suppress(FileExistsError):
        os.mkdir(folder, 0o755)
    dir_fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        text = json.dumps(recorded, sort_keys=True, indent=1)
        prefix_files.write_at(dir_fd, SOURCES_FILE.name, text, 0o644)
    finally:
        os.close(dir_fd)


# ---------------------------------------------------------------------- the prefix


def _interpreter(prefix: Path) -> Path | None:
    for name in ("python", "python3"):
        candidate = prefix / "bin" / name
        if candidate.exists():
            return candidate
    return None


def _dists(prefix: Path) -> list[_Dist]:
    """Every distribution in the prefix's site-packages (a venv's or a conda python's)."""
    out: list[_Dist] = []
    real = Path(os.path.realpath(prefix))
    for site in sorted(prefix.glob("lib/python*/site-packages")):
        if Path(os.path.realpath(site)) != real / site.relative_to(prefix):
            continue  # a link on the way (``lib``, ``python3.X``, the folder): a build's
        for info in sorted(site.glob("*.dist-info")):
            name, version = _name_version(info)
            if name is None:
                continue
            try:
                installer = _read_header(info / "INSTALLER").strip()
            except OSError:
                installer = ""
            out.append(_Dist(canonicalize_name(name), version, info, installer))
    return out


def _name_version(info: Path) -> tuple[str | None, str]:
    """Name and version from METADATA's headers (the folder name is normalised, lossy)."""
    name: str | None = None
    version = ""
    try:
        text = _read_header(info / "METADATA")
    except OSError:
        return None, ""
    for line in text.splitlines():
        if not line.strip():
            break
        key, _, value = line.partition(":")
        if key == "Name":
            name = value.strip()
        elif key == "Version":
            version = value.strip()
    return name, version


# ---------------------------------------------------------------------- uv


def _uv_env(ctx: ManagerContext) -> dict[str, str]:
    return {
        **ctx.env,
        "UV_CACHE_DIR": str(ctx.cache / "uv"),
        "UV_PYTHON_DOWNLOADS": "never",
        "UV_NO_PROGRESS": "1",
        # The cache and the prefix are two bind mounts in the tool's sandbox, where hard
        # links between them fail (EXDEV) and uv falls back to copying anyway; copying on
        # purpose also keeps the prefix's files from sharing inodes with the cache.
        "UV_LINK_MODE": "copy",
    }


def _parse(spec: str) -> Requirement:
    text = spec.strip()
    if not text or text.startswith("-"):
        raise ManagerError(
            "invalid_spec",
            f"{spec!r} is not a package spec; give a name with an optional version, e.g. "
            f"'requests>=2.31' (options such as --index-url go in their own fields)",
        )
    try:
        return Requirement(text)
    except InvalidRequirement as exc:
        raise ManagerError(
            "invalid_spec",
            f"{spec!r} is not a valid package spec ({exc}); write it as pip would, e.g. "
            f"'name==1.2' or 'name>=1,<2'",
        ) from None


def _classify(tail: str, verb: str) -> ManagerError:
    """uv's failure, by its message, as a V8 error kind."""
    message = _error_lines(tail)
    if any(p.search(tail) for p in _INVALID):
        return ManagerError("invalid_spec", f"uv refused the spec: {message}")
    if any(p.search(tail) for p in _UNREACHABLE):
        return ManagerError(
            "unreachable",
            f"the package index or a link could not be reached: {message}; check the URL "
            f"and the runner's network",
        )
    if any(p.search(tail) for p in _NOT_FOUND):
        return ManagerError(
            "not_found", f"no such package or version: {message}; check the name and version"
        )
    if "No solution found" in tail:
        return ManagerError("conflict", f"the requirements cannot be satisfied: {message}")
    return ManagerError("failed", f"uv pip {verb} failed: {message}")


#: How the runner's own lines in a tool's log begin (tools.py: a limit or the free-space
#: reserve stopped the tool).
RUNNER_MARK = "shellyard: "


def _error_lines(tail: str) -> str:
    """uv's ``error:`` paragraph (its causes included) without the preamble, after the
    runner's own verdict when it stopped the tool: that line comes last in the log, and a
    backend's long traceback cut it from the 2,000 characters kept (a build that filled the
    volume then failed without saying so)."""
    lines = tail.strip().splitlines()
    ours = [line[len(RUNNER_MARK) :].strip() for line in lines if line.startswith(RUNNER_MARK)]
    lines = [line for line in lines if not line.startswith(RUNNER_MARK)]
    verdict = "".join(f"{line}; " for line in ours)
    for i, line in enumerate(lines):
        if line.startswith("error:"):
            return (verdict + " ".join(part.strip() for part in lines[i:]))[:2000]
    return (verdict + " ".join(line.strip() for line in lines[-8:]))[:2000]
