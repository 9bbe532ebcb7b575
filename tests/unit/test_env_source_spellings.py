"""Local package sources by every spelling a pip spec takes (R2; docs/security.md "Attack pass
(session 43)"): ``name @ file:/p`` and ``name @ /p`` are held to the same rule as
``name @ file:///p``."""

from __future__ import annotations

from pathlib import Path

import pytest

from shellyard.errors import InvalidInput
from shellyard.runner.environments import sources
from shellyard.runner.protocol import EnvironmentChangeRequest


def _check(rule: sources.Allowed, root: Path, **fields: object) -> None:
    request = EnvironmentChangeRequest.model_validate(
        {"change_id": "c", "environment_id": "e", "action": "install", **fields}
    )
    sources.check_request(rule, request, runner_root=root, workspace=None)


def test_a_local_spec_url_is_checked_by_every_spelling(tmp_path: Path) -> None:
    """R2 (docs/security.md "Attack pass (session 43)"): ``name @ file:/p`` and ``name @ /p``
    name host paths as ``name @ file:///p`` does; all three are held to the local-folder rule
    and the runner's folder, and ``..`` in any of them is refused."""
    rule = sources.parse(["pypi", str(tmp_path / "allowed")])
    (tmp_path / "allowed").mkdir()
    request = {"manager": "pip", "for_agent": True}
    for target in ("file:/etc/x.whl", "/etc/x.whl", "FILE:/etc/x.whl", "file:///etc/x.whl"):
        with pytest.raises(InvalidInput, match="not in a local folder"):
            _check(rule, tmp_path / "runner", **request, specs=[f"x @ {target}"])
    with pytest.raises(InvalidInput, match="runner's own folder"):
        _check(rule, tmp_path / "allowed", **request, specs=[f"x @ {tmp_path}/allowed/a"])
    with pytest.raises(InvalidInput, match=r"without '\.\.'"):
        _check(rule, tmp_path / "runner", **request, specs=[f"x @ {tmp_path}/allowed/../b"])
    _check(rule, tmp_path / "runner", **request, specs=[f"x @ {tmp_path}/allowed/x.whl"])
