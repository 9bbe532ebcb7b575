"""MCP tools of managed environments (V1–V8): the contract's ``environment_create``,
``environment_install``, ``environment_uninstall``, plus ``environment_list``,
``environment_show``, ``environment_revisions`` and ``environment_change_status``.
``build_server`` adds them when its backend can serve them (``AsyncClient`` can)."""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

from mcp.server.mcpserver import MCPServer

from shellyard.contract.environments import ChangeView, EnvironmentView, RevisionView
from shellyard.errors import ShellyardError
from shellyard.mcp.server import tool_error


@runtime_checkable
class EnvironmentsBackend(Protocol):
    """What the environment tools call (``AsyncClient`` is one)."""

    async def environment_create(
        self,
        name: str,
        language: str = "python",
        runner_id: str | None = None,
        wait_ms: int = 10_000,
    ) -> EnvironmentView: ...
    async def environment_install(
        self,
        environment_id: str,
        manager: str,
        specs: list[str],
        *,
        channels: list[str] | None = None,
        index_url: str | None = None,
        extra_index_urls: list[str] | None = None,
        find_links: list[str] | None = None,
        repos: list[str] | None = None,
        wait_ms: int = 10_000,
    ) -> ChangeView: ...
    async def environment_uninstall(
        self, environment_id: str, manager: str, specs: list[str], *, wait_ms: int = 10_000
    ) -> ChangeView: ...
    async def environment_list(self, runner_id: str | None = None) -> list[EnvironmentView]: ...
    async def environment_show(self, environment_id: str) -> EnvironmentView: ...
    async def environment_revisions(
        self, environment_id: str, revision: int | None = None
    ) -> list[RevisionView]: ...
    async def environment_change_status(
        self, change_id: str, wait_s: float = 0.0
    ) -> ChangeView: ...


_WAITING = (
    "A change waits until no running execution uses the environment, and executions asking "
    "for it meanwhile queue behind it, so no command ever sees a half-updated environment; "
    "while it waits, state is 'waiting' and waiting_for lists the execution (or earlier "
    "change) ids it waits for. wait_ms (0..30000, default 10000) is how long to wait for the "
    "result; a longer change comes back 'waiting' or 'running' with its change_id: poll it "
    "with environment_change_status. A bad spec, an unknown package or an unreachable "
    "channel is an error and leaves the environment exactly as it was (no new revision)."
)


def _change_result(change: ChangeView) -> dict[str, Any]:
    return change.model_dump(mode="json")


def add_environment_tools(server: MCPServer, backend: EnvironmentsBackend) -> None:
    @server.tool(
        description=(
            "Create a managed package environment: a prefix on a runner (default local) with "
            "the language's tools, language 'python' (an interpreter with pip/uv) or 'r' (R "
            "with its library in the prefix). Returns environment_id and revision (1 once "
            "created; 0 and state 'creating' if it takes longer than wait_ms, then follow "
            "change_id with environment_change_status). Add packages with "
            "environment_install, then pass environment_id to run_shell: commands see the "
            "environment read-only, with its bin first on PATH."
        )
    )
    async def environment_create(
        name: str,
        language: str = "python",
        runner_id: str | None = None,
        wait_ms: int = 10_000,
    ) -> dict[str, Any]:
        try:
            view = await backend.environment_create(name, language, runner_id, wait_ms)
        except ShellyardError as exc:
            raise tool_error(exc) from None
        return view.model_dump(mode="json")

    @server.tool(
        description=(
            "Install packages into an environment. This is the ONLY way to add packages: "
            "inside run_shell the environment is read-only, so 'pip install', "
            "'conda install' or 'install.packages' in a command fail. manager: 'conda' "
            "(specs like 'python=3.11', 'numpy>=1.26'; channels), 'pip' (specs like "
            "'requests==2.32.3'; index_url, extra_index_urls, find_links), 'cran' or "
            "'bioconductor' (R package names; repos). All managers work in the same "
            "environment, e.g. conda adds R or Python and then pip or cran add to it. Each "
            "change that succeeds records a new revision (its number is in 'revision'). " + _WAITING
        )
    )
    async def environment_install(
        environment_id: str,
        manager: str,
        specs: list[str],
        channels: list[str] | None = None,
        index_url: str | None = None,
        extra_index_urls: list[str] | None = None,
        find_links: list[str] | None = None,
        repos: list[str] | None = None,
        wait_ms: int = 10_000,
    ) -> dict[str, Any]:
        try:
            change = await backend.environment_install(
                environment_id,
                manager,
                specs,
                channels=channels,
                index_url=index_url,
                extra_index_urls=extra_index_urls,
                find_links=find_links,
                repos=repos,
                wait_ms=wait_ms,
            )
        except ShellyardError as exc:
            raise tool_error(exc) from None
        return _change_result(change)

    @server.tool(
        description=(
            "Remove packages (by name) from an environment with the manager that installed "
            "them ('conda', 'pip', 'cran', 'bioconductor'). Records a new revision. " + _WAITING
        )
    )
    async def environment_uninstall(
        environment_id: str, manager: str, specs: list[str], wait_ms: int = 10_000
    ) -> dict[str, Any]:
        try:
            change = await backend.environment_uninstall(
                environment_id, manager, specs, wait_ms=wait_ms
            )
        except ShellyardError as exc:
            raise tool_error(exc) from None
        return _change_result(change)

    @server.tool(
        description=(
            "The environments of your session: environment_id, name, language, runner_id, "
            "state (creating, ready, failed) and latest revision."
        )
    )
    async def environment_list(runner_id: str | None = None) -> dict[str, Any]:
        try:
            views = await backend.environment_list(runner_id)
        except ShellyardError as exc:
            raise tool_error(exc) from None
        return {"environments": [v.model_dump(mode="json") for v in views]}

    @server.tool(
        description=(
            "One environment: its latest revision, a summary of every revision (what each "
            "change installed or removed), pending changes with what they wait for, and the "
            "prefix path commands see."
        )
    )
    async def environment_show(environment_id: str) -> dict[str, Any]:
        try:
            view = await backend.environment_show(environment_id)
        except ShellyardError as exc:
            raise tool_error(exc) from None
        return view.model_dump(mode="json")

    @server.tool(
        description=(
            "The full package list of an environment's revisions (every manager: name, "
            "version, source) and the request that made each; revision picks one."
        )
    )
    async def environment_revisions(
        environment_id: str, revision: int | None = None
    ) -> dict[str, Any]:
        try:
            views = await backend.environment_revisions(environment_id, revision)
        except ShellyardError as exc:
            raise tool_error(exc) from None
        return {"revisions": [v.model_dump(mode="json") for v in views]}

    @server.tool(
        description=(
            "Status of an environment change (from environment_install / _uninstall / "
            "_create): state waiting (waiting_for lists what it waits for), running (progress "
            "says what it does), succeeded (revision is the new revision) or failed (error "
            "says why; the environment is unchanged). wait_s (0..30) waits for the end first."
        )
    )
    async def environment_change_status(change_id: str, wait_s: float = 0.0) -> dict[str, Any]:
        try:
            change = await backend.environment_change_status(change_id, wait_s)
        except ShellyardError as exc:
            raise tool_error(exc) from None
        return _change_result(change)


__all__ = ["EnvironmentsBackend", "add_environment_tools"]
