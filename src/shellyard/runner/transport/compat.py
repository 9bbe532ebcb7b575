"""What a runner daemon of an older protocol version cannot honour (runner/protocol.py
``PROTOCOL_VERSION``). A daemon reads requests with its own models, which ignore fields they
do not know: a start with ``cwd`` sent to a version-1 daemon would run in the workspace's
root, one with ``env`` without the variables. The control plane refuses such a start with the
reason instead of running it differently (docs/runners.md "Runner versions")."""

from __future__ import annotations

from shellyard.errors import RunnerOutdated
from shellyard.runner.protocol import PROTOCOL_VERSION, StartRequest

#: The start fields added after version 1, each with the protocol version that honours it.
START_FIELDS_SINCE: dict[str, int] = {"env": 2, "cwd": 2, "args": 2}


def unhonoured(request: StartRequest, protocol: int | None) -> list[str]:
    """The fields ``request`` sets that a runner of ``protocol`` (None: not known yet, taken
    as 1) would drop."""
    known = protocol or 1
    return [
        name
        for name, since in START_FIELDS_SINCE.items()
        if since > known and getattr(request, name)
    ]


def check_start(request: StartRequest, protocol: int | None, label: str) -> None:
    """Refuse a start whose options the runner at ``label`` would drop."""
    dropped = unhonoured(request, protocol)
    if dropped:
        names = ", ".join(dropped)
        raise RunnerOutdated(
            f"the runner at {label} speaks runner protocol {protocol or 1}, which does not "
            f"know {names} (protocol {PROTOCOL_VERSION} does): it would run the command "
            f"without them, so nothing ran. Upgrade shellyard on that runner (and restart its "
            f"daemon), or run without {names}",
            runner_protocol=protocol or 1,
            needed_protocol=PROTOCOL_VERSION,
            options=dropped,
        )
