"""Bearer tokens and the principal a request acts as (docs/contract.md, docs/security.md).

Three kinds of token:

- ``admin``: everything; may act as any agent (``X-Shellyard-Agent``), lists every session,
  registers runners, manages tokens. One is made at the first start and kept in
  ``<home>/admin.token`` (mode 0600).
- ``session``: the agents of one session; ``X-Shellyard-Agent`` must name one of them (default:
  the main agent); may create agent tokens for them.
- ``agent``: exactly one agent.

Only the sha256 of a secret is stored; the secret is shown once, when it is made. A revocation
takes effect on the next request: on PostgreSQL (several replicas, any of which may revoke)
every request looks its token up again; on SQLite this process is the only one writing the
database, so the principals of verified tokens are kept (bounded) and all forgotten at any
revocation (``TokenRecords.revocations``), which spares every request a transaction
(docs/benchmarks.md, section 20).

Objects owned by an agent (executions, timers, notices, workspaces, transfers, artifacts) are
checked against the acting agent by their services; this module checks what names a session
or an agent directly, and the admin-only operations. Anything outside the principal's scope is
reported exactly like a missing object (404), so nothing about another session leaks.
"""

from __future__ import annotations

import hashlib
import os
import secrets
from dataclasses import dataclass
from pathlib import Path

from shellyard.contract.tokens import TokenCreated, TokenCreateRequest, TokenKind, TokenView
from shellyard.control.agents import session_of
from shellyard.errors import Forbidden, InvalidInput, NotFound, TooMany, Unauthorized
from shellyard.store import Store
from shellyard.store.records import field_names, values_of
from shellyard.store.tokens import WEB_SESSION_ID_PREFIX, Token
from shellyard.store.tokens import WEB_SESSION_TTL_S as WEB_SESSION_TTL_S

ADMIN_TOKEN_NAME = "admin.token"
#: Secrets start with this, so a leaked one is recognisable (secret scanners, logs).
SECRET_PREFIX = "sy_"


@dataclass(frozen=True)
class Principal:
    """Who a request acts for."""

    kind: TokenKind
    token_id: str | None = None
    session_id: str | None = None
    agent_id: str | None = None
    main_agent_id: str | None = None

    @property
    def is_admin(self) -> bool:
        return self.kind == "admin"


#: The principal of a server started with ``--no-auth`` (loopback only).
UNAUTHENTICATED_ADMIN = Principal(kind="admin")


def hash_secret(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def new_secret() -> str:
    return SECRET_PREFIX + secrets.token_urlsafe(32)


#: D3: the fields a token's record and its view share, listed once (never its hash).
_VIEW_FIELDS = field_names(Token, TokenView.model_fields)


def _view(row: Token) -> TokenView:
    return TokenView.model_validate({**values_of(row, _VIEW_FIELDS), "token_id": row.id})


#: Verified tokens remembered (SQLite only); the oldest is forgotten beyond this.
PRINCIPALS_KEPT = 1024


#: ``Settings.agent_tokens_per_session``'s default: a session's live agent tokens (each may
#: hold web sessions of its own, web/login.py) stay bounded; a careful operator makes one per
#: agent and revokes it when the agent is done, far below this.
AGENT_TOKENS_PER_SESSION = 100


class TokenService:
    def __init__(
        self, store: Store, *, agent_tokens_per_session: int = AGENT_TOKENS_PER_SESSION
    ) -> None:
        self.store = store
        self.agent_tokens_per_session = agent_tokens_per_session
        #: sha256 of a secret → its principal, while no revocation was written since (SQLite:
        #: one process writes the database; a session is never deleted, only archived, and
        #: the principal is all the token's row and its session's main agent).
        self._known: dict[str, Principal] = {}
        self._known_at = 0  # ``records.revocations`` when ``_known`` was last valid
        self._remember = store.is_sqlite

    # ------------------------------------------------------------------ the admin token

    async def ensure_admin_file(self, home: Path) -> str:
        """The admin secret of ``<home>/admin.token``, made (0600 from the start) at the first
        start and reused after. Registered again if this database does not know it (a new
        database URL); replaced if it was revoked."""
        path = home / ADMIN_TOKEN_NAME
        secret = _read_secret(path)
        if secret is not None:
            row = await self.store.token_by_hash(hash_secret(secret))
            if row is not None and row.revoked_at is None and row.kind == "admin":
                return secret
            if row is None:
                await self.store.add_token("admin", hash_secret(secret))
                return secret
        secret = new_secret()
        await self.store.add_token("admin", hash_secret(secret))
        _write_secret(path, secret)
        return secret

    # ------------------------------------------------------------------ requests

    async def authenticate(self, secret: str) -> Principal:
        digest = hash_secret(secret) if secret else ""
        generation = self.store.revocations
        if generation != self._known_at:
            self._known.clear()
            self._known_at = generation
        known = self._known.get(digest) if secret else None
        if known is not None:
            return known
        row = await self.store.token_by_hash(digest) if secret else None
        if row is None or row.revoked_at is not None:
            what = "missing" if not secret else "unknown or revoked"
            raise Unauthorized(
                f"{what} bearer token: send 'Authorization: Bearer TOKEN' with the admin token "
                f"(<home>/{ADMIN_TOKEN_NAME}) or a session/agent token made by "
                "'shellyard token create'"
            )
        who = await self.principal_of(row)
        # Kept only if no revocation was written while it was read (it may be this one's).
        if self._remember and self.store.revocations == generation == self._known_at:
            if len(self._known) >= PRINCIPALS_KEPT:
                del self._known[next(iter(self._known))]
            self._known[digest] = who
        return who

    async def principal_of(self, row: Token) -> Principal:
        """The principal of a live record (a bearer token's, or a web login's: web/cookies.py
        finds those by a hash of its own, which no bearer secret's hash can equal)."""
        kind: TokenKind = row.kind
        if kind == "admin":
            return Principal(kind="admin", token_id=row.id)
        session = await self.store.get_session(str(row.session_id))
        if session is None:  # the session was deleted under the token
            raise Unauthorized("the token's session no longer exists; make a new token")
        return Principal(
            kind=kind,
            token_id=row.id,
            session_id=row.session_id,
            agent_id=row.agent_id,
            main_agent_id=session.main_agent_id,
        )

    async def acting_agent(self, principal: Principal, named: str | None) -> str | None:
        """The agent a request acts as: the one named in ``X-Shellyard-Agent`` if the token
        may act as it; None means the default session's main agent (admin only)."""
        if principal.kind == "admin":
            return named
        if principal.kind == "agent":
            if named is not None and named != principal.agent_id:
                raise Forbidden(
                    f"this token acts only as agent {principal.agent_id}: drop the "
                    "X-Shellyard-Agent header or name that agent, or use another agent's token"
                )
            return principal.agent_id
        if named is None:
            return principal.main_agent_id
        if await session_of(self.store, named) != principal.session_id:
            raise Forbidden(
                f"this token acts only for the agents of session {principal.session_id}: "
                "name one of them in X-Shellyard-Agent (default: its main agent)"
            )
        return named

    # ------------------------------------------------------------------ scope checks

    def require_admin(self, principal: Principal, what: str) -> None:
        if not principal.is_admin:
            raise Forbidden(
                f"{what} needs the admin token; this token is scoped to one {principal.kind}"
            )

    def check_session(self, principal: Principal, session_id: str) -> None:
        """Another session is reported like a missing one."""
        if not principal.is_admin and session_id != principal.session_id:
            raise NotFound(f"no session {session_id!r}; list yours with GET /v1/sessions")

    async def check_agent(self, principal: Principal, agent_id: str) -> None:
        """A session token reaches the agents of its session, an agent token its own agent;
        any other agent is reported like a missing one."""
        if principal.is_admin:
            return
        if principal.kind == "agent":
            allowed = agent_id == principal.agent_id
        else:
            allowed = await session_of(self.store, agent_id) == principal.session_id
        if not allowed:
            raise NotFound(f"no agent {agent_id!r} in your session")

    async def check_wake(self, principal: Principal, wake_id: str) -> None:
        if principal.is_admin:
            return
        if await self.store.session_of_wake(wake_id) != principal.session_id:
            raise NotFound(f"no wake {wake_id!r} in your session")

    # ------------------------------------------------------------------ token admin

    async def create(self, principal: Principal, request: TokenCreateRequest) -> TokenCreated:
        """Admin: any token. Session token: agent tokens for the agents of its session."""
        if not principal.is_admin and (principal.kind != "session" or request.kind != "agent"):
            raise Forbidden(
                "only the admin token makes admin and session tokens; a session token "
                "makes agent tokens for its own agents; an agent token makes none"
            )
        session_id = request.session_id
        if request.kind == "agent":
            assert request.agent_id is not None
            await self.check_agent(principal, request.agent_id)
            agent = await self.store.get_agent(request.agent_id)
            if agent is None:
                raise NotFound(f"no agent {request.agent_id!r}")
            session_id = agent.session_id
        elif request.kind == "session":
            assert session_id is not None
            if await self.store.get_session(session_id) is None:
                raise NotFound(
                    f"no session {session_id!r}; list them with 'shellyard session list'"
                )
        secret = new_secret()
        if request.kind == "agent":
            assert session_id is not None and request.agent_id is not None
            most = self.agent_tokens_per_session
            made, live = await self.store.add_agent_token(
                hash_secret(secret),
                session_id=session_id,
                agent_id=request.agent_id,
                created_by=principal.token_id,
                most=most,
            )
            if made is None:  # refused, never made room by revoking or deleting any
                raise TooMany(
                    f"session {session_id} already holds {live} live agent tokens, the most "
                    f"one session may hold (SHELLYARD_AGENT_TOKENS_PER_SESSION, {most}); "
                    "revoke the ones no longer used ('shellyard token revoke TOKEN_ID', "
                    "DELETE /v1/tokens/TOKEN_ID; 'shellyard token list' shows them), then "
                    "make this one again",
                    session_id=session_id,
                    limit=most,
                )
            return TokenCreated(**_view(made).model_dump(), token=secret)
        row = await self.store.add_token(
            request.kind,
            hash_secret(secret),
            session_id=session_id,
            agent_id=request.agent_id,
            created_by=principal.token_id,
        )
        return TokenCreated(**_view(row).model_dump(), token=secret)

    async def list(self, principal: Principal) -> list[TokenView]:
        if principal.kind == "agent":
            raise Forbidden("an agent token cannot list tokens; use the session or admin token")
        rows = await self.store.list_tokens(None if principal.is_admin else principal.session_id)
        return [_view(r) for r in rows]

    async def revoke(self, principal: Principal, token_id: str) -> TokenView:
        if principal.kind == "agent":
            raise Forbidden("an agent token cannot revoke tokens; use the session or admin token")
        row = await self.store.get_token(token_id)
        if row is None or (not principal.is_admin and row.session_id != principal.session_id):
            raise NotFound(f"no token {token_id!r}; list them with 'shellyard token list'")
        revoked = await self.store.revoke_token(token_id)
        assert revoked is not None
        return _view(revoked)


def _read_secret(path: Path) -> str | None:
    try:
        text = path.read_text(encoding="utf-8").strip()
    except FileNotFoundError:
        return None
    if not text:
        raise InvalidInput(f"{path} is empty: delete it to have a new admin token made")
    return text


def _write_secret(path: Path, secret: str) -> None:
    """Write the secret to a new file that is 0600 from its creation (O_EXCL), then move it
    into place: there is never a moment with a wider mode or a half-written token."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.unlink(missing_ok=True)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.write(secret + "\n")
    os.replace(tmp, path)


__all__ = [
    "ADMIN_TOKEN_NAME",
    "UNAUTHENTICATED_ADMIN",
    "Principal",
    "TokenCreateRequest",
    "TokenCreated",
    "TokenService",
    "TokenView",
]


def is_web_session(token_id: str) -> bool:
    """Whether ``token_id`` names a web session (a login's token, ``web_…``), not a bearer
    token an operator or a session made."""
    return token_id.startswith(WEB_SESSION_ID_PREFIX + "_")
