"""REST endpoints of bearer tokens: make one (its secret is in this answer only), list them
(never with secrets), revoke one (refused from the next request on)."""

from typing import Annotated, Any

from fastapi import APIRouter

from shellyard.api.auth import PrincipalDep
from shellyard.api.bodies import body_of
from shellyard.api.docs import ErrorBody, body_doc
from shellyard.contract.tokens import TokenCreated, TokenCreateRequest, TokenView
from shellyard.control.plane import ControlPlane

#: The one route here with a bound of its own (docs/security.md "Limits at each door").
_TOO_MANY_TOKENS: dict[int | str, dict[str, Any]] = {
    429: {
        "model": ErrorBody,
        "description": "too_many: the session already holds the most live agent tokens it may "
        "(SHELLYARD_AGENT_TOKENS_PER_SESSION, 100 by default); revoke unused ones first.",
    }
}


def tokens_router(plane: ControlPlane) -> APIRouter:
    router = APIRouter()

    @router.post(
        "/v1/tokens", openapi_extra=body_doc(TokenCreateRequest), responses=_TOO_MANY_TOKENS
    )
    async def create_token(
        who: PrincipalDep, request: Annotated[TokenCreateRequest, body_of(TokenCreateRequest)]
    ) -> TokenCreated:
        """Admin: any kind. A session token: agent tokens for its own agents."""
        return await plane.tokens.create(who, request)

    @router.get("/v1/tokens")
    async def list_tokens(who: PrincipalDep) -> list[TokenView]:
        return await plane.tokens.list(who)

    @router.delete("/v1/tokens/{token_id}")
    async def revoke_token(token_id: str, who: PrincipalDep) -> TokenView:
        return await plane.tokens.revoke(who, token_id)

    return router


__all__ = ["tokens_router"]
