"""Object packs across runner versions (docs/runners.md "Runner versions", protocol 3): the
control plane asks a source for pack version 2 only when the importing runner reads it, and a
request without the field (an older control plane) gets version 1, which every importer
reads."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from pydantic import ValidationError

from shellyard.runner.protocol import PROTOCOL_VERSION, pack_version_for
from shellyard.runner.transport.wire import OPERATIONS, ExportRequest


def test_version_2_goes_only_to_an_importer_that_reads_it() -> None:
    assert pack_version_for(SimpleNamespace(protocol_version=2)) == 1
    assert pack_version_for(SimpleNamespace(protocol_version=1)) == 1
    assert pack_version_for(SimpleNamespace(protocol_version=3)) == 2
    assert pack_version_for(object()) == (2 if PROTOCOL_VERSION >= 3 else 1)  # this process


def test_an_export_request_without_a_version_asks_for_version_1() -> None:
    assert OPERATIONS["export_objects"].request is ExportRequest
    assert ExportRequest.model_validate({"sha256s": []}).pack_version == 1
    with pytest.raises(ValidationError):
        ExportRequest.model_validate({"sha256s": [], "pack_version": 3})
