"""The conda manager's child process: py-rattler solves and links, run by ``conda.py``
through the environment's tool sandbox (docs/environments.md, "Package tools run as the
sandbox uid").

Run as a script (``python -I conda_child.py``) by an interpreter the sandbox uid can execute,
so it imports nothing of shellyard: the standard library and rattler only (the runner passes
the folder rattler lives in). It reads one JSON request on stdin::

    {"action": "install" | "uninstall" | "list", "prefix": …, "cache": …,
     "specs": [...], "channels": [...], "path": [folders to import rattler from]}

and writes JSON lines on stdout: ``{"progress": "…"}`` while it works, then one
``{"result": {"packages": [...]}}`` (the conda records in the prefix afterwards) or
``{"error": {"kind": …, "message": …}}``. It runs as the sandbox uid, seeing the prefix, the
environment's own cache, the change's scratch and the channels the request names: a channel
(a workspace folder) is read with that uid's rights only, and a link in it reaches nothing
that uid may not read. Link scripts never run (``execute_link_scripts=False``), and every
package about to be linked has its ``info/paths.json`` checked first so that no path lands
outside the prefix or below a symbolic link (rattler itself aborts on an absolute path and
follows ``..``).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import re
import sys
from collections.abc import Callable, Iterable
from pathlib import Path, PurePosixPath
from typing import Any
from urllib.parse import unquote, urlparse

if __name__ == "__main__":
    # the request names the folder rattler is imported from (the runner's own)
    REQUEST: dict[str, Any] = json.loads(sys.stdin.buffer.read())
    sys.path[:0] = [str(p) for p in REQUEST.get("path", [])]

from rattler import (
    Channel,
    Client,
    Gateway,
    MatchSpec,
    PrefixRecord,
    RepoDataRecord,
    VirtualPackage,
    install,
    solve,
)
from rattler.exceptions import (
    FetchRepoDataError,
    GatewayError,
    InstallerError,
    InvalidChannelError,
    InvalidMatchSpecError,
    SolverError,
)
from rattler.package_streaming import PackageArchive

Progress = Callable[[str], None]


class ManagerError(Exception):
    """What went wrong, in the words of V8 (``kind`` is an ``EnvErrorKind``)."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message


#: Channels used when a request names none (conda's own default community channel).
DEFAULT_CHANNELS = ("conda-forge",)

_NOT_FOUND = re.compile(r"No candidates were found for (.+?)\.?$")
_DEP_NAME = re.compile(r"[A-Za-z0-9_.\-]+")
_NETWORK_WORDS = ("error sending request", "connect", "dns error", "timed out", "status code")


class Change:
    """One request against one prefix, with rattler's caches under ``cache/rattler``."""

    def __init__(self, prefix: Path, cache: Path, progress: Progress) -> None:
        self.prefix = prefix
        self.cache = cache / "rattler"
        self.progress = progress

    async def install(self, raw_specs: list[str], raw_channels: list[str]) -> None:
        specs = parse_specs(raw_specs)
        sources = parse_channels(raw_channels or list(DEFAULT_CHANNELS))
        installed = installed_records(self.prefix)
        wanted = {spec_name(spec) for spec in specs}
        # Everything installed stays requested by name and is preferred at its installed
        # build (locked): a change moves only what the new specs force to move.
        kept = [MatchSpec(r.name.normalized) for r in installed if r.name.normalized not in wanted]
        self.progress("solving")
        gateway = Gateway(cache_dir=self.cache / "repodata")
        try:
            solved = await solve(
                sources,
                [*kept, *specs],
                gateway=gateway,
                locked_packages=installed,
                virtual_packages=host_virtual_packages(),
            )
        except (GatewayError, FetchRepoDataError) as exc:
            raise unreachable(sources, str(exc)) from exc
        except SolverError as exc:
            raise solver_error(str(exc), wanted) from exc
        known = {r.sha256 for r in installed if r.sha256}
        incoming = [r for r in solved if not r.sha256 or r.sha256 not in known]
        self.progress(f"checking {len(incoming)} packages")
        # the path lists of local archives read before, kept in this environment's own cache
        # (only its own tools write there: docs/environments.md, "Caches")
        await check_packages(incoming, installed, self.cache / "verified", self.prefix)
        await link(self, solved, installed)

    async def uninstall(self, specs: list[str]) -> None:
        names = [uninstall_name(spec) for spec in specs]
        if not names:
            raise ManagerError("invalid_spec", "Name at least one conda package to uninstall.")
        installed = installed_records(self.prefix)
        present = {r.name.normalized for r in installed}
        missing = [name for name in names if name not in present]
        if missing:
            listing = ", ".join(sorted(present)) or "none"
            raise ManagerError(
                "not_found",
                f"conda has no package {', '.join(missing)} installed in this environment "
                f"(installed by conda: {listing}).",
            )
        removed = set(names)
        kept = [r for r in installed if r.name.normalized not in removed]
        needed = dependents(kept, removed)
        if needed:
            raise ManagerError(
                "conflict",
                "Cannot uninstall: "
                + "; ".join(f"{dep} is needed by {user}" for dep, user in needed)
                + ". Uninstall those packages in the same request, or leave it installed.",
            )
        # The remaining set was consistent before and loses only leaves, so it needs no solve
        # (and no channel): rattler unlinks what is missing from the list.
        await link(self, list(kept), installed)

    def packages(self) -> list[dict[str, str | None]]:
        return [
            {
                "name": record.name.normalized,
                "version": str(record.version),
                "build": str(record.build),
                "source": record.channel or None,
                "sha256": record.sha256.hex() if record.sha256 else None,
            }
            for record in installed_records(self.prefix)
        ]


def host_virtual_packages() -> list[VirtualPackage]:
    """What the runner offers packages (__glibc, __linux, __unix, __archspec …)."""
    try:
        return VirtualPackage.detect()
    except Exception as exc:
        raise ManagerError(
            "failed",
            f"The runner's system (glibc, kernel) could not be detected for conda ({exc}).",
        ) from exc


def installed_records(prefix: Path) -> list[PrefixRecord]:
    meta = prefix / "conda-meta"
    if not meta.is_dir():
        return []
    records = []
    for path in sorted(meta.glob("*.json")):
        try:
            records.append(PrefixRecord.from_path(path))
        except Exception as exc:
            raise ManagerError(
                "failed",
                f"The conda record {path.name} in the environment cannot be read ({exc}); "
                "recreate the environment.",
            ) from exc
    return records


def parse_specs(raw: list[str]) -> list[MatchSpec]:
    if not raw:
        raise ManagerError("invalid_spec", "Name at least one conda package spec to install.")
    specs = []
    for text in raw:
        try:
            spec = MatchSpec(text, strict=True)
        except (InvalidMatchSpecError, ValueError) as exc:
            raise ManagerError(
                "invalid_spec",
                f"'{text}' is not a valid conda package spec ({exc}). Write it as 'name', "
                "'name 1.2.*', 'name >=1.2,<2' or 'name ==1.2.3'.",
            ) from exc
        spec_name(spec)
        specs.append(spec)
    return specs


def spec_name(spec: MatchSpec) -> str:
    name = spec.name.as_package_name()
    if name is None:
        raise ManagerError(
            "invalid_spec",
            f"'{spec}' does not name one package; give the exact package name.",
        )
    return name.normalized


def uninstall_name(text: str) -> str:
    try:
        spec = MatchSpec(text, strict=True)
    except (InvalidMatchSpecError, ValueError) as exc:
        raise ManagerError(
            "invalid_spec", f"'{text}' is not a conda package name ({exc})."
        ) from exc
    name = spec_name(spec)
    if name != text.strip().lower():
        raise ManagerError(
            "invalid_spec",
            f"Uninstall takes package names only; write '{name}' instead of '{text}'.",
        )
    return name


def parse_channels(raw: list[str]) -> list[Channel]:
    channels = []
    for text in raw:
        text = text.strip()
        if text.startswith(("/", "file://")):
            folder = file_path(text)
            if not (folder / "noarch" / "repodata.json").is_file():
                raise ManagerError(
                    "unreachable",
                    f"The conda channel {text} cannot be read: {folder} holds no "
                    "noarch/repodata.json. Check the path, and index the folder "
                    "(rattler-index or conda index) if it holds packages.",
                )
            text = folder.resolve().as_uri()
        elif text.startswith((".", "~")) or not text:
            raise ManagerError(
                "invalid_spec",
                f"The conda channel '{text}' is neither a name, a URL nor an absolute path; "
                "give a channel name (conda-forge), a URL or an absolute folder path.",
            )
        try:
            channels.append(Channel(text))
        except (InvalidChannelError, ValueError) as exc:
            raise ManagerError(
                "invalid_spec", f"'{text}' is not a valid conda channel ({exc})."
            ) from exc
    return channels


def unreachable(sources: list[Channel], detail: str) -> ManagerError:
    named = [c.base_url for c in sources if c.base_url.rstrip("/") in detail]
    which = ", ".join(named or [c.base_url for c in sources])
    first = detail.strip().splitlines()[0] if detail.strip() else "no detail"
    return ManagerError(
        "unreachable",
        f"The conda channel {which} cannot be fetched ({first}). Check the channel URL or "
        "name and that the runner can reach it.",
    )


def solver_error(detail: str, wanted: set[str]) -> ManagerError:
    detail = detail.strip().removeprefix("Cannot solve the request because of:").strip()
    lines = detail.splitlines()
    missing = [m.group(1).removesuffix(" *") for m in map(_NOT_FOUND.match, lines) if m]
    # Only a flat list of "no candidates" lines means the package itself is unknown; the same
    # words inside a tree explain a conflict between versions.
    if missing and len(missing) == len(lines):
        named = ", ".join(f"'{name}'" for name in missing)
        extra = [m for m in missing if m.split()[0] not in wanted]
        needed = f" (needed by the request: {', '.join(extra)})" if extra else ""
        return ManagerError(
            "not_found",
            f"No conda package {named}{needed} in the given channels. Check the name, or add "
            "the channel that has it.",
        )
    return ManagerError(
        "conflict",
        f"The conda request cannot be satisfied together with what is installed:\n{detail}",
    )


async def check_packages(
    incoming: list[RepoDataRecord],
    installed: list[PrefixRecord],
    verified: Path | None = None,
    prefix: Path | None = None,
) -> None:
    """Refuse a package whose paths would leave the prefix: absolute, ``..``, or below a
    symbolic link some package puts in the prefix or that is in ``prefix`` already (a pip
    build could leave one for rattler to write through: docs/environments.md). ``verified``:
    where the path lists of local archives already read are kept by sha256."""
    client = Client.default_client()
    gate = asyncio.Semaphore(8)
    local = [
        r for r in incoming if verified is not None and r.url.startswith("file://") and r.sha256
    ]
    known: dict[str, list[tuple[str, bool]]] = {}
    if verified is not None and local:
        # one thread hop for all of them: 40 hops cost more than the hashing itself
        known = await asyncio.to_thread(_known_all, local, verified)

    async def read(record: RepoDataRecord) -> list[tuple[str, bool]]:
        if record.url in known:
            return known[record.url]
        async with gate:
            paths = await package_paths(client, record)
        if verified is not None and record in local:
            await asyncio.to_thread(_keep_paths, record, verified, paths)
        return paths

    found = await asyncio.gather(*(read(record) for record in incoming))
    listed = {r.name.normalized: paths for r, paths in zip(incoming, found, strict=True)}
    links = {p for entries in listed.values() for p, is_link in entries if is_link}
    for record in installed:
        links.update(str(e.relative_path) for e in record.paths_data.paths if e.path_type.softlink)
    on_disk: dict[str, bool] = {}

    def linked(parent: str) -> bool:
        if prefix is None or parent in (".", ""):
            return False
        if parent not in on_disk:
            on_disk[parent] = os.path.islink(prefix / parent)
        return on_disk[parent]

    for name, entries in listed.items():
        for path, _ in entries:
            if not safe_relative(path):
                raise ManagerError(
                    "failed",
                    f"The conda package {name} has a file path outside the prefix ({path}); "
                    "refusing to install it. Use a trusted build of the package.",
                )
            parents = {str(p) for p in PurePosixPath(path).parents}
            through = (parents & links) | {p for p in parents if linked(p)}
            if through:
                raise ManagerError(
                    "failed",
                    f"The conda package {name} puts {path} below the symbolic link "
                    f"{sorted(through)[0]}; refusing to install it.",
                )


async def package_paths(client: Client, record: RepoDataRecord) -> list[tuple[str, bool]]:
    url = record.url
    try:
        if url.startswith("file://"):
            archive = await PackageArchive.from_path(file_path(url))
        else:
            archive = await PackageArchive.from_url(client, url)
        paths = await archive.paths_json()
    except Exception as exc:
        raise ManagerError(
            "unreachable" if _networkish(str(exc)) else "failed",
            f"The conda package {record.file_name} cannot be read from {url} ({exc}).",
        ) from exc
    return [(str(e.relative_path), e.path_type.softlink) for e in paths.paths]


def _known_paths(record: RepoDataRecord, verified: Path) -> list[tuple[str, bool]] | None:
    """A local archive's path list when this runner read the same content before. The
    archive is hashed (cheap next to unpacking a .tar.bz2 to find info/paths.json) and must
    match its repodata sha256, which rattler checks again when it links; the lists are kept by
    sha256 outside every tool sandbox (a tool could otherwise forge one). Measured: 0.29 s of
    a 0.52 s conda change of 40 packages went to re-reading archives read before."""
    assert record.sha256 is not None
    expected = record.sha256.hex()
    archive = file_path(record.url)
    digest = hashlib.sha256()
    try:
        with archive.open("rb") as handle:
            for chunk in iter(lambda: handle.read(1 << 20), b""):
                digest.update(chunk)
    except OSError as exc:
        raise ManagerError(
            "failed", f"The conda package {record.file_name} cannot be read ({exc})."
        ) from exc
    if digest.hexdigest() != expected:
        raise ManagerError(
            "failed",
            f"The conda package {archive} does not match the sha256 its channel's repodata "
            "gives; re-index the channel (rattler-index) or use a trusted copy.",
        )
    try:
        data = json.loads((verified / f"{expected}.json").read_text())
    except (OSError, ValueError):
        return None
    return [(str(path), bool(link)) for path, link in data]


def _known_all(records: list[RepoDataRecord], verified: Path) -> dict[str, list[tuple[str, bool]]]:
    out = {}
    for record in records:
        paths = _known_paths(record, verified)
        if paths is not None:
            out[record.url] = paths
    return out


def _keep_paths(record: RepoDataRecord, verified: Path, paths: list[tuple[str, bool]]) -> None:
    assert record.sha256 is not None
    verified.mkdir(mode=0o700, parents=True, exist_ok=True)
    kept = verified / f"{record.sha256.hex()}.json"
    temp = kept.with_name(f"{kept.name}.{os.getpid()}.tmp")
    temp.write_text(json.dumps(paths))
    os.replace(temp, kept)


def safe_relative(path: str) -> bool:
    pure = PurePosixPath(path)
    return bool(path) and not pure.is_absolute() and ".." not in pure.parts


def dependents(kept: Iterable[RepoDataRecord], removed: set[str]) -> list[tuple[str, str]]:
    found = []
    for record in kept:
        for dep in record.depends:
            match = _DEP_NAME.match(dep.strip())
            if match and match.group(0).lower() in removed:
                name = match.group(0).lower()
                found.append((name, record.name.normalized))
    return found


class _Reporter:
    """Turns rattler's installer callbacks into progress lines (InstallerReporter protocol)."""

    def __init__(self, progress: Progress, loop: asyncio.AbstractEventLoop) -> None:
        # rattler calls back from its own threads; the caller's progress belongs to the loop.
        self.loop = loop
        self.report = progress
        self.total = 0
        self.done = 0
        self.downloads = 0

    def progress(self, line: str) -> None:
        self.loop.call_soon_threadsafe(self.report, line)

    def on_transaction_start(self, total_operations: int) -> None:
        self.total = total_operations
        self.progress(f"linking 0/{total_operations}")

    def on_transaction_operation_start(self, operation: int) -> None:
        return None

    def on_populate_cache_start(self, operation: int, package_name: str) -> int:
        return operation

    def on_validate_start(self, cache_entry: int) -> int:
        return cache_entry

    def on_validate_complete(self, validate_idx: int) -> None:
        return None

    def on_download_start(self, cache_entry: int) -> int:
        self.downloads += 1
        self.progress(f"downloading {self.downloads}")
        return self.downloads

    def on_download_progress(self, download_idx: int, progress: int, total: int | None) -> None:
        return None

    def on_download_completed(self, download_idx: int) -> None:
        return None

    def on_populate_cache_complete(self, cache_entry: int) -> None:
        return None

    def on_unlink_start(self, operation: int, package_name: str) -> int:
        return operation

    def on_unlink_complete(self, index: int) -> None:
        return None

    def on_link_start(self, operation: int, package_name: str) -> int:
        return operation

    def on_link_complete(self, index: int) -> None:
        return None

    def on_transaction_operation_complete(self, operation: int) -> None:
        self.done += 1
        self.progress(f"linking {self.done}/{self.total}")

    def on_transaction_complete(self) -> None:
        return None

    def on_post_link_start(self, package_name: str, script_path: str) -> int:
        return 0

    def on_post_link_complete(self, index: int, success: bool) -> None:
        return None

    def on_pre_unlink_start(self, package_name: str, script_path: str) -> int:
        return 0

    def on_pre_unlink_complete(self, index: int, success: bool) -> None:
        return None


async def link(
    change: Change, records: list[RepoDataRecord], installed: list[PrefixRecord]
) -> None:
    try:
        await install(
            records,
            target_prefix=change.prefix,
            cache_dir=change.cache / "pkgs",
            installed_packages=installed,
            execute_link_scripts=False,
            show_progress=False,
            reporter=_Reporter(change.progress, asyncio.get_running_loop()),
        )
    except InstallerError as exc:
        detail = " ".join(str(exc).split())
        if _networkish(detail):
            raise ManagerError(
                "unreachable",
                f"A conda package could not be downloaded ({detail}). Check that the runner "
                "can reach the channel.",
            ) from exc
        raise ManagerError("failed", f"Linking the conda packages failed: {detail}") from exc


def _networkish(detail: str) -> bool:
    lowered = detail.lower()
    return any(word in lowered for word in _NETWORK_WORDS)


def file_path(url: str) -> Path:
    """The folder a ``file://`` URL names (percent-escapes decoded)."""
    return Path(unquote(urlparse(url).path))


def _say(line: dict[str, object]) -> None:
    sys.stdout.write(json.dumps(line) + "\n")
    sys.stdout.flush()


async def _main(request: dict[str, Any]) -> None:
    change = Change(
        Path(request["prefix"]), Path(request["cache"]), lambda line: _say({"progress": line})
    )
    try:
        action = request["action"]
        if action == "install":
            await change.install(list(request["specs"]), list(request["channels"]))
        elif action == "uninstall":
            await change.uninstall(list(request["specs"]))
        _say({"result": {"packages": change.packages()}})
    except ManagerError as exc:
        _say({"error": {"kind": exc.kind, "message": exc.message}})


if __name__ == "__main__":
    asyncio.run(_main(REQUEST))
    # py-rattler's worker threads can still be releasing the GIL when the interpreter
    # finalizes: an abort ("PyGILState_Release ... finalizing", exit 134 or 139) after the
    # answer was written, which the runner must read as a failed change. The answer is
    # flushed, nothing is left to clean up in this one-shot process: end without finalizing.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
