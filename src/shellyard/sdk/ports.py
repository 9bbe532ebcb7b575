"""SDK operations of ports for the host (R5): forward a loopback port of the runner's
host into your workspace's network, list the forwards, close one."""

from __future__ import annotations

from pydantic import TypeAdapter

from shellyard.contract.ports import PortView
from shellyard.sdk.base import Op, _Call, call

_PORT = TypeAdapter(PortView)
_PORTS = TypeAdapter(list[PortView])


def _where(workspace_id: str | None, runner_id: str | None) -> dict[str, str]:
    return {
        k: v for k, v in (("workspace_id", workspace_id), ("runner_id", runner_id)) if v is not None
    }


def _open_port(
    port: int,
    host_port: int = 0,
    *,
    workspace_id: str | None = None,
    runner_id: str | None = None,
) -> _Call[PortView]:
    """Forward ``host_port`` on the workspace's own loopback address (127.X.Y.Z) of the
    runner's host (0: a free one) to ``port`` in the workspace's network; the answer's ``url``
    is where a browser on that host opens it."""
    body = {"port": port, "host_port": host_port, **_where(workspace_id, runner_id)}
    return call("POST", "/v1/ports", _PORT, body=body)


def _ports(workspace_id: str | None = None, runner_id: str | None = None) -> _Call[list[PortView]]:
    """The workspace's open forwards."""
    return call("GET", "/v1/ports", _PORTS, params=_where(workspace_id, runner_id))


def _close_port(
    port: int, *, workspace_id: str | None = None, runner_id: str | None = None
) -> _Call[PortView]:
    """Stop forwarding to ``port``."""
    body = {"port": port, **_where(workspace_id, runner_id)}
    return call("POST", "/v1/ports/close", _PORT, body=body)


class PortOps:
    """Ports of the runner's host forwarded into a workspace's network."""

    open_port = Op(_open_port)
    ports = Op(_ports)
    close_port = Op(_close_port)


__all__ = ["PortOps"]
