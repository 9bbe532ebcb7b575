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

from shellyard.errors import RunnerUnavailable
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


def parse(adapter: TypeAdapter[T], raw: bytes) -> T:
    """``raw`` JSON as ``adapter``'s type; an answer naming a file that is not UTF-8 holds
    ``\\udcNN`` escapes pydantic's parser refuses (docs/files-and-transfers.md "Names that
    are not UTF-8"): Python's ``json`` reads those, then the value is validated."""
    try:
        return adapter.validate_json(raw)
    except ValidationError as exc:
        if not any(e["type"] == "json_invalid" for e in exc.errors()):
            raise
        try:
            value = json.loads(raw)
        except ValueError:
            raise exc from None
        return adapter.validate_python(value)


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
    §54)."""

    def __init__(self, http: httpx.Client | httpx.AsyncClient) -> None:
        if hasattr(http, "_cookies"):  # httpx keeps a client's jar there (no public switch)
            http._cookies = _NoCookies()
        # httpx joins a relative path to the base URL's path by concatenation, as here
        self._prefix = str(http.base_url).rstrip("/")
        self._headers = httpx.Headers(http.headers)

    def build(self, request: _Call[Any]) -> httpx.Request:
        url = httpx.URL(self._prefix + request.path)
        if request.params:
            url = url.copy_merge_params(request.params)
        extensions = {"timeout": httpx.Timeout(request.timeout_s).as_dict()}
        body = request.body
        if body is None:
            return httpx.Request(request.method, url, headers=self._headers, extensions=extensions)
        if isinstance(body, BaseModel):
            body = body.model_dump(mode="json")
        # httpx's own encoding of json= (a lone surrogate fails here as it did there)
        content = json.dumps(body, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
        built = httpx.Request(
            request.method,
            url,
            headers=self._headers,
            content=content.encode("utf-8"),
            extensions=extensions,
        )
        built.headers["Content-Type"] = "application/json"  # after Content-Length, as httpx
        return built


def _unreachable(exc: httpx.TransportError) -> RunnerUnavailable:
    return unreachable(exc)


def broken(what: str, exc: httpx.TransportError) -> RunnerUnavailable:
    return RunnerUnavailable(f"the {what} to or from the control plane broke ({exc}); retry")


class SyncSender:
    """Sends a ``_Call`` with a blocking ``httpx.Client``."""

    def __init__(self, url: str, token: str, *, agent_id: str | None = None) -> None:
        self._http = httpx.Client(
            base_url=url,
            headers=headers(token, agent_id),
            timeout=30,
            transport=sync_transport(),  # a request's head and body in one write (sdk/wire.py)
        )
        self._requests = _Requests(self._http)

    def _send(self, request: _Call[T]) -> T:
        try:
            response = self._http.send(self._requests.build(request))
        except httpx.TransportError as exc:
            raise _unreachable(exc) from exc
        return decode(response, request)

    def _download(self, request: dict[str, Any]) -> Iterator[bytes]:
        try:
            with self._http.stream("GET", **request, timeout=SLOW_TIMEOUT_S) as response:
                if response.status_code >= 400:
                    raise_for(response.status_code, response.read())
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
        clone._requests = _Requests(clone._http)
        return clone

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()


class AsyncSender:
    """Sends a ``_Call`` with an ``httpx.AsyncClient``."""

    def __init__(self, url: str, token: str, *, agent_id: str | None = None) -> None:
        self._http = httpx.AsyncClient(
            base_url=url,
            headers=headers(token, agent_id),
            timeout=30,
            transport=async_transport(),  # a request's head and body in one write (sdk/wire.py)
        )
        self._requests = _Requests(self._http)

    async def _send(self, request: _Call[T]) -> T:
        try:
            response = await self._http.send(self._requests.build(request))
        except httpx.TransportError as exc:
            raise _unreachable(exc) from exc
        return decode(response, request)

    async def _download(self, request: dict[str, Any]) -> AsyncIterator[bytes]:
        try:
            async with self._http.stream("GET", **request, timeout=SLOW_TIMEOUT_S) as response:
                if response.status_code >= 400:
                    raise_for(response.status_code, await response.aread())
                async for chunk in response.aiter_raw():
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
        clone._requests = _Requests(clone._http)
        return clone

    async def aclose(self) -> None:
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
    "broken",
    "call",
    "decode",
    "headers",
    "raise_for",
]
