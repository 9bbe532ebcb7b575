"""SDK operations of runners: list them with their health, register one, remove one."""

from __future__ import annotations

from pydantic import TypeAdapter

from shellyard.contract.runners import RunnerBootstrapResult, RunnerView
from shellyard.sdk.base import Op, _Call, call

_RUNNER = TypeAdapter(RunnerView)
_RUNNERS = TypeAdapter(list[RunnerView])
#: Registering checks the runner (SSH handshake, host and user keys, its key): not instant.
ADD_TIMEOUT_S = 60.0
#: Bootstrapping also starts the daemon on the far host and waits for its socket.
BOOTSTRAP_TIMEOUT_S = 180.0
_BOOTSTRAPPED = TypeAdapter(RunnerBootstrapResult)


def _add_runner(
    runner_id: str,
    address: str,
    token: str,
    *,
    identity: str | None = None,
    known_hosts: str | None = None,
    accept_new: bool = False,
    tls_fingerprint: str | None = None,
) -> _Call[RunnerView]:
    """Register a runner daemon (admin): ``http(s)://`` direct or ``ssh://`` (with
    ``identity`` and ``known_hosts`` files on the control plane's host); ``token`` is its key."""
    # Sent as given: the server validates it (contract.runners.RunnerAddRequest) and answers a clear
    # invalid_input, the same for every door.
    fields = {
        "runner_id": runner_id,
        "address": address,
        "token": token,
        "identity": identity,
        "known_hosts": known_hosts,
        "accept_new": accept_new,
        "tls_fingerprint": tls_fingerprint,
    }
    body = {k: v for k, v in fields.items() if v is not None}
    return call("POST", "/v1/runners", _RUNNER, body=body, timeout_s=ADD_TIMEOUT_S)


def _bootstrap_runner(
    runner_id: str,
    address: str,
    *,
    identity: str,
    known_hosts: str,
    accept_new: bool = False,
    root: str | None = None,
    command: str | None = None,
    network: str | None = None,
) -> _Call[RunnerBootstrapResult]:
    """Start (idempotently) a runner daemon on the host of ``ssh://USER@HOST[:PORT]`` as
    that user, on a Unix socket, and register it (admin); files on the control plane's host."""
    fields = {
        "runner_id": runner_id,
        "address": address,
        "identity": identity,
        "known_hosts": known_hosts,
        "accept_new": accept_new,
        "root": root,
        "command": command,
        "network": network,
    }
    body = {k: v for k, v in fields.items() if v is not None}
    return call(
        "POST", "/v1/runners/bootstrap", _BOOTSTRAPPED, body=body, timeout_s=BOOTSTRAP_TIMEOUT_S
    )


def _remove_runner(runner_id: str) -> _Call[RunnerView]:
    """Forget a runner (admin); refused while executions run there."""
    return call("POST", "/v1/runners/remove", _RUNNER, body={"runner_id": runner_id})


class RunnerOps:
    """Runners: state, version, sandbox, limits and running executions of each."""

    runners = Op(lambda: call("GET", "/v1/runners", _RUNNERS))
    add_runner = Op(_add_runner)
    bootstrap_runner = Op(_bootstrap_runner)
    remove_runner = Op(_remove_runner)


__all__ = ["RunnerOps"]
