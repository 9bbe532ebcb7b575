"""Client operations of workspace files, snapshot history, retention, transfers and artifacts,
shared by ``Client`` and ``AsyncClient``. Each JSON operation is an ``Op`` (described once, sent
by either client), and so is each download (a ``Download``: chunks, sync or async). Uploads are
written per client around shared request descriptions (a sync one takes bytes, a binary file
or an iterator of chunks; an async one bytes or an async iterator). Nothing is read whole into
memory."""

from __future__ import annotations

from collections.abc import AsyncIterable, Iterable, Iterator
from typing import IO, Any

import httpx
from pydantic import TypeAdapter

from shellyard.contract.files import (
    DEFAULT_DIFF_LIMIT,
    DEFAULT_LIST_LIMIT,
    DEFAULT_OUTCOME_PAGE,
    DEFAULT_TEXT_READ,
    DEFAULT_TRANSFER_PAGE,
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
from shellyard.sdk.base import (
    SLOW_TIMEOUT_S,
    WAIT_SLACK_S,
    AsyncSender,
    Download,
    Op,
    SyncSender,
    _Call,
    aread_answer,
    broken,
    call,
    parse,
    raise_for,
    read_answer,
)
from shellyard.sdk.bounds import AnswerTooLarge, too_large_error

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
CHUNK = 1 << 20


def _where(
    workspace_id: str | None, runner_id: str | None, seq: int | None = None
) -> dict[str, Any]:
    return {"workspace_id": workspace_id, "runner_id": runner_id, "seq": seq}


def _present(values: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in values.items() if v is not None}


def _range(offset: int, length: int | None) -> dict[str, str]:
    if offset == 0 and length is None:
        return {}
    if length == 0:
        raise ValueError("length 0 reads nothing")
    end = "" if length is None else str(offset + length - 1)
    return {"Range": f"bytes={offset}-{end}"}


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


# ---------------------------------------------------------------------- JSON operations


def _list_files(
    path: str = "",
    *,
    workspace_id: str | None = None,
    runner_id: str | None = None,
    seq: int | None = None,
    recursive: bool = False,
    after: str | None = None,
    limit: int = DEFAULT_LIST_LIMIT,
) -> _Call[DirListing]:
    """W2: a folder of a committed snapshot (the head by default), paged with ``after``."""
    params = {
        "path": path,
        **_where(workspace_id, runner_id, seq),
        "recursive": recursive,
        "after": after,
        "limit": limit,
    }
    return call("GET", "/v1/files", _LISTING, params)


def _stat(
    path: str,
    *,
    workspace_id: str | None = None,
    runner_id: str | None = None,
    seq: int | None = None,
) -> _Call[PathEntry]:
    return call(
        "GET", "/v1/files/stat", _ENTRY, {"path": path, **_where(workspace_id, runner_id, seq)}
    )


def _read_text(
    path: str,
    *,
    workspace_id: str | None = None,
    runner_id: str | None = None,
    seq: int | None = None,
    offset: int = 0,
    limit: int = DEFAULT_TEXT_READ,
) -> _Call[FileText]:
    params = {
        "path": path,
        **_where(workspace_id, runner_id, seq),
        "offset": offset,
        "limit": limit,
    }
    return call("GET", "/v1/files/text", _TEXT, params)


def _history(
    *, workspace_id: str | None = None, runner_id: str | None = None
) -> _Call[HistoryView]:
    return call("GET", "/v1/files/history", _HISTORY, _where(workspace_id, runner_id))


def _diff(
    from_seq: int,
    to_seq: int | None = None,
    path: str = "",
    *,
    workspace_id: str | None = None,
    runner_id: str | None = None,
    after: str | None = None,
    limit: int = DEFAULT_DIFF_LIMIT,
) -> _Call[DiffResult]:
    params = {
        "from_seq": from_seq,
        "to_seq": to_seq,
        "path": path,
        **_where(workspace_id, runner_id),
        "after": after,
        "limit": limit,
    }
    return call("GET", "/v1/files/diff", _DIFF, params)


def _edit(action: str, body: dict[str, Any]) -> _Call[EditView]:
    return call("POST", f"/v1/files/{action}", _EDIT, body=_present(body), timeout_s=SLOW_TIMEOUT_S)


def _delete(path: str, *, recursive: bool = False, **where: Any) -> _Call[EditView]:
    """Delete a file or (``recursive``) a folder: a writer operation (W1)."""
    return _edit("delete", {"path": path, "recursive": recursive, **where})


def _move(
    source: str, destination: str, *, overwrite: bool = False, **where: Any
) -> _Call[EditView]:
    body = {"source": source, "destination": destination, "overwrite": overwrite, **where}
    return _edit("move", body)


def _restore(seq: int, path: str = "", **where: Any) -> _Call[EditView]:
    """W3: bring ``path`` (everything by default) back as it was in snapshot ``seq``."""
    return _edit("restore", {"seq": seq, "path": path, **where})


def _collect(keep_last: int | None = None, grace_s: float | None = None) -> _Call[RetentionView]:
    """Apply the retention policy now (prune, then collect garbage)."""
    body = _present({"keep_last": keep_last, "grace_s": grace_s})
    return call("POST", "/v1/retention", _RETENTION, body=body, timeout_s=SLOW_TIMEOUT_S)


def _transfer_start(
    source_workspace_id: str,
    paths: list[str],
    target_workspace_id: str,
    target_folder: str = "",
    *,
    queue: bool = False,
    **options: Any,
) -> _Call[TransferView]:
    """T2: copy ``paths`` of a source workspace's head snapshot into a target workspace."""
    body = {
        "source_workspace_id": source_workspace_id,
        "paths": paths,
        "target_workspace_id": target_workspace_id,
        "target_folder": target_folder,
        "queue": queue,
        **options,
    }
    return call("POST", "/v1/transfers", _TRANSFER, body=_present(body), timeout_s=120.0)


def _transfers(limit: int = DEFAULT_TRANSFER_PAGE) -> _Call[list[TransferView]]:
    return call("GET", "/v1/transfers", _TRANSFERS, {"limit": limit})


def _transfer(transfer_id: str) -> _Call[TransferView]:
    return call("GET", f"/v1/transfers/{transfer_id}", _TRANSFER)


def _transfer_wait(transfer_id: str, timeout_s: float = 10.0) -> _Call[TransferView]:
    """Wait up to ``timeout_s`` (at most 30) for the transfer to end; its state either way."""
    path = f"/v1/transfers/{transfer_id}/wait"
    return call(
        "GET", path, _TRANSFER, {"timeout_s": timeout_s}, timeout_s=timeout_s + WAIT_SLACK_S
    )


def _transfer_files(
    transfer_id: str, outcome: str | None = None, offset: int = 0, limit: int = DEFAULT_OUTCOME_PAGE
) -> _Call[TransferFilesView]:
    params = {"outcome": outcome, "offset": offset, "limit": limit}
    return call("GET", f"/v1/transfers/{transfer_id}/files", _TFILES, params)


def _transfer_cancel(transfer_id: str, wait_s: float = 0.0) -> _Call[TransferView]:
    path = f"/v1/transfers/{transfer_id}/cancel"
    return call("POST", path, _TRANSFER, {"wait_s": wait_s}, timeout_s=wait_s + WAIT_SLACK_S)


def _artifact_declare(
    path: str, name: str | None = None, *, workspace_id: str | None = None, seq: int | None = None
) -> _Call[ArtifactView]:
    """T5: declare a file of a committed snapshot a deliverable."""
    body = _present({"path": path, "name": name, "workspace_id": workspace_id, "seq": seq})
    return call("POST", "/v1/artifacts", _ARTIFACT, body=body)


def _artifact(artifact_id: str) -> _Call[ArtifactView]:
    return call("GET", f"/v1/artifacts/{artifact_id}", _ARTIFACT)


class FileOps:
    """Files, history, retention, transfers and artifacts (the JSON operations)."""

    workspaces = Op(lambda: call("GET", "/v1/workspaces", _WORKSPACES))
    list_files = Op(_list_files)
    stat = Op(_stat)
    read_text = Op(_read_text)
    history = Op(_history)
    diff = Op(_diff)
    delete = Op(_delete)
    move = Op(_move)
    restore = Op(_restore)
    collect = Op(_collect)
    transfer_start = Op(_transfer_start)
    transfers = Op(_transfers)
    transfer = Op(_transfer)
    transfer_wait = Op(_transfer_wait)
    transfer_files = Op(_transfer_files)
    transfer_cancel = Op(_transfer_cancel)
    artifact_declare = Op(_artifact_declare)
    artifacts = Op(lambda: call("GET", "/v1/artifacts", _ARTIFACTS))
    artifact = Op(_artifact)


# ---------------------------------------------------------------------- byte streams


def _file_download(
    path: str,
    *,
    workspace_id: str | None = None,
    runner_id: str | None = None,
    seq: int | None = None,
    offset: int = 0,
    length: int | None = None,
) -> dict[str, Any]:
    """A file of a committed snapshot (the head by default), streamed in chunks; ``offset``
    and ``length`` ask for a byte range."""
    params = _present({"path": path, **_where(workspace_id, runner_id, seq)})
    return {"url": "/v1/files/content", "params": params, "headers": _range(offset, length)}


def _archive_download(
    path: str = "",
    *,
    workspace_id: str | None = None,
    runner_id: str | None = None,
    seq: int | None = None,
) -> dict[str, Any]:
    """A folder of a committed snapshot as a tar stream."""
    params = _present({"path": path, **_where(workspace_id, runner_id, seq)})
    return {"url": "/v1/files/archive", "params": params, "headers": {}}


def _artifact_download(artifact_id: str) -> dict[str, Any]:
    """An artifact's bytes."""
    return {"url": f"/v1/artifacts/{artifact_id}/content", "params": {}, "headers": {}}


def _file_upload(
    path: str,
    workspace_id: str | None,
    runner_id: str | None,
    mode: int | None,
    queue: bool,
    wait_s: float | None,
) -> dict[str, Any]:
    params = {"path": path, **_where(workspace_id, runner_id), "mode": mode, "queue": queue}
    return {
        "method": "PUT",
        "url": "/v1/files/content",
        "params": _present({**params, "wait_s": wait_s}),
    }


def _archive_upload(
    path: str, workspace_id: str | None, runner_id: str | None, queue: bool, wait_s: float | None
) -> dict[str, Any]:
    params = {"path": path, **_where(workspace_id, runner_id), "queue": queue, "wait_s": wait_s}
    return {"method": "POST", "url": "/v1/files/archive", "params": _present(params)}


_OCTETS = {"Content-Type": "application/octet-stream"}


class FileDownloads:
    """Downloads of both clients."""

    iter_file = Download(_file_download)
    iter_archive = Download(_archive_download)
    iter_artifact = Download(_artifact_download)


class FileStreams(SyncSender):
    """Uploads for the synchronous ``Client`` (from bytes, a binary file or chunks)."""

    def _upload(
        self, request: dict[str, Any], data: bytes | IO[bytes] | Iterable[bytes]
    ) -> EditView:
        built = self._http.build_request(
            **request, content=_chunks_of(data), headers=_OCTETS, timeout=SLOW_TIMEOUT_S
        )
        try:
            response = self._http.send(built, stream=True)
            try:  # its JSON answer has the bound of every JSON answer (sdk/bounds.py)
                content = read_answer(response, self.max_json_bytes, f"POST {built.url.path}")
            finally:
                response.close()
        except AnswerTooLarge as exc:
            raise too_large_error(exc) from exc
        except httpx.TransportError as exc:
            raise broken("upload", exc) from exc
        raise_for(response.status_code, content)
        return parse(_EDIT, content)

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
        request = _file_upload(path, workspace_id, runner_id, mode, queue, wait_s)
        return self._upload(request, data)

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
        return self._upload(_archive_upload(path, workspace_id, runner_id, queue, wait_s), data)


class AsyncFileStreams(AsyncSender):
    """Uploads for ``AsyncClient`` (from bytes or an async iterator of chunks)."""

    async def _upload(
        self, request: dict[str, Any], data: bytes | AsyncIterable[bytes]
    ) -> EditView:
        built = self._http.build_request(
            **request, content=data, headers=_OCTETS, timeout=SLOW_TIMEOUT_S
        )
        try:
            response = await self._http.send(built, stream=True)
            try:
                what = f"POST {built.url.path}"
                content = await aread_answer(response, self.max_json_bytes, what)
            finally:
                await response.aclose()
        except AnswerTooLarge as exc:
            raise too_large_error(exc) from exc
        except httpx.TransportError as exc:
            raise broken("upload", exc) from exc
        raise_for(response.status_code, content)
        return parse(_EDIT, content)

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
        request = _file_upload(path, workspace_id, runner_id, mode, queue, wait_s)
        return await self._upload(request, data)

    async def upload_archive(
        self,
        data: bytes | AsyncIterable[bytes],
        path: str = "",
        *,
        workspace_id: str | None = None,
        runner_id: str | None = None,
        queue: bool = False,
        wait_s: float | None = None,
    ) -> EditView:
        request = _archive_upload(path, workspace_id, runner_id, queue, wait_s)
        return await self._upload(request, data)


__all__ = ["AsyncFileStreams", "FileDownloads", "FileOps", "FileStreams"]
