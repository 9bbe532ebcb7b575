"""One installed package of a managed environment as its manager records it (V2): a runner's
answer that reaches the caller unchanged. The runner protocol re-exports it."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel


class PackageRecord(BaseModel):
    """One installed package as its manager knows it (V2)."""

    #: ``base`` for what ``create`` put in (the interpreter, pip/uv, R itself).
    manager: Literal["base", "conda", "pip", "cran", "bioconductor"]
    name: str
    version: str
    #: Where it came from: channel URL, index URL or folder, repository URL, or the runner
    #: path of an interpreter it was made from.
    source: str | None = None
    build: str | None = None
    sha256: str | None = None
