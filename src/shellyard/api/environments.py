"""REST endpoints of managed environments (V1–V8). ``create_app`` mounts them behind the same
authentication as the other routers; every call acts for the agent named in
``X-Shellyard-Agent`` (the default session's main agent without it), and sees the environments
of that agent's session only."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query

from shellyard.api.auth import AgentHeader
from shellyard.api.forward import Forward, add_routes
from shellyard.contract.environments import (
    ChangeView,
    EnvironmentChangeBody,
    EnvironmentCreateRequest,
    EnvironmentListQuery,
    EnvironmentRevisionsQuery,
    EnvironmentView,
    RevisionView,
)
from shellyard.control.plane import ControlPlane

#: The routes that hand their path ids, query model or body and acting agent to the service
#: unchanged.
ENVIRONMENT_ROUTES = (
    Forward("GET", "/v1/environments", "environment_list", "environments.list_environments",
            list[EnvironmentView], EnvironmentListQuery, agent=True),
    Forward("GET", "/v1/environments/{environment_id}", "environment_show", "environments.show",
            EnvironmentView, agent=True),
    Forward("GET", "/v1/environments/{environment_id}/revisions", "environment_revisions",
            "environments.revisions", list[RevisionView], EnvironmentRevisionsQuery, agent=True),
    Forward("POST", "/v1/environments", "environment_create", "environments.create",
            EnvironmentView, agent=True, body=EnvironmentCreateRequest),
    Forward("POST", "/v1/environments/{environment_id}/install", "environment_install",
            "environments.install", ChangeView, agent=True, body=EnvironmentChangeBody),
    Forward("POST", "/v1/environments/{environment_id}/uninstall", "environment_uninstall",
            "environments.uninstall", ChangeView, agent=True, body=EnvironmentChangeBody),
)  # fmt: skip


def environments_router(plane: ControlPlane) -> APIRouter:
    router = APIRouter()
    add_routes(router, plane, ENVIRONMENT_ROUTES)

    @router.get("/v1/environment-changes/{change_id}")
    async def environment_change_status(
        change_id: str,
        wait_s: Annotated[float, Query(ge=0, le=30)] = 0,
        agent: AgentHeader = None,
    ) -> ChangeView:
        if wait_s > 0:
            return await plane.environments.wait(change_id, wait_s, agent)
        return await plane.environments.change_status(change_id, agent)

    return router
