"""SSH-tunnel runners, runner health and outages (R1, R3, R4, E9) against a real OpenSSH sshd
on loopback (its own host and user keys and config) with a real runner daemon behind it on
a Unix socket; and ``direct`` runners over TLS with a pinned certificate."""

from __future__ import annotations

import asyncio
import shutil
import subprocess as sp
import time
from pathlib import Path

import pytest
from netns_fixture import make_netns, netns_or_skip
from runner_daemon_fixture import RunnerDaemon, start_daemon
from sshd_fixture import SshServer, fingerprint, keygen, sshd_or_skip, start_sshd

from conftest import open_yard
from shellyard.contract.executions import (
    ExecutionCancelQuery,
    ExecutionList,
    ExecutionLogsQuery,
    ExecutionState,
    RunShellRequest,
)
from shellyard.control.plane import ControlPlane
from shellyard.errors import Conflict, InvalidInput, RunnerUnavailable, Unauthorized
from shellyard.runner.protocol import RunnerExecState, SandboxPolicy, StartRequest
from shellyard.runner.transport.ssh import SshTarget, check_host_key, probe, ssh_runner

pytestmark = pytest.mark.timeout(240)

POLICY = SandboxPolicy(network="off", cancel_grace_s=1.0, workspace_quota_bytes=3 << 30)


# --- host keys and user keys ---


async def test_unknown_host_key_refused_with_its_fingerprint(sshd: SshServer, home: Path) -> None:
    """R4: an unknown host key is refused and named; --accept-new records it once."""
    target = SshTarget.parse(sshd.address("/nowhere.sock"))
    known = home / "empty_known_hosts"
    expected = fingerprint(sshd.host_key.with_suffix(".pub"))
    with pytest.raises(Unauthorized, match="unknown SSH host key") as refused:
        await check_host_key(target, known, accept_new=False)
    assert expected in refused.value.message
    assert not known.exists()  # nothing recorded without the operator's word

    assert await check_host_key(target, known, accept_new=True) == expected
    assert await check_host_key(target, known, accept_new=False) == expected  # now known
    assert len(known.read_text().splitlines()) == 1
    await probe(target, sshd.identity, known)  # and the connection verifies against it


async def test_changed_host_key_and_wrong_user_key_refused(sshd: SshServer, home: Path) -> None:
    """R4: a host key other than the recorded one, and a user key the server does not
    know, are both refused (never silently replaced or retried as another key)."""
    target = SshTarget.parse(sshd.address("/nowhere.sock"))
    other = keygen(home / "other_host").with_suffix(".pub").read_text().split()
    forged = home / "forged_known_hosts"
    forged.write_text(f"[127.0.0.1]:{sshd.port} {other[0]} {other[1]}\n")
    with pytest.raises(Unauthorized, match="not the one in the known-hosts file"):
        await probe(target, sshd.identity, forged)

    stranger = keygen(home / "stranger")
    with pytest.raises(Unauthorized, match="refused user"):
        await probe(target, stranger, sshd.known_hosts)


def test_bad_ssh_addresses_say_how_to_write_them() -> None:
    for address in (
        "ssh://host/sock",  # no user
        "ssh://u@host",  # neither a socket nor ?port=
        "ssh://u@host/s.sock?port=1",  # both
        "ssh://u@host?port=abc",
        "http://u@host/s.sock",
    ):
        with pytest.raises(InvalidInput, match="ssh://USER@HOST"):
            SshTarget.parse(address)
    t = SshTarget.parse("ssh://me@h.example:2222/run/r.sock")
    assert (t.user, t.host, t.port, t.socket, t.remote_port) == (
        "me",
        "h.example",
        2222,
        "/run/r.sock",
        None,
    )
    assert SshTarget.parse("ssh://me@h?port=8765").remote_port == 8765


async def test_loopback_port_on_the_far_end(sshd: SshServer, home: Path) -> None:
    """The far end may listen on a loopback port instead of a socket (``?port=N``)."""
    daemon = await start_daemon(home / "r", POLICY)
    try:
        address = sshd.address(f"?port={daemon.port}")
        async with ssh_runner(address, daemon.token, sshd.identity, sshd.known_hosts) as runner:
            assert (await runner.info()).network == "off"
    finally:
        await daemon.stop()


# --- the control plane over an ssh runner ---


async def registered(
    home: Path, sshd: SshServer, **daemon_options: object
) -> tuple[ControlPlane, RunnerDaemon]:
    plane, _, _ = await open_yard(home, "local", POLICY)
    daemon = await start_daemon(home / "far", POLICY, ssh=sshd, **daemon_options)  # type: ignore[arg-type]
    await plane.runners.add_ssh(
        "far", daemon.address, daemon.token, sshd.identity, sshd.known_hosts
    )
    return plane, daemon


async def test_registration_checks_the_key_and_health_is_reported(
    sshd: SshServer, home: Path
) -> None:
    """``runner add`` asks the runner before recording it (a wrong key is refused); the
    runner's view gives state, version, sandbox, limits, running executions; ``remove`` is
    refused while an execution runs there."""
    plane, daemon = await registered(home, sshd)
    try:
        with pytest.raises(Unauthorized, match="bad signature"):
            await plane.runners.add_ssh(
                "far2", daemon.address, "wrong-key", sshd.identity, sshd.known_hosts
            )
        assert "far2" not in plane.runners.ids()

        started = await plane.executions.run_shell(
            RunShellRequest(command="sleep 30", runner_id="far", background=True)
        )
        await plane.runners.heartbeat()
        view = await plane.runners.view("far")
        assert (view.kind, view.state, view.sandbox, view.network) == (
            "ssh",
            "up",
            "bubblewrap",
            "off",
        )
        assert view.version and view.last_seen and view.running_executions == 1
        assert view.limits is not None and view.limits.workspace_quota_bytes == 3 << 30
        assert view.fingerprint == fingerprint(sshd.host_key.with_suffix(".pub"))
        with pytest.raises(Conflict, match="1 execution"):
            await plane.runners.remove("far")

        await plane.executions.cancel(started.execution_id, ExecutionCancelQuery(wait_s=30), None)
        await plane.runners.remove("far")
        assert "far" not in plane.runners.ids()
        assert [v.runner_id for v in await plane.runners.views()] == ["local"]
    finally:
        await plane.aclose()
        await daemon.stop()


async def test_dropped_ssh_connection_reconnects(sshd: SshServer, home: Path) -> None:
    """A dropped connection is made again on the next request; what ran meanwhile kept
    running on the far host."""
    daemon = await start_daemon(home / "r", POLICY, ssh=sshd)
    try:
        runner = daemon.runner
        await runner.ensure_workspace("ws")
        await runner.start(
            StartRequest(execution_id="e1", workspace_id="ws", command="sleep 1; echo kept")
        )
        transport = runner._client._transport  # the SshTransport of this runner
        tunnel = transport.tunnel  # type: ignore[attr-defined]
        assert tunnel.connects == 1
        tunnel.disconnect()
        record = await runner.wait("e1", 30)
        assert record.state == RunnerExecState.finished
        assert (await runner.read_log("e1", "stdout", 0, 100)).data == b"kept\n"
        assert tunnel.connects == 2
    finally:
        await daemon.stop()


# --- R3 end to end: executions outlive an outage and are reconciled ---


async def wait_state(
    plane: ControlPlane, execution_id: str, state: ExecutionState, timeout_s: float = 60
) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        view = await plane.executions.status(execution_id)
        if view.state == state:
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"{execution_id} not {state} in {timeout_s} s: {view}")


@pytest.mark.parametrize("cut", ["kill the daemon", "drop the ssh connection"])
async def test_outage_then_reconciled(sshd: SshServer, home: Path, cut: str) -> None:
    """R3, E9: cut an ssh runner off while an execution runs there: it keeps running,
    status queries fail, after 5 failures it is unknown (nothing resubmitted); when the
    runner is back the record is reconciled, keeps ``was_unknown``, logs and snapshot
    intact."""
    plane, daemon = await registered(home, sshd, subprocess=True)
    try:
        started = await plane.executions.run_shell(
            RunShellRequest(
                command="sleep 3; echo survived > proof.txt; echo done",
                runner_id="far",
                background=True,
            )
        )
        if cut == "kill the daemon":
            daemon.kill()
        else:
            sshd.stop()
        await wait_state(plane, started.execution_id, ExecutionState.unknown)
        await plane.runners.heartbeat()
        view = await plane.runners.view("far")
        assert view.state == "unreachable" and view.unreachable_since is not None
        await asyncio.sleep(3.5)  # it finishes on the far host while nobody can ask
        if cut == "kill the daemon":
            await daemon.restart()
        else:
            await sshd.start()
        await wait_state(plane, started.execution_id, ExecutionState.completed)
        final = await plane.executions.status(started.execution_id)
        assert final.was_unknown and final.exit_code == 0
        assert (
            await plane.executions.logs(started.execution_id, ExecutionLogsQuery())
        ).data == "done\n"
        far = plane.runners.get("far")
        assert final.snapshot_seq is not None
        chunk = await far.read_file(final.workspace_id, final.snapshot_seq, "proof.txt", 0, 100)
        assert chunk.data == b"survived\n"
        # Ran exactly once: nothing was resubmitted while it was unknown.
        assert len([e for e in await plane.executions.list(ExecutionList(limit=100), None)]) == 1
        await plane.runners.heartbeat()
        assert (await plane.runners.view("far")).state == "up"
    finally:
        await plane.aclose()
        await daemon.stop()


# --- direct runners: TLS off loopback, certificate pinned ---


def self_signed(folder: Path, name: str) -> tuple[Path, Path]:
    cert, key = folder / f"{name}.pem", folder / f"{name}.key"
    sp.run(
        ["openssl", "req", "-x509", "-newkey", "ed25519", "-nodes", "-days", "2",
         "-subj", f"/CN={name}", "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True,
    )  # fmt: skip
    return cert, key


async def test_direct_runner_off_loopback_needs_tls_and_pins_its_certificate(home: Path) -> None:
    """R4: plain HTTP is refused off loopback; https:// pins the certificate the daemon
    presents at ``runner add`` (or the one the operator names) and trusts no other."""
    if shutil.which("openssl") is None:
        pytest.skip("the openssl command is not installed on this machine")
    plane, _, _ = await open_yard(home, "local", POLICY)
    try:
        with pytest.raises(InvalidInput, match="plain HTTP off loopback"):
            await plane.runners.add_direct("far", "http://192.0.2.7:8765", "k")
        cert, key = self_signed(home, "runner")
        other_cert, other_key = self_signed(home, "impostor")
        daemon = await start_daemon(home / "far", POLICY, subprocess=True, tls=(cert, key))
        try:
            assert daemon.url.startswith("https://")
            with pytest.raises(Unauthorized, match="not the expected"):
                from shellyard.contract.runners import RunnerAddRequest

                await plane.runners.add(
                    RunnerAddRequest(
                        runner_id="far",
                        address=daemon.url,
                        token=daemon.token,
                        tls_fingerprint="SHA256:" + "0" * 64,
                    )
                )
            view = await plane.runners.add(
                RunnerAddRequest(runner_id="far", address=daemon.url, token=daemon.token)
            )
            assert view.fingerprint and view.fingerprint.startswith("SHA256:")
            ran = await plane.executions.run_shell(
                RunShellRequest(command="echo over-tls", runner_id="far")
            )
            assert ran.stdout == "over-tls\n"
            # Another certificate on the same address (a new daemon, or someone in the
            # middle): the pinned runner refuses to talk to it.
            daemon.kill()
            daemon.tls = (other_cert, other_key)
            await daemon.restart()
            with pytest.raises(RunnerUnavailable, match="CERTIFICATE_VERIFY_FAILED"):
                await plane.runners.get("far").info()
        finally:
            await daemon.stop()
    finally:
        await plane.aclose()


# --- R3 with real separation: the runner host in a network namespace, its route cut ---


@pytest.mark.parametrize("kind", ["direct", "ssh"])
async def test_route_cut_then_reconciled(home: Path, kind: str) -> None:
    """R3, E9: the runner host is a network namespace of its own (veth, 10.200.x.0/30);
    its route is taken down while an execution runs there, then brought back: unknown
    after 5 failed queries, nothing resubmitted, reconciled with ``was_unknown``."""
    netns_or_skip()
    if kind == "ssh":
        sshd_or_skip()
    if shutil.which("openssl") is None:
        pytest.skip("the openssl command is not installed on this machine")
    host = make_netns()
    plane, _, _ = await open_yard(home, "local", POLICY)
    sshd: SshServer | None = None
    daemon: RunnerDaemon | None = None
    try:
        prefix = tuple(host.prefix)
        if kind == "ssh":
            sshd = await start_sshd(home / "sshd", host.ns_ip, prefix)
            daemon = await start_daemon(
                home / "far", POLICY, subprocess=True, ssh=sshd, prefix=prefix
            )
            await plane.runners.add_ssh(
                "far", daemon.address, daemon.token, sshd.identity, sshd.known_hosts
            )
        else:
            tls = self_signed(home, "runner")
            daemon = await start_daemon(
                home / "far", POLICY, subprocess=True, tls=tls, prefix=prefix, host=host.ns_ip
            )
            from shellyard.contract.runners import RunnerAddRequest

            await plane.runners.add(
                RunnerAddRequest(runner_id="far", address=daemon.url, token=daemon.token)
            )
        started = await plane.executions.run_shell(
            RunShellRequest(
                command="sleep 4; echo survived > proof.txt; echo done",
                runner_id="far",
                background=True,
            )
        )
        host.cut()
        await wait_state(plane, started.execution_id, ExecutionState.unknown, 120)
        await asyncio.sleep(4)  # it finishes over there while the route is down
        host.mend()
        await wait_state(plane, started.execution_id, ExecutionState.completed, 120)
        final = await plane.executions.status(started.execution_id)
        assert final.was_unknown and final.exit_code == 0
        assert (
            await plane.executions.logs(started.execution_id, ExecutionLogsQuery())
        ).data == "done\n"
        assert final.snapshot_seq is not None
        far = plane.runners.get("far")
        chunk = await far.read_file(final.workspace_id, final.snapshot_seq, "proof.txt", 0, 100)
        assert chunk.data == b"survived\n"
        assert (
            len(await plane.executions.list(ExecutionList(limit=100), None)) == 1
        )  # nothing resubmitted
    finally:
        await plane.aclose()
        if daemon is not None:
            await daemon.stop()
        if sshd is not None:
            sshd.stop()
        host.delete()


# --- the doors: CLI verbs (through REST and the SDK) and the MCP runner view ---


async def test_runner_verbs_through_cli_and_mcp(
    served_home: Path, sshd: SshServer, home: Path
) -> None:
    """``runner add ssh://…`` refuses an unknown host key with its fingerprint, takes it with
    --accept-new; ``runner list`` / ``show`` and MCP's ``runner_list`` give the health view;
    ``runner remove`` forgets it."""
    import json

    from conftest import sy
    from shellyard.cli.manual import EXIT_REFUSED
    from shellyard.home import read_info
    from shellyard.mcp.server import build_server
    from shellyard.sdk.client import AsyncClient

    daemon = await start_daemon(home / "edge", POLICY, ssh=sshd)
    try:
        known = home / "operator_known_hosts"
        add = ["runner", "add", "edge", daemon.address, "--token", daemon.token]
        add += ["--identity", str(sshd.identity), "--known-hosts", str(known)]
        refused = await asyncio.to_thread(sy, served_home, *add)
        assert refused.returncode == EXIT_REFUSED, refused.stderr
        assert fingerprint(sshd.host_key.with_suffix(".pub")) in refused.stderr
        done = await asyncio.to_thread(sy, served_home, *add, "--accept-new")
        assert done.returncode == 0, done.stderr
        assert "registered edge" in done.stdout

        listed = await asyncio.to_thread(sy, served_home, "runner", "list", "--json")
        views = {v["runner_id"]: v for v in json.loads(listed.stdout)}
        assert views["edge"]["kind"] == "ssh" and views["edge"]["state"] == "up"
        shown = await asyncio.to_thread(sy, served_home, "runner", "show", "edge")
        assert "bubblewrap" in shown.stdout and "workspace_quota_bytes" in shown.stdout

        info = read_info(served_home)
        assert info is not None
        client = AsyncClient(info.url, info.token)
        try:
            result = await build_server(client).call_tool("runner_list", {})
            assert not getattr(result, "is_error", False)
            text = json.dumps(getattr(result, "structured_content", None) or str(result))
            assert '"edge"' in text and '"up"' in text
        finally:
            await client.aclose()

        removed = await asyncio.to_thread(sy, served_home, "runner", "remove", "edge")
        assert removed.returncode == 0, removed.stderr
        listed = await asyncio.to_thread(sy, served_home, "runner", "list", "--json")
        assert [v["runner_id"] for v in json.loads(listed.stdout)] == ["local"]
    finally:
        await daemon.stop()
