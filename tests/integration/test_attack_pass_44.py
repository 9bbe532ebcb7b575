"""Attack pass of session 44 (second engineer): the agent-privileges findings re-proved where
their tests could not fail for the reason they name, and new attempts on the doors around the
sandbox (R2, V1–V4, N4; docs/security.md "Attack pass (session 44)").

As the holder of one session's agent token (a second session made through the admin API; the
in-process ControlPlane's agent-scoped calls, the code REST, MCP and the SDK reach), on real
bubblewrap sandboxes, uv and a real ``shellyard serve`` on the local runner (root)."""

from __future__ import annotations

import hashlib
import http.server
import json
import os
import shutil
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import test_base_environment
from env_fixtures import backend_sdist, make_wheel
from test_attack_pass_41 import _agent, _run
from test_env_tool_rights import _create, _import, _install, _put
from test_home_files import probe
from test_webhook_policy import _second_session_agent

from conftest import Yard, stop_server
from shellyard.contract.environments import EnvironmentChangeBody, EnvironmentCreateRequest
from shellyard.contract.files import TransferWait
from shellyard.contract.tokens import TokenCreateRequest
from shellyard.control.tokens import UNAUTHENTICATED_ADMIN
from shellyard.errors import ShellyardError
from shellyard.home import read_info
from shellyard.runner.transport.signing import (
    H_DIGEST,
    H_NONCE,
    H_TIMESTAMP,
    SCHEME,
    body_digest,
    sign,
    string_to_sign,
)
from shellyard.runner.transport.wire import OPERATIONS
from shellyard.sdk.client import Client

pytestmark = [pytest.mark.timeout(300), pytest.mark.runner_kinds("local")]

#: The session's one prepared python-base, and the setting that makes it the default.
python_base = test_base_environment.python_base
use_base = test_base_environment.use_base

NOBODY = 65534


@pytest.fixture
def visible_canary() -> Iterator[Path]:
    """A root-only (0600) file in a world-searchable folder under /usr, which every package
    tool's host view shows (``bwrap.SYSTEM_ROOTS``): only the tool's uid keeps it from a build.
    The canary of test_env_tool_rights lives under /tmp, which the view hides whatever the uid."""
    folder = Path("/usr/local/share") / f"sy-attack44-{uuid.uuid4().hex[:8]}"
    folder.mkdir(mode=0o755, parents=True)
    canary = folder / "canary"
    canary.write_text("visible-root-only-canary-44")
    canary.chmod(0o600)
    try:
        yield canary
    finally:
        shutil.rmtree(folder, ignore_errors=True)


async def test_a_build_cannot_read_a_root_only_file_its_host_view_shows(
    yard: Yard, visible_canary: Path
) -> None:
    """R2, V2 (docs/environments.md "Package tools run as the sandbox uid"): a second
    session's sdist backend reads a 0600 root file that its sandbox does show; it gets EACCES,
    and the shadow file is empty (covered). Run as uid 0 (``tool_ids`` returning None) it read
    the canary."""
    agent = await _agent(yard)
    environment_id = await _create(yard, agent, "canary")
    body = f"""
    RESULT = {{"uid": os.getuid(), "seen": os.path.exists({str(visible_canary)!r})}}
    try:
        with open({str(visible_canary)!r}) as f:
            RESULT["read"] = f.read()
    except OSError as exc:
        RESULT["read"] = "error: " + type(exc).__name__
    """
    sdist = backend_sdist("sy-canary", "1.0", body)
    await _put(yard, agent, {"dist/sy_canary-1.0.tar.gz": sdist}, {})
    change = await _install(
        yard, agent, environment_id, manager="pip", specs=["sy-canary"], index_url="none",
        find_links=["/workspace/dist"],
    )  # fmt: skip
    assert change.state == "succeeded", change
    seen = await _import(yard, agent, environment_id, "sy_canary")
    assert seen["seen"], seen  # the view shows it: the uid alone must hold
    assert seen["read"] == "error: PermissionError", seen
    assert seen["uid"] != 0, seen


class _Recorder(http.server.BaseHTTPRequestHandler):
    """Counts what reaches it; answers ``redirect`` (a Location) or 204."""

    hits: list[str]
    redirect: str | None

    def _answer(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        self.rfile.read(length)
        self.hits.append(f"{self.command} {self.path}")
        if self.redirect is not None:
            self.send_response(307)
            self.send_header("Location", self.redirect)
        else:
            self.send_response(204)
        self.send_header("Content-Length", "0")
        self.end_headers()

    do_GET = do_POST = _answer

    def log_message(self, format: str, *args: object) -> None:
        """Quiet."""


def _listen(redirect: str | None) -> tuple[http.server.HTTPServer, list[str]]:
    hits: list[str] = []
    handler = type("Handler", (_Recorder,), {"hits": hits, "redirect": redirect})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, hits


def test_a_webhook_receiver_redirecting_to_host_loopback_is_not_followed(
    served_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """N4, R6: the operator allows one receiver (an exact host:port exception); it answers
    every delivery with a 307 to another port of the host's loopback, which no exception
    names. A real wake is delivered to the receiver and nothing reaches the other port: the
    control plane follows no redirect (it would carry the signed body past the policy)."""
    target, target_hits = _listen(None)
    receiver, receiver_hits = _listen(f"http://127.0.0.1:{target.server_port}/stolen")
    try:
        monkeypatch.setenv("SHELLYARD_WEBHOOK_EXCEPTIONS", f"127.0.0.1:{receiver.server_port}")
        session_id, _agent_id, token = _second_session_agent(served_home)
        stop_server(served_home)
        Client.for_home(served_home)  # started again, with the exception
        info = read_info(served_home)
        assert info is not None
        bearer = {"Authorization": f"Bearer {token}"}
        with httpx.Client(base_url=info.url, headers=bearer, timeout=60) as agent:
            url = f"http://127.0.0.1:{receiver.server_port}/hook"
            made = agent.post("/v1/webhooks", json={"url": url})
            assert made.status_code == 200, made.text
            refused = agent.post(
                "/v1/webhooks", json={"url": f"http://127.0.0.1:{target.server_port}/"}
            )
            assert refused.status_code == 400, refused.text  # the target itself is refused
            ran = agent.post("/v1/executions", json={"command": "true", "background": True})
            assert ran.status_code == 200, ran.text
            deadline = time.monotonic() + 90
            while len(receiver_hits) < 2 and not target_hits:  # a retry, or the redirect taken
                assert time.monotonic() < deadline, receiver_hits
                time.sleep(0.3)
            wakes = agent.get(f"/v1/sessions/{session_id}/wakes").json()
            deliveries = agent.get(f"/v1/wakes/{wakes[0]['wake_id']}/deliveries").json()
        assert [d["state"] for d in deliveries] != ["delivered"], deliveries
        assert receiver_hits and receiver_hits[0].startswith("POST /hook"), receiver_hits
        assert target_hits == [], target_hits
    finally:
        for server in (receiver, target):
            server.shutdown()
            server.server_close()


def _world_reachable(home: Path) -> list[str]:
    """Regular files and folders below ``home`` that a user with no name in an ACL (others)
    could read or list: every folder on the way searchable by others, the entry readable.
    The home itself is taken as passable (it is 0700, so this asks what the layer below
    it would give away if the home's mode were ever widened, as older releases did)."""
    found = []
    stack = [home]
    while stack:
        folder = stack.pop()
        mode = folder.lstat().st_mode
        if folder != home and not mode & 0o001:  # others cannot pass: nothing below is theirs
            continue
        if mode & 0o004:
            found.append(f"list {oct(mode & 0o777)} {folder.relative_to(home)}")
        with os.scandir(folder) as entries:
            for entry in entries:
                info = entry.stat(follow_symlinks=False)
                if entry.is_dir(follow_symlinks=False):
                    stack.append(Path(entry.path))
                elif entry.is_file(follow_symlinks=False) and info.st_mode & 0o004:
                    found.append(
                        f"read {oct(info.st_mode & 0o777)} {Path(entry.path).relative_to(home)}"
                    )
    return sorted(found)


async def test_nothing_the_newer_doors_leave_in_the_home_is_readable_by_others(
    yard: Yard,
) -> None:
    """R2, docs/security.md "The home's files": after an environment change from the
    workspace (the wheels store, the change's scratch and log, the environment's cache) and a
    read view, no file of the home is readable by another local user and
    no folder listable, and what uid 65534 gets for the new stores is EACCES."""
    agent = await _agent(yard)
    environment_id = await _create(yard, agent, "modes")
    sdist = backend_sdist("sy-modes", "1.0", 'RESULT = "built"\n')
    await _put(yard, agent, {"dist/sy_modes-1.0.tar.gz": sdist}, {})
    change = await _install(
        yard, agent, environment_id, manager="pip", specs=["sy-modes"], index_url="none",
        find_links=["/workspace/dist"],
    )  # fmt: skip
    assert change.state == "succeeded", change
    assert await _import(yard, agent, environment_id, "sy_modes") == "built"
    assert (await _run(yard, agent, "echo secret-44 > notes")).exit_code == 0
    assert (await _run(yard, agent, "cat notes", read_only=True)).stdout == "secret-44\n"
    home = yard.home / "home"
    local = home / "runners" / "local"
    stores = [p for p in (local / "environments").rglob("*") if p.is_file()]
    assert stores, "the change left nothing: the probe would prove nothing"
    answers = probe(NOBODY, [("read", p) for p in stores[:200]])
    assert set(answers.values()) == {"EACCES"}, {k: v for k, v in answers.items() if v != "EACCES"}
    assert _world_reachable(home) == []


@pytest.mark.runner_kinds("direct")
async def test_the_runner_protocol_refuses_an_agents_and_a_sessions_token(yard: Yard) -> None:
    """R4: a second session's session token and agent token, sent to every operation of the
    runner daemon as a bearer token and as the key of a well-formed signature, are refused
    (401) and run nothing: the daemon takes only requests signed with its own key."""
    assert yard.daemon is not None
    session = await yard.plane.sessions.create()
    made = [
        await yard.plane.tokens.create(UNAUTHENTICATED_ADMIN, request)
        for request in (
            TokenCreateRequest(kind="session", session_id=session.session_id),
            TokenCreateRequest(kind="agent", agent_id=session.main_agent_id),
        )
    ]
    body = json.dumps({"workspace_id": "ws_0000000000000000"}).encode()
    answers: dict[str, int] = {}
    with httpx.Client(base_url=yard.daemon.url, timeout=30) as client:
        for token in (t.token for t in made):
            for op in OPERATIONS.values():
                bearer = client.post(
                    op.path, content=body, headers={"Authorization": f"Bearer {token}"}
                )
                answers[f"bearer {op.path}"] = bearer.status_code
                stamp, nonce = str(int(time.time() * 1000)), uuid.uuid4().hex
                digest = body_digest(body)
                signature = sign(
                    token.encode(), string_to_sign("POST", op.path, stamp, nonce, digest, "")
                )
                signed = client.post(
                    op.path,
                    content=body,
                    headers={
                        "Authorization": f"{SCHEME} {signature}",
                        H_TIMESTAMP: stamp,
                        H_NONCE: nonce,
                        H_DIGEST: digest,
                    },
                )
                answers[f"signed {op.path}"] = signed.status_code
    assert answers and set(answers.values()) == {401}, answers
    # the daemon still serves its own control plane
    assert (await yard.run("echo still")).stdout == "still\n"


async def _from_base(yard: Yard, agent: str, name: str) -> Any:
    """An environment of ``agent``'s made from python-base, waited for (a create copies the
    base: seconds, more on a loaded machine)."""
    made = await yard.plane.environments.create(
        EnvironmentCreateRequest(
            name=name, base="python-base", runner_id=yard.runner_id, wait_ms=30_000
        ),
        agent,
    )
    deadline, change_id = time.monotonic() + 300, made.change_id
    while made.state not in ("ready", "failed") and change_id:
        assert time.monotonic() < deadline, f"the create never ended: {made}"
        await yard.plane.environments.wait(change_id, 30, agent)
        made = await yard.plane.environments.show(made.environment_id, agent)
    assert made.state == "ready", made
    return made


@pytest.mark.usefixtures("use_base")
@pytest.mark.timeout(900)
async def test_a_base_files_link_count_tells_nothing_of_other_sessions_environments(
    yard_factory: Any,
) -> None:
    """R2 (as read views, docs/security.md "Environments share no inode with a base"):
    session B's commands in the default base and in an environment of its own made from it
    read the link count of a base file (numpy's ``__init__.py``) before and after session A
    makes two environments from the same base. What B reads must not change with what A
    does. Before (hard links): ``3`` then ``5`` in the base."""
    yard: Yard = await yard_factory()
    probe_command = "stat -c %h /base/python/lib/python3*/site-packages/numpy/__init__.py"
    own_command = "stat -c %h /env/lib/python3*/site-packages/numpy/__init__.py"
    bob, alice = await _agent(yard), await _agent(yard)
    bobs = await _from_base(yard, bob, "b1")
    before = await _run(yard, bob, probe_command)
    assert before.exit_code == 0, before.stderr
    own_before = await _run(yard, bob, own_command, environment_id=bobs.environment_id)
    assert own_before.exit_code == 0, own_before.stderr
    for name in ("a1", "a2"):
        await _from_base(yard, alice, name)
    after = await _run(yard, bob, probe_command)
    assert after.exit_code == 0, after.stderr
    own_after = await _run(yard, bob, own_command, environment_id=bobs.environment_id)
    assert (before.stdout, own_before.stdout) == (after.stdout, own_after.stdout), (
        before.stdout,
        after.stdout,
        own_before.stdout,
        own_after.stdout,
    )
    # nor does it count B's own environment: the base's file and B's copy are one link each
    assert (before.stdout, own_before.stdout) == ("1\n", "1\n")


@pytest.mark.parametrize("spelling", ["file", "folder"])
async def test_a_fifo_named_as_a_package_file_fails_the_change_and_holds_nothing(
    yard: Yard, spelling: str, tmp_path: Path
) -> None:
    """R2 (docs/security.md "Every door", local package files): a FIFO where a wheel should
    be, named as ``name @ file://…`` or in a find_links folder. The reader (the workspace's
    uid) must not block on it for ever: the change fails (naming it, when named), and the
    environment takes the next change (its lock was not left held). Before: the reader's
    open of the named FIFO blocked for ever, and the change with it."""
    agent = await _agent(yard)
    environment_id = await _create(yard, agent, "fifo")
    wheel = "sy_fifo-1.0-py3-none-any.whl"
    assert (await _run(yard, agent, f"mkdir -p dist && mkfifo dist/{wheel}")).exit_code == 0
    fields: dict[str, Any] = (
        {"specs": [f"sy-fifo @ file:///workspace/dist/{wheel}"]}
        if spelling == "file"
        else {"specs": ["sy-fifo"], "index_url": "none", "find_links": ["/workspace/dist"]}
    )
    error = ""
    try:
        change = await yard.plane.environments.install(
            environment_id, EnvironmentChangeBody(manager="pip", wait_ms=1000, **fields), agent
        )
        deadline = time.monotonic() + 180
        while not change.done:  # a hang, not a speed, is what this bounds
            assert time.monotonic() < deadline, f"the change never ended: {change}"
            change = await yard.plane.environments.wait(change.change_id, 5, agent)
    except ShellyardError as exc:  # the change failed, with the mapped error
        error = exc.message
    else:  # ended within the first wait: its record says how
        assert change.state == "failed", change
        error = str(change.error)
    if spelling == "file":
        assert "is not a regular file" in error, error
    built = make_wheel(tmp_path, "sy-plain", "1.0", {"sy_plain.py": "RESULT = 1\n"})
    await _put(yard, agent, {f"dist2/{built.name}": built.read_bytes()}, {})
    again = await _install(
        yard, agent, environment_id, manager="pip", specs=["sy-plain"], index_url="none",
        find_links=["/workspace/dist2"],
    )  # fmt: skip
    assert again.state == "succeeded", again


#: A file with a few data extents between holes, written by a command: python3 writes
#: distinct bytes at offsets inside, across and at the edges of blocks and 1 MiB chunks, and
#: ends one file in a hole, one in data, one all hole, one with a single byte.
EXTENTS = r"""python3 - <<'PY'
import hashlib, os
M = 1 << 20
def make(name, size, writes):
    with open(name, "wb") as f:
        f.truncate(size)
        for offset, data in writes:
            f.seek(offset)
            f.write(data)
make("few", 96 * M, [(0, b"A" * 10), (4095, b"BC"), (M - 1, b"D" * 4097),
                     (33 * M + 17, os.urandom(70000)), (64 * M - 3, b"EFGHIJ")])
make("tail", 40 * M, [(5 * M, b"x" * 100), (40 * M - 1, b"Z")])
make("hole", 24 * M, [])
make("one", 1, [(0, b"\x01")])
os.makedirs("d", exist_ok=True)
make("d/zeros", 3 * M, [(M, bytes(M))])  # data that is all zeros
for name in ("few", "tail", "hole", "one", "d/zeros"):
    print(name, os.stat(name).st_size, hashlib.sha256(open(name, "rb").read()).hexdigest())
PY"""
SUMS = (
    "python3 -c 'import hashlib, os\n"
    'for n in ("few", "tail", "hole", "one", "d/zeros"):\n'
    '    print(n, os.stat(n).st_size, hashlib.sha256(open(n, "rb").read()).hexdigest())\''
)


async def test_a_file_with_a_few_data_extents_reads_back_whole_everywhere(yard: Yard) -> None:
    """W3, W5 (docs/limits.md "Sparse files"): files with holes and a few data extents at
    block and chunk edges, committed, are the same bytes in a read-only view, in the
    workspace's next command, through the files door, after a delete and a restore of the
    snapshot, and in a child's workspace after a transfer."""
    session = await yard.plane.sessions.create()
    agent = session.main_agent_id
    made = await _run(yard, agent, EXTENTS, wait_ms=30_000)
    assert made.exit_code == 0, made.stderr
    expected = made.stdout
    seen = await _run(yard, agent, SUMS, read_only=True)
    assert seen.stdout == expected, (expected, seen.stdout, seen.stderr)
    again = await _run(yard, agent, SUMS)
    assert again.stdout == expected, (expected, again.stdout)
    for line in expected.splitlines():
        name, _size, digest = line.split()
        stream = await yard.plane.files.open(name, workspace_id=made.workspace_id, agent_id=agent)
        read = hashlib.sha256()
        async for chunk in stream.chunks:
            read.update(chunk)
        assert read.hexdigest() == digest, name
    assert made.snapshot_seq is not None
    gone = await _run(yard, agent, "rm -r few tail hole one d")
    assert gone.exit_code == 0
    await yard.plane.files.restore(
        made.snapshot_seq, "", workspace_id=made.workspace_id, agent_id=agent
    )
    back = await _run(yard, agent, SUMS)
    assert back.stdout == expected, (expected, back.stdout)
    child = await yard.plane.store.create_agent(session.session_id, agent)
    child_ws = (await yard.plane.files.access.own(child, yard.runner_id)).id
    started = await yard.plane.transfers.start(
        {
            "source_workspace_id": made.workspace_id,
            "paths": ["few", "tail", "hole", "one", "d"],
            "target_workspace_id": child_ws,
        },
        agent,
    )
    assert (
        await yard.plane.transfers.wait(started.transfer_id, TransferWait(timeout_s=300), agent)
    ).state == "completed"
    moved = await _run(yard, str(child.id), SUMS)
    assert moved.stdout == expected, (expected, moved.stdout)
