"""What ``Client`` and ``AsyncClient`` share: the description of one REST call (``_Call``), the
``Op`` descriptor that turns a description into a method of both clients, and the two senders.

An operation is written once, as a function from the caller's arguments to a ``_Call``::

    class ExecutionOps:
        status = Op(_status)          # def _status(execution_id: str) -> _Call[ExecutionView]

On a ``Client`` the attribute is a method returning ``ExecutionView``; on an ``AsyncClient``,
one returning an awaitable of it. The two clients differ only in how they send.
"""

from __future__ import annotations

import copy
import functools
import json
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator
from dataclasses import dataclass, field
from typing import Any, Generic, ParamSpec, Self, TypeVar, overload

import httpx
from pydantic import BaseModel, TypeAdapter, ValidationError

from shellyard.errors import (
    AnswerLost,
    RunnerUnavailable,
    ShellyardError,
    problems_text,
    visible,
)
from shellyard.sdk.answer_clock import (
    CLOCK,
    MAX_JSON_BYTES,
    RESENDABLE,
    AnswerClock,
    advice,
    unreadable,
)
from shellyard.sdk.bounds import AnswerTooLarge, AnswerTooSlow, too_large, too_large_error
from shellyard.sdk.lean import LeanHttp
from shellyard.sdk.native import running_loop
from shellyard.sdk.status import raise_for, unreachable
from shellyard.sdk.wire import async_transport, sync_transport

T = TypeVar("T")
P = ParamSpec("P")

#: Extra seconds on top of a server-side wait before the HTTP read gives up.
WAIT_SLACK_S = 15.0
#: Downloads, uploads and writer operations may move gigabytes or wait for the writer.
SLOW_TIMEOUT_S = 3600.0
AGENT_HEADER = "X-Shellyard-Agent"


@dataclass
class _Call(Generic[T]):
    method: str
    path: str
    result: TypeAdapter[T]
    params: dict[str, Any] = field(default_factory=dict)
    body: Any = None
    timeout_s: float = 30.0


def call(
    method: str,
    path: str,
    result: TypeAdapter[T],
    params: dict[str, Any] | None = None,
    body: Any = None,
    timeout_s: float = 30.0,
) -> _Call[T]:
    """A ``_Call`` whose ``None`` query parameters are left out (the server's default applies)."""
    present = {k: v for k, v in (params or {}).items() if v is not None}
    return _Call(method, path, result, params=present, body=body, timeout_s=timeout_s)


def decode(response: httpx.Response, request: _Call[T]) -> T:
    raise_for(response.status_code, response.content)
    return parse(request.result, response.content)


def _refused(response: httpx.Response, limit: int, what: str) -> None:
    """A ``Content-Length`` past the bound is refused before a byte of the body."""
    length = response.headers.get("content-length", "")
    if length.isdigit() and int(length) > limit:
        raise too_large(limit, what)


def read_answer(response: httpx.Response, limit: int, what: str) -> bytes:
    """A streamed httpx answer's body (decoded), at most ``limit`` bytes (sdk/bounds.py).

    Only these bytes earn the answer's clock its second per 64 KiB: counted on
    the wire, as before, chunk extensions or empty deflate blocks (framing that is no body)
    earned time at 64 KiB/s while the body grew a few bytes a second, so the answer's end,
    and the size bound, never came (docs/security.md "Attack pass (session 49)")."""
    _refused(response, limit, what)
    chunks: list[bytes] = []
    size = 0
    clock = CLOCK.get()
    for chunk in response.iter_bytes():
        size += len(chunk)
        if clock is not None:
            clock.received = size  # body bytes earn time, as on the lean path
        if size > limit:
            raise too_large(limit, what)
        chunks.append(chunk)
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


async def aread_answer(response: httpx.Response, limit: int, what: str) -> bytes:
    """``read_answer`` of an async client's answer."""
    _refused(response, limit, what)
    chunks: list[bytes] = []
    size = 0
    clock = CLOCK.get()
    async for chunk in response.aiter_bytes():
        size += len(chunk)
        if clock is not None:
            clock.received = size
        if size > limit:
            raise too_large(limit, what)
        chunks.append(chunk)
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def _failed(
    exc: httpx.TransportError, clock: AnswerClock | None, method: str = "GET"
) -> ShellyardError:
    """A JSON call's transport failure as the caller's error: a bound's own message (the
    answer too large, or not complete in time), else the server cannot be reached."""
    if isinstance(exc, AnswerTooLarge):
        return too_large_error(exc)
    if isinstance(exc, AnswerTooSlow):
        return exc.clock.late_error()
    method = clock.method if clock is not None else method
    # A request a write of which failed never went whole (httpcore reads after a failed
    # write, so its error is a read's): "cannot reach ... retry", as on the lean path and
    # the CLI's fast path (docs/security.md "Attack pass (session 51)").
    unsent = clock is not None and clock.unsent
    if method.upper() not in RESENDABLE and not unsent:
        # A read waits, and finds the connection broken or the answer not HTTP, only once
        # the request went whole: a server that took a POST may act on it (AnswerLost: look
        # first), never "cannot reach ... retry", which ran a command twice (docs/security.md
        # "Attack pass (session 50)"); the CLI's fast path says the same (cli/entry.py).
        if isinstance(exc, httpx.ReadTimeout):
            return AnswerLost(f"the control plane's answer did not come ({exc}); " + advice(method))
        if isinstance(exc, (httpx.ReadError, httpx.RemoteProtocolError)):
            return AnswerLost(
                f"the connection broke before the control plane's answer came whole ({exc}); "
                + advice(method)
            )
    late = clock.error() if clock is not None else None
    return late if late is not None else _unreachable(exc)


def parse(adapter: TypeAdapter[T], raw: bytes) -> T:
    """``raw`` JSON as ``adapter``'s type; an answer naming a file that is not UTF-8 holds
    ``\\udcNN`` escapes pydantic's parser refuses (docs/files-and-transfers.md "Names that
    are not UTF-8"): Python's ``json`` reads those, then the value is validated. An answer
    that is neither (a proxy's page, another service at that URL, a server of another
    version) is a ShellyardError that says so, never pydantic's own."""
    try:
        try:
            return adapter.validate_json(raw)
        except ValidationError as exc:
            if not any(e["type"] == "json_invalid" for e in exc.errors()):
                raise
            try:
                value = json.loads(raw)
            except (ValueError, RecursionError):  # a deep nest pydantic's parser refused too
                raise exc from None
            return adapter.validate_python(value)
    except ValidationError as exc:
        raise not_understood(raw, exc) from None


#: Most characters of pydantic's problems named in ``not_understood``'s message.
_PROBLEMS_CHARS = 300


def not_understood(raw: bytes, exc: ValidationError) -> ShellyardError:
    """The error for a successful answer the SDK cannot read as what it asked for."""
    problems = exc.errors()
    if any(e["type"] == "json_invalid" for e in problems):
        what = "is not JSON"
    else:  # the first few: a whole model's missing fields would fill the screen
        more = f"; and {len(problems) - 3:,} more" if len(problems) > 3 else ""
        # their locations hold the answer's own keys: cut, control codes shown as \xNN,
        # as its bytes are (the message reaches terminals and logs)
        said = visible(problems_text(problems[:3]))
        said = said if len(said) <= _PROBLEMS_CHARS else said[:_PROBLEMS_CHARS] + "…"
        what = f"is not what the SDK expects ({said}{more})"
    return unreadable(raw, what)


def headers(token: str, agent_id: str | None) -> dict[str, str]:
    result = {"Authorization": f"Bearer {token}"}
    if agent_id:
        result[AGENT_HEADER] = agent_id
    return result


class _NoCookies(httpx.Cookies):
    """The SDK authenticates with its token and keeps no cookie a server sets: httpx would
    read every answer's headers through ``http.cookiejar`` for them (~6% of a call's CPU)."""

    def extract_cookies(self, response: httpx.Response) -> None:
        return None


class _Requests:
    """A call's ``httpx.Request``, built as ``httpx.Client.request`` builds it (the client's
    headers and base URL, the query, the JSON body as httpx encodes it, the timeout) but
    with the client's headers merged once, not per call: that merging, of the URL, query,
    headers and cookies, was a sixth of a REST call's CPU in the client (docs/benchmarks.md
    §56)."""

    def __init__(self, http: httpx.Client | httpx.AsyncClient) -> None:
        self.http = http
        if hasattr(http, "_cookies"):  # httpx keeps a client's jar there (no public switch)
            http._cookies = _NoCookies()
        # httpx joins a relative path to the base URL's path by concatenation, as here
        self._prefix = str(http.base_url).rstrip("/") + "/"
        self._headers = httpx.Headers(http.headers)

    def build(self, request: _Call[Any]) -> httpx.Request:
        url = httpx.URL(self._prefix + request.path.lstrip("/"))
        if request.params:
            url = url.copy_merge_params(request.params)
        extensions = {"timeout": httpx.Timeout(request.timeout_s).as_dict()}
        content = json_body(request.body)
        if content is None:
            return httpx.Request(request.method, url, headers=self._headers, extensions=extensions)
        built = httpx.Request(
            request.method, url, headers=self._headers, content=content, extensions=extensions
        )
        built.headers["Content-Type"] = "application/json"  # after Content-Length, as httpx
        return built


def json_body(body: Any) -> bytes | None:
    """A call's JSON body as httpx encodes ``json=`` (a lone surrogate fails here as there)."""
    if body is None:
        return None
    if isinstance(body, BaseModel):
        body = body.model_dump(mode="json")
    text = json.dumps(body, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    return text.encode("utf-8")


def _requests_of(sender: SyncSender | AsyncSender) -> _Requests:
    """The sender's ``_Requests``, made for its current client: on first use (a client made
    by a subclass, as the in-process one of /mcp, included) and again once ``as_agent``'s
    copy has a client of its own."""
    requests = sender._requests
    if requests is None or requests.http is not sender._http:
        requests = sender._requests = _Requests(sender._http)
    return requests


def _unreachable(exc: httpx.TransportError) -> RunnerUnavailable:
    return unreachable(exc)


def broken(what: str, exc: httpx.TransportError) -> RunnerUnavailable:
    return RunnerUnavailable(f"the {what} to or from the control plane broke ({exc}); retry")


#: Most bytes of an error answer to a download read to describe it (the server's error
#: bodies are small JSON; a foreign one is cut, its connection closed unread).
MAX_ERROR_BODY = 64 * 1024


def error_body(body: Iterator[bytes]) -> bytes:
    """``error_abody`` of a blocking stream: its first :data:`MAX_ERROR_BODY` bytes."""
    chunks: list[bytes] = []
    size = 0
    for chunk in body:
        chunks.append(chunk)
        size += len(chunk)
        if size >= MAX_ERROR_BODY:
            break
    return b"".join(chunks)[:MAX_ERROR_BODY]


async def error_abody(body: AsyncIterator[bytes]) -> bytes:
    chunks: list[bytes] = []
    size = 0
    async for chunk in body:
        chunks.append(chunk)
        size += len(chunk)
        if size >= MAX_ERROR_BODY:
            break
    return b"".join(chunks)[:MAX_ERROR_BODY]


class SyncSender:
    """Sends a ``_Call`` with a blocking ``httpx.Client``."""

    _http: httpx.Client
    _requests: _Requests | None = None
    #: Most bytes of one JSON answer's body (sdk/bounds.py); an upload's answer too.
    max_json_bytes: int = MAX_JSON_BYTES

    def __init__(self, url: str, token: str, *, agent_id: str | None = None) -> None:
        self._http = httpx.Client(
            base_url=url,
            headers=headers(token, agent_id),
            timeout=30,
            transport=sync_transport(),  # a request's head and body in one write (sdk/wire.py)
        )

    def _send(self, request: _Call[T]) -> T:
        # the whole answer within its clock, at most max_json_bytes (sdk/bounds.py):
        # wire.py's streams cut each read to the clock of this context
        clock = AnswerClock(request.timeout_s, method=request.method)
        token = CLOCK.set(clock)
        try:
            response = self._http.send(_requests_of(self).build(request), stream=True)
            try:
                what = f"{request.method} {request.path}"
                content = read_answer(response, self.max_json_bytes, what)
            finally:
                response.close()
        except httpx.TransportError as exc:
            raise _failed(exc, clock) from exc
        finally:
            CLOCK.reset(token)
        raise_for(response.status_code, content)
        return parse(request.result, content)

    def _download(self, request: dict[str, Any]) -> Iterator[bytes]:
        try:
            with self._http.stream("GET", **request, timeout=SLOW_TIMEOUT_S) as response:
                if response.status_code >= 400:
                    raise_for(response.status_code, error_body(response.iter_bytes()))
                # as the bytes arrive: re-chunking them costs a copy per byte (measured)
                yield from response.iter_raw()
        except httpx.TransportError as exc:
            raise broken("download", exc) from exc

    def as_agent(self, agent_id: str) -> Self:
        """The same server, acting for ``agent_id`` (inbox, timers, executions, files)."""
        clone = copy.copy(self)
        clone._http = httpx.Client(
            base_url=self._http.base_url,
            headers={**self._http.headers, AGENT_HEADER: agent_id},
            timeout=self._http.timeout,
            transport=sync_transport(),
        )
        return clone

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()


class AsyncSender:
    """Sends a ``_Call`` with the lean keep-alive client (``sdk/lean.py``) to an ``http://``
    server on asyncio, else with an ``httpx.AsyncClient`` (``https://``, trio, the in-process
    client of /mcp, which sets ``_http`` itself and has no ``_lean``)."""

    _http: httpx.AsyncClient
    _requests: _Requests | None = None
    _lean: LeanHttp | None = None
    #: Most bytes of one JSON answer's body (sdk/bounds.py); an upload's answer too.
    max_json_bytes: int = MAX_JSON_BYTES

    def __init__(self, url: str, token: str, *, agent_id: str | None = None) -> None:
        self._http = httpx.AsyncClient(
            base_url=url,
            headers=headers(token, agent_id),
            timeout=30,
            transport=async_transport(),  # a request's head and body in one write (sdk/wire.py)
        )
        self._lean = LeanHttp.for_url(url, headers(token, agent_id))

    async def _send(self, request: _Call[T]) -> T:
        lean = self._lean
        if lean is None or running_loop() is None:
            return await self._send_httpx(request)
        lean.max_json_bytes = self.max_json_bytes
        try:
            status, content = await lean.call(
                request.method,
                request.path,
                request.params,
                json_body(request.body),
                request.timeout_s,
            )
        except httpx.TransportError as exc:
            raise _failed(exc, None, request.method) from exc
        raise_for(status, content)
        return parse(request.result, content)

    async def _send_httpx(self, request: _Call[T]) -> T:
        """``SyncSender._send`` on the async httpx client (its bounds, sdk/bounds.py)."""
        clock = AnswerClock(request.timeout_s, method=request.method)
        token = CLOCK.set(clock)
        try:
            response = await self._http.send(_requests_of(self).build(request), stream=True)
            try:
                what = f"{request.method} {request.path}"
                content = await aread_answer(response, self.max_json_bytes, what)
            finally:
                await response.aclose()
        except httpx.TransportError as exc:
            raise _failed(exc, clock) from exc
        finally:
            CLOCK.reset(token)
        raise_for(response.status_code, content)
        return parse(request.result, content)

    async def _download(self, request: dict[str, Any]) -> AsyncIterator[bytes]:
        lean = self._lean
        try:
            if lean is None or running_loop() is None:
                async with self._http.stream("GET", **request, timeout=SLOW_TIMEOUT_S) as response:
                    if response.status_code >= 400:
                        raise_for(response.status_code, await error_abody(response.aiter_bytes()))
                    async for chunk in response.aiter_raw():
                        yield chunk
                return
            path, params, extra = request["url"], request["params"], request["headers"]
            async with lean.stream("GET", path, params, extra, SLOW_TIMEOUT_S) as (status, body):
                if status >= 400:
                    raise_for(status, await error_abody(body))
                async for chunk in body:
                    yield chunk
        except httpx.TransportError as exc:
            raise broken("download", exc) from exc

    def as_agent(self, agent_id: str) -> Self:
        clone = copy.copy(self)
        clone._http = httpx.AsyncClient(
            base_url=self._http.base_url,
            headers={**self._http.headers, AGENT_HEADER: agent_id},
            timeout=self._http.timeout,
            transport=async_transport(),
        )
        if self._lean is not None:
            agent = {**self._lean.extra, AGENT_HEADER: agent_id}
            clone._lean = LeanHttp.for_url(str(self._http.base_url), agent)
        return clone

    async def aclose(self) -> None:
        if self._lean is not None:
            await self._lean.aclose()
        await self._http.aclose()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *_exc: object) -> None:
        await self.aclose()


class Op(Generic[P, T]):
    """One operation of both clients, described once by ``build`` (arguments → ``_Call``)."""

    def __init__(self, build: Callable[P, _Call[T]]) -> None:
        self.build = build
        self.__doc__ = build.__doc__

    @overload
    def __get__(self, obj: None, owner: type[Any]) -> Self: ...

    @overload
    def __get__(self, obj: SyncSender, owner: type[Any] | None = None) -> Callable[P, T]: ...

    @overload
    def __get__(
        self, obj: AsyncSender, owner: type[Any] | None = None
    ) -> Callable[P, Coroutine[Any, Any, T]]: ...

    def __get__(self, obj: Any, owner: type[Any] | None = None) -> Any:
        if obj is None:
            return self
        build = self.build

        @functools.wraps(build)
        def bound(*args: Any, **kwargs: Any) -> Any:
            return obj._send(build(*args, **kwargs))

        return bound


class Download(Generic[P]):
    """A byte download of both clients, described once by ``build`` (arguments → the GET's
    ``url``, ``params`` and ``headers``): an iterator of chunks on a ``Client``, an async
    iterator on an ``AsyncClient``. Nothing is read whole into memory."""

    def __init__(self, build: Callable[P, dict[str, Any]]) -> None:
        self.build = build
        self.__doc__ = build.__doc__

    @overload
    def __get__(self, obj: None, owner: type[Any]) -> Self: ...

    @overload
    def __get__(
        self, obj: SyncSender, owner: type[Any] | None = None
    ) -> Callable[P, Iterator[bytes]]: ...

    @overload
    def __get__(
        self, obj: AsyncSender, owner: type[Any] | None = None
    ) -> Callable[P, AsyncIterator[bytes]]: ...

    def __get__(self, obj: Any, owner: type[Any] | None = None) -> Any:
        if obj is None:
            return self
        build = self.build

        @functools.wraps(build)
        def bound(*args: Any, **kwargs: Any) -> Any:
            return obj._download(build(*args, **kwargs))

        return bound


__all__ = [
    "SLOW_TIMEOUT_S",
    "WAIT_SLACK_S",
    "AsyncSender",
    "Download",
    "Op",
    "SyncSender",
    "_Call",
    "aread_answer",
    "broken",
    "call",
    "decode",
    "error_abody",
    "error_body",
    "headers",
    "raise_for",
    "read_answer",
]
