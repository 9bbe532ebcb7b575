"""Client operations of managed environments (V1–V8), mixed into ``Client`` and
``AsyncClient`` as ``Op`` descriptors: each is described once and is a method of both (awaited
on the async one). Names follow the MCP tools: ``environment_create``, ``environment_install``,
``environment_uninstall``, ``environment_list``, ``environment_show``,
``environment_revisions``, ``environment_change_status``."""

from __future__ import annotations

from typing import Any

from pydantic import TypeAdapter

from shellyard.contract.environments import ChangeView, EnvironmentView, RevisionView
from shellyard.contract.executions import DEFAULT_WAIT_MS
from shellyard.sdk.base import WAIT_SLACK_S, Op, _Call, call

_ENV = TypeAdapter(EnvironmentView)
_ENVS = TypeAdapter(list[EnvironmentView])
_REVISIONS = TypeAdapter(list[RevisionView])
_CHANGE = TypeAdapter(ChangeView)


def _create(
    name: str,
    language: str = "python",
    runner_id: str | None = None,
    wait_ms: int = DEFAULT_WAIT_MS,
    base: str | None = None,
) -> _Call[EnvironmentView]:
    """V1: a managed prefix for ``language`` (``python`` or ``r``) on a runner (default
    local), at revision 1 once created. Waits up to ``wait_ms`` (at most 30 000) for that;
    a longer creation comes back ``creating`` with its ``change_id`` to follow. ``base``
    (``python-base``): start with that prepared base's packages (docs/environments.md)."""
    body = {
        "name": name,
        "language": language,
        "runner_id": runner_id,
        "wait_ms": wait_ms,
        "base": base,
    }
    return call(
        "POST",
        "/v1/environments",
        _ENV,
        body={k: v for k, v in body.items() if v is not None},
        timeout_s=wait_ms / 1000 + WAIT_SLACK_S,
    )


def _change(
    action: str,
    environment_id: str,
    manager: str,
    specs: list[str],
    wait_ms: int,
    options: dict[str, Any],
) -> _Call[ChangeView]:
    body: dict[str, Any] = {"manager": manager, "specs": list(specs), "wait_ms": wait_ms}
    body.update({k: v for k, v in options.items() if v})
    return call(
        "POST",
        f"/v1/environments/{environment_id}/{action}",
        _CHANGE,
        body=body,
        timeout_s=wait_ms / 1000 + WAIT_SLACK_S,
    )


def _install(
    environment_id: str,
    manager: str,
    specs: list[str],
    *,
    channels: list[str] | None = None,
    index_url: str | None = None,
    extra_index_urls: list[str] | None = None,
    find_links: list[str] | None = None,
    repos: list[str] | None = None,
    wait_ms: int = DEFAULT_WAIT_MS,
) -> _Call[ChangeView]:
    """V2: install ``specs`` with ``manager`` (conda, pip, cran, bioconductor) into the
    environment. The change waits for executions using the environment (V5) and is returned
    as it stands after ``wait_ms``; one that failed within that time raises the error."""
    options = {
        "channels": channels,
        "index_url": index_url,
        "extra_index_urls": extra_index_urls,
        "find_links": find_links,
        "repos": repos,
    }
    return _change("install", environment_id, manager, specs, wait_ms, options)


def _uninstall(
    environment_id: str, manager: str, specs: list[str], *, wait_ms: int = DEFAULT_WAIT_MS
) -> _Call[ChangeView]:
    """V2: remove the packages named by ``specs`` with ``manager``."""
    return _change("uninstall", environment_id, manager, specs, wait_ms, {})


def _list(runner_id: str | None = None) -> _Call[list[EnvironmentView]]:
    """The environments of your session (on one runner with ``runner_id``)."""
    return call("GET", "/v1/environments", _ENVS, {"runner_id": runner_id})


def _show(environment_id: str) -> _Call[EnvironmentView]:
    """One environment with its revisions summary and pending changes."""
    return call("GET", f"/v1/environments/{environment_id}", _ENV)


def _revisions(environment_id: str, revision: int | None = None) -> _Call[list[RevisionView]]:
    """Every revision (or one) with its full package list and the request that made it."""
    path = f"/v1/environments/{environment_id}/revisions"
    return call("GET", path, _REVISIONS, {"revision": revision})


def _change_status(change_id: str, wait_s: float = 0.0) -> _Call[ChangeView]:
    """A change's state, what it waits for, its progress line; ``wait_s`` (at most 30) waits
    for it to end first."""
    path = f"/v1/environment-changes/{change_id}"
    params = {"wait_s": wait_s} if wait_s else {}
    return call("GET", path, _CHANGE, params, timeout_s=wait_s + WAIT_SLACK_S)


class EnvironmentOps:
    """Managed environments (V1–V8)."""

    environment_create = Op(_create)
    environment_install = Op(_install)
    environment_uninstall = Op(_uninstall)
    environment_list = Op(_list)
    environment_show = Op(_show)
    environment_revisions = Op(_revisions)
    environment_change_status = Op(_change_status)


__all__ = ["EnvironmentOps"]
