"""The package sources an operator allows on a runner (docs/environments.md).

``SHELLYARD_ALLOWED_SOURCES`` (or the runner daemon's ``--allowed-source``) lists them:
``pypi``, ``cran``, ``bioconductor`` (their public defaults), a conda channel name
(``conda-forge``), an ``https://`` URL (a mirror: everything below that path), a local folder
(``/srv/wheels``, ``file:///srv/channel``), or, the operator's explicit exception, one
``http://`` mirror. Unset, every ``https://`` source may be used, and local folders only in
the caller's workspace (``/workspace/…``) and ``SHELLYARD_AGENT_LOCAL_SOURCES``'s folders;
the operator's own direct calls to a runner
(``for_agent`` false) may also name any folder outside the runner's own folder.
``SHELLYARD_PACKAGES_OFFLINE=1`` (``--packages-offline``) allows local sources only: pip
runs with ``--no-index`` unless an allowed local index is named, and CRAN and Bioconductor
are refused.

A request is checked before anything runs (``EnvironmentStore._validate``): its own sources
and the defaults it falls back on. Local paths under ``/workspace/`` name the caller's
workspace (as inside a command); no local path may point into the runner's folder otherwise
(other sessions' workspaces, its records). The syntax rules (https, no credentials, …) are
``contract/sources.py``'s.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

from shellyard.contract.sources import (
    ALIASES,
    CONDA_CHANNEL_ALIAS,
    WORKSPACE,
    SourceError,
    check_spec,
    check_url,
    in_workspace,
    is_channel_name,
    is_local,
    local_path,
    names_workspace,
)
from shellyard.errors import InvalidInput
from shellyard.runner.protocol import EnvironmentChangeRequest

ALLOWED_VARIABLE = "SHELLYARD_ALLOWED_SOURCES"
#: Host folders (separated by ``:``) agents may name as local sources beside their workspace
#: on a runner with no allow-list (with one, its local entries are these).
AGENT_FOLDERS_VARIABLE = "SHELLYARD_AGENT_LOCAL_SOURCES"
OFFLINE_VARIABLE = "SHELLYARD_PACKAGES_OFFLINE"
NO_INDEX = frozenset({"none", "no-index"})
#: The sources a request falls back on when it names none.
DEFAULTS = {
    "pip": [ALIASES["pypi"]],
    "conda": [f"{CONDA_CHANNEL_ALIAS}/conda-forge"],
    "cran": [ALIASES["cran"]],
    "bioconductor": [ALIASES["bioconductor"], ALIASES["cran"]],
}


@dataclass(frozen=True)
class Allowed:
    """One runner's rule. ``urls`` / ``folders`` None: no allow-list (anything valid)."""

    urls: tuple[str, ...] | None = None
    folders: tuple[Path, ...] | None = None
    offline: bool = False
    #: No allow-list: the host folders an agent's request may still name (its workspace
    #: always); ``AGENT_FOLDERS_VARIABLE``.
    agent_folders: tuple[Path, ...] = ()

    @property
    def restricted(self) -> bool:
        return self.urls is not None


def parse(entries: list[str] | None, offline: bool = False) -> Allowed:
    """The operator's list as a rule; a bad entry is an error naming it."""
    if entries is None:
        raw = os.environ.get(AGENT_FOLDERS_VARIABLE, "")
        agent = tuple(Path(os.path.realpath(p)) for p in raw.split(":") if p.strip())
        return Allowed(offline=offline, agent_folders=agent)
    urls: list[str] = []
    folders: list[Path] = []
    for raw in entries:
        entry = raw.strip()
        if not entry:
            continue
        where = f"{ALLOWED_VARIABLE} entry {entry!r}"
        if entry.lower() in ALIASES:
            urls.append(ALIASES[entry.lower()])
            continue
        if is_channel_name(entry):
            urls.append(f"{CONDA_CHANNEL_ALIAS}/{entry}")  # a conda channel name
            continue
        try:
            text = check_url(entry, where, allow_http=True)
        except SourceError as exc:
            raise InvalidInput(f"{exc}; fix the runner's allowed sources") from None
        if is_local(text):
            folders.append(Path(os.path.realpath(local_path(text))))
        else:
            urls.append(text.rstrip("/"))
    return Allowed(urls=tuple(urls), folders=tuple(folders), offline=offline)


def named_workspace(request: EnvironmentChangeRequest) -> str | None:
    """The workspace ``request`` came with when a local source of it names that workspace
    (``/workspace/…``, by the same test as the check's), else None: only such a change holds
    the workspace's folders (R2; an index-only install reads nothing of it)."""
    if request.workspace_id is None:
        return None
    return request.workspace_id if names_workspace(request) else None


@dataclass
class Checked:
    """A request whose sources passed, with ``/workspace`` paths made runner paths, and what
    each rewritten source was called in the request (recorded as its origin)."""

    request: EnvironmentChangeRequest
    origins: dict[str, str] = field(default_factory=dict)


def check_request(
    rule: Allowed,
    request: EnvironmentChangeRequest,
    *,
    runner_root: Path,
    workspace: Path | None,
) -> Checked:
    """Refuse (InvalidInput) a request using a source the rule does not allow; else return
    it with its local paths resolved."""
    manager = request.manager
    if request.action != "install" or manager is None:
        return Checked(request)
    checker = _Checker(rule, runner_root.resolve(), workspace, manager, request.for_agent)
    try:
        for spec in request.specs:
            check_spec(manager, spec)
        update: dict[str, object] = {}
        if manager == "pip":
            update = checker.pip(request)
        elif manager == "conda":
            update["channels"] = checker.each(request.channels, "channels", "conda")
        else:
            update["repos"] = checker.each(request.repos, "repos", manager)
    except SourceError as exc:
        raise InvalidInput(str(exc)) from None
    return Checked(request.model_copy(update=update), checker.origins)


class _Checker:
    def __init__(
        self, rule: Allowed, root: Path, workspace: Path | None, manager: str, for_agent: bool
    ) -> None:
        self.rule = rule
        self.for_agent = for_agent
        self.root = root
        self.workspace = workspace
        self.manager = manager
        self.origins: dict[str, str] = {}

    def pip(self, request: EnvironmentChangeRequest) -> dict[str, object]:
        update: dict[str, object] = {}
        index = request.index_url
        if index is not None and index.strip().lower() in NO_INDEX:
            pass
        elif index is None and self.rule.offline:
            update["index_url"] = "none"  # offline: no index unless a local one is named
        elif index is None:
            self.remote(ALIASES["pypi"], "the default index (PyPI)", default=True)
        else:
            update["index_url"] = self.one(index, "index_url")
        update["extra_index_urls"] = [
            self.one(u, "extra_index_urls") for u in request.extra_index_urls
        ]
        update["find_links"] = [self.one(u, "find_links") for u in request.find_links]
        specs = []
        for spec in request.specs:
            name, at, url = spec.partition("@")
            target, sep, marker = url.partition(";")
            # a local target by any spelling pip accepts (``file:///p``, ``file:/p``, ``/p``):
            # each is a host path the rule must see (docs/security.md, session 43)
            if at and ("://" in url or is_local(target.strip())):
                resolved = self.one(target.strip(), f"the URL of {name.strip()}")
                spec = f"{name.strip()} @ {resolved}" + (f" ;{marker}" if sep else "")
            specs.append(spec)
        update["specs"] = specs
        return update

    def each(self, values: list[str], what: str, manager: str) -> list[str]:
        if not values:
            for default in DEFAULTS[manager]:
                self.remote(default, f"the default {what} ({default})", default=True)
            return []
        return [self.one(v, what) for v in values]

    def one(self, value: str, what: str) -> str:
        text = value.strip()
        if self.manager == "conda" and is_channel_name(text):
            self.remote(f"{CONDA_CHANNEL_ALIAS}/{text}", f"{what} {text!r}")
            return text
        text = check_url(text, what, allow_http=True)
        if is_local(text):
            resolved = self.local(local_path(text), what)
            self.origins[resolved] = text
            return resolved
        self.remote(text, f"{what} {text!r}")
        return text

    def remote(self, url: str, what: str, *, default: bool = False) -> None:
        rule = self.rule
        if rule.offline:
            if self.manager in ("cran", "bioconductor"):
                raise SourceError(
                    "this runner is offline (local package sources only): CRAN and "
                    "Bioconductor cannot be used; give repos a local repository "
                    "(file:///… holding src/contrib/PACKAGES) the operator allows"
                )
            hint = " (pass index_url 'none' and find_links)" if self.manager == "pip" else ""
            raise SourceError(
                f"this runner is offline (local package sources only): {what} is remote; "
                f"use a local folder the operator allows{hint}"
            )
        allowed = self._listed(url)
        if urlsplit(url).scheme.lower() == "http" and not allowed:
            check_url(url, what)  # raises: plain http, with what to do
        if rule.restricted and not allowed:
            suggestion = ", ".join(rule.urls or ()) or "none remote"
            raise SourceError(
                f"{what} is not among this runner's allowed package sources ({suggestion}"
                f"{self._folders()}); use one of them"
                + (" in the request" if default else "")
                + f", or ask the operator to add it to {ALLOWED_VARIABLE}"
            )

    def local(self, path: str, what: str) -> str:
        if in_workspace(path):
            if self.workspace is None:
                raise SourceError(
                    f"{what} {path!r} names the workspace, but this change came with none "
                    f"(send it through the control plane, which names the caller's workspace)"
                )
            base = self.workspace.resolve()
            real = Path(os.path.realpath(base / path[len(WORKSPACE) :].lstrip("/")))
            if real != base and base not in real.parents:
                raise SourceError(f"{what} {path!r} leads out of the workspace (a symbolic link)")
            return str(real)
        real = Path(os.path.realpath(path))
        if real == self.root or self.root in real.parents or real in self.root.parents:
            # inside: another session's files; around it: a folder bound into the tool's
            # sandbox would show the runner's whole folder
            raise SourceError(
                f"{what} {path!r} lies in or around the runner's own folder (other sessions' "
                f"workspaces, its records); give files of your workspace as {WORKSPACE}/…"
            )
        folders = self.rule.folders
        if folders is None and self.for_agent:
            # An agent names host folders only where the operator allowed them: its own
            # files are under /workspace/ (docs/environments.md, "Package tools run as the
            # sandbox uid"); /root, /etc/ssh and the like are nobody's package source.
            folders = self.rule.agent_folders
        if folders is not None and not any(real == f or f in real.parents for f in folders):
            listed = ", ".join(str(f) for f in folders) or "none"
            variable = ALLOWED_VARIABLE if self.rule.restricted else AGENT_FOLDERS_VARIABLE
            raise SourceError(
                f"{what} {path!r} is not in a local folder this runner allows ({listed}); put "
                f"the packages in your workspace and name them as {WORKSPACE}/…, or ask the "
                f"operator to add the folder to {variable}"
            )
        return str(real)

    def _listed(self, url: str) -> bool:
        if self.rule.urls is None:
            return False
        wanted = urlsplit(url.rstrip("/"))
        for entry in self.rule.urls:
            allowed = urlsplit(entry)
            if (allowed.scheme.lower(), allowed.netloc.lower()) != (
                wanted.scheme.lower(),
                wanted.netloc.lower(),
            ):
                continue
            prefix = allowed.path.rstrip("/")
            if wanted.path == prefix or wanted.path.startswith(prefix + "/"):
                return True
        return False

    def _folders(self) -> str:
        folders = self.rule.folders or ()
        return "; local: " + ", ".join(str(f) for f in folders) if folders else ""


def unresolve(message: str, origins: dict[str, str]) -> str:
    """A failure's message with each local source named as the request named it (R2,
    docs/security.md "Host paths"): the runner path of a ``/workspace`` source is a host path
    of the home the agent must not see. Longest first, so a folder inside another stays whole."""
    for resolved in sorted(origins, key=len, reverse=True):
        message = message.replace(resolved, origins[resolved])
    return message
