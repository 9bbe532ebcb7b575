"""The OpenAPI document is accurate (issue 6): schemathesis generates requests for every
operation of a real server (its own process, a fresh home, the admin token) and checks that
none answers 5xx and that every answer — success or error — matches the declared schema.

Deterministic (``derandomize``) and bounded: a few examples per operation. Long-poll
parameters are bounded by the document itself (``timeout_s`` ≤ 30, ``wait_s`` ≤ 60 or 3600
with a writer queue); random ids name no object, so those calls answer at once.
The wake stream (server-sent events) is excluded: for a real session it streams until the
client hangs up, which is not a request/response the checks can judge; its error answers
(unknown session) are checked by ``test_wake_stream_errors_match_the_document``."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error, response_schema_conformance

from conftest import make_home
from shellyard.home import ensure_server, is_served, read_info

SSE_PATH = "/v1/sessions/{session_id}/wakes/stream"


@pytest.fixture(scope="module")
def server() -> Iterator[tuple[str, dict[str, str]]]:
    home = make_home()
    info = ensure_server(home)
    yield info.url, {"Authorization": f"Bearer {info.token}"}
    current = read_info(home)
    if current is not None and is_served(home):
        os.kill(current.pid, signal.SIGTERM)


def _summary(exc: BaseException) -> str:
    """One line per failure found: what and how to reproduce (the curl line)."""
    found = exc.exceptions if isinstance(exc, BaseExceptionGroup) else [exc]
    lines = []
    for failure in found:
        text = str(failure).strip().splitlines()
        lines.append(" | ".join(line.strip() for line in text[:3] if line.strip()))
    curl = [line.strip() for line in str(exc).splitlines() if "curl " in line]
    return "; ".join(lines) + (f" ({curl[0]})" if curl else "")


def _operations(url: str, auth: dict[str, str]) -> list[Any]:
    document = httpx.get(f"{url}/openapi.json", headers=auth).json()
    schema = schemathesis.openapi.from_dict(document)
    schema.config.update(base_url=url)
    return [result.ok() for result in schema.exclude(path=SSE_PATH).get_all_operations()]


@pytest.mark.timeout(600)
def test_every_operation_matches_the_document(server: tuple[str, dict[str, str]]) -> None:
    """For every operation, inputs valid by the document (positive) and invalid ones
    (negative): no 5xx, and every answer's body matches the schema declared for its status.
    All operations run even when one fails; the failures are listed together."""
    url, auth = server
    operations = _operations(url, auth)
    assert len(operations) > 40
    failures: list[str] = []
    for operation in operations:
        for mode, examples in ((GenerationMode.POSITIVE, 5), (GenerationMode.NEGATIVE, 3)):

            @given(case=operation.as_strategy(generation_mode=mode))
            @settings(
                max_examples=examples,
                derandomize=True,
                deadline=None,
                database=None,
                phases=[Phase.explicit, Phase.generate],
                suppress_health_check=list(HealthCheck),
            )
            def check(case: Any) -> None:
                case.call_and_validate(
                    headers=auth,
                    timeout=60,
                    checks=[not_a_server_error, response_schema_conformance],
                )

            try:
                check()
            except Unsatisfiable:
                pass  # negative mode: the operation has no input that can be made invalid
            except BaseException as exc:  # schemathesis's FailureGroup is no Exception
                if isinstance(exc, KeyboardInterrupt):
                    raise
                failures.append(f"{operation.label} [{mode.value}]: {_summary(exc)}")
    assert not failures, "\n".join(failures)


def test_document_declares_errors_and_models(server: tuple[str, dict[str, str]]) -> None:
    """Every operation declares a success schema and the error body for 400/401/403/404/409/
    413/503/507 (the request bounds' 413 ``too_large`` and the full disk's 507 ``store_full`` /
    ``out_of_room`` included, docs/security.md "Limits at each door"), so a generated client
    knows them; nothing is left to FastAPI's default 422 shape, which this API never sends."""
    url, auth = server
    document = httpx.get(f"{url}/openapi.json", headers=auth).json()
    assert "HTTPValidationError" not in document["components"]["schemas"]
    for path, item in document["paths"].items():
        for method, operation in item.items():
            responses = operation["responses"]
            for status in ("400", "401", "403", "404", "409", "413", "503", "507"):
                ref = responses[status]["content"]["application/json"]["schema"]["$ref"]
                assert ref.endswith("/ErrorBody"), (method, path, status)
            ok = responses.get("200") or responses.get("201")
            assert ok is not None and ok.get("content"), (method, path)
            schemas = [c.get("schema") or c.get("itemSchema") for c in ok["content"].values()]
            assert all(s for s in schemas), f"{method} {path} has no success schema"


def test_wake_stream_errors_match_the_document(server: tuple[str, dict[str, str]]) -> None:
    url, auth = server
    missing = httpx.get(f"{url}/v1/sessions/ses_nope/wakes/stream", headers=auth)
    assert missing.status_code == 404
    assert missing.json()["error"]["code"] == "not_found"
    anonymous = httpx.get(f"{url}/v1/sessions/ses_nope/wakes/stream")
    assert anonymous.status_code == 401
    assert anonymous.json()["error"]["code"] == "unauthorized"
