"""mcp/common.py ``utf8_only`` (docs/files-and-transfers.md "Names that are not UTF-8"): a
tool result's strings that are not UTF-8 (PEP 383 raw bytes), in values, keys and lists at
any depth, come out in their marked form; a result that is all UTF-8 is handed on as it is,
not rebuilt (one check in C, not a Python call per string: docs/benchmarks.md §54)."""

from __future__ import annotations

from typing import Any

from shellyard.contract.rawjson import marked
from shellyard.mcp.common import for_model, utf8_only


def test_strings_not_utf8_are_marked_at_any_depth() -> None:
    raw = "caf\udce9.txt"  # b"caf\xe9.txt" read as a name
    result = {"entries": [{"path": raw, "size": 3}], raw: None, "ok": "é", "n": 1.5}
    assert utf8_only(result) == {
        "entries": [{"path": marked(raw), "size": 3}],
        marked(raw): None,
        "ok": "é",
        "n": 1.5,
    }
    assert marked(raw) == "/caf\\xe9.txt"
    assert result["entries"][0]["path"] == raw  # the caller's dict is left as it was


def test_a_result_all_utf8_is_handed_on_whole() -> None:
    result: dict[str, Any] = {"state": "completed", "stdout": "héllo\n", "tags": ["a", "b"]}
    assert utf8_only(result) is result
    text = for_model("file_list", result)
    assert text.structured_content is result
