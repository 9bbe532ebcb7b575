"""REST endpoints of managed environments (V1–V8). ``create_app`` mounts them behind the same
authentication as the other routers; every call acts for the agent named in
``X-Shellyard-Agent`` (the default session's main agent without it), and sees the environments
of that agent's session only."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query

from shellyard.api.auth import AgentHeader
from shellyard.api.bodies import body_of
from shellyard.api.docs import body_doc
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

#: The reads that hand their path ids, query model and acting agent to the service unchanged.
ENVIRONMENT_ROUTES = (
    Forward("GET", "/v1/environments", "environment_list", "environments.list_environments",
            list[EnvironmentView], EnvironmentListQuery, agent=True),
    Forward("GET", "/v1/environments/{environment_id}", "environment_show", "environments.show",
            EnvironmentView, agent=True),
    Forward("GET", "/v1/environments/{environment_id}/revisions", "environment_revisions",
            "environments.revisions", list[RevisionView], EnvironmentRevisionsQuery, agent=True),
)  # fmt: skip


def environments_router(plane: ControlPlane) -> APIRouter:
    router = APIRouter()
    add_routes(router, plane, ENVIRONMENT_ROUTES)

    @router.post("/v1/environments", openapi_extra=body_doc(EnvironmentCreateRequest))
    async def environment_create(
        *,
        agent: AgentHeader = None,
        request: Annotated[EnvironmentCreateRequest, body_of(EnvironmentCreateRequest)],
    ) -> EnvironmentView:
        return await plane.environments.create(request, agent)

    @router.post(
        "/v1/environments/{environment_id}/install",
        openapi_extra=body_doc(EnvironmentChangeBody),
    )
    async def environment_install(
        environment_id: str,
        *,
        agent: AgentHeader = None,
        change: Annotated[EnvironmentChangeBody, body_of(EnvironmentChangeBody)],
    ) -> ChangeView:
        return await plane.environments.install(environment_id, change, agent)

    @router.post(
        "/v1/environments/{environment_id}/uninstall",
        openapi_extra=body_doc(EnvironmentChangeBody),
    )
    async def environment_uninstall(
        environment_id: str,
        *,
        agent: AgentHeader = None,
        change: Annotated[EnvironmentChangeBody, body_of(EnvironmentChangeBody)],
    ) -> ChangeView:
        return await plane.environments.uninstall(environment_id, change, agent)

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
