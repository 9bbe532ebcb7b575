"""Package sources (docs/environments.md): the rules every channel, index, link and repository URL
obeys, and the package-spec checks that keep an option or a URL from riding in a spec.

Written once here and used twice: by the change request models (so a bad source is refused
before anything is recorded, V8) and by the runner (which also applies its operator's
allow-list, ``runner/environments/sources.py``, and may be called by a control plane of another
version). Only syntax lives here; whether a source is *allowed* is the runner's decision.
"""

from __future__ import annotations

import re
from typing import Protocol
from urllib.parse import unquote, urlsplit

#: The longest source URL accepted (a longer one is a mistake or an attack on a parser).
MAX_URL_CHARS = 2048
#: The default sources of each manager, by the alias an allow-list may use for them.
ALIASES = {
    "pypi": "https://pypi.org/simple",
    "cran": "https://cloud.r-project.org",
    "bioconductor": "https://bioconductor.org/packages",
}
#: conda channel names resolve below this URL (rattler's default channel alias).
CONDA_CHANNEL_ALIAS = "https://conda.anaconda.org"
#: A conda channel name, labels included (``conda-forge``, ``conda-forge/label/dev``).
_CHANNEL_NAME = re.compile(
    r"^[A-Za-z0-9][A-Za-z0-9_-]*(\.[A-Za-z0-9_-]+)*(/[A-Za-z0-9][A-Za-z0-9._-]*)*$"
)


class SourceError(ValueError):
    """A source or spec that is refused; the message says what was wrong and what to do."""


def check_url(value: str, what: str, *, allow_http: bool = False) -> str:
    """A remote (``https://``) or local (``file://``, absolute path) source, stripped.

    Refused: longer than :data:`MAX_URL_CHARS`, control characters or spaces, credentials in
    the URL (``user:pass@``: they would be recorded in every revision and log), a query or a
    fragment (not a place packages are looked up), another scheme, ``..`` in a local path,
    and ``http://`` unless ``allow_http`` (the operator named that exact origin)."""
    text = value.strip()
    if not text:
        raise SourceError(f"{what} is empty; give an https:// URL or an absolute folder path")
    if len(text) > MAX_URL_CHARS:
        raise SourceError(
            f"{what} is {len(text)} characters long; a source URL may have at most {MAX_URL_CHARS}"
        )
    if any(ord(c) < 33 or ord(c) == 127 for c in text):
        raise SourceError(f"{what} {text[:80]!r} contains a space or a control character")
    if text.startswith("-"):
        raise SourceError(
            f"{what} {text[:80]!r} looks like a command-line option; give a URL or a folder"
        )
    if text.startswith("/"):
        _check_local(text, what)
        return text
    try:
        parts = urlsplit(text)
        parts.port  # noqa: B018 - raises on a bad port
    except ValueError as exc:
        raise SourceError(f"{what} {text[:80]!r} is not a valid URL ({exc})") from None
    scheme = parts.scheme.lower()
    if scheme == "file":
        if parts.netloc not in ("", "localhost"):
            raise SourceError(f"{what} {text[:80]!r}: a file:// URL names a path on the runner")
        _check_local(unquote(parts.path), what)
        if parts.query or parts.fragment:
            raise SourceError(f"{what} {text[:80]!r} must have no query (?…) or fragment (#…)")
        return text
    if scheme not in ("https", "http"):
        raise SourceError(
            f"{what} {text[:80]!r} must be an https:// URL, a file:// URL or an absolute "
            f"folder path on the runner"
        )
    if scheme == "http" and not allow_http:
        raise SourceError(
            f"{what} {text[:80]!r} is plain http: packages fetched without TLS can be swapped "
            f"on the way; use https:// (an operator can allow one http mirror by naming it in "
            f"SHELLYARD_ALLOWED_SOURCES)"
        )
    if not parts.hostname:
        raise SourceError(f"{what} {text[:80]!r} has no host")
    if parts.username is not None or parts.password is not None or "@" in parts.netloc:
        raise SourceError(
            f"{what} {_redacted(text)!r} carries credentials; they would be written into every "
            f"revision and log. Configure the index's credentials on the runner (a netrc or a "
            f"keyring) and give the URL without them"
        )
    if parts.query or parts.fragment:
        raise SourceError(f"{what} {text[:80]!r} must have no query (?…) or fragment (#…)")
    return text


def is_local(text: str) -> bool:
    return text.startswith("/") or text.lower().startswith("file:")


def local_path(text: str) -> str:
    """The runner path a local source names (``file://`` decoded)."""
    if text.startswith("/"):
        return text
    return unquote(urlsplit(text).path)


#: Where commands see their workspace; a local source at or below it names the caller's
#: workspace (resolved by the runner against the workspace the change came with).
WORKSPACE = "/workspace"


class NamedSources(Protocol):
    """The source fields of a change (the control plane's body, the runner's request)."""

    @property
    def specs(self) -> list[str]: ...
    @property
    def index_url(self) -> str | None: ...
    @property
    def extra_index_urls(self) -> list[str]: ...
    @property
    def find_links(self) -> list[str]: ...
    @property
    def channels(self) -> list[str]: ...
    @property
    def repos(self) -> list[str]: ...


def names_workspace(change: NamedSources) -> bool:
    """Whether a change's sources name the caller's workspace (a local path at or below
    ``WORKSPACE``, by the runner's own test; a substring such as ``/x/workspace-wheels`` or
    ``https://…/workspace/…`` does not): the one test for the control plane (which then sends
    the caller's workspace id) and the runner (which then holds that workspace's folders)."""
    values = [change.index_url or "", *change.extra_index_urls, *change.find_links]
    values += [*change.channels, *change.repos]
    values += [spec.partition("@")[2].partition(";")[0] for spec in change.specs]
    for value in values:
        text = value.strip()
        if is_local(text) and in_workspace(local_path(text)):
            return True
    return False


def in_workspace(path: str) -> bool:
    """Whether the local path ``path`` is ``WORKSPACE`` or below it."""
    return path == WORKSPACE or path.startswith(WORKSPACE + "/")


def is_channel_name(text: str) -> bool:
    return len(text) <= 200 and ".." not in text and bool(_CHANNEL_NAME.match(text))


def check_channel(value: str, what: str = "conda channel") -> str:
    """A conda channel: a name (``conda-forge``) or a source URL / folder."""
    text = value.strip()
    if is_channel_name(text):
        return text
    return check_url(text, what, allow_http=True)


#: Hosts an index serves its files from, besides its own (PyPI's simple pages link there).
FILE_HOSTS = {"pypi.org": ("files.pythonhosted.org",)}


def registry_hosts(allowed: list[str] | None) -> list[str]:
    """The package registries the configured sources name, as ``host`` or ``host:port``
    entries of ``SHELLYARD_PACKAGE_REGISTRIES`` (its default): with no allow-list the
    managers' defaults (PyPI, conda's channel alias, CRAN, Bioconductor), otherwise the hosts
    of the allowed https:// sources, aliases and conda channel names; local folders name none."""
    urls: list[str] = []
    for entry in allowed if allowed is not None else [*ALIASES, "conda-forge"]:
        text = entry.strip()
        if text.lower() in ALIASES:
            urls.append(ALIASES[text.lower()])
        elif is_channel_name(text):
            urls.append(CONDA_CHANNEL_ALIAS)
        elif not is_local(text):
            urls.append(text)
    hosts: list[str] = []
    for url in urls:
        parts = urlsplit(url)
        if not parts.hostname:
            continue
        port = parts.port or (80 if parts.scheme.lower() == "http" else None)
        host = parts.hostname.lower()
        hosts.append(host if port is None else f"{host}:{port}")
        hosts.extend(FILE_HOSTS.get(host, ()) if port is None else ())
    return list(dict.fromkeys(hosts))


def check_spec(manager: str, spec: str) -> None:
    """Refuse what does not belong in a package spec: options (``--index-url x``, ``-r
    file``), and for conda a URL or a channel where the package name belongs (that would
    fetch from a source no ``channels`` list names). A pip ``name @ URL`` is allowed; its URL
    is checked like any source by the pip manager."""
    text = spec.strip()
    if text.startswith("-") or re.search(r"(^|\s)--?[A-Za-z]", text):
        raise SourceError(
            f"package spec {text[:80]!r} carries a command-line option; give one package "
            f"(e.g. 'requests>=2.31'), and sources in their own fields (index_url, find_links, "
            f"channels, repos)"
        )
    if manager == "conda":
        lowered = text.lower()
        if "://" in text or "::" in text or re.search(r"\b(channel|url)\s*=", lowered):
            raise SourceError(
                f"conda spec {text[:80]!r} names a channel or a URL; give the package (e.g. "
                f"'numpy >=1.26') and put the channel in channels"
            )
    elif manager == "pip":
        name, at, url = text.partition("@")
        if not at and re.match(r"^[A-Za-z][A-Za-z0-9+.-]*:", text):
            raise SourceError(
                f"pip spec {text[:80]!r} is a URL where a package name belongs; write "
                f"'name @ {text[:60]}' (the URL is then checked like an index)"
            )
        target = url.split(";")[0].strip()
        if at and ("://" in url or is_local(target)):  # file:/p and /p are local URLs too
            check_url(target, f"the URL of {name.strip()}", allow_http=True)


def _check_local(path: str, what: str) -> None:
    if not path.startswith("/") or ".." in path.split("/"):
        raise SourceError(
            f"{what} {path[:80]!r} must be an absolute path on the runner without '..'"
        )


def _redacted(text: str) -> str:
    parts = urlsplit(text)
    host = parts.netloc.rpartition("@")[2]
    return f"{parts.scheme}://***@{host}{parts.path}"
