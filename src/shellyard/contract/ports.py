"""Ports for the host (R5): a loopback port of the runner's host forwarded to a port
inside a workspace's own network, for a person's browser or a tool on that host. What
``workspace_port`` (MCP), ``/v1/ports`` (REST), the SDK and ``shellyard port`` take and return
(docs/contract.md, "Ports")."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

PortAction = Literal["open", "list", "close"]


class PortRequest(BaseModel):
    """One call of ``workspace_port``: open, list or close a forwarded port."""

    model_config = ConfigDict(extra="forbid")

    action: PortAction = Field(
        default="open",
        description="open a forward to PORT, list the workspace's forwards, or close one",
    )
    port: int | None = Field(
        default=None,
        ge=1,
        le=65535,
        description="the port a server listens on inside the workspace (open, close)",
    )
    host_port: int = Field(
        default=0,
        ge=0,
        le=65535,
        description="open: the loopback port on the runner's host (0: any free one)",
    )
    workspace_id: str | None = Field(
        default=None, description="your workspace (default: yours on runner_id)"
    )
    runner_id: str | None = Field(
        default=None, description="your workspace on this runner (default local)"
    )

    @model_validator(mode="after")
    def _port_given(self) -> PortRequest:
        if self.action != "list" and self.port is None:
            raise ValueError(f"action {self.action!r} needs port: the port inside the workspace")
        return self


class PortOpenRequest(BaseModel):
    """``POST /v1/ports``: forward a loopback port of the runner's host to ``port``."""

    model_config = ConfigDict(extra="forbid")

    port: int = Field(ge=1, le=65535, description="the port inside the workspace")
    host_port: int = Field(
        default=0, ge=0, le=65535, description="the host's loopback port (0: any free one)"
    )
    workspace_id: str | None = Field(default=None, description="your workspace (default: yours)")
    runner_id: str | None = Field(default=None, description="the runner (default local)")


class PortCloseRequest(BaseModel):
    """``POST /v1/ports/close``: stop forwarding to ``port``."""

    model_config = ConfigDict(extra="forbid")

    port: int = Field(ge=1, le=65535, description="the port inside the workspace")
    workspace_id: str | None = Field(default=None, description="your workspace (default: yours)")
    runner_id: str | None = Field(default=None, description="the runner (default local)")


class PortView(BaseModel):
    """A forwarded port: ``host:host_port`` on the runner's host reaches ``port`` inside the
    workspace's network. It lives until closed or until the workspace's last execution ends."""

    workspace_id: str
    port: int
    #: Always a loopback address, the workspace's own in 127.128.0.0/9 (never 127.0.0.1, where
    #: the web page is: docs/web.md): the forward is never reachable from other machines.
    host: str = "127.0.0.1"
    host_port: int
    url: str
    opened_at: float
    #: Filled in by the control plane (a runner does not know its own name).
    runner_id: str | None = None


class PortList(BaseModel):
    ports: list[PortView]


# ------------------------ the GETs' query models: ports (R5)
# (``Annotated[Model, Query()]`` in api/; docs/architecture.md "The doors")


class PortListQuery(BaseModel):
    workspace_id: str | None = Field(None, description="your workspace (default: yours)")
    runner_id: str | None = Field(None, description="the runner (default local)")


__all__ = [
    "PortAction",
    "PortCloseRequest",
    "PortList",
    "PortListQuery",
    "PortOpenRequest",
    "PortRequest",
    "PortView",
]
