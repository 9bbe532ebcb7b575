"""REST endpoints of the web page's login (docs/web.md; how the cookie works: web/cookies.py).

``POST /v1/auth/codes`` (with a token): a one-time login code, valid for two minutes, with the
reach of that token. ``POST /v1/auth/login`` trades a code (or a token typed into the page's
form) for the HttpOnly, SameSite=Strict login cookie, an opaque web session id bound to the
page's origin (web/cookies.py). ``GET /v1/auth/me`` says who the request acts as (and gives the
page its CSRF value); ``POST /v1/auth/logout`` ends the web session and clears the cookie.

Codes live in this server process only: a restart voids the unused ones (run ``shellyard ui``
again); only their sha256 is kept."""

from __future__ import annotations

import asyncio
import secrets
import time
from dataclasses import dataclass
from typing import Annotated, Any

from fastapi import APIRouter, Request, Response
from pydantic import BaseModel, ConfigDict, Field

from shellyard.api.auth import PrincipalDep, principal
from shellyard.api.bodies import body_of
from shellyard.api.docs import body_doc
from shellyard.contract.rawjson import parse
from shellyard.control.plane import ControlPlane
from shellyard.control.tokens import Principal, hash_secret, is_web_session
from shellyard.errors import Forbidden, InvalidInput, NotFound, TooMany, Unauthorized
from shellyard.web.cookies import (
    CSRF_HEADER,
    WEB_SESSION_PREFIX,
    WEB_SESSION_TTL_S,
    cookie_name,
    cookie_secret,
    csrf_of,
    page_origin,
    web_session_hash,
)

#: How long a login code can be used.
CODE_TTL_S = 120.0
#: How long after the first pending code expires the timer deletes what has expired by then
#: (one timer for all codes, so expiries close together are deleted together).
CODE_SWEEP_SLACK_S = 1.0
#: How long the browser keeps the cookie (the web session behind it ends then too).
COOKIE_MAX_AGE_S = int(WEB_SESSION_TTL_S)
#: Unused codes kept at most: asking for codes cannot grow memory unbounded. When full, a
#: new code is refused (429), never made by dropping another reach's code, but for the admin's,
#: which drops the oldest code of another reach.
MAX_PENDING_CODES = 1000
#: Codes one reach (kind, session, agent) may have pending, its own oldest dropped first: a
#: flood of codes, through any number of tokens or web sessions of that reach (a login with a
#: token makes a web session, a token of its own), drops only its own codes, not the ones
#: others (the operator's ``shellyard ui``) are about to use.
MAX_CODES_PER_TOKEN = 10
#: Web sessions one token may have (logged in, logged out or expired but not yet swept): a
#: login past it deletes that token's oldest, whose browser then answers 401. A loop of
#: logins with one token (each a row, kept 7 days) so grows the database by at most this.
MAX_WEB_SESSIONS_PER_TOKEN = 20


async def _source_token(plane: ControlPlane, token_id: str) -> str:
    """The bearer token a login counts against: a code made with a web session's cookie
    counts against the token that web session came from, so web sessions cannot make web
    sessions without end (each within its own bound)."""
    if not is_web_session(token_id):
        return token_id
    row = await plane.store.get_token(token_id)
    if row is None or row.created_by is None:
        raise Unauthorized("this login code's web session has ended: log in again")
    return row.created_by


#: Codes one session's reaches may have pending together (its session token and every agent
#: of it: a session token may make child agents and a token for each, so reaches alone would
#: let it fill the table), that session's own oldest dropped first. The admin's codes name no
#: session and are not counted here.
MAX_CODES_PER_SESSION = 20


def _reach(who: Principal) -> tuple[str, str | None, str | None]:
    return (who.kind, who.session_id, who.agent_id)


def _session_of(who: Principal) -> str | None:
    """The session whose budget a code counts in (an agent token's too: its agent's)."""
    if who.is_admin:
        return None
    return who.session_id


class CodeRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    #: The session the page opens first (optional; must be one the token reaches).
    session_id: str | None = None


class CodeView(BaseModel):
    code: str
    expires_at: float
    #: Where to point a browser: the page with the code in its fragment (never sent to a
    #: server, so it stays out of access logs and Referer headers).
    path: str


class LoginRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    code: str | None = Field(default=None, max_length=200)
    #: Instead of a code: a token typed into the page's login form.
    token: str | None = Field(default=None, max_length=500)


class LoginView(BaseModel):
    """Who the page acts as."""

    kind: str
    session_id: str | None = None
    agent_id: str | None = None
    #: How this request was authenticated: ``cookie``, ``bearer`` or ``none`` (--no-auth).
    via: str
    #: The value to send in X-Shellyard-CSRF with the cookie (only when ``via`` is cookie).
    csrf: str | None = None


@dataclass(frozen=True)
class PendingCode:
    who: Principal
    expires_at: float


def _view(who: Principal, via: str, secret: str | None = None) -> LoginView:
    return LoginView(
        kind=who.kind,
        session_id=who.session_id,
        agent_id=who.agent_id,
        via=via,
        csrf=csrf_of(secret) if secret else None,
    )


def login_router(plane: ControlPlane, pending: dict[str, PendingCode] | None = None) -> APIRouter:
    """``pending``: the unused codes by their sha256 (the caller's, to look at; else new)."""
    router = APIRouter()
    pending = {} if pending is None else pending
    #: the one timer that deletes codes once expired (no request need come for that)
    sweep: list[asyncio.TimerHandle] = []

    def drop_expired(now: float) -> None:
        for key in [k for k, p in pending.items() if p.expires_at < now]:
            del pending[key]

    def swept() -> None:
        sweep.clear()
        drop_expired(time.time())
        schedule()

    def schedule() -> None:
        if sweep or not pending:
            return
        first = min(p.expires_at for p in pending.values())
        delay = max(0.0, first - time.time()) + CODE_SWEEP_SLACK_S
        sweep.append(asyncio.get_running_loop().call_later(delay, swept))

    def make_room(who: Principal) -> None:
        mine = [key for key, p in pending.items() if _reach(p.who) == _reach(who)]
        for key in mine[: max(0, len(mine) + 1 - MAX_CODES_PER_TOKEN)]:
            del pending[key]
        session = _session_of(who)
        if session is not None:
            ours = [key for key, p in pending.items() if _session_of(p.who) == session]
            for key in ours[: max(0, len(ours) + 1 - MAX_CODES_PER_SESSION)]:
                del pending[key]
        if len(pending) < MAX_PENDING_CODES:
            return
        others = [key for key, p in pending.items() if not p.who.is_admin]
        if not who.is_admin or not others:
            raise TooMany(
                f"{MAX_PENDING_CODES} login codes are waiting to be used; codes expire "
                f"{CODE_TTL_S:.0f} s after they are made: ask again then"
            )
        del pending[others[0]]

    @router.post("/v1/auth/codes", openapi_extra=body_doc(CodeRequest))
    async def create_code(
        who: PrincipalDep, request: Annotated[CodeRequest, body_of(CodeRequest)]
    ) -> CodeView:
        """A one-time code for the web page with this token's reach."""
        if who.token_id is None:
            raise InvalidInput(
                "this server runs without tokens (--no-auth): open /ui/ directly, no login needed"
            )
        if request.session_id is not None:
            plane.tokens.check_session(who, request.session_id)
            await plane.sessions.session_record(request.session_id)
        now = time.time()
        drop_expired(now)
        make_room(who)
        code = secrets.token_urlsafe(24)
        pending[hash_secret(code)] = PendingCode(who, now + CODE_TTL_S)
        schedule()
        fragment = f"login={code}"
        if request.session_id:
            fragment += f"&session={request.session_id}"
        return CodeView(code=code, expires_at=now + CODE_TTL_S, path=f"/ui/#{fragment}")

    @router.post("/v1/auth/login", openapi_extra=body_doc(LoginRequest))
    async def login(body: dict[str, Any], request: Request, response: Response) -> LoginView:
        """Trade a login code (or a token) for the login cookie. Needs the X-Shellyard-CSRF
        header (any value): a cross-site form cannot send it, so no other site can log a
        browser in to an account of its choosing."""
        if not request.headers.get(CSRF_HEADER):
            raise Forbidden(f"send the {CSRF_HEADER} header (any value) with a login")
        # parsed here, not by body_of (api/bodies.py): the CSRF header is checked first
        asked = parse(LoginRequest, body, raw_bytes=True)
        if (asked.code is None) == (asked.token is None):
            raise InvalidInput("give exactly one of 'code' (from 'shellyard ui') or 'token'")
        if asked.code is not None:
            drop_expired(time.time())
            found = pending.pop(hash_secret(asked.code.strip()), None)
            if found is None:
                raise Unauthorized(
                    "this login code is unknown, used or expired (codes work once, for two "
                    "minutes): run 'shellyard ui' for a new one"
                )
            who = found.who
        else:
            who = await plane.tokens.authenticate((asked.token or "").strip())
        if who.token_id is None:
            raise InvalidInput("this server runs without tokens (--no-auth): no login needed")
        # An opaque web session id, found by a hash bound to this page's origin: not a
        # bearer token, and no other host or port can use it (web/cookies.py).
        secret = WEB_SESSION_PREFIX + secrets.token_urlsafe(32)
        await plane.store.add_web_session(
            who.kind,
            web_session_hash(page_origin(request), secret),
            session_id=who.session_id,
            agent_id=who.agent_id,
            created_by=await _source_token(plane, who.token_id),
            keep=MAX_WEB_SESSIONS_PER_TOKEN,
        )
        response.set_cookie(
            cookie_name(request),
            secret,
            max_age=COOKIE_MAX_AGE_S,
            path="/",
            httponly=True,
            samesite="strict",
            secure=request.url.scheme == "https",
        )
        return _view(who, "cookie", secret)

    @router.get("/v1/auth/me")
    async def me(request: Request) -> LoginView:
        """Who this request acts as; 401 without a token or cookie."""
        who = await principal(request, request.headers.get("authorization"))
        if not request.app.state.auth_required:
            return _view(who, "none")
        if request.headers.get("authorization"):
            return _view(who, "bearer")
        return _view(who, "cookie", cookie_secret(request))

    @router.post("/v1/auth/logout")
    async def logout(request: Request, response: Response) -> LoginView:
        """Revoke the login cookie's token and clear the cookie."""
        secret = cookie_secret(request)
        if secret is None or request.headers.get("authorization"):
            raise InvalidInput("there is no login cookie to log out of")
        who = await principal(request, None)  # checks the CSRF header
        row = await plane.store.token_by_hash(web_session_hash(page_origin(request), secret))
        if row is None:
            raise NotFound("the login cookie's web session is gone already")
        await plane.store.revoke_token(row.id)
        response.delete_cookie(cookie_name(request), path="/", httponly=True, samesite="strict")
        return _view(who, "cookie")

    return router


__all__ = ["PendingCode", "login_router"]
