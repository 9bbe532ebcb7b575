"""Package builds and installs run with no more than the agent's sandbox rights (R2 with V2;
docs/environments.md, "Package tools run as the sandbox uid", "Caches").

Real components: the control plane with its LocalRunner, bubblewrap, uv and Python building
sdists whose in-tree build backends are the attack; two sessions, each with its own agent,
put their files into their own workspace through ``run_shell`` (as an attacker would) and
name them as ``/workspace/…`` sources.
"""

from __future__ import annotations

import base64
import errno
import json
import os
from pathlib import Path
from typing import Any

import pytest
from conda_channel import CondaPackage, PackageFile, build_test_channel_sync
from env_fixtures import backend_sdist, make_wheel

from conftest import Yard
from shellyard.contract.environments import EnvironmentChangeBody, EnvironmentCreateRequest
from shellyard.contract.executions import RunShellRequest
from shellyard.errors import ChangeFailed, InvalidInput

pytestmark = pytest.mark.timeout(300)

CANARY = "root-only-canary-7f3a"


async def _agent(yard: Yard) -> str:
    _session, agent = await yard.plane.store.create_session()
    return str(agent.id)


async def _sh(yard: Yard, agent: str, command: str) -> str:
    result = await yard.plane.executions.run_shell(
        RunShellRequest(command=command, runner_id=yard.runner_id, wait_ms=30_000), agent
    )
    assert result.exit_code == 0, result
    return str(result.stdout)


async def _put(yard: Yard, agent: str, files: dict[str, bytes], links: dict[str, str]) -> None:
    """Write ``files`` and symbolic ``links`` into the agent's workspace from inside it."""
    payload = {
        "files": {k: base64.b64encode(v).decode() for k, v in files.items()},
        "links": links,
    }
    script = (
        "import base64, json, os, sys\n"
        "d = json.loads(base64.b64decode(sys.argv[1]))\n"
        "for p, b in d['files'].items():\n"
        "    os.makedirs(os.path.dirname(p) or '.', exist_ok=True)\n"
        "    open(p, 'wb').write(base64.b64decode(b))\n"
        "for p, t in d['links'].items():\n"
        "    os.makedirs(os.path.dirname(p) or '.', exist_ok=True)\n"
        "    os.symlink(t, p)\n"
    )
    blob = base64.b64encode(json.dumps(payload).encode()).decode()
    code = base64.b64encode(script.encode()).decode()
    await _sh(yard, agent, f"python3 -c \"import base64; exec(base64.b64decode('{code}'))\" {blob}")


async def _create(yard: Yard, agent: str, name: str) -> str:
    view = await yard.plane.environments.create(
        EnvironmentCreateRequest(
            name=name, language="python", runner_id=yard.runner_id, wait_ms=30_000
        ),
        agent,
    )
    if view.state != "ready":
        assert view.change_id is not None, view
        await yard.plane.environments.wait(view.change_id, 120, agent)
        view = await yard.plane.environments.show(view.environment_id, agent)
    assert view.state == "ready", view
    return view.environment_id


async def _install(yard: Yard, agent: str, environment_id: str, **body: Any) -> Any:
    body.setdefault("wait_ms", 30_000)
    plane = yard.plane
    change = await plane.environments.install(environment_id, EnvironmentChangeBody(**body), agent)
    if not change.done:
        change = await plane.environments.wait(change.change_id, 120, agent)
    return change


async def _import(yard: Yard, agent: str, environment_id: str, module: str) -> Any:
    result = await yard.plane.executions.run_shell(
        RunShellRequest(
            command=f"python -c 'import {module}; print({module}.RESULT)'",
            environment_id=environment_id,
            wait_ms=30_000,
        ),
        agent,
    )
    assert result.exit_code == 0, result
    return json.loads(str(result.stdout))


def _host_keys() -> list[Path]:
    return sorted(Path("/etc/ssh").glob("ssh_host_*_key"))


async def test_a_build_reads_no_root_only_file_and_does_not_run_as_root(
    yard: Yard, home: Path
) -> None:
    """R2: an sdist from the agent's workspace whose build backend reads a root-only canary,
    /etc/shadow and the SSH host keys gets none of them, and does not run as uid 0; a host
    folder (/root, /etc/ssh, /etc) named as an index is refused before anything runs."""
    canary = home / "canary"
    canary.write_text(CANARY)
    canary.chmod(0o600)
    targets = [str(canary), "/etc/shadow", *(str(p) for p in _host_keys())]
    agent = await _agent(yard)
    environment_id = await _create(yard, agent, "probe")
    body = f"""
    RESULT = {{"uid": os.getuid(), "euid": os.geteuid(), "read": {{}}}}
    for path in {targets!r}:
        try:
            with open(path) as f:
                RESULT["read"][path] = f.read()
        except OSError as exc:
            RESULT["read"][path] = "error: " + type(exc).__name__
    """
    await _put(
        yard, agent, {"dist/sy_probe-1.0.tar.gz": backend_sdist("sy-probe", "1.0", body)}, {}
    )
    change = await _install(
        yard, agent, environment_id, manager="pip", specs=["sy-probe"], index_url="none",
        find_links=["/workspace/dist"],
    )  # fmt: skip
    assert change.state == "succeeded", change
    seen = await _import(yard, agent, environment_id, "sy_probe")
    assert seen["uid"] != 0 and seen["euid"] != 0, seen
    for path, text in seen["read"].items():
        # unreadable, or (the sandbox's cover of /etc's secrets) empty
        assert text == "" or text.startswith("error: "), (path, text)
        assert Path(path).read_text() != "", path
    assert CANARY not in json.dumps(seen)

    for folder in ("/root", "/etc/ssh", "/etc"):
        for field in ("index_url", "extra_index_urls", "find_links"):
            value: Any = [folder] if field != "index_url" else folder
            with pytest.raises(InvalidInput, match="not in a local folder this runner allows"):
                await yard.plane.environments.install(
                    environment_id,
                    EnvironmentChangeBody(manager="pip", specs=["sy-probe"], **{field: value}),
                    agent,
                )


async def test_a_link_to_the_admin_token_never_yields_its_content(
    yard: Yard, monkeypatch: pytest.MonkeyPatch
) -> None:
    """R2: a find_links folder and a ``name @ file://`` requirement in the workspace that are
    symbolic links to the home's admin token: the install is refused with a clear error, and
    the token's bytes are nowhere in the environments' folders (store, scratch, prefix)."""
    token_file = yard.home / "home" / "admin.token"
    if not token_file.exists():
        token_file.write_text("admin-token-for-the-test-0123456789")
        token_file.chmod(0o600)
    token = token_file.read_bytes().strip()
    assert token
    agent = await _agent(yard)
    environment_id = await _create(yard, agent, "links")
    await _put(
        yard, agent, {},
        {"dist/sy_evil-1.0.tar.gz": str(token_file),
         "dist2/sy_evil-1.0-py3-none-any.whl": str(token_file),
         "linked": str(token_file.parent)},
    )  # fmt: skip
    attempts = [
        {"index_url": "none", "find_links": ["/workspace/dist"], "specs": ["sy-evil"]},
        {"specs": ["sy-evil @ file:///workspace/dist2/sy_evil-1.0-py3-none-any.whl"]},
        {"index_url": "none", "find_links": ["/workspace/linked"], "specs": ["sy-evil"]},
    ]
    for fields in attempts:
        try:
            change = await _install(yard, agent, environment_id, manager="pip", **fields)
        except InvalidInput as exc:  # refused before anything ran
            assert "workspace" in exc.message, exc.message
            continue
        except ChangeFailed as exc:  # refused by the reader
            assert "symbolic link" in exc.message, exc.message
            continue
        raise AssertionError(f"an install through a link succeeded: {change}")
    environments = yard.home / "home"
    for folder, _dirs, files in os.walk(environments):
        for name in files:
            path = Path(folder, name)
            if path == token_file or path.is_symlink() or not path.is_file():
                continue
            try:
                data = path.read_bytes()
            except OSError:
                continue
            assert token not in data or path.name.endswith((".db", ".db-wal", "-wal")), path


async def test_a_poisoned_build_in_session_b_never_reaches_session_a(yard: Yard) -> None:
    """R2: session A installs sy-shared from the operator's mirror; session B's package
    build rewrites every copy of sy_shared it can reach in its uv cache; A's next install of
    sy-shared into a new environment still runs A's own code."""
    alice, bob = await _agent(yard), await _agent(yard)
    # the operator's mirror (an index every session may use, as PyPI is)
    index = yard.home / "index"
    wheel = make_wheel(index / "sy-shared", "sy-shared", "1.0",
                       {"sy_shared.py": "RESULT = '\"clean\"'\n"})  # fmt: skip
    (index / "sy-shared" / "index.html").write_text(
        f'<html><body><a href="{wheel.name}">{wheel.name}</a></body></html>'
    )
    (index / "index.html").write_text('<html><body><a href="sy-shared/">x</a></body></html>')
    first = await _create(yard, alice, "a1")
    done = await _install(
        yard, alice, first, manager="pip", specs=["sy-shared==1.0"], index_url=str(index)
    )
    assert done.state == "succeeded", done
    assert await _import(yard, alice, first, "sy_shared") == "clean"

    body = """
    hits = []
    cache = os.environ.get("UV_CACHE_DIR", "/")
    # its own cache, and the folder that held every environment's cache before
    for root in {cache, os.path.dirname(cache), os.path.dirname(os.path.dirname(cache))}:
        for folder, _dirs, files in os.walk(root):
            for name in files:
                if name == "sy_shared.py":
                    path = os.path.join(folder, name)
                    try:
                        with open(path, "w") as f:
                            f.write("RESULT = '\\"poisoned\\"'\\n")
                        hits.append(path)
                    except OSError:
                        pass
    RESULT = hits
    """
    await _put(
        yard, bob, {"dist/sy_poison-1.0.tar.gz": backend_sdist("sy-poison", "1.0", body)}, {}
    )
    evil = await _create(yard, bob, "b1")
    done = await _install(
        yard, bob, evil, manager="pip", specs=["sy-poison"], index_url="none",
        find_links=["/workspace/dist"],
    )  # fmt: skip
    assert done.state == "succeeded", done

    second = await _create(yard, alice, "a2")
    done = await _install(
        yard, alice, second, manager="pip", specs=["sy-shared==1.0"],
        index_url=str(index),
    )  # fmt: skip
    assert done.state == "succeeded", done
    assert await _import(yard, alice, second, "sy_shared") == "clean"


async def test_a_conda_install_runs_as_the_sandbox_uid_and_reads_no_root_only_archive(
    yard: Yard, home: Path
) -> None:
    """R2 with V2: rattler runs as the sandbox uid, and a channel in the agent's workspace is
    read as the workspace's uid (docs/environments.md, "Package tools run as the sandbox
    uid"). A workspace channel installs, and every file it unpacked belongs to a uid that is
    not root; a second channel whose package is a link to a root-only archive (0600, its
    payload a canary) is refused, and the canary's bytes are nowhere in the environments'
    folders."""
    built = build_test_channel_sync(
        home / "conda-built",
        [
            CondaPackage("sy-fine", "1.0", {"share/sy-fine/fine.txt": PackageFile(b"fine\n")}),
            CondaPackage(
                "sy-secret", "1.0", {"share/sy-secret/secret.txt": PackageFile(CANARY.encode())}
            ),
        ],
    )
    [secret] = (built / "noarch").glob("sy-secret-*.tar.bz2")
    canary = home / "canary-package.tar.bz2"
    canary.write_bytes(secret.read_bytes())
    canary.chmod(0o600)
    files: dict[str, bytes] = {}
    for path in built.rglob("*"):
        if path.is_file():
            relative = str(path.relative_to(built))
            if path != secret:
                files[f"chan/{relative}"] = path.read_bytes()
                files[f"evil/{relative}"] = path.read_bytes()
    agent = await _agent(yard)
    environment_id = await _create(yard, agent, "condaprobe")
    await _put(yard, agent, files, {f"evil/noarch/{secret.name}": str(canary)})

    change = await _install(
        yard, agent, environment_id, manager="conda", specs=["sy-fine"],
        channels=["/workspace/chan"],
    )  # fmt: skip
    assert change.state == "succeeded", change
    environments = yard.home  # the control plane's home and a direct runner's
    unpacked = list(environments.rglob("share/sy-fine/fine.txt"))
    records = list(environments.rglob("conda-meta/sy-fine-*.json"))
    assert unpacked and records, "the install left no files"
    for path in [*unpacked, *records]:
        assert path.lstat().st_uid != 0, f"{path} was written by root"

    with pytest.raises((ChangeFailed, InvalidInput), match="symbolic link"):
        await _install(
            yard, agent, environment_id, manager="conda", specs=["sy-secret"],
            channels=["/workspace/evil"],
        )  # fmt: skip
    assert not list(environments.rglob("share/sy-secret")), "the canary was installed"
    for folder, _dirs, names in os.walk(environments):
        for name in names:
            path = Path(folder, name)
            if path.is_symlink() or not path.is_file():
                continue
            try:
                data = path.read_bytes()
            except OSError:
                continue
            assert CANARY.encode() not in data or path.name.endswith((".db", "-wal")), path


@pytest.mark.parametrize("refusal", [errno.EMFILE, errno.ENOSYS])
async def test_a_package_tool_the_kernel_gives_no_pidfd_of_is_still_waited_for(
    yard: Yard, monkeypatch: pytest.MonkeyPatch, refusal: int
) -> None:
    """V1, E11: a package tool's end is woken on its pidfd; when ``pidfd_open`` is refused
    (EMFILE at the descriptor limit, ENOSYS before Linux 5.3; injected, as in
    test_attack_pass_49b) its end is polled: the change completes as it would, and the
    environment runs commands (before: the OSError failed the change after its tool ran)."""

    def refused(pid: int, flags: int = 0) -> int:
        raise OSError(refusal, os.strerror(refusal))

    agent = await _agent(yard)
    monkeypatch.setattr(os, "pidfd_open", refused)
    environment_id = await _create(yard, agent, f"nopidfd{refusal}")
    result = await yard.plane.executions.run_shell(
        RunShellRequest(
            command="python -c 'import sys; print(sys.prefix)'",
            environment_id=environment_id,
            wait_ms=30_000,
        ),
        agent,
    )
    assert result.exit_code == 0 and result.stdout.strip(), result
