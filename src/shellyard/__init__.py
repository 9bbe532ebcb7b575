"""shellyard: a durable, sandboxed shell for AI agents.

``from shellyard import Client, AsyncClient`` gives the Python SDK. The clients are imported
lazily (module ``__getattr__``) so that ``import shellyard`` stays light: the runner daemon and
the sandbox helpers never pull in httpx.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

__all__ = ["AsyncClient", "Client", "__version__"]

if TYPE_CHECKING:
    from shellyard.sdk.client import AsyncClient, Client


def __getattr__(name: str) -> Any:
    if name in ("Client", "AsyncClient"):
        from shellyard.sdk import client

        return getattr(client, name)
    raise AttributeError(f"module 'shellyard' has no attribute {name!r}")
