"""The cran and bioconductor managers: ``install.packages`` / ``remove.packages`` run by
``Rscript`` through the environment store's tool runner, into the prefix's R library (V2).

``install.packages`` only warns when something goes wrong, so the script checks the
repositories' index first (unreachable repository, unknown package, unavailable version),
watches the warnings of the install and then looks at the library itself; it ends with one
machine-readable line per outcome, which is parsed here. Specs are ``name`` or
``name==version``; the version must be the one the repositories hold (``install.packages``
installs the repository's current version, and archives are out of scope).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
from pathlib import Path
from urllib.parse import unquote, urlparse

from shellyard.runner.environments.managers import prefix_files, wheels
from shellyard.runner.environments.managers.base import ManagerContext, ManagerError, tools_folder
from shellyard.runner.environments.managers.prefix_files import RECORD_BYTES
from shellyard.runner.protocol import EnvErrorKind, EnvironmentChangeRequest, PackageRecord

#: The prefix's R library, relative to the prefix (the same for an ``r`` environment and for a
#: ``python`` one that got R from conda).
R_LIBRARY = Path("lib/R/library")
#: Which manager installed which package from where: ``{name: {manager, repository}}``.
SOURCES_FILE = ".shellyard-sources.json"

CRAN_DEFAULT = "https://cloud.r-project.org"
#: Bioconductor release per R minor version (each Bioconductor release supports one R).
BIOC_RELEASES = {
    "4.0": "3.12",
    "4.1": "3.14",
    "4.2": "3.16",
    "4.3": "3.18",
    "4.4": "3.20",
    "4.5": "3.22",
}

_NAME = re.compile(r"[A-Za-z][A-Za-z0-9.]*[A-Za-z0-9]")
_VERSION = re.compile(r"[0-9]+([.-][0-9]+)+")
_MARK = "SHELLYARD"
_KINDS: dict[str, EnvErrorKind] = {
    "not_found": "not_found",
    "unreachable": "unreachable",
    "failed": "failed",
    "invalid_spec": "invalid_spec",
}


class CranManager:
    name = "cran"

    async def apply(self, ctx: ManagerContext, request: EnvironmentChangeRequest) -> None:
        library = library_path(ctx.prefix)
        tools_folder(library, ctx.prefix)
        if request.action == "uninstall":
            await self._uninstall(ctx, request, library)
        else:
            await self._install(ctx, request, library)

    async def packages(self, ctx: ManagerContext) -> list[PackageRecord]:
        return [r for r in library_packages(ctx.prefix) if r.manager == self.name]

    def default_repos(self) -> str:
        """An R expression for the repositories used when a request names none."""
        return f'c(CRAN = "{CRAN_DEFAULT}")'

    async def _install(
        self, ctx: ManagerContext, request: EnvironmentChangeRequest, library: Path
    ) -> None:
        wanted = parse_specs(request.specs)
        # R2, V4: a repository of the workspace is read into a copy R sees where the
        # request named it (/workspace/…): what it records names no host path of the home
        copies = wheels.FolderCopies(ctx)
        repos = []
        for text in request.repos:
            url = repo_url(text)  # its index checked, a failure naming what was asked
            seen = copies.shown(text)
            repos.append(url if seen is None else seen.as_uri())
        repos_expr = f"c({', '.join(r_string(r) for r in repos)})" if repos else ""
        script = INSTALL_SCRIPT.format(
            lib=r_string(ctx.inside(str(library))),  # V4: as the tool's sandbox shows it
            repos=repos_expr or self.default_repos(),
            pkgs=r_vector(list(wanted)),
            versions=r_vector(list(wanted.values())),
        )
        ctx.progress(f"installing {', '.join(wanted)} with R")
        output = await self._run(ctx, script, repos, copies.mounts)
        installed = parse_installed(output)
        record_sources(library, self.name, installed)

    async def _uninstall(
        self, ctx: ManagerContext, request: EnvironmentChangeRequest, library: Path
    ) -> None:
        names = list(parse_specs(request.specs, names_only=True))
        present = {p.name: p for p in library_packages(ctx.prefix)}
        missing = [n for n in names if n not in present]
        if missing:
            raise ManagerError(
                "not_found",
                f"No R package {', '.join(missing)} is installed in this environment's "
                f"library (installed: {', '.join(sorted(present)) or 'none'}).",
            )
        users = [
            (name, other)
            for other in sorted(present)
            if other not in names
            for name in dependencies(library / other)
            if name in names
        ]
        if users:
            raise ManagerError(
                "conflict",
                "Cannot uninstall: "
                + "; ".join(f"{name} is needed by {other}" for name, other in users)
                + ". Uninstall those packages in the same request, or leave it installed.",
            )
        foreign = [n for n in names if present[n].manager != self.name]
        if foreign:
            raise ManagerError(
                "conflict",
                f"{', '.join(foreign)} was installed by another manager "
                f"({', '.join(sorted({present[n].manager for n in foreign}))}); "
                "uninstall it with that one.",
            )
        script = REMOVE_SCRIPT.format(lib=r_string(ctx.inside(str(library))), pkgs=r_vector(names))
        ctx.progress(f"removing {', '.join(names)} with R")
        await self._run(ctx, script, [])
        forget_sources(library, names)

    async def _run(
        self,
        ctx: ManagerContext,
        script: str,
        repos: list[str],
        mounts: dict[Path, Path] | None = None,
    ) -> str:
        """Run ``script``; ``mounts``: the copies of repositories, {where R sees one: the
        copy}; every other ``file://`` repository is bound at its own path."""
        mounts = mounts or {}
        folders = [file_path(r) for r in repos if r.startswith("file://")]
        local_only = bool(repos) and len(folders) == len(repos)
        folders = [f for f in folders if f not in mounts]
        # A file in the scratch folder rather than ``-e``: the tool log then shows one short
        # command line, and the script's own text cannot be mistaken for its result lines.
        ctx.scratch.mkdir(parents=True, exist_ok=True)
        path = ctx.scratch / f"shellyard-{self.name}.R"
        path.write_text(script)
        code, output = await ctx.run_tool(
            [rscript(ctx.prefix), "--vanilla", str(path)],
            env=dict(ctx.env),
            binds=folders,
            # Repositories that are all folders need no network at all.
            network=not local_only,
            mounts=mounts,
        )
        error = parse_error(output)
        if error is not None:
            raise error
        if code != 0:
            raise ManagerError("failed", f"R stopped with exit code {code}: {r_errors(output)}")
        return output


class BioconductorManager(CranManager):
    name = "bioconductor"

    def default_repos(self) -> str:
        # The release matching the R that runs, with CRAN for the packages Bioconductor ones
        # depend on (what BiocManager::repositories() gives).
        table = ", ".join(f'"{r}" = "{b}"' for r, b in BIOC_RELEASES.items())
        base = "https://bioconductor.org/packages/"
        return (
            f"local({{ releases <- c({table}); "
            'rv <- paste(R.version$major, sub("\\\\..*", "", R.version$minor), sep = "."); '
            'if (!(rv %in% names(releases))) shellyard_report("failed", paste0('
            '"no Bioconductor release is known for R ", rv, "; pass the repository URLs")); '
            f'b <- paste0("{base}", releases[[rv]]); '
            'c(BioCsoft = paste0(b, "/bioc"), BioCann = paste0(b, "/data/annotation"), '
            'BioCexp = paste0(b, "/data/experiment"), '
            f'CRAN = "{CRAN_DEFAULT}") }})'
        )


def library_path(prefix: Path) -> Path:
    return prefix / R_LIBRARY


def rscript(prefix: Path) -> str:
    """The prefix's own R (from conda) when it has one, else the runner's."""
    own = prefix / "bin" / "Rscript"
    if own.exists():
        return str(own)
    found = shutil.which("Rscript")
    if found is None:
        raise ManagerError(
            "failed",
            "R is not installed on this runner and the environment has none; install R "
            "into the environment with conda (r-base) first.",
        )
    return found


def parse_specs(raw: list[str], *, names_only: bool = False) -> dict[str, str]:
    """``name`` or ``name==version`` → {name: version or ""}."""
    if not raw:
        raise ManagerError("invalid_spec", "Name at least one R package.")
    wanted: dict[str, str] = {}
    for text in raw:
        name, sep, version = text.strip().partition("==")
        name, version = name.strip(), version.strip()
        if not _NAME.fullmatch(name) or (sep and not _VERSION.fullmatch(version)):
            raise ManagerError(
                "invalid_spec",
                f"'{text}' is not an R package spec: write a package name (ggplot2) or "
                "name==version (ggplot2==3.4.0). Other version constraints are not supported: "
                "install.packages installs the repository's current version.",
            )
        if names_only and sep:
            raise ManagerError(
                "invalid_spec", f"Uninstall takes package names only; write '{name}'."
            )
        wanted[name] = version
    return wanted


def repo_url(text: str) -> str:
    text = text.strip()
    if text.startswith("/"):
        text = Path(text).as_uri()
    if text.startswith("file://"):
        folder = file_path(text)
        if not (folder / "src" / "contrib" / "PACKAGES").is_file():
            raise ManagerError(
                "unreachable",
                f"The R repository {text} cannot be read: {folder} holds no "
                "src/contrib/PACKAGES. Check the path, and index it with "
                "tools::write_PACKAGES.",
            )
        return text.rstrip("/")
    if not re.fullmatch(r"https?://[^\s\"\\]+", text):
        raise ManagerError(
            "invalid_spec",
            f"'{text}' is not a repository URL: give an http(s) URL, a file:// URL or an "
            "absolute folder path.",
        )
    return text.rstrip("/")


def r_string(text: str) -> str:
    if any(ord(c) < 32 for c in text):
        raise ManagerError("invalid_spec", f"{text!r} contains control characters.")
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def r_vector(items: list[str]) -> str:
    return f"c({', '.join(r_string(i) for i in items)})"


def parse_error(output: str) -> ManagerError | None:
    for line in output.splitlines():
        parts = line.split("\t")
        if len(parts) >= 3 and parts[0] == f"{_MARK}-ERROR" and parts[1] in _KINDS:
            kind = _KINDS[parts[1]]
            message = parts[2].strip()
            if kind == "failed":
                message = f"{message}: {r_errors(output)}"
            return ManagerError(kind, message)
    return None


def r_errors(output: str) -> str:
    """The R error lines of the output (what a user needs to see), else its last lines."""
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    picked = [
        line
        for line in lines
        if line.startswith(("Error", "ERROR")) or "error" in line.lower()[:40]
    ]
    picked = [line for line in picked if not line.startswith(_MARK)]
    return " | ".join((picked or lines)[-6:])[-2000:]


def parse_installed(output: str) -> dict[str, tuple[str, str]]:
    found = {}
    for line in output.splitlines():
        parts = line.split("\t")
        if len(parts) == 4 and parts[0] == f"{_MARK}-INSTALLED":
            found[parts[1]] = (parts[2], parts[3])
    return found


def _prefix_of(library: Path) -> Path:
    return library.parents[len(R_LIBRARY.parts) - 1]


def _load_sources(library: Path) -> dict[str, dict[str, str]]:
    """Read by root from a library the tools' uid owns: walked from the prefix without
    following a link, bounded (prefix_files.py; a build may have left links there)."""
    with prefix_files.folder(_prefix_of(library), R_LIBRARY) as fd:
        if fd is None:
            return {}
        try:
            data = json.loads(prefix_files.read_at(fd, SOURCES_FILE, RECORD_BYTES, whole=True))
        except (OSError, ValueError):
            return {}
    return data if isinstance(data, dict) else {}


def _save_sources(library: Path, sources: dict[str, dict[str, str]]) -> None:
    """Written by root into the library by its descriptor: never through a link a build
    left (the sources file, its temp file, or a folder on the way)."""
    with prefix_files.folder(_prefix_of(library), R_LIBRARY) as fd:
        if fd is None:
            raise ManagerError(
                "failed",
                f"the prefix's R library ({R_LIBRARY}) is no longer a folder of it (a "
                f"symbolic link on its way?); the packages' sources were not recorded",
            )
        prefix_files.write_at(fd, SOURCES_FILE, json.dumps(sources, indent=1, sort_keys=True))


def record_sources(library: Path, manager: str, installed: dict[str, tuple[str, str]]) -> None:
    sources = _load_sources(library)
    for name, (_, repository) in installed.items():
        sources[name] = {"manager": manager, "repository": repository}
    _save_sources(library, sources)


def forget_sources(library: Path, names: list[str]) -> None:
    sources = _load_sources(library)
    for name in names:
        sources.pop(name, None)
    _save_sources(library, sources)


def read_description(path: Path) -> dict[str, str]:
    """The DCF fields of a DESCRIPTION file (continuation lines joined); the file and its
    folder are opened without following a link, and read up to HEADER_BYTES."""
    try:
        folder = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return {}
    try:
        return parse_description(prefix_files.read_at(folder, path.name))
    except OSError:
        return {}
    finally:
        os.close(folder)


def parse_description(text: str) -> dict[str, str]:
    fields: dict[str, str] = {}
    key = None
    for line in text.splitlines():
        if line[:1] in (" ", "\t") and key is not None:
            fields[key] += " " + line.strip()
        elif ":" in line:
            key, _, value = line.partition(":")
            key = key.strip()
            fields[key] = value.strip()
    return fields


def dependencies(package_dir: Path) -> set[str]:
    fields = read_description(package_dir / "DESCRIPTION")
    names = set()
    for field in ("Depends", "Imports", "LinkingTo"):
        for item in fields.get(field, "").split(","):
            match = _NAME.match(item.strip())
            if match and match.group(0) != "R":
                names.add(match.group(0))
    return names


def library_packages(prefix: Path) -> list[PackageRecord]:
    """Every package in the prefix's R library; the manager is the one that installed it
    (``cran`` when unknown, ``conda`` when a conda package put it there)."""
    library = library_path(prefix)
    with prefix_files.folder(prefix, R_LIBRARY) as fd:
        if fd is None:  # none, or a link a build left (never followed by root)
            return []
        names = sorted(os.listdir(fd))
        texts: dict[str, str] = {}
        for name in names:
            with prefix_files.folder(library, name) as package:
                if package is None:
                    continue
                with contextlib.suppress(OSError):
                    texts[name] = prefix_files.read_at(package, "DESCRIPTION")
    sources = _load_sources(library)
    from_conda = conda_owned(prefix)
    records = []
    for name, text in texts.items():
        fields = parse_description(text)
        known = sources.get(name, {})
        manager = "conda" if name in from_conda else known.get("manager", "cran")
        if manager not in ("cran", "bioconductor", "conda"):
            manager = "cran"
        records.append(
            PackageRecord(
                manager=manager,
                name=fields.get("Package", name),
                version=fields.get("Version", "unknown"),
                source=known.get("repository") or fields.get("Repository") or None,
            )
        )
    return records


def conda_owned(prefix: Path) -> set[str]:
    """R packages whose files a conda package put into the library (r-base's own packages
    when R came from conda, and every ``r-*`` package)."""
    owned: set[str] = set()
    marker = f"{R_LIBRARY.as_posix()}/"
    records: list[str] = []
    with prefix_files.folder(prefix, "conda-meta") as fd:
        if fd is None:
            return owned
        for name in sorted(os.listdir(fd)):
            if name.endswith(".json"):
                with contextlib.suppress(OSError):
                    records.append(prefix_files.read_at(fd, name, RECORD_BYTES, whole=True))
    for text in records:
        try:
            files = json.loads(text).get("files", [])
        except (ValueError, AttributeError):
            continue
        for name in files:
            if isinstance(name, str) and name.startswith(marker) and name.endswith("/DESCRIPTION"):
                owned.add(name[len(marker) :].split("/")[0])
    return owned


INSTALL_SCRIPT = """
shellyard_report <- function(kind, msg) {{
  cat("\\nSHELLYARD-ERROR\\t", kind, "\\t", gsub("[\\t\\n]", " ", msg), "\\n", sep = "")
  quit(save = "no", status = 3)
}}
lib <- {lib}
dir.create(lib, recursive = TRUE, showWarnings = FALSE)
.libPaths(c(lib, .libPaths()))
repos <- {repos}
options(repos = repos, warn = 1, timeout = 120)
pkgs <- {pkgs}
versions <- {versions}
names(versions) <- pkgs
problems <- character()
ap <- withCallingHandlers(
  available.packages(repos = repos, type = "source"),
  warning = function(w) {{
    problems <<- c(problems, conditionMessage(w))
    invokeRestart("muffleWarning")
  }}
)
down <- grep("unable to access index", problems, value = TRUE)
if (length(down)) shellyard_report("unreachable", paste0(
  "The R repository cannot be read (", paste(down, collapse = "; "),
  "). Check the repository URL and that the runner can reach it."))
missing <- setdiff(pkgs, rownames(ap))
if (length(missing)) shellyard_report("not_found", paste0(
  "No R package ", paste(missing, collapse = ", "), " in the repositories ",
  paste(repos, collapse = ", "), ". Check the name (R package names are case-sensitive)."))
for (p in pkgs) if (nzchar(versions[[p]]) && ap[p, "Version"] != versions[[p]])
  shellyard_report("not_found", paste0(
    p, " ", versions[[p]], " is not in the repositories, which hold ", p, " ",
    ap[p, "Version"], "; ask for that version or for the name alone."))
before <- installed.packages(lib.loc = lib, noCache = TRUE)[, "Version"]
warned <- character()
withCallingHandlers(
  install.packages(pkgs, lib = lib, repos = repos, available = ap, type = "source",
                   dependencies = NA, Ncpus = 2L),
  warning = function(w) warned <<- c(warned, conditionMessage(w))
)
after <- installed.packages(lib.loc = lib, noCache = TRUE)
gone <- grep("dependenc.* not available", warned, value = TRUE)
if (length(gone)) shellyard_report("not_found", paste0(
  paste(gone, collapse = "; "), " in the repositories ", paste(repos, collapse = ", ")))
bad <- grep("non-zero exit status", warned, value = TRUE)
absent <- setdiff(pkgs, rownames(after))
if (length(bad) || length(absent)) shellyard_report("failed", paste0(
  "Installing the R packages failed (", paste(c(bad, absent), collapse = "; "), ")"))
for (p in rownames(after)) {{
  v <- after[p, "Version"]
  if (!(p %in% names(before)) || before[[p]] != v || p %in% pkgs) {{
    repo <- if (p %in% rownames(ap)) ap[p, "Repository"] else ""
    cat("SHELLYARD-INSTALLED\\t", p, "\\t", v, "\\t", repo, "\\n", sep = "")
  }}
}}
"""

REMOVE_SCRIPT = """
lib <- {lib}
pkgs <- {pkgs}
remove.packages(pkgs, lib = lib)
left <- intersect(pkgs, rownames(installed.packages(lib.loc = lib, noCache = TRUE)))
if (length(left)) {{
  cat("\\nSHELLYARD-ERROR\\tfailed\\tCould not remove ", paste(left, collapse = ", "), "\\n",
      sep = "")
  quit(save = "no", status = 3)
}}
"""


def file_path(url: str) -> Path:
    """The folder a ``file://`` URL names (percent-escapes decoded)."""
    return Path(unquote(urlparse(url).path))
