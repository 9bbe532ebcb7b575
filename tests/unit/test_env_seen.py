"""V4 (docs/environments.md "Prefix layout"): where a package tool's sandbox shows an
environment's folders, and the record of the path a prefix was built for."""

from __future__ import annotations

from pathlib import Path

from shellyard.runner.environments import seen


def test_host_paths_become_the_sandbox_paths_whole_components_only(tmp_path: Path) -> None:
    env = tmp_path / "environments" / "env1"
    places = seen.Places(env / "prefix", env / "cache", env / "scratch", seen.ENV)
    assert places.inside(f"{env}/prefix") == "/env"
    assert places.inside(f"--python={env}/prefix/bin/python") == "--python=/env/bin/python"
    assert places.inside(f"{env}/prefix/bin:/usr/bin") == "/env/bin:/usr/bin"
    assert places.inside(f"{env}/cache/uv") == "/env-cache/uv"
    assert places.inside(f"file://{env}/scratch/files/x.whl") == "file:///env-scratch/files/x.whl"
    # a sibling whose name merely starts like one of them is left alone
    assert places.inside(f"{env}/prefix2/x") == f"{env}/prefix2/x"
    assert places.inside("/usr/bin/python3") == "/usr/bin/python3"
    assert dict(places.binds)[env / "prefix"] == Path("/env")


def test_a_prefix_built_before_keeps_its_host_path(tmp_path: Path) -> None:
    prefix = tmp_path / "env1" / "prefix"
    prefix.mkdir(parents=True)
    assert seen.built_at(prefix) == prefix  # no record: the legacy host path
    places = seen.Places(prefix, tmp_path / "c", tmp_path / "s", seen.built_at(prefix))
    assert places.inside(f"{prefix}/bin/python") == f"{prefix}/bin/python"
    assert places.inside(f"{tmp_path}/c/uv") == "/env-cache/uv"
    assert seen.settle(prefix, fresh=True) == seen.ENV
    assert seen.settle(prefix, fresh=False) == seen.ENV  # recorded beside the prefix
    assert seen.mount(prefix) == seen.Mount(prefix, {"PATH": "/env/bin"}, seen.ENV)
