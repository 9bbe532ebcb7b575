"""What the token operations take and return (docs/security.md); kept apart from
``control/tokens.py`` so the SDK can use them without the store."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, model_validator

TokenKind = Literal["admin", "session", "agent"]


class TokenCreateRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    kind: TokenKind
    session_id: str | None = None
    agent_id: str | None = None

    @model_validator(mode="after")
    def _check(self) -> TokenCreateRequest:
        if self.kind == "session" and (self.session_id is None or self.agent_id is not None):
            raise ValueError("a session token needs session_id (and no agent_id)")
        if self.kind == "agent" and (self.agent_id is None or self.session_id is not None):
            raise ValueError("an agent token needs agent_id (and no session_id)")
        if self.kind == "admin" and (self.session_id is not None or self.agent_id is not None):
            raise ValueError("an admin token takes neither session_id nor agent_id")
        return self


class TokenView(BaseModel):
    token_id: str
    kind: TokenKind
    session_id: str | None
    agent_id: str | None
    created_by: str | None
    created_at: float
    revoked_at: float | None


class TokenCreated(TokenView):
    #: The bearer secret: shown only in this answer, never stored.
    token: str
