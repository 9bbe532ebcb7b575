"""Attack pass of session 45 (second engineer): the doors around the sandbox after session
44's copy-by-reader change, sparse files, prefix overlays, webhooks and the web login (R2,
V1–V5, N4; docs/security.md "Attack pass (session 45)").

As the holder of one session's agent token (a second session made through the admin API; the
in-process ControlPlane's agent-scoped calls, the code REST, MCP and the SDK reach), on real
bubblewrap sandboxes and uv on the local runner (root)."""

from __future__ import annotations

import base64
import os
from pathlib import Path

import pytest
import test_base_environment
from env_fixtures import make_wheel
from test_attack_pass_41 import _agent, _run
from test_env_tool_rights import _create, _install, _put
from tmpfs_fixture import mounted_tmpfs, yard_on

from conftest import Yard
from shellyard.contract.environments import EnvironmentChangeBody, EnvironmentCreateRequest
from shellyard.contract.executions import ExecutionCancelQuery
from shellyard.errors import InvalidInput, ShellyardError
from shellyard.runner.environments.managers import wheels
from shellyard.runner.protocol import SandboxPolicy

pytestmark = [pytest.mark.timeout(300), pytest.mark.runner_kinds("local")]

MIB = 1 << 20

#: The session's one prepared python-base, and the setting that makes it findable.
python_base = test_base_environment.python_base
use_base = test_base_environment.use_base


async def test_nested_workspace_indexes_are_copied_within_one_bound_per_change(
    yard: Yard, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """R2, V2 (docs/security.md "Every door", the workspace's folders a change names): each
    folder of the workspace a change names is copied whole by the reader, and the runner (root)
    writes the copy into the change's scratch. The bound on a copy (``TREE_BYTES``) must hold
    for the change, not per folder: naming ``a``, ``a/b``, ``a/b/c`` copies what ``a/b/c``
    holds three times, so N nested names wrote N times the workspace's bytes, with no bound on
    N. Here the bound is lowered to 8 MiB; three nested indexes holding 6 MiB in all (9 MiB
    copied) must fail the change saying so. Before: each copy passed its own bound, the
    change succeeded."""
    monkeypatch.setattr(wheels, "TREE_BYTES", 8 * MIB)
    agent = await _agent(yard)
    environment_id = await _create(yard, agent, "nested")
    wheel = make_wheel(tmp_path, "sy-nest", "1.0", {"sy_nest.py": "RESULT = 1\n"})
    page = f'<a href="{wheel.name}">{wheel.name}</a>\n'.encode()
    await _put(
        yard, agent, {f"a/b/c/sy-nest/{wheel.name}": wheel.read_bytes(),
                      "a/b/c/sy-nest/index.html": page}, {},
    )  # fmt: skip
    made = await _run(
        yard, agent, "head -c 3M /dev/zero > a/one && head -c 3M /dev/zero > a/b/two",
        wait_ms=30_000,
    )  # fmt: skip
    assert made.exit_code == 0, made.stderr
    with pytest.raises(InvalidInput, match="bytes one change copies"):
        change = await _install(
            yard, agent, environment_id, manager="pip", specs=["sy-nest"],
            extra_index_urls=["/workspace/a/b/c", "/workspace/a/b", "/workspace/a"],
        )  # fmt: skip
        raise AssertionError(f"the change was not refused: {change}")
    # one of them alone is copied and installs
    change = await _install(
        yard, agent, environment_id, manager="pip", specs=["sy-nest"],
        extra_index_urls=["/workspace/a/b/c"],
    )  # fmt: skip
    assert change.state == "succeeded", change


async def test_hard_links_of_one_package_file_are_copied_within_the_changes_bound(
    yard: Yard, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """R2, V2: the workspace's quota counts a file's hard links once, but the runner (root)
    copies every package file of a ``find_links`` folder into the change's scratch, one copy
    per name: 1,000 links of a 1 GiB wheel wrote 1,000 GiB past the free-space reserve. The
    copies of one change share the bound of its folder copies (lowered here to 8 MiB): three
    links of a 3 MiB wheel are refused, saying so. Before: installed, 9 MiB copied."""
    monkeypatch.setattr(wheels, "TREE_BYTES", 8 * MIB)
    agent = await _agent(yard)
    environment_id = await _create(yard, agent, "links")
    noise = base64.b64encode(os.urandom(3 * MIB)).decode()  # ~3 MiB once deflated
    wheel = make_wheel(tmp_path, "sy-hl", "1.0", {"sy_hl.py": "RESULT = 1\n", "noise": noise})
    assert wheel.stat().st_size > 2 * MIB
    first = await _run(yard, agent, "mkdir dist", wait_ms=30_000)
    await yard.plane.files.write(
        f"dist/{wheel.name}", wheel.read_bytes(), workspace_id=first.workspace_id, agent_id=agent
    )
    linked = await _run(
        yard, agent,
        f"ln dist/{wheel.name} dist/sy_hl-1.1-py3-none-any.whl && "
        f"ln dist/{wheel.name} dist/sy_hl-1.2-py3-none-any.whl && stat -c %h dist/{wheel.name}",
        wait_ms=30_000,
    )  # fmt: skip
    assert linked.stdout == "3\n", (linked.stdout, linked.stderr)
    with pytest.raises(InvalidInput, match="bytes in all") as refused:
        change = await _install(
            yard, agent, environment_id, manager="pip", specs=["sy-hl==1.0"], index_url="none",
            find_links=["/workspace/dist"],
        )  # fmt: skip
        raise AssertionError(f"the change was not refused: {change}")
    assert "/workspace/dist" in refused.value.message, refused.value.message
    assert str(yard.home.resolve()) not in refused.value.message, refused.value.message


async def test_commands_in_one_environment_share_one_prefix_overlay(yard: Yard) -> None:
    """R2, V5 (docs/security.md "An overlay of its own per environment prefix"): the
    overlay's name is the prefix's identity (inode and change times of the prefix and its
    folder), so nothing a command does may give its environment a new overlay: a background
    command, read-only commands beside it, a warm sandbox, and commands that touch what they
    can of ``/env`` (``touch``, ``chmod``, xattrs: refused, read-only) all share one mount;
    an install while a command runs is refused (V5) rather than mounting a second one."""
    agent = await _agent(yard)
    environment_id = await _create(yard, agent, "overlays")
    at = yard.home / "home" / "runners" / "local" / "sandbox" / "prefixes" / "at"

    def mounted() -> list[str]:
        lines = Path("/proc/self/mountinfo").read_text().splitlines()
        return sorted(line.split()[4] for line in lines if str(at) in line.split()[4])

    running = await _run(
        yard, agent, "sleep 20", environment_id=environment_id, background=True, wait_ms=0
    )
    for command in (
        "touch /env/x; chmod 777 /env; setfattr -n user.a -v b /env 2>&1; true",
        "ls /env > /dev/null",
    ):
        done = await _run(
            yard, agent, command, environment_id=environment_id, read_only=True, wait_ms=30_000
        )
        assert done.exit_code == 0, done
    assert len(mounted()) == 1, mounted()
    change = await yard.plane.environments.install(
        environment_id, EnvironmentChangeBody(manager="pip", specs=["sy-none"], wait_ms=0), agent
    )
    assert change.state == "waiting", change  # V5: behind the command, no second overlay
    assert len(mounted()) == 1, mounted()
    await yard.plane.executions.cancel(running.execution_id, ExecutionCancelQuery(), agent)


async def test_the_runners_copies_of_local_sources_stop_at_the_free_space_reserve(
    tmp_path: Path,
) -> None:
    """R2 (docs/limits.md, the free-space reserve): the runner (root) copies a change's
    local sources into its scratch before any tool runs, so the tools' reserve watch never
    sees those writes. On a 384 MiB volume with a 128 MiB reserve, 20 hard links of a
    ~20 MiB wheel in a ``find_links`` folder (20 MiB of the workspace, 400 MiB of copies,
    under the change's 2 GiB bound) must end in the reserve's refusal, not ENOSPC: the copies
    check the reserve as they write. Before: no check, the volume filled (ENOSPC)."""
    noise = base64.b64encode(os.urandom(15 * MIB)).decode()
    wheel = make_wheel(tmp_path, "sy-room", "1.0", {"sy_room.py": "RESULT = 1\n", "n": noise})
    assert wheel.stat().st_size > 14 * MIB
    policy = SandboxPolicy(free_space_reserve_bytes=128 * MIB, workspace_quota_bytes=0)
    with mounted_tmpfs("384m", "shellyard-att45-") as volume:
        async with yard_on(volume, "local", policy) as yard:
            agent = await _agent(yard)
            environment_id = await _create(yard, agent, "room")
            first = await _run(yard, agent, "mkdir dist", wait_ms=30_000)
            await yard.plane.files.write(
                f"dist/{wheel.name}", wheel.read_bytes(), workspace_id=first.workspace_id,
                agent_id=agent,
            )  # fmt: skip
            links = " && ".join(
                f"ln dist/{wheel.name} dist/sy_room-1.{i}-py3-none-any.whl" for i in range(1, 20)
            )
            assert (await _run(yard, agent, links, wait_ms=30_000)).exit_code == 0
            with pytest.raises(ShellyardError) as refused:
                change = await _install(
                    yard, agent, environment_id, manager="pip", specs=["sy-room==1.0"],
                    index_url="none", find_links=["/workspace/dist"],
                )  # fmt: skip
                raise AssertionError(f"the change was not refused: {change}")
            message = refused.value.message
            assert "copying the change's local sources" in message, message
            assert "reserve" in message and "No space left" not in message, message


@pytest.mark.usefixtures("use_base")
async def test_environments_from_a_base_stop_at_the_free_space_reserve() -> None:
    """R2 (docs/limits.md, the reserve): an environment made ``--from`` a base is filled by
    the runner itself (hard links here, copies on the way: 7,500 files), before any tool,
    so the tools' reserve watch never sees it. On a volume of 20,000 inodes (an inode reserve
    of 1,024), making environments one after another must end in the reserve's refusal,
    never in ENOSPC. Before: a create failed with "No space left on device"."""
    policy = SandboxPolicy(free_space_reserve_bytes=64 * MIB, workspace_quota_bytes=0)
    with mounted_tmpfs("1g", "shellyard-att45-", "nr_inodes=20000") as volume:
        async with yard_on(volume, "local", policy) as yard:
            agent = await _agent(yard)
            errors: list[str] = []
            for i in range(5):
                try:
                    made = await yard.plane.environments.create(
                        EnvironmentCreateRequest(
                            name=f"e{i}", base="python-base", runner_id=yard.runner_id,
                            wait_ms=30_000,
                        ),
                        agent,
                    )  # fmt: skip
                except ShellyardError as exc:
                    errors.append(exc.message)
                    continue
                while made.state not in ("ready", "failed") and made.change_id:
                    await yard.plane.environments.wait(made.change_id, 60, agent)
                    made = await yard.plane.environments.show(made.environment_id, agent)
            assert errors, "every create succeeded: the volume was not filled"
            assert all("reserve" in e and "No space left" not in e for e in errors), errors
