"""What the runner operations take and return: the one ``RunnerView`` of REST, the SDK, the
CLI and MCP, and the request that registers a runner."""

from __future__ import annotations

from pydantic import BaseModel, Field


class DirectRunnerRequest(BaseModel):
    runner_id: str = Field(
        pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$",
        description="a name of your choice: letters, digits, '_', '.', '-'",
    )
    address: str = Field(pattern=r"^https?://[!-~]+$", description="the daemon's http(s) URL")
    token: str = Field(pattern=r"^[!-~]+$", description="the daemon's token (its ROOT/token)")


class RunnerView(BaseModel):
    """A runner the control plane sends executions to (``local`` or a registered daemon)."""

    runner_id: str
    kind: str
    address: str | None
