"""The operator's package sources (issue 20): read from SHELLYARD_ALLOWED_SOURCES /
SHELLYARD_PACKAGES_OFFLINE and the runner daemon's options, checked when read (a bad entry
is a clear error at start, not a surprise at the first install), and matched by prefix at a
path boundary."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from shellyard.contract.environments import EnvironmentChangeBody
from shellyard.contract.sources import names_workspace
from shellyard.errors import InvalidInput
from shellyard.runner.environments import sources
from shellyard.runner.policy import SandboxPolicy, policy_from_env
from shellyard.runner.protocol import EnvironmentChangeRequest
from shellyard.runner.transport.daemon import sources_options


def test_environment_variables_set_the_policy(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SHELLYARD_ALLOWED_SOURCES", "pypi, conda-forge https://m.example/simple")
    monkeypatch.setenv("SHELLYARD_PACKAGES_OFFLINE", "1")
    policy = policy_from_env(SandboxPolicy())
    assert policy.allowed_sources == ["pypi", "conda-forge", "https://m.example/simple"]
    assert policy.packages_offline is True


def test_a_bad_entry_is_refused_when_read(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SHELLYARD_ALLOWED_SOURCES", "https://user:pw@m.example/simple")
    with pytest.raises(InvalidInput) as caught:
        policy_from_env(SandboxPolicy())
    assert "credentials" in caught.value.message and "pw" not in caught.value.message


def test_daemon_options_win_over_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SHELLYARD_ALLOWED_SOURCES", "pypi")
    args = argparse.Namespace(allowed_source=["/srv/wheels"], packages_offline=True)
    policy = sources_options(SandboxPolicy(), args)
    assert (policy.allowed_sources, policy.packages_offline) == (["/srv/wheels"], True)
    unset = sources_options(
        SandboxPolicy(), argparse.Namespace(allowed_source=None, packages_offline=False)
    )
    assert unset.allowed_sources == ["pypi"]


def _check(rule: sources.Allowed, root: Path, **fields: object) -> None:
    request = EnvironmentChangeRequest.model_validate(
        {"change_id": "c", "environment_id": "e", "action": "install", **fields}
    )
    sources.check_request(rule, request, runner_root=root, workspace=None)


def test_a_listed_url_allows_what_is_below_it_only(tmp_path: Path) -> None:
    """``https://m.example/simple`` allows ``…/simple/`` and below, not ``…/simple-evil`` nor
    another host; ``pypi`` is PyPI's index; a channel name is conda.anaconda.org/<name>."""
    rule = sources.parse(["https://m.example/simple", "pypi", "conda-forge"])
    ok = {"manager": "pip", "specs": ["x"]}
    _check(rule, tmp_path, **ok, index_url="https://m.example/simple/")
    _check(rule, tmp_path, **ok)  # the default index, PyPI, is listed
    _check(rule, tmp_path, manager="conda", specs=["x"], channels=["conda-forge"])
    _check(rule, tmp_path, manager="conda", specs=["x"], channels=["conda-forge/label/dev"])
    for index in ("https://m.example/simple-evil", "https://other.example/simple"):
        with pytest.raises(InvalidInput) as caught:
            _check(rule, tmp_path, **ok, index_url=index)
        assert "not among this runner's allowed package sources" in caught.value.message
    with pytest.raises(InvalidInput):
        _check(rule, tmp_path, manager="conda", specs=["x"], channels=["bioconda"])


@pytest.mark.parametrize(
    ("fields", "held"),
    [
        ({"find_links": ["/workspace/dist"]}, True),
        ({"find_links": ["file:///workspace"]}, True),
        ({"extra_index_urls": ["/workspace/idx"]}, True),
        ({"specs": ["a @ file:///workspace/a-1.0.tar.gz ; python_version>'3'"]}, True),
        ({"manager": "conda", "channels": ["file:///workspace/chan"]}, True),
        ({"manager": "cran", "repos": ["file:///workspace/repo"]}, True),
        ({"find_links": ["/tmp/y0/workspace-wheels"]}, False),
        ({"find_links": ["/workspaces/dist"]}, False),
        ({"index_url": "https://m.example/workspace/simple"}, False),
        ({"specs": ["requests"]}, False),
        ({"find_links": ["/workspace/dist"], "workspace_id": None}, False),
    ],
)
def test_only_a_source_under_workspace_makes_a_change_hold_it(
    fields: dict[str, object], held: bool
) -> None:
    """R2: ``named_workspace`` decides whether a change holds its workspace's folders, by the
    source check's own test (a path at or below /workspace), not a substring of it."""
    request = EnvironmentChangeRequest.model_validate(
        {
            "change_id": "c",
            "environment_id": "e",
            "action": "install",
            "manager": "pip",
            "workspace_id": "ws",
            **fields,
        }
    )
    assert sources.named_workspace(request) == ("ws" if held else None)
    # the control plane sends the caller's workspace by the same test (it once skipped
    # extra_index_urls and held for any "/workspace" substring)
    if fields.get("workspace_id", "ws") is not None:
        body = {k: v for k, v in fields.items() if k != "workspace_id"}
        named = names_workspace(EnvironmentChangeBody(**{"manager": "pip", "specs": ["x"], **body}))
        assert named is held
