"""Client operations of bearer tokens, mixed into ``Client`` and ``AsyncClient`` (each
described once as an ``Op``): make one (its secret is in that answer only), list, revoke."""

from __future__ import annotations

from pydantic import TypeAdapter

from shellyard.contract.tokens import TokenCreated, TokenView
from shellyard.sdk.base import Op, _Call, call

_CREATED = TypeAdapter(TokenCreated)
_VIEW = TypeAdapter(TokenView)
_VIEWS = TypeAdapter(list[TokenView])


def _create(
    kind: str, *, session_id: str | None = None, agent_id: str | None = None
) -> _Call[TokenCreated]:
    """A token of ``kind`` ``admin``, ``session`` (give ``session_id``) or ``agent`` (give
    ``agent_id``). Keep ``.token``: only a hash of it is stored."""
    body = {"kind": kind, "session_id": session_id, "agent_id": agent_id}
    return call("POST", "/v1/tokens", _CREATED, body={k: v for k, v in body.items() if v})


def _list() -> _Call[list[TokenView]]:
    """The tokens this caller may see (never their secrets)."""
    return call("GET", "/v1/tokens", _VIEWS)


def _revoke(token_id: str) -> _Call[TokenView]:
    """Refuse the token from the next request on."""
    return call("DELETE", f"/v1/tokens/{token_id}", _VIEW)


class TokenOps:
    """Bearer tokens (docs/security.md)."""

    token_create = Op(_create)
    token_list = Op(_list)
    token_revoke = Op(_revoke)


__all__ = ["TokenOps"]
