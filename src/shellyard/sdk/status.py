"""An HTTP answer's status turned into the ``ShellyardError`` the server described, without
httpx or pydantic: the SDK's senders and the CLI's fast ``run`` path (``cli.entry``) share it."""

from __future__ import annotations

from shellyard.errors import RunnerUnavailable, ShellyardError, decode_error


def raise_for(status: int, body: bytes | str) -> None:
    """Raise the ``ShellyardError`` the server described, or a plain one for a foreign answer."""
    if status < 400:
        return
    error = decode_error(body)
    if error is None:
        text = body[:200]
        if status >= 500:
            raise RunnerUnavailable(f"the control plane answered {status}: {text!r}") from None
        raise ShellyardError(f"HTTP {status}: {text!r}") from None
    raise error


def unreachable(exc: Exception) -> RunnerUnavailable:
    return RunnerUnavailable(
        f"cannot reach the control plane ({exc}); is `shellyard serve` running? retry"
    )
