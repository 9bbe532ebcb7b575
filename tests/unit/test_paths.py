"""W6: every path is relative to the workspace root; escapes are refused with a clear error."""

from __future__ import annotations

import pytest

from shellyard.errors import InvalidInput, PathRefused
from shellyard.paths import MAX_COMPONENT_BYTES, MAX_PATH_BYTES, normalize_relative


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ("", ""),
        (".", ""),
        ("./", ""),
        ("./.", ""),
        ("a", "a"),
        ("a/", "a"),
        ("a//b/./c/", "a/b/c"),
        ("a/../b", "b"),
        ("a/b/..", "a"),
        ("a/b/../../c", "c"),
        ("a/..", ""),
        ("..foo/bar..", "..foo/bar.."),
        ("a/...", "a/..."),
        ("dir with spaces/ü.txt", "dir with spaces/ü.txt"),
        ("back\\slash", "back\\slash"),
        ("~/x", "~/x"),
    ],
)
def test_w6_normalizes_relative_paths(given: str, expected: str) -> None:
    assert normalize_relative(given) == expected


def test_w6_absolute_path_refused_with_a_relative_suggestion() -> None:
    with pytest.raises(PathRefused) as info:
        normalize_relative("/etc/passwd")
    message = str(info.value)
    assert "absolute" in message
    assert "'etc/passwd'" in message  # says what to pass instead
    assert info.value.code == "path_refused"
    assert isinstance(info.value, InvalidInput)


@pytest.mark.parametrize("given", ["..", "../x", "a/../../x", "./../x", "a/b/../../../etc"])
def test_w6_dotdot_leaving_the_root_refused(given: str) -> None:
    with pytest.raises(PathRefused, match=r"'\.\.' to leave the workspace root"):
        normalize_relative(given)


def test_w6_nul_byte_refused() -> None:
    with pytest.raises(PathRefused, match="NUL byte"):
        normalize_relative("a\0b")


def test_w6_component_length_counted_in_bytes() -> None:
    assert normalize_relative("x" * MAX_COMPONENT_BYTES) == "x" * MAX_COMPONENT_BYTES
    with pytest.raises(PathRefused, match="256 bytes"):
        normalize_relative("d/" + "x" * (MAX_COMPONENT_BYTES + 1))
    # 128 two-byte characters: 128 characters but 256 bytes
    with pytest.raises(PathRefused, match="at most 255 bytes"):
        normalize_relative("é" * 128)


def test_w6_total_length_limit() -> None:
    ok = "/".join(["x" * 200] * 20)
    ok += "/" + "y" * (MAX_PATH_BYTES - len(ok) - 1)
    assert len(ok) == MAX_PATH_BYTES
    assert normalize_relative(ok) == ok
    with pytest.raises(PathRefused, match="4097 bytes long"):
        normalize_relative(ok + "z")


def test_w6_non_text_refused() -> None:
    with pytest.raises(PathRefused, match="must be a string"):
        normalize_relative(b"a/b")  # type: ignore[arg-type]
    with pytest.raises(PathRefused, match="unpaired surrogate"):
        normalize_relative("a/\ud800")


def test_w6_undecodable_file_names_round_trip() -> None:
    """Names that are not UTF-8 arrive as surrogate escapes (os.fsdecode) and stay usable."""
    name = "bad\udcff.bin"
    assert normalize_relative(f"dir/{name}") == f"dir/{name}"


def test_w6_a_sandbox_path_suggests_its_workspace_relative_form() -> None:
    """R2: commands see the workspace at /workspace; a file path copied from a command's
    output is refused with the relative path that names the same file."""
    with pytest.raises(PathRefused, match=r"pass 'src/main\.py'"):
        normalize_relative("/workspace/src/main.py")


def test_the_marked_form_of_a_name_that_is_not_utf8_round_trips_and_takes_nothing_else() -> None:
    """docs/files-and-transfers.md "Names that are not UTF-8": ``/`` + escape names the raw
    bytes through strict UTF-8 doors (MCP, a URL's query); an absolute path, a real name
    holding ``\\x`` text, or a broken escape keeps its old meaning (refused or itself)."""
    from shellyard.contract.rawjson import marked
    from shellyard.paths import PathRefused, escape, from_marked

    for name in ["n/caf\udce9.txt", "a\\b/\udcff\udc80x", "\udc80"]:
        assert marked(name) == "/" + escape(name)
        assert from_marked(marked(name)) == name
        assert normalize_relative(marked(name)) == name
    assert marked("plain\\x41") == "plain\\x41"
    for text in ["/etc/x", "/a\\x41", "/a\\x", "/a\\xzz", "/a\\xe9\\", "/a\\\\xe9"]:
        assert from_marked(text) is None
        with pytest.raises(PathRefused, match="absolute"):
            normalize_relative(text)
