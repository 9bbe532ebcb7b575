"""The query parameters of the REST GETs (and the few POSTs that take theirs in the query), one
model per operation: ``api/forward.py`` reads the query string into it
(``Annotated[Model, Query()]``) and hands its fields to the service by name, so each field is
named as the service method's parameter and bounded as the route documents it."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from shellyard.contract.executions import DEFAULT_LOG_LIMIT, DEFAULT_MAX_OUTPUT, MAX_CANCEL_WAIT_S
from shellyard.contract.files import (
    DEFAULT_DIFF_LIMIT,
    DEFAULT_LIST_LIMIT,
    DEFAULT_OUTCOME_PAGE,
    DEFAULT_TEXT_READ,
    DEFAULT_TRANSFER_PAGE,
    MAX_LIST_LIMIT,
    MAX_TEXT_READ,
    MAX_TRANSFER_PAGE,
)

_WORKSPACE = Field(None, description="a workspace id (default: your own)")
_RUNNER = Field(None, description="your workspace on this runner (default local)")
_SEQ = Field(None, ge=0, description="a snapshot number (default: the head)")

# ---------------------------------------------------------------- executions (E1-E13)


class ExecutionList(BaseModel):
    limit: int = Field(100, ge=1, le=1000)


class ExecutionWait(BaseModel):
    timeout_s: float = Field(10, ge=0, le=30)


class ExecutionResult(BaseModel):
    max_output_length: int = Field(DEFAULT_MAX_OUTPUT, ge=0, le=10_000_000)


class ExecutionLogs(BaseModel):
    stream: str = "stdout"
    offset: int = Field(0, ge=0)
    limit: int = Field(DEFAULT_LOG_LIMIT, ge=0)
    tail: int | None = Field(None, ge=0)
    tail_lines: int | None = Field(None, ge=0)
    #: base64: the exact bytes (the SDK's follow_logs, the CLI; docs/cli.md)
    encoding: Literal["utf-8", "base64"] = "utf-8"


class ExecutionCancel(BaseModel):
    wait_s: float = Field(0, ge=0, le=MAX_CANCEL_WAIT_S)


# ---------------------------------------------------------------- files and history (W2, W5)


class FileList(BaseModel):
    path: str = ""
    workspace_id: str | None = _WORKSPACE
    runner_id: str | None = _RUNNER
    seq: int | None = _SEQ
    recursive: bool = False
    after: str | None = None
    limit: int = Field(DEFAULT_LIST_LIMIT, ge=1, le=MAX_LIST_LIMIT)


class FileStat(BaseModel):
    path: str
    workspace_id: str | None = _WORKSPACE
    runner_id: str | None = _RUNNER
    seq: int | None = _SEQ


class FileReadText(FileStat):
    offset: int = Field(0, ge=0)
    limit: int = Field(DEFAULT_TEXT_READ, ge=1, le=MAX_TEXT_READ)


class FileHistory(BaseModel):
    workspace_id: str | None = _WORKSPACE
    runner_id: str | None = _RUNNER


class FileDiff(BaseModel):
    from_seq: int = Field(ge=0)
    to_seq: int | None = _SEQ
    path: str = ""
    workspace_id: str | None = _WORKSPACE
    runner_id: str | None = _RUNNER
    after: str | None = None
    limit: int = Field(DEFAULT_DIFF_LIMIT, ge=1, le=MAX_LIST_LIMIT)


# ---------------------------------------------------------------- transfers (T1-T4)


class TransferList(BaseModel):
    limit: int = Field(DEFAULT_TRANSFER_PAGE, ge=1, le=MAX_TRANSFER_PAGE)


class TransferWait(BaseModel):
    timeout_s: float = Field(10, ge=0, le=30)


class TransferFiles(BaseModel):
    outcome: Literal["pending", "copied", "unchanged", "skipped", "failed"] | None = None
    offset: int = Field(0, ge=0)
    limit: int = Field(DEFAULT_OUTCOME_PAGE, ge=1, le=MAX_LIST_LIMIT)


class TransferCancel(BaseModel):
    wait_s: float = Field(0, ge=0, le=60)


# ---------------------------------------------------------------- environments (V1-V8), ports (R5)


class EnvironmentList(BaseModel):
    runner_id: str | None = None


class EnvironmentRevisions(BaseModel):
    revision: int | None = Field(None, ge=0)


class PortList(BaseModel):
    workspace_id: str | None = Field(None, description="your workspace (default: yours)")
    runner_id: str | None = Field(None, description="the runner (default local)")
