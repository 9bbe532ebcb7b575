"""Client operations of workspace files, snapshot history, retention, transfers and artifacts,
mixed into ``Client`` and ``AsyncClient``. Each JSON operation is described once (``FileCalls``
builds the ``_Call``); byte operations stream: downloads are iterators of chunks, uploads take
bytes, a binary file object or an iterator of chunks, and nothing is read whole into memory."""

from __future__ import annotations

from collections.abc import AsyncIterable, AsyncIterator, Iterable, Iterator
from typing import IO, TYPE_CHECKING, Any, TypeVar

import httpx
from pydantic import TypeAdapter

from shellyard.errors import RunnerUnavailable, ShellyardError, error_from_dict
from shellyard.files_model import (
    ArtifactView,
    DiffResult,
    DirListing,
    EditView,
    FileText,
    HistoryView,
    PathEntry,
    RetentionView,
    TransferFilesView,
    TransferView,
    WorkspaceView,
)

if TYPE_CHECKING:
    from shellyard.interfaces.client import _Call

T = TypeVar("T")

_WORKSPACES = TypeAdapter(list[WorkspaceView])
_LISTING = TypeAdapter(DirListing)
_ENTRY = TypeAdapter(PathEntry)
_TEXT = TypeAdapter(FileText)
_HISTORY = TypeAdapter(HistoryView)
_DIFF = TypeAdapter(DiffResult)
_EDIT = TypeAdapter(EditView)
_RETENTION = TypeAdapter(RetentionView)
_TRANSFER = TypeAdapter(TransferView)
_TRANSFERS = TypeAdapter(list[TransferView])
_TFILES = TypeAdapter(TransferFilesView)
_ARTIFACT = TypeAdapter(ArtifactView)
_ARTIFACTS = TypeAdapter(list[ArtifactView])
#: Writer operations and uploads may wait for the writer or move gigabytes: no short timeout.
SLOW_TIMEOUT_S = 3600.0
CHUNK = 1 << 20


def _call(
    method: str,
    path: str,
    result: TypeAdapter[T],
    params: dict[str, Any] | None = None,
    body: Any = None,
    timeout_s: float = 30.0,
) -> _Call[T]:
    from shellyard.interfaces.client import _Call  # client.py imports this module

    return _Call(
        method, path, result, params=_present(params or {}), body=body, timeout_s=timeout_s
    )


def _present(values: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in values.items() if v is not None}


def _where(
    workspace_id: str | None, runner_id: str | None, seq: int | None = None
) -> dict[str, Any]:
    return {"workspace_id": workspace_id, "runner_id": runner_id, "seq": seq}


def _range(offset: int, length: int | None) -> dict[str, str]:
    if offset == 0 and length is None:
        return {}
    if length == 0:
        raise ValueError("length 0 reads nothing")
    end = "" if length is None else str(offset + length - 1)
    return {"Range": f"bytes={offset}-{end}"}


def _raise_for(response: httpx.Response, body: bytes) -> None:
    if response.status_code < 400:
        return
    import json

    try:
        error = json.loads(body)["error"]
    except (ValueError, KeyError, TypeError):
        if response.status_code >= 500:
            raise RunnerUnavailable(
                f"the control plane answered {response.status_code}: {body[:200]!r}"
            ) from None
        raise ShellyardError(f"HTTP {response.status_code}: {body[:200]!r}") from None
    raise error_from_dict(error)


def _chunks_of(data: bytes | IO[bytes] | Iterable[bytes]) -> Iterator[bytes]:
    if isinstance(data, bytes | bytearray | memoryview):
        payload = bytes(data)
        for start in range(0, len(payload), CHUNK):
            yield payload[start : start + CHUNK]
        return
    read = getattr(data, "read", None)
    if read is not None:
        while True:
            chunk = read(CHUNK)
            if not chunk:
                return
            yield chunk
        return
    assert not isinstance(data, IO)
    yield from data


class FileCalls:
    """The REST call of each JSON operation (shared by both clients)."""

    @staticmethod
    def workspaces() -> _Call[list[WorkspaceView]]:
        return _call("GET", "/v1/workspaces", _WORKSPACES)

    @staticmethod
    def list_files(
        path: str,
        workspace_id: str | None,
        runner_id: str | None,
        seq: int | None,
        recursive: bool,
        after: str | None,
        limit: int,
    ) -> _Call[DirListing]:
        params = {
            "path": path,
            **_where(workspace_id, runner_id, seq),
            "recursive": recursive,
            "after": after,
            "limit": limit,
        }
        return _call("GET", "/v1/files", _LISTING, params)

    @staticmethod
    def stat(
        path: str, workspace_id: str | None, runner_id: str | None, seq: int | None
    ) -> _Call[PathEntry]:
        return _call(
            "GET", "/v1/files/stat", _ENTRY, {"path": path, **_where(workspace_id, runner_id, seq)}
        )

    @staticmethod
    def read_text(
        path: str,
        workspace_id: str | None,
        runner_id: str | None,
        seq: int | None,
        offset: int,
        limit: int,
    ) -> _Call[FileText]:
        params = {
            "path": path,
            **_where(workspace_id, runner_id, seq),
            "offset": offset,
            "limit": limit,
        }
        return _call("GET", "/v1/files/text", _TEXT, params)

    @staticmethod
    def history(workspace_id: str | None, runner_id: str | None) -> _Call[HistoryView]:
        return _call("GET", "/v1/files/history", _HISTORY, _where(workspace_id, runner_id))

    @staticmethod
    def diff(
        from_seq: int,
        to_seq: int | None,
        path: str,
        workspace_id: str | None,
        runner_id: str | None,
        after: str | None,
        limit: int,
    ) -> _Call[DiffResult]:
        params = {
            "from_seq": from_seq,
            "to_seq": to_seq,
            "path": path,
            **_where(workspace_id, runner_id),
            "after": after,
            "limit": limit,
        }
        return _call("GET", "/v1/files/diff", _DIFF, params)

    @staticmethod
    def edit(action: str, body: dict[str, Any]) -> _Call[EditView]:
        return _call(
            "POST", f"/v1/files/{action}", _EDIT, body=_present(body), timeout_s=SLOW_TIMEOUT_S
        )

    @staticmethod
    def retention(keep_last: int | None, grace_s: float | None) -> _Call[RetentionView]:
        body = _present({"keep_last": keep_last, "grace_s": grace_s})
        return _call("POST", "/v1/retention", _RETENTION, body=body, timeout_s=SLOW_TIMEOUT_S)

    @staticmethod
    def transfer_start(request: dict[str, Any]) -> _Call[TransferView]:
        return _call("POST", "/v1/transfers", _TRANSFER, body=_present(request), timeout_s=120.0)

    @staticmethod
    def transfer(
        transfer_id: str, action: str = "", params: dict[str, Any] | None = None
    ) -> _Call[TransferView]:
        method = "POST" if action == "cancel" else "GET"
        timeout = 30.0 + float((params or {}).get("wait_s") or (params or {}).get("timeout_s") or 0)
        path = f"/v1/transfers/{transfer_id}{action and '/' + action}"
        return _call(method, path, _TRANSFER, params, timeout_s=timeout)

    @staticmethod
    def transfer_files(
        transfer_id: str, outcome: str | None, offset: int, limit: int
    ) -> _Call[TransferFilesView]:
        params = {"outcome": outcome, "offset": offset, "limit": limit}
        return _call("GET", f"/v1/transfers/{transfer_id}/files", _TFILES, params)

    @staticmethod
    def artifact_declare(
        path: str, name: str | None, workspace_id: str | None, seq: int | None
    ) -> _Call[ArtifactView]:
        body = _present({"path": path, "name": name, "workspace_id": workspace_id, "seq": seq})
        return _call("POST", "/v1/artifacts", _ARTIFACT, body=body)


def _transfer_body(
    source_workspace_id: str,
    paths: list[str],
    target_workspace_id: str,
    target_folder: str,
    queue: bool,
    options: dict[str, Any],
) -> dict[str, Any]:
    return {
        "source_workspace_id": source_workspace_id,
        "paths": paths,
        "target_workspace_id": target_workspace_id,
        "target_folder": target_folder,
        "queue": queue,
        **options,
    }


class FileClient:
    """Files, history, retention, transfers and artifacts for the synchronous ``Client``."""

    _http: httpx.Client

    def _send(self, call: _Call[T]) -> T:
        raise NotImplementedError

    # ------------------------------------------------------------------ reads

    def workspaces(self) -> list[WorkspaceView]:
        """T1: the workspaces you may read and copy between."""
        return self._send(FileCalls.workspaces())

    def list_files(
        self,
        path: str = "",
        *,
        workspace_id: str | None = None,
        runner_id: str | None = None,
        seq: int | None = None,
        recursive: bool = False,
        after: str | None = None,
        limit: int = 1000,
    ) -> DirListing:
        return self._send(
            FileCalls.list_files(path, workspace_id, runner_id, seq, recursive, after, limit)
        )

    def stat(
        self,
        path: str,
        *,
        workspace_id: str | None = None,
        runner_id: str | None = None,
        seq: int | None = None,
    ) -> PathEntry:
        return self._send(FileCalls.stat(path, workspace_id, runner_id, seq))

    def read_text(
        self,
        path: str,
        *,
        workspace_id: str | None = None,
        runner_id: str | None = None,
        seq: int | None = None,
        offset: int = 0,
        limit: int = 65536,
    ) -> FileText:
        return self._send(FileCalls.read_text(path, workspace_id, runner_id, seq, offset, limit))

    def _stream(self, url: str, params: dict[str, Any], headers: dict[str, str]) -> Iterator[bytes]:
        try:
            with self._http.stream(
                "GET", url, params=_present(params), headers=headers, timeout=SLOW_TIMEOUT_S
            ) as response:
                if response.status_code >= 400:
                    _raise_for(response, response.read())
                # as the bytes arrive: re-chunking them costs a copy per byte (measured)
                yield from response.iter_raw()
        except httpx.TransportError as exc:
            raise RunnerUnavailable(f"the download from the control plane broke: {exc}") from exc

    def iter_file(
        self,
        path: str,
        *,
        workspace_id: str | None = None,
        runner_id: str | None = None,
        seq: int | None = None,
        offset: int = 0,
        length: int | None = None,
    ) -> Iterator[bytes]:
        """A file of a committed snapshot (the head by default), streamed in chunks."""
        params = {"path": path, **_where(workspace_id, runner_id, seq)}
        return self._stream("/v1/files/content", params, _range(offset, length))

    def iter_archive(
        self,
        path: str = "",
        *,
        workspace_id: str | None = None,
        runner_id: str | None = None,
        seq: int | None = None,
    ) -> Iterator[bytes]:
        """A folder of a committed snapshot as a tar stream."""
        params = {"path": path, **_where(workspace_id, runner_id, seq)}
        return self._stream("/v1/files/archive", params, {})

    def iter_artifact(self, artifact_id: str) -> Iterator[bytes]:
        return self._stream(f"/v1/artifacts/{artifact_id}/content", {}, {})

    def history(
        self, *, workspace_id: str | None = None, runner_id: str | None = None
    ) -> HistoryView:
        return self._send(FileCalls.history(workspace_id, runner_id))

    def diff(
        self,
        from_seq: int,
        to_seq: int | None = None,
        path: str = "",
        *,
        workspace_id: str | None = None,
        runner_id: str | None = None,
        after: str | None = None,
        limit: int = 1000,
    ) -> DiffResult:
        return self._send(
            FileCalls.diff(from_seq, to_seq, path, workspace_id, runner_id, after, limit)
        )

    # ------------------------------------------------------------------ writes

    def _upload(self, url: str, params: dict[str, Any], data: Any) -> EditView:
        try:
            response = self._http.request(
                "PUT" if url.endswith("content") else "POST",
                url,
                params=_present(params),
                content=_chunks_of(data),
                headers={"Content-Type": "application/octet-stream"},
                timeout=SLOW_TIMEOUT_S,
            )
        except httpx.TransportError as exc:
            raise RunnerUnavailable(f"the upload to the control plane broke: {exc}") from exc
        _raise_for(response, response.content)
        return _EDIT.validate_python(response.json())

    def write_file(
        self,
        path: str,
        data: bytes | IO[bytes] | Iterable[bytes],
        *,
        workspace_id: str | None = None,
        runner_id: str | None = None,
        mode: int | None = None,
        queue: bool = False,
        wait_s: float | None = None,
    ) -> EditView:
        """Write or replace a file (streamed from ``data``): a writer operation (W1)."""
        params = {
            "path": path,
            **_where(workspace_id, runner_id),
            "mode": mode,
            "queue": queue,
            "wait_s": wait_s,
        }
        return self._upload("/v1/files/content", params, data)

    def upload_archive(
        self,
        data: bytes | IO[bytes] | Iterable[bytes],
        path: str = "",
        *,
        workspace_id: str | None = None,
        runner_id: str | None = None,
        queue: bool = False,
        wait_s: float | None = None,
    ) -> EditView:
        """Unpack a tar stream below ``path`` (all or nothing)."""
        params = {"path": path, **_where(workspace_id, runner_id), "queue": queue, "wait_s": wait_s}
        return self._upload("/v1/files/archive", params, data)

    def delete(self, path: str, *, recursive: bool = False, **where: Any) -> EditView:
        return self._send(FileCalls.edit("delete", {"path": path, "recursive": recursive, **where}))

    def move(
        self, source: str, destination: str, *, overwrite: bool = False, **where: Any
    ) -> EditView:
        body = {"source": source, "destination": destination, "overwrite": overwrite, **where}
        return self._send(FileCalls.edit("move", body))

    def restore(self, seq: int, path: str = "", **where: Any) -> EditView:
        return self._send(FileCalls.edit("restore", {"seq": seq, "path": path, **where}))

    def collect(self, keep_last: int | None = None, grace_s: float | None = None) -> RetentionView:
        """Apply the retention policy now (prune, then collect garbage)."""
        return self._send(FileCalls.retention(keep_last, grace_s))

    # ------------------------------------------------------------------ transfers

    def transfer_start(
        self,
        source_workspace_id: str,
        paths: list[str],
        target_workspace_id: str,
        target_folder: str = "",
        *,
        queue: bool = False,
        **options: Any,
    ) -> TransferView:
        body = _transfer_body(
            source_workspace_id, paths, target_workspace_id, target_folder, queue, options
        )
        return self._send(FileCalls.transfer_start(body))

    def transfers(self, limit: int = 100) -> list[TransferView]:
        return self._send(_call("GET", "/v1/transfers", _TRANSFERS, {"limit": limit}))

    def transfer(self, transfer_id: str) -> TransferView:
        return self._send(FileCalls.transfer(transfer_id))

    def transfer_wait(self, transfer_id: str, timeout_s: float = 10.0) -> TransferView:
        return self._send(FileCalls.transfer(transfer_id, "wait", {"timeout_s": timeout_s}))

    def transfer_files(
        self, transfer_id: str, outcome: str | None = None, offset: int = 0, limit: int = 1000
    ) -> TransferFilesView:
        return self._send(FileCalls.transfer_files(transfer_id, outcome, offset, limit))

    def transfer_cancel(self, transfer_id: str, wait_s: float = 0.0) -> TransferView:
        return self._send(FileCalls.transfer(transfer_id, "cancel", {"wait_s": wait_s}))

    # ------------------------------------------------------------------ artifacts

    def artifact_declare(
        self,
        path: str,
        name: str | None = None,
        *,
        workspace_id: str | None = None,
        seq: int | None = None,
    ) -> ArtifactView:
        return self._send(FileCalls.artifact_declare(path, name, workspace_id, seq))

    def artifacts(self) -> list[ArtifactView]:
        return self._send(_call("GET", "/v1/artifacts", _ARTIFACTS))

    def artifact(self, artifact_id: str) -> ArtifactView:
        return self._send(_call("GET", f"/v1/artifacts/{artifact_id}", _ARTIFACT))


class AsyncFileClient:
    """The same operations for ``AsyncClient`` (what the MCP server calls)."""

    _http: httpx.AsyncClient

    async def _send(self, call: _Call[T]) -> T:
        raise NotImplementedError

    async def workspaces(self) -> list[WorkspaceView]:
        return await self._send(FileCalls.workspaces())

    async def list_files(
        self,
        path: str = "",
        *,
        workspace_id: str | None = None,
        runner_id: str | None = None,
        seq: int | None = None,
        recursive: bool = False,
        after: str | None = None,
        limit: int = 1000,
    ) -> DirListing:
        return await self._send(
            FileCalls.list_files(path, workspace_id, runner_id, seq, recursive, after, limit)
        )

    async def stat(
        self,
        path: str,
        *,
        workspace_id: str | None = None,
        runner_id: str | None = None,
        seq: int | None = None,
    ) -> PathEntry:
        return await self._send(FileCalls.stat(path, workspace_id, runner_id, seq))

    async def read_text(
        self,
        path: str,
        *,
        workspace_id: str | None = None,
        runner_id: str | None = None,
        seq: int | None = None,
        offset: int = 0,
        limit: int = 65536,
    ) -> FileText:
        return await self._send(
            FileCalls.read_text(path, workspace_id, runner_id, seq, offset, limit)
        )

    async def iter_file(
        self,
        path: str,
        *,
        workspace_id: str | None = None,
        runner_id: str | None = None,
        seq: int | None = None,
        offset: int = 0,
        length: int | None = None,
    ) -> AsyncIterator[bytes]:
        params = _present({"path": path, **_where(workspace_id, runner_id, seq)})
        try:
            async with self._http.stream(
                "GET",
                "/v1/files/content",
                params=params,
                headers=_range(offset, length),
                timeout=SLOW_TIMEOUT_S,
            ) as response:
                if response.status_code >= 400:
                    _raise_for(response, await response.aread())
                async for chunk in response.aiter_raw():
                    yield chunk
        except httpx.TransportError as exc:
            raise RunnerUnavailable(f"the download from the control plane broke: {exc}") from exc

    async def write_file(
        self,
        path: str,
        data: bytes | AsyncIterable[bytes],
        *,
        workspace_id: str | None = None,
        runner_id: str | None = None,
        mode: int | None = None,
        queue: bool = False,
        wait_s: float | None = None,
    ) -> EditView:
        params = _present(
            {
                "path": path,
                **_where(workspace_id, runner_id),
                "mode": mode,
                "queue": queue,
                "wait_s": wait_s,
            }
        )
        try:
            response = await self._http.put(
                "/v1/files/content",
                params=params,
                content=data,
                headers={"Content-Type": "application/octet-stream"},
                timeout=SLOW_TIMEOUT_S,
            )
        except httpx.TransportError as exc:
            raise RunnerUnavailable(f"the upload to the control plane broke: {exc}") from exc
        _raise_for(response, response.content)
        return _EDIT.validate_python(response.json())

    async def delete(self, path: str, *, recursive: bool = False, **where: Any) -> EditView:
        body = {"path": path, "recursive": recursive, **where}
        return await self._send(FileCalls.edit("delete", body))

    async def move(
        self, source: str, destination: str, *, overwrite: bool = False, **where: Any
    ) -> EditView:
        body = {"source": source, "destination": destination, "overwrite": overwrite, **where}
        return await self._send(FileCalls.edit("move", body))

    async def restore(self, seq: int, path: str = "", **where: Any) -> EditView:
        return await self._send(FileCalls.edit("restore", {"seq": seq, "path": path, **where}))

    async def history(
        self, *, workspace_id: str | None = None, runner_id: str | None = None
    ) -> HistoryView:
        return await self._send(FileCalls.history(workspace_id, runner_id))

    async def diff(
        self,
        from_seq: int,
        to_seq: int | None = None,
        path: str = "",
        *,
        workspace_id: str | None = None,
        runner_id: str | None = None,
        after: str | None = None,
        limit: int = 1000,
    ) -> DiffResult:
        return await self._send(
            FileCalls.diff(from_seq, to_seq, path, workspace_id, runner_id, after, limit)
        )

    async def transfer_start(
        self,
        source_workspace_id: str,
        paths: list[str],
        target_workspace_id: str,
        target_folder: str = "",
        *,
        queue: bool = False,
        **options: Any,
    ) -> TransferView:
        body = _transfer_body(
            source_workspace_id, paths, target_workspace_id, target_folder, queue, options
        )
        return await self._send(FileCalls.transfer_start(body))

    async def transfers(self, limit: int = 100) -> list[TransferView]:
        return await self._send(_call("GET", "/v1/transfers", _TRANSFERS, {"limit": limit}))

    async def transfer(self, transfer_id: str) -> TransferView:
        return await self._send(FileCalls.transfer(transfer_id))

    async def transfer_files(
        self, transfer_id: str, outcome: str | None = None, offset: int = 0, limit: int = 1000
    ) -> TransferFilesView:
        return await self._send(FileCalls.transfer_files(transfer_id, outcome, offset, limit))

    async def transfer_cancel(self, transfer_id: str, wait_s: float = 0.0) -> TransferView:
        return await self._send(FileCalls.transfer(transfer_id, "cancel", {"wait_s": wait_s}))

    async def artifact_declare(
        self,
        path: str,
        name: str | None = None,
        *,
        workspace_id: str | None = None,
        seq: int | None = None,
    ) -> ArtifactView:
        return await self._send(FileCalls.artifact_declare(path, name, workspace_id, seq))

    async def artifacts(self) -> list[ArtifactView]:
        return await self._send(_call("GET", "/v1/artifacts", _ARTIFACTS))


__all__ = ["AsyncFileClient", "FileCalls", "FileClient"]
