"""MCP tools of managed environments (V1–V8): the contract's ``environment_create``,
``environment_install``, ``environment_uninstall``, plus ``environment_list``,
``environment_show``, ``environment_revisions`` and ``environment_change_status``.
``build_server`` adds them when its backend can serve them (``AsyncClient`` can)."""

from __future__ import annotations

from typing import Any

from mcp.server.mcpserver import Context
from mcp.server.mcpserver.tools import Tool
from pydantic import BaseModel

from shellyard.contract.environments import (
    ChangeStatusRequest,
    ChangeView,
    EnvironmentChangeRequest,
    EnvironmentCreateRequest,
    EnvironmentListRequest,
    EnvironmentRevisionsRequest,
    EnvironmentShowRequest,
    EnvironmentView,
    RevisionView,
)
from shellyard.mcp.common import READ, hints, model_tool
from shellyard.sdk.client import AsyncClient

_WAITING = (
    "It waits for running executions that use the environment (state 'waiting'); later ones "
    "queue behind it (waiting_for). wait_ms (0..30000) bounds this answer; a longer change returns "
    "change_id: poll environment_change_status. A failed change changes nothing."
)


class EnvironmentList(BaseModel):
    environments: list[EnvironmentView]


class RevisionList(BaseModel):
    revisions: list[RevisionView]


#: An uninstall names packages only: the index and channel options are install's.
_INSTALL_ONLY = ("channels", "index_url", "extra_index_urls", "find_links", "repos")


def environment_tools(backend: AsyncClient) -> list[Tool]:
    async def environment_create(request: EnvironmentCreateRequest, ctx: Context) -> dict[str, Any]:
        view = await backend.environment_create(
            request.name, request.language, request.runner_id, request.wait_ms, request.base
        )
        return view.model_dump(mode="json")

    async def environment_install(
        request: EnvironmentChangeRequest, ctx: Context
    ) -> dict[str, Any]:
        change = await backend.environment_install(
            request.environment_id,
            request.manager,
            request.specs,
            channels=request.channels or None,
            index_url=request.index_url,
            extra_index_urls=request.extra_index_urls or None,
            find_links=request.find_links or None,
            repos=request.repos or None,
            wait_ms=request.wait_ms,
        )
        return change.model_dump(mode="json")

    async def environment_uninstall(
        request: EnvironmentChangeRequest, ctx: Context
    ) -> dict[str, Any]:
        change = await backend.environment_uninstall(
            request.environment_id, request.manager, request.specs, wait_ms=request.wait_ms
        )
        return change.model_dump(mode="json")

    async def environment_list(request: EnvironmentListRequest, ctx: Context) -> dict[str, Any]:
        views = await backend.environment_list(request.runner_id)
        return {"environments": [v.model_dump(mode="json") for v in views]}

    async def environment_show(request: EnvironmentShowRequest, ctx: Context) -> dict[str, Any]:
        return (await backend.environment_show(request.environment_id)).model_dump(mode="json")

    async def environment_revisions(
        request: EnvironmentRevisionsRequest, ctx: Context
    ) -> dict[str, Any]:
        views = await backend.environment_revisions(request.environment_id, request.revision)
        return {"revisions": [v.model_dump(mode="json") for v in views]}

    async def environment_change_status(
        request: ChangeStatusRequest, ctx: Context
    ) -> dict[str, Any]:
        change = await backend.environment_change_status(request.change_id, request.wait_s)
        return change.model_dump(mode="json")

    # Installing reaches package indexes and channels: open world, whatever the sandbox.
    change = hints(open_world=True)
    return [
        model_tool(
            "environment_create",
            EnvironmentCreateRequest,
            environment_create,
            title="Create a package environment",
            description=(
                "Create a managed package environment on a runner (default local): language "
                "'python' (pip/uv) or 'r'. Returns environment_id and revision (0 and state "
                "'creating' past wait_ms: follow change_id with environment_change_status). Add "
                "packages with environment_install, then pass environment_id to run_shell "
                "(read-only, its bin first on PATH). base 'python-base': the runner's numpy, "
                "pandas, scipy, matplotlib in under a second; installs never change the base."
            ),
            annotations=change,
            output=EnvironmentView,
        ),
        model_tool(
            "environment_install",
            EnvironmentChangeRequest,
            environment_install,
            title="Install packages",
            description=(
                "Install packages into an environment: the ONLY way to add packages (inside "
                "run_shell the environment is read-only, so pip/conda install or "
                "install.packages fail). manager 'conda' (specs like 'numpy>=1.26'; channels), "
                "'pip' (specs like 'requests==2.32.3'; index_url, extra_index_urls, "
                "find_links), 'cran' or 'bioconductor' (R package names; repos); managers mix "
                "in one environment. Success records a new revision. " + _WAITING
            ),
            annotations=change,
            output=ChangeView,
        ),
        model_tool(
            "environment_uninstall",
            EnvironmentChangeRequest,
            environment_uninstall,
            title="Uninstall packages",
            description=(
                "Remove packages (by name) from an environment with the manager that installed "
                "them. Records a new revision. " + _WAITING
            ),
            annotations=hints(destructive=True),
            output=ChangeView,
            exclude=_INSTALL_ONLY,
        ),
        model_tool(
            "environment_list",
            EnvironmentListRequest,
            environment_list,
            title="List environments",
            description=(
                "The environments of your session: environment_id, name, language, runner_id, "
                "state (creating, ready, failed) and latest revision."
            ),
            annotations=READ,
            output=EnvironmentList,
        ),
        model_tool(
            "environment_show",
            EnvironmentShowRequest,
            environment_show,
            title="Show an environment",
            description=(
                "One environment: its latest revision, a summary of every revision (what each "
                "change installed or removed), pending changes with what they wait for, and the "
                "prefix path commands see."
            ),
            annotations=READ,
            output=EnvironmentView,
        ),
        model_tool(
            "environment_revisions",
            EnvironmentRevisionsRequest,
            environment_revisions,
            title="Environment revisions",
            description=(
                "The full package list of an environment's revisions (every manager: name, "
                "version, source) and the request that made each; revision picks one."
            ),
            annotations=READ,
            output=RevisionList,
        ),
        model_tool(
            "environment_change_status",
            ChangeStatusRequest,
            environment_change_status,
            title="Environment change status",
            description=(
                "Status of an environment change (from environment_install / _uninstall / "
                "_create): state waiting (waiting_for lists what it waits for), running "
                "(progress says what it does), succeeded (revision is the new revision) or "
                "failed (error says why; the environment is unchanged). wait_s (0..30) waits "
                "for the end first."
            ),
            annotations=READ,
            output=ChangeView,
        ),
    ]


__all__ = ["environment_tools"]
