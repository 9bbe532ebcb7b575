"""Attack pass of session 43 (second engineer): environment changes' sources by every
spelling, package builds, and (phase 2) the neutral prefix and the relays' namespace join.
R2, V1–V4; docs/security.md "Attack pass (session 43)".

As the holder of one session's agent token (a second session made through the admin API),
on real bubblewrap sandboxes and uv on the in-process local runner."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import re
import shutil
import subprocess
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import test_base_environment
from cran_repo import build_test_repo, r_available
from env_fixtures import backend_sdist, make_wheel
from served_server import served_server
from test_attack_pass_41 import _agent, _run
from test_env_tool_rights import _create, _import, _install, _put, _sh

from conftest import Yard
from shellyard.contract.environments import EnvironmentCreateRequest, EnvironmentRevisionsQuery
from shellyard.contract.executions import ExecutionCancelQuery, ExecutionLogsQuery, RunShellRequest
from shellyard.control.notify.webhook_policy import PolicyRefusal, WebhookPolicy
from shellyard.errors import InvalidInput, ShellyardError
from shellyard.runner.environments import bases
from shellyard.runner.protocol import SandboxPolicy

pytestmark = [pytest.mark.timeout(300), pytest.mark.runner_kinds("local")]

#: The session's one prepared python-base (built once, ~100 MB of wheels).
python_base = test_base_environment.python_base


@pytest.fixture
def hidden_folder() -> Iterator[Path]:
    """A world-readable host folder the sandbox's host view does not show (/var/tmp is a
    private tmpfs inside) and no operator allowed as a package source."""
    folder = Path("/var/tmp") / f"sy-attack43-{uuid.uuid4().hex[:8]}"
    folder.mkdir(mode=0o755)
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


@pytest.mark.parametrize("form", ["file:{path}", "{path}", "file:{dir}", "{dir}"])
async def test_a_spec_naming_a_host_path_without_slashes_is_held_to_the_source_rule(
    yard: Yard, hidden_folder: Path, form: str
) -> None:
    """``name @ file:/path`` and ``name @ /path`` (no ``://``) skipped the source check
    (``sources._Checker.pip`` rewrote only ``://`` URLs), so an agent installed a wheel from
    a host folder nobody allowed and the sandbox hides, or had a host folder bound into the
    package tool's sandbox. Refused now as ``file://`` URLs are."""
    wheel = make_wheel(hidden_folder, "sy-hidden", "1.0", {"sy_hidden.py": "RESULT = 'host'\n"})
    wheel.chmod(0o644)
    project = hidden_folder / "project"
    project.mkdir(mode=0o755)
    (project / "pyproject.toml").write_text(
        '[project]\nname = "sy-hidden"\nversion = "1.0"\n'
        '[build-system]\nrequires = []\nbuild-backend = "b"\nbackend-path = ["."]\n'
    )
    agent = await _agent(yard)
    environment_id = await _create(yard, agent, "hidden")
    target = form.format(path=wheel, dir=project)
    try:
        change = await _install(
            yard, agent, environment_id, manager="pip", index_url="none",
            specs=[f"sy-hidden @ {target}"],
        )  # fmt: skip
    except ShellyardError as exc:
        assert "not in a local folder this runner allows" in exc.message, exc.message
        return
    raise AssertionError(f"a host path nobody allowed was used: {change}")


async def test_a_spec_naming_the_runners_folder_without_slashes_is_refused(
    yard: Yard,
) -> None:
    """The same spelling into the runner's own folder (other sessions' workspaces, its
    records): refused as the ``file://`` form is, before anything is read or bound."""
    agent = await _agent(yard)
    environment_id = await _create(yard, agent, "root")
    home = yard.home / "home"
    runner = home / "runners" / "local"
    for target in (f"file:{home}", str(home), f"{runner}/workspaces", f"file:{runner}/x.whl"):
        with pytest.raises(ShellyardError, match="runner's own folder"):
            await _install(
                yard, agent, environment_id, manager="pip", index_url="none",
                specs=[f"sy-root @ {target}"],
            )  # fmt: skip


PLANT = """
    import glob
    prefix = "/env" if os.path.isdir("/env/bin") else {prefix!r}  # where the tool sees it
    planted = []
    for name, target in {links!r}.items():
        path = os.path.join(prefix, name)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        os.symlink(target, path)
        planted.append(path)
    RESULT = planted
"""


@pytest.mark.skipif(not r_available(), reason="R (Rscript) is not installed on this machine")
async def test_a_link_a_build_leaves_in_the_r_library_is_never_written_through(
    yard: Yard, home: Path
) -> None:
    """A pip build backend (the agent's code, the tools' uid) leaves symbolic links in its
    prefix's R library where the runner, as root, keeps the R packages' sources file
    (``.shellyard-sources.json`` and its temp ``.shellyard-sources.tmp``). A CRAN install
    then records its package there: before, root wrote the JSON through the link (a root-only
    host file overwritten) and read the sources file through its link. Now neither link is
    followed."""
    victim = home / "victim"
    victim.write_text("original\n")
    victim.chmod(0o600)
    secret = home / "secret.json"
    secret.write_text('{"shellyardhello": {"manager": "cran", "repository": "s3cr3t"}}')
    secret.chmod(0o600)
    repo = build_test_repo(home / "cran")
    agent = await _agent(yard)
    environment_id = await _create(yard, agent, "rlinks")
    prefix = yard.home / "home" / "runners" / "local" / "environments" / environment_id
    library = "lib/R/library"
    links = {
        f"{library}/.shellyard-sources.tmp": str(victim),
        f"{library}/.shellyard-sources.json": str(secret),
    }
    body = PLANT.format(prefix=str(prefix / "prefix"), links=links)
    await _put(
        yard, agent, {"dist/sy_plant-1.0.tar.gz": backend_sdist("sy-plant", "1.0", body)}, {}
    )
    change = await _install(
        yard, agent, environment_id, manager="pip", specs=["sy-plant"], index_url="none",
        find_links=["/workspace/dist"],
    )  # fmt: skip
    assert change.state == "succeeded", change
    try:
        change = await _install(
            yard, agent, environment_id, manager="cran", specs=["shellyardhello"],
            repos=[repo.as_uri()],
        )  # fmt: skip
    except ShellyardError as exc:
        assert "link" in exc.message, exc.message
    else:
        assert change.state == "succeeded", change
        revisions = await yard.plane.environments.revisions(
            environment_id, EnvironmentRevisionsQuery(), agent
        )
        assert "s3cr3t" not in " ".join(r.model_dump_json() for r in revisions)
    assert victim.read_text() == "original\n"


SPARSE = """
    import glob
    prefix = "/env" if os.path.isdir("/env/bin") else {prefix!r}  # where the tool sees it
    site = glob.glob(os.path.join(prefix, "lib", "python3*", "site-packages"))[0]
    made = []
    for name, target in {links!r}.items():
        path = os.path.join(prefix, name)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        os.symlink(target, path)
        made.append(path)
    huge = os.path.join(site, "sy_huge-6.6.dist-info")
    os.makedirs(huge)
    with open(os.path.join(huge, "METADATA"), "wb") as f:
        f.truncate({size})  # sparse: no room taken, the reserve never sees it
        f.seek({size})
        f.write(b"\\nName: sy-huge\\nVersion: 6.6\\n\\n")
    linked = os.path.join(site, "sy_linked-1.0.dist-info")
    os.makedirs(linked)
    with open(os.path.join(linked, "METADATA"), "w") as f:
        f.write("Metadata-Version: 2.1\\nName: sy-linked\\nVersion: 1.0\\n")
    os.symlink({secret!r}, os.path.join(linked, "direct_url.json"))
    RESULT = made
"""


async def test_what_a_build_leaves_in_a_prefix_is_read_bounded_and_without_links(
    yard: Yard, home: Path
) -> None:
    """A pip build backend leaves in its prefix: a ``lib/python3.99`` link to a root-only
    host folder holding a dist-info, a dist-info whose ``direct_url.json`` is a link to a
    root-only JSON file, and a sparse METADATA of 300 MiB with its headers at the end. Before,
    root listed the host folder's package, named the secret as a package's source, and read
    the whole sparse file into the runner's memory. Now none is followed, and a METADATA is
    read up to 1 MiB (its headers are at its start)."""
    hidden = home / "hostlib"
    info = hidden / "site-packages" / "sy_hostonly-1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: sy-hostonly\nVersion: 1.0\n")
    hidden.chmod(0o700)
    secret = home / "direct.json"
    secret.write_text('{"url": "file:///s3cr3t-url"}')
    secret.chmod(0o600)
    agent = await _agent(yard)
    environment_id = await _create(yard, agent, "leaves")
    prefix = yard.home / "home" / "runners" / "local" / "environments" / environment_id
    links = {"lib/python3.99": str(hidden)}
    body = SPARSE.format(
        prefix=str(prefix / "prefix"), links=links, secret=str(secret), size=300 << 20
    )
    await _put(
        yard, agent, {"dist/sy_plant-1.0.tar.gz": backend_sdist("sy-plant", "1.0", body)}, {}
    )
    change = await _install(
        yard, agent, environment_id, manager="pip", specs=["sy-plant"], index_url="none",
        find_links=["/workspace/dist"],
    )  # fmt: skip
    assert change.state == "succeeded", change
    revisions = await yard.plane.environments.revisions(
        environment_id, EnvironmentRevisionsQuery(), agent
    )
    shown = " ".join(r.model_dump_json() for r in revisions)
    assert "sy-plant" in shown, shown
    assert "sy-hostonly" not in shown, shown
    assert "s3cr3t" not in shown, shown
    assert "sy-huge" not in shown, shown


_ID = re.compile(r"^(ex|ws|env|chg|tmr|art|trf|agt|ses|whk|ntc)_[0-9a-f]+$")


def _ids_in(value: object, out: set[str]) -> None:
    if isinstance(value, dict):
        for item in value.values():
            _ids_in(item, out)
    elif isinstance(value, list):
        for item in value:
            _ids_in(item, out)
    elif isinstance(value, str) and _ID.match(value):
        out.add(value)


@pytest.mark.runner_kinds("local")
@pytest.mark.timeout(900)
def test_no_id_taking_route_answers_another_sessions_agent() -> None:
    """T1/R2: session A's agent makes an execution (one still running), a file, a timer, an
    artifact, an environment and its change, a forwarded port, a webhook and a notice. Session
    B's agent token then calls every route of the OpenAPI document with each of A's ids in
    every path parameter (and A's workspace in the query and the body): no answer is a
    success that names any of A's ids or A's file, or acts on A's workspace."""
    with served_server() as served:
        client = httpx.Client(base_url=served.url, timeout=120)

        def agent_token() -> tuple[dict[str, Any], dict[str, str]]:
            made = client.post("/v1/sessions", headers=served.admin, json={}).json()
            body = {"kind": "agent", "agent_id": made["main_agent_id"]}
            token = client.post("/v1/tokens", headers=served.admin, json=body).json()
            return made, {"Authorization": f"Bearer {token['token']}"}

        session_a, a = agent_token()
        _session_b, b = agent_token()
        mine: set[str] = {session_a["session_id"], session_a["main_agent_id"]}
        run = {"command": "echo s3cr3t-a > f.txt; echo out", "wait_ms": 30_000}
        done = client.post("/v1/executions", headers=a, json=run).json()
        ws_a = done["workspace_id"]
        running = client.post(
            "/v1/executions", headers=a, json={"command": "sleep 600", "wait_ms": 0}
        ).json()
        ws_b = client.post(
            "/v1/executions", headers=b, json={"command": "true", "wait_ms": 30_000}
        ).json()["workspace_id"]
        for path, body in [
            ("/v1/timers", {"text": "a", "after_ms": 3_600_000}),
            ("/v1/artifacts", {"path": "f.txt"}),
            ("/v1/environments", {"name": "e", "language": "python", "wait_ms": 30_000}),
            ("/v1/ports", {"port": 8000}),
            ("/v1/webhooks", {"url": "https://example.com/x"}),
        ]:
            answer = client.post(path, headers=a, json=body)
            assert answer.status_code == 200, (path, answer.text)
            _ids_in(answer.json(), mine)
        for answer in (done, running, client.get("/v1/inbox", headers=a).json()):
            _ids_in(answer, mine)
        assert {x.split("_")[0] for x in mine} >= {"ex", "ws", "env", "tmr", "art", "whk"}, mine
        ex_running = running["execution_id"]
        query = {"workspace_id": ws_a, "path": "f.txt", "from_seq": 0, "wait_ms": 0}
        bodies: dict[str, dict[str, Any]] = {
            "/v1/files/delete": {"path": "f.txt", "workspace_id": ws_a},
            "/v1/files/move": {"source": "f.txt", "destination": "g.txt", "workspace_id": ws_a},
            "/v1/files/restore": {"seq": 1, "workspace_id": ws_a},
            "/v1/transfers": {
                "source_workspace_id": ws_a, "paths": ["f.txt"], "target_workspace_id": ws_b,
            },
            "/v1/artifacts": {"path": "f.txt", "workspace_id": ws_a},
            "/v1/ports": {"port": 8000, "workspace_id": ws_a},
            "/v1/ports/close": {"port": 8000, "workspace_id": ws_a},
            "/v1/executions": {"command": "cat f.txt", "workspace_id": ws_a, "wait_ms": 20_000},
            "/v1/timers": {"text": "t", "after_ms": 3_600_000, "execution_id": ex_running},
            "/v1/inbox/read": {"notice_ids": sorted(x for x in mine if x.startswith("ntc_"))},
            "/v1/environments/{environment_id}/install": {"manager": "pip", "specs": ["x"]},
        }  # fmt: skip
        document = client.get("/openapi.json", headers=served.admin).json()
        leaks: list[str] = []
        tried = 0
        for template, operations in document["paths"].items():
            params = re.findall(r"\{(\w+)\}", template)
            values = [["stdout"] if p == "stream" else sorted(mine) for p in params]
            for method in operations:
                for combo in itertools.product(*values):
                    url = template.format(**dict(zip(params, combo, strict=True)))
                    if url.endswith(("/stream", "/events")):
                        continue
                    body = bodies.get(template, {"workspace_id": ws_a})
                    if template == "/v1/executions" and method == "post":
                        env_a = min(x for x in mine if x.startswith("env_"))
                        extra = {"command": "true", "environment_id": env_a, "wait_ms": 20_000}
                        answer = client.post(url, headers=b, json=extra)
                        if answer.status_code < 300:
                            leaks.append(f"POST {url} with A's environment: {answer.text}")
                    if method == "get":
                        answer = client.get(url, headers=b, params=query)
                    elif method == "put":
                        answer = client.put(url, headers=b, params=query, content=b"x")
                    elif method == "delete":
                        answer = client.delete(url, headers=b)
                    else:
                        answer = client.post(url, headers=b, json=body)
                    tried += 1
                    named = [x for x in (*mine, "s3cr3t-a") if x in answer.text]
                    if answer.status_code < 300 and named:
                        leaks.append(f"{method.upper()} {url} {answer.status_code} {named}")
        assert tried > 300, tried
        assert not leaks, leaks
        # A's file and running command are untouched
        seen = client.get("/v1/files/text", headers=a, params={"path": "f.txt"})
        assert "s3cr3t-a" in seen.text, seen.text
        state = client.get(f"/v1/executions/{running['execution_id']}", headers=a).json()
        assert state["state"] == "running", state
        # Executions outlive their server (E11): left running, its sandbox would keep the
        # workspace's mounts after the server stops.
        client.post(f"/v1/executions/{running['execution_id']}/cancel", headers=a)


#: Address forms of loopback, link-local, metadata and private hosts a webhook URL may take.
HOOK_FORMS = [
    "http://0.0.0.0/", "http://[::]/", "http://[::ffff:127.0.0.1]/", "http://[::127.0.0.1]/",
    "http://[fe80::1%25lo]/", "http://[::1%25lo]/", "http://0x7f000001/",
    "http://127.000.000.001/", "http://[0:0:0:0:0:0:0:1]/", "http://[::ffff:0:7f00:1]/",
    "http://[64:ff9b:1::7f00:1]/", "http://[2002:7f00:1::]/", "http://[2002:a9fe:a9fe::1]/",
    "http://[2001:0:4136:e378:8000:63bf:80ff:fffe]/", "http://169.254.169.254/",
    "http://[::ffff:169.254.169.254]/", "http://100.64.0.1/", "http://[fd00::1]/",
    "http://192.0.0.1/", "http://240.0.0.1/", "http://255.255.255.255/", "http://224.0.0.1/",
    "http://[ff02::1]/", "http://[100::1]/", "http://[2001:db8::1]/", "http://127.0.0.1./",
    "http://\uff11\uff12\uff17.\uff10.\uff10.\uff11/", "http://127.1/",
    "http://[::ffff:7f00:1]:5432/", "http://[5f00::1]/", "http://[3fff::1]/",
    "http://[2001:2::1]/", "http://[2001:10::1]/", "http://192.88.99.1/", "http://0/",
    "http://[::ffff:a00:1]/", "http://[::ffff:127.0.0.1%25eth0]/", "http://localhost%2e/",
    "http://127.0.0.1%00.example.com/",
]  # fmt: skip


@pytest.mark.parametrize("url", HOOK_FORMS)
async def test_a_webhook_to_any_spelling_of_a_special_address_is_never_pinned(url: str) -> None:
    """N4 (held): registration refuses each literal form (a name that does not resolve is
    accepted there), and every delivery's pin refuses it or cannot resolve it, so no
    connection is made: fullwidth digits, zone ids, 6to4/Teredo/NAT64 of loopback, the
    metadata address, a trailing dot, percent-escapes."""
    policy = WebhookPolicy([])
    with contextlib.suppress(InvalidInput):
        await policy.check_registration(url)
    with pytest.raises((PolicyRefusal, OSError)):
        await policy.pin(url)


def _as_nobody() -> None:
    os.setgroups([])
    os.setgid(65534)
    os.setuid(65534)


@pytest.mark.skipif(os.geteuid() != 0, reason="a base's owner and modes are a root runner's")
@pytest.mark.timeout(900)
def test_a_local_nobody_cannot_change_a_prepared_bases_files(
    python_base: bases.BaseRevision,
) -> None:
    """As a local unprivileged user (``nobody``, 65534): a prepared base's files belong to
    65534 (``BASE_OWNER``), so ``nobody`` could chmod and rewrite numpy's ``__init__.py`` in
    the base, and with it every environment made ``--from`` it (they share the inode), in
    every session. The bases folder is now closed to other users (the sandbox group alone
    may pass), so nobody reaches no file of it."""
    target = next(python_base.prefix.glob("lib/python3*/site-packages/numpy/__init__.py"))
    before = target.read_bytes()
    poison = (
        "import os, sys\n"
        "path = sys.argv[1]\n"
        "os.chmod(path, 0o644)\n"
        "with open(path, 'a') as f:\n"
        "    f.write('\\nPOISONED = True\\n')\n"
    )
    done = subprocess.run(
        ["/usr/bin/python3", "-I", "-c", poison, str(target)],
        preexec_fn=_as_nobody,
        capture_output=True,
        text=True,
        check=False,
    )
    after = target.read_bytes()
    if after != before:  # put the shared fixture back before failing
        target.write_bytes(before)
    os.chmod(target, 0o444)
    assert done.returncode != 0, done
    assert after == before


LINGER = """
    import subprocess, signal
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    child = subprocess.Popen(
        ["/bin/sh", "-c", "trap '' HUP TERM; (setsid sleep {tag} &) ; sleep {tag}1 &"],
        start_new_session=True, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    RESULT = child.pid
"""


async def test_a_build_backend_leaves_no_process_behind(yard: Yard) -> None:
    """R2 (held): a build backend double-forks ``setsid`` children that ignore SIGHUP and
    SIGTERM; once the change has ended none of them is alive on the host (the tool's sandbox
    has its own pid namespace, which ends with it, and --die-with-parent)."""
    tag = "987653"
    agent = await _agent(yard)
    environment_id = await _create(yard, agent, "linger")
    sdist = backend_sdist("sy-linger", "1.0", LINGER.format(tag=tag))
    await _put(yard, agent, {"dist/sy_linger-1.0.tar.gz": sdist}, {})
    change = await _install(
        yard, agent, environment_id, manager="pip", specs=["sy-linger"], index_url="none",
        find_links=["/workspace/dist"],
    )  # fmt: skip
    assert change.state == "succeeded", change
    left: list[str] = []
    for _ in range(100):
        left = []
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
            except OSError:
                continue
            if tag.encode() in cmdline and b"trap" not in cmdline and b"pytest" not in cmdline:
                left.append(cmdline.decode(errors="replace"))
        if not left:
            break
        await asyncio.sleep(0.05)
    assert not left, left


PROBE = """
    import sys
    seen = {}
    for name in ("/proc/self/mountinfo", "/proc/self/cmdline", "/proc/self/environ",
                 "/proc/1/cmdline"):
        with open(name, "rb") as f:
            seen[name] = f.read().decode("utf-8", "replace")
    seen["cwd"] = os.getcwd()
    seen["fds"] = " ".join(
        os.readlink(f"/proc/self/fd/{fd}") for fd in os.listdir("/proc/self/fd")
        if os.path.exists(f"/proc/self/fd/{fd}")
    )
    seen["argv"] = " ".join(sys.argv) if hasattr(sys, "argv") else ""
    seen["sys"] = f"{sys.prefix} {sys.executable} {sys.path}"
    RESULT = seen
"""


def _places(text: str, needles: set[str]) -> list[str]:
    return [line for line in text.splitlines() if any(n in line for n in needles)]


async def test_no_host_path_of_the_home_reaches_a_build_or_a_command_using_the_environment(
    yard_factory: Any,
) -> None:
    """V4, R2 (docs/security.md "Host paths"): with one uid for every workspace (where a
    workspace folder can be an index and a project directory), an install of ``name @
    file:///workspace/proj`` (an in-tree backend that records what it sees) with
    ``extra_index_urls=/workspace/idx``: neither what the build backend saw (its mountinfo,
    field 4 too since the tools' folders are overlays of their own, tool_mounts.py; command
    lines, environment, descriptors, cwd, sys), nor the package list, nor the prefix's
    records read by a command (direct_url.json, pip-sources.json), nor the command's own
    view, nor ``environment_show``'s answer to the agent names the home's host path."""
    yard: Yard = await yard_factory(SandboxPolicy(uid_range="off"))
    needles = {str(yard.home), str(yard.home.resolve())}
    agent = await _agent(yard)
    environment_id = await _create(yard, agent, "paths")
    body = PROBE
    await _put(yard, agent, {"sdist.tar.gz": backend_sdist("sy-paths", "1.0", body)}, {})
    await _put(yard, agent, {"idx/x": b""}, {})
    await _sh(yard, agent, "mkdir proj && tar -xzf sdist.tar.gz -C proj --strip-components=1")
    change = await _install(
        yard, agent, environment_id, manager="pip", index_url="none",
        extra_index_urls=["/workspace/idx"], specs=["sy-paths @ file:///workspace/proj"],
    )  # fmt: skip
    assert change.state == "succeeded", change
    leaks: dict[str, list[str]] = {}
    seen = await _import(yard, agent, environment_id, "sy_paths")
    for where, text in seen.items():
        found = _places(text.replace("\0", "\n"), needles)
        if found:
            leaks[f"build {where}"] = found
    revisions = await yard.plane.environments.revisions(
        environment_id, EnvironmentRevisionsQuery(), agent
    )
    listed = " ".join(r.model_dump_json() for r in revisions)
    shown = (await yard.plane.environments.show(environment_id, agent)).model_dump_json()
    if any(n in shown for n in needles):
        leaks["environment_show"] = _places(shown.replace(",", "\n"), needles)
    if any(n in listed for n in needles):
        leaks["package list"] = _places(listed.replace(",", "\n"), needles)
    command = (
        "cat $(python -c 'import sys; print(sys.prefix)')/lib/python3*/site-packages/"
        "sy_paths-1.0.dist-info/direct_url.json; echo; "
        "cat $(python -c 'import sys; print(sys.prefix)')/.shellyard/pip-sources.json; echo; "
        "python -c 'import sys, sy_paths; print(sys.prefix, sy_paths.__file__)'; env"
    )
    ran = await yard.plane.executions.run_shell(
        RunShellRequest(command=command, environment_id=environment_id, wait_ms=30_000), agent
    )
    assert ran.exit_code == 0, ran.model_dump()
    if found := _places(str(ran.stdout), needles):
        leaks["command"] = found
    for key, found in leaks.items():
        print("LEAK", key, [x[:200] for x in found[:3]])
    assert not leaks, sorted(leaks)


SPARSE_PREFIX = """
    import glob
    prefix = "/env" if os.path.isdir("/env/bin") else {prefix!r}  # where the tool sees it
    site = glob.glob(os.path.join(prefix, "lib", "python3*", "site-packages"))[0]
    with open(os.path.join(site, "sy_zeros.bin"), "wb") as f:
        f.truncate({size})  # sparse: no room taken, the reserve never sees it
    RESULT = os.statvfs(site).f_bfree
"""


async def test_a_sparse_file_a_build_leaves_does_not_fill_the_snapshot_store(
    yard: Yard,
) -> None:
    """R2 (limits): a build backend leaves a sparse file of 3 GiB in its prefix (no block
    taken, the free-space reserve never sees it). The commit after the change (the next
    change's rollback base) must not write 3 GiB of zeros into the environments' snapshot
    store: a 1 TiB one would fill the runner's volume for every session."""
    agent = await _agent(yard)
    environment_id = await _create(yard, agent, "sparse")
    root = yard.home / "home" / "runners" / "local" / "environments"
    body = SPARSE_PREFIX.format(prefix=str(root / environment_id / "prefix"), size=3 << 30)
    await _put(
        yard, agent, {"dist/sy_sparse-1.0.tar.gz": backend_sdist("sy-sparse", "1.0", body)}, {}
    )
    before = shutil.disk_usage(root).used
    try:
        change = await _install(
            yard, agent, environment_id, manager="pip", specs=["sy-sparse"], index_url="none",
            find_links=["/workspace/dist"],
        )  # fmt: skip
    except ShellyardError as exc:
        assert "sparse" in exc.message, exc.message
        change = None
    store = yard.runner._environments  # the settle runs after the change's result
    for _ in range(600):
        if not store._settling:
            break
        await asyncio.sleep(0.1)
    await asyncio.gather(*store._settling.values(), return_exceptions=True)
    grown = shutil.disk_usage(root).used - before
    assert grown < 1 << 30, (change, grown)


FORWARDED = 8767


async def _serving(yard: Yard, agent: str, text: str) -> str:
    command = (
        f"echo {text} > who.txt; echo listening; exec python3 -m http.server {FORWARDED} "
        "--bind 127.0.0.1 --directory /workspace"
    )
    started = await _run(yard, agent, command, background=True)
    for _ in range(600):
        logs = await yard.plane.executions.logs(started.execution_id, ExecutionLogsQuery(), agent)
        if "listening" in logs.data:
            return started.execution_id
        await asyncio.sleep(0.05)
    raise AssertionError("the server did not start")


def _fetch(url: str) -> str:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    error: Exception | None = None
    for _ in range(100):
        try:
            with opener.open(url, timeout=5) as answer:
                return str(answer.read().decode())
        except OSError as exc:
            error = exc
            time.sleep(0.05)
    raise AssertionError(f"{url} did not answer: {error}")


@pytest.mark.skipif(os.geteuid() != 0, reason="a network namespace per workspace is root's")
async def test_a_forward_only_ever_reaches_its_own_workspaces_server(
    yard: Yard, monkeypatch: pytest.MonkeyPatch
) -> None:
    """R2 (relays): two sessions serve the same port in their own workspaces, each with a
    forward; three times A's server ends (its forward and namespace go: no linger) and comes
    back in a fresh namespace: every answer of A's forward is A's file, never B's, and B's is
    B's."""
    monkeypatch.setenv("SHELLYARD_NETWORK_LINGER_S", "0")  # each round: a fresh namespace
    alice, bob = await _agent(yard), await _agent(yard)
    bobs = await _serving(yard, bob, "bob")
    b_view = await yard.plane.ports.open(FORWARDED, agent_id=bob)
    try:
        for round_ in range(3):
            alices = await _serving(yard, alice, f"alice{round_}")
            a_view = await yard.plane.ports.open(FORWARDED, agent_id=alice)
            assert a_view.host != b_view.host, (a_view, b_view)
            assert _fetch(a_view.url + "who.txt") == f"alice{round_}\n"
            assert _fetch(b_view.url + "who.txt") == "bob\n"
            await yard.plane.executions.cancel(alices, ExecutionCancelQuery(wait_s=30), alice)
    finally:
        await yard.plane.executions.cancel(bobs, ExecutionCancelQuery(wait_s=30), bob)


async def test_a_sparse_wheel_in_find_links_is_not_copied_at_its_apparent_size(
    yard: Yard,
) -> None:
    """R2 (limits): ``truncate -s 2G dist/sy_big-1.0-py3-none-any.whl`` in the workspace (no
    block) and an install from ``/workspace/dist``: the runner wrote its 2 GiB of zeros into
    its wheels store and the change's scratch (4.35 GB at the peak, outside the reserve).
    Now the reader refuses a package file with holes, naming it."""
    agent = await _agent(yard)
    made = await _run(
        yard, agent, "mkdir dist && truncate -s 2G dist/sy_big-1.0-py3-none-any.whl",
        wait_ms=30_000,
    )  # fmt: skip
    for _ in range(600):  # its commit stores the file's apparent size (the open row above)
        view = await yard.plane.executions.status(made.execution_id, agent)
        if view.state.terminal:
            break
        await asyncio.sleep(0.2)
    assert view.exit_code == 0, view
    environment_id = await _create(yard, agent, "bigwheel")
    root = yard.home / "home"
    before = shutil.disk_usage(root).used
    peak = 0

    async def watch() -> None:
        nonlocal peak
        while True:
            peak = max(peak, shutil.disk_usage(root).used - before)
            await asyncio.sleep(0.05)

    watcher = asyncio.create_task(watch())
    try:
        with pytest.raises(ShellyardError, match="sparse file"):
            await _install(
                yard, agent, environment_id, manager="pip", specs=["sy-big"],
                index_url="none", find_links=["/workspace/dist"],
            )  # fmt: skip
    finally:
        watcher.cancel()
    assert peak < 1 << 30, peak


@pytest.mark.skipif(os.geteuid() != 0, reason="a base's hard links are a root runner's")
@pytest.mark.timeout(900)
async def test_a_command_in_the_default_base_or_an_environment_from_it_sees_no_bases_path(
    yard_factory: Any, python_base: bases.BaseRevision, monkeypatch: pytest.MonkeyPatch
) -> None:
    """V4, R2 (docs/security.md "Host paths"): root's bases live under its home by default
    (``/var/lib/shellyard/bases``), so the bases folder's host path is the home's. A command
    with no environment (the default python-base) and one in an environment made ``--from``
    it (hard links of the base's files): neither PATH, ``sys.prefix``, mountinfo (but a
    bind's field 4) nor a file of the prefix (``grep -rl``) names the bases folder."""
    root = python_base.prefix.parents[2]
    monkeypatch.setenv("SHELLYARD_BASES", str(root))
    monkeypatch.delenv("SHELLYARD_DEFAULT_ENVIRONMENT", raising=False)
    yard: Yard = await yard_factory()
    agent = await _agent(yard)
    needle = str(root)
    probe = (
        'echo "PATH=$PATH"; python -c "import sys; print(sys.prefix, sys.executable)"; '
        "awk '{print $5, $10}' /proc/self/mountinfo; "
        f'P=$(python -c "import sys; print(sys.prefix)"); grep -rl "{needle}" "$P" | head -3'
    )
    leaks: dict[str, list[str]] = {}
    default = await _run(yard, agent, probe, wait_ms=30_000)
    assert default.exit_code in (0, 1), default
    if found := _places(str(default.stdout), {needle}):
        leaks["default base"] = found
    view = await yard.plane.environments.create(
        EnvironmentCreateRequest(
            name="from", base="python-base", runner_id=yard.runner_id, wait_ms=30_000
        ),
        agent,
    )
    assert view.state == "ready", view
    derived = await yard.plane.executions.run_shell(
        RunShellRequest(command=probe, environment_id=view.environment_id, wait_ms=30_000),
        agent,
    )
    if found := _places(str(derived.stdout), {needle}):
        leaks["from python-base"] = found
    for key, found in leaks.items():
        print("LEAK", key, [x[:200] for x in found[:4]])
    assert not leaks, sorted(leaks)


async def test_a_build_reads_no_host_path_in_its_pid_1s_command_line(yard: Yard) -> None:
    """V4, R2: the tool's sandbox shows the prefix at /env, its cache and scratch at
    /env-cache and /env-scratch, but its pid 1 is bwrap, whose command line held every
    bind's host path (the prefix's under the home). Found after the prefix branch: a build
    backend read them in /proc/1/cmdline. Now the tool's bwrap gets its options by a memfd,
    as the commands' does."""
    needles = {str(yard.home), str(yard.home.resolve())}
    agent = await _agent(yard)
    environment_id = await _create(yard, agent, "cmdline")
    await _put(yard, agent, {"dist/sy_cmd-1.0.tar.gz": backend_sdist("sy-cmd", "1.0", PROBE)}, {})
    change = await _install(
        yard, agent, environment_id, manager="pip", specs=["sy-cmd"], index_url="none",
        find_links=["/workspace/dist"],
    )  # fmt: skip
    assert change.state == "succeeded", change
    seen = await _import(yard, agent, environment_id, "sy_cmd")
    for where in ("/proc/1/cmdline", "/proc/self/cmdline", "/proc/self/environ", "cwd"):
        text = seen[where].replace("\0", " ")
        assert not any(n in text for n in needles), (where, text)
