"""A bounded pre-scan of a tar upload, between the request body and ``tarfile`` (R2, T1;
docs/security.md "Limits at each door").

``tarfile`` of the Python this service runs on trusts the archive: a pax header's records are
parsed with regular expressions that take quadratic time on long runs of digits
(CVE-2024-6232), and pax and GNU long-name payloads of any declared size are read whole into
memory. Both run under the GIL, so one small upload could stall every client of the server.

:class:`BoundedTar` is the file object ``tarfile`` reads (mode ``r|``). It decompresses the
stream itself (gzip, bzip2, xz, as ``r|*`` would; the output is pulled in bounded pieces, so a
compression bomb is never expanded past what the limits allow) and walks the 512-byte headers
as they pass, before ``tarfile`` sees them. It refuses, with what was wrong:

- a header whose checksum is wrong or whose numbers do not parse (``tarfile`` would too);
- a pax header (``x``/``g``) larger than :data:`MAX_PAX_BYTES`, records that are not
  ``"<length> <keyword>=<value>\\n"`` filling it exactly, a run of more than
  :data:`MAX_DIGIT_RUN` digits (what makes the regular expressions slow), GNU sparse keywords,
  a global ``size``;
- a GNU long name or long link (``L``/``K``) larger than :data:`MAX_LONGNAME_BYTES`;
- more than :data:`MAX_META_CHAIN` such headers in a row (``tarfile`` recurses on each);
- sparse members and member types ``tarfile`` does not know (their data would be guessed);
- more members than ``max_entries`` or file contents declared larger in total than
  ``max_bytes`` (the room left under the workspace quota), each before any byte of that
  member is written.

Everything the scan let through is exactly what ``tarfile`` parses: the same header fields,
the same rule for which members carry data blocks, the same pax ``size`` override. The scan is
linear in the bytes and keeps at most one pax payload in memory.

A subprocess with rlimits was the other way: it costs a process start per upload and still
needs the same decompression bound; the scan does one pass over bytes already in hand.
"""

from __future__ import annotations

import bz2
import lzma
import re
import zlib
from dataclasses import dataclass
from typing import Protocol

from shellyard.errors import InvalidInput, TooLarge

BLOCK = 512
#: Largest pax header payload (``x`` or ``g``): room for a path and a link target of
#: PATH_MAX each and the usual times, ids and names.
MAX_PAX_BYTES = 64 * 1024
#: Longest run of ASCII digits inside a pax payload: times and sizes need about twenty;
#: ``tarfile``'s ``\d+ hdrcharset=`` search costs the square of each run.
MAX_DIGIT_RUN = 64
#: Largest GNU long name or long link payload.
MAX_LONGNAME_BYTES = 16 * 1024
#: Most pax / long-name headers before one member.
MAX_META_CHAIN = 4
#: Most bytes of global (``g``) pax payloads in one archive (``tarfile`` keeps them all).
MAX_GLOBAL_BYTES = 64 * 1024
#: Default most members of one upload.
MAX_UPLOAD_ENTRIES = 100_000
#: Decompressed bytes produced per step (bounds a compression bomb's memory).
_PIECE = 1 << 20

_REGULAR = frozenset({b"0", b"\0", b"7"})
_NO_DATA = frozenset({b"1", b"2", b"3", b"4", b"5", b"6"})
_META = frozenset({b"x", b"g", b"L", b"K"})
_DIGITS = re.compile(rb"[0-9]{%d}" % (MAX_DIGIT_RUN + 1))
_ZERO = bytes(BLOCK)


class Source(Protocol):
    def read(self, n: int = -1, /) -> bytes: ...


@dataclass(frozen=True)
class TarLimits:
    """``max_bytes``: most bytes of file content (None: no bound; the room left under the
    workspace quota, docs/limits.md); ``max_entries``: members."""

    max_bytes: int | None = None
    max_entries: int = MAX_UPLOAD_ENTRIES


def _refuse(what: str, offset: int) -> InvalidInput:
    return InvalidInput(
        f"the upload is not a tar archive this service unpacks: {what} (at byte {offset} of "
        f"the unpacked stream); send a plain tar stream (for example `tar -c -C FOLDER .`, "
        f"optionally gzip-, bzip2- or xz-compressed); nothing was unpacked"
    )


def _number(field: bytes, what: str, offset: int) -> int:
    """A header number as ``tarfile.nti`` reads it (octal, or GNU base-256)."""
    if field and field[0] in (0o200, 0o377):
        n = 0
        for byte in field[1:]:
            n = (n << 8) + byte
        return n - (256 ** (len(field) - 1)) if field[0] == 0o377 else n
    text = field.split(b"\0", 1)[0].strip()
    try:
        return int(text.decode("ascii") or "0", 8)
    except ValueError:
        raise _refuse(f"the header's {what} field {text[:20]!r} is not a number", offset) from None


def _checksum_ok(block: bytes, offset: int) -> bool:
    stored = _number(block[148:156], "checksum", offset)
    rest = block[:148] + block[156:]
    unsigned = 256 + sum(rest)
    signed = 256 + sum(b - 256 if b > 127 else b for b in rest)
    return stored in (unsigned, signed)


def _pax_records(payload: bytes, offset: int) -> dict[str, bytes]:
    """The records of a pax payload, checked to be well formed and to fill it exactly."""
    if _DIGITS.search(payload):
        raise _refuse(f"a pax header has a run of more than {MAX_DIGIT_RUN} digits", offset)
    records: dict[str, bytes] = {}
    pos = 0
    while pos < len(payload):
        space = payload.find(b" ", pos, pos + 8)
        digits = payload[pos:space] if space > pos else b""
        if not digits.isdigit():
            raise _refuse("a pax record does not start with its length", offset)
        length = int(digits)
        end = pos + length
        record = payload[space + 1 : end]
        equals = record.find(b"=")
        if end > len(payload) or length <= len(digits) + 1 or not record.endswith(b"\n"):
            raise _refuse("a pax record's length does not match its text", offset)
        if equals <= 0:
            raise _refuse("a pax record has no keyword", offset)
        records[record[:equals].decode("utf-8", "surrogateescape")] = record[equals + 1 : -1]
        pos = end
    return records


class _Inflate:
    """The decompressed stream, pulled in pieces of at most :data:`_PIECE` bytes."""

    def __init__(self, source: Source) -> None:
        self._source = source
        self._first = source.read(BLOCK)
        head = self._first
        self._zlib: zlib._Decompress | None = None
        self._other: bz2.BZ2Decompressor | lzma.LZMADecompressor | None = None
        if head.startswith(b"\x1f\x8b\x08"):
            self._zlib = zlib.decompressobj(16 + zlib.MAX_WBITS)
        elif head.startswith(b"BZh91"):
            self._other = bz2.BZ2Decompressor()
        elif head.startswith((b"\x5d\x00\x00\x80", b"\xfd7zXZ")):
            self._other = lzma.LZMADecompressor()
        self._tail = b""  # compressed input not yet given to the codec (zlib)

    def _raw(self) -> bytes:
        if self._first:
            data, self._first = self._first, b""
            return data
        return self._source.read(_PIECE)

    def piece(self) -> bytes:
        """The next decompressed bytes; b"" at the end."""
        while True:
            if self._zlib is not None:
                if self._zlib.eof:
                    return b""
                data = self._tail or self._raw()
                if not data:
                    return self._zlib.flush()
                out = self._zlib.decompress(data, _PIECE)
                self._tail = self._zlib.unconsumed_tail
            elif self._other is not None:
                codec = self._other
                if codec.eof:
                    return b""
                data = self._raw() if codec.needs_input else b""
                if codec.needs_input and not data:
                    return b""
                try:
                    out = codec.decompress(data, _PIECE)
                except (OSError, lzma.LZMAError) as exc:
                    raise InvalidInput(
                        f"the upload's compressed stream is damaged ({exc}); nothing was unpacked"
                    ) from None
            else:
                return self._raw()
            if out:
                return out


class BoundedTar:
    """The file object ``tarfile.open(fileobj=…, mode="r|")`` reads: the upload, decompressed
    and checked header by header (see the module's text)."""

    def __init__(self, source: Source, limits: TarLimits) -> None:
        self._limits = limits
        try:
            self._inflate = _Inflate(source)
        except zlib.error as exc:
            raise InvalidInput(f"the upload's gzip stream is damaged ({exc})") from None
        self._pending = bytearray()  # decompressed, not yet scanned
        self._out = bytearray()  # scanned, not yet read by tarfile
        self._offset = 0  # of the next scanned byte in the decompressed stream
        self._data_left = 0  # bytes of member data (with padding) still to pass
        self._meta: tuple[bytes, int] | None = None  # (type, payload size) awaited
        self._chain = 0
        self._x_before = False
        self._globals = 0
        self._pax_size: int | None = None
        self._entries = 0
        self._bytes = 0
        self._ended = False
        self._eof = False

    # ------------------------------------------------------------------ file object

    def read(self, n: int = -1) -> bytes:
        while not self._eof and (n < 0 or len(self._out) < n):
            self._step()
        if n < 0:
            n = len(self._out)
        out = bytes(self._out[:n])
        del self._out[:n]
        return out

    def readable(self) -> bool:
        return True

    # ------------------------------------------------------------------ the scan

    def _fill(self, want: int) -> bool:
        while len(self._pending) < want:
            try:
                piece = self._inflate.piece()
            except zlib.error as exc:
                raise InvalidInput(
                    f"the upload's gzip stream is damaged ({exc}); nothing was unpacked"
                ) from None
            if not piece:
                return False
            self._pending += piece
        return True

    def _pass(self, n: int) -> None:
        self._out += self._pending[:n]
        del self._pending[:n]
        self._offset += n

    def _step(self) -> None:
        if self._ended:
            self._eof = True  # what follows the end marker is never read
            return
        if self._data_left:
            if not self._pending and not self._fill(1):
                self._eof = True
                return
            n = min(self._data_left, len(self._pending))
            self._data_left -= n
            self._pass(n)
            return
        if self._meta is not None:
            kind, size = self._meta
            padded = -(-size // BLOCK) * BLOCK
            if not self._fill(padded):
                self._pass(len(self._pending))
                self._eof = True
                return
            if kind in (b"x", b"g"):
                self._check_pax(kind, bytes(self._pending[:size]))
            self._meta = None
            self._pass(padded)
            return
        if not self._fill(BLOCK):
            self._pass(len(self._pending))  # tarfile reports the truncation
            self._eof = True
            return
        self._header(bytes(self._pending[:BLOCK]))
        self._pass(BLOCK)

    def _header(self, block: bytes) -> None:
        at = self._offset
        if block == _ZERO:
            self._ended = True
            return
        if not _checksum_ok(block, at):
            raise _refuse("a header's checksum is wrong", at)
        kind = block[156:157]
        size = _number(block[124:136], "size", at)
        if size < 0:
            raise _refuse("a header declares a negative size", at)
        if kind in _META:
            self._chain += 1
            if self._chain > MAX_META_CHAIN:
                raise _refuse(f"more than {MAX_META_CHAIN} extended headers in a row", at)
            bound = MAX_LONGNAME_BYTES if kind in (b"L", b"K") else MAX_PAX_BYTES
            if size > bound:
                raise _refuse(
                    f"an extended header ({kind.decode()}) of {size} bytes, more than {bound}",
                    at,
                )
            if kind == b"x":
                if self._x_before:
                    raise _refuse("two pax headers for one member", at)
                self._x_before = True
            if kind == b"g":
                self._globals += size
                if self._globals > MAX_GLOBAL_BYTES:
                    raise _refuse(f"global pax headers of more than {MAX_GLOBAL_BYTES} bytes", at)
            self._meta = (kind, size)
            return
        self._chain = 0
        self._x_before = False
        if self._pax_size is not None:
            size, self._pax_size = self._pax_size, None
        name = block[:100].split(b"\0", 1)[0]
        if kind in _REGULAR and not (kind == b"\0" and name.endswith(b"/")):
            carries = size
        elif kind in _NO_DATA or kind == b"\0":
            carries = 0
        elif kind == b"S":
            raise _refuse("the archive has a sparse file; archive it without --sparse", at)
        else:
            raise _refuse(f"a member of type {kind!r}, which this service does not unpack", at)
        self._entries += 1
        if self._entries > self._limits.max_entries:
            raise TooLarge(
                f"the upload has more than {self._limits.max_entries} entries, the most one "
                f"upload may hold; split it into several uploads; nothing was unpacked",
                limit=self._limits.max_entries,
            )
        self._bytes += carries
        if self._limits.max_bytes is not None and self._bytes > self._limits.max_bytes:
            raise TooLarge(
                f"the upload's files hold more than {self._limits.max_bytes} bytes, the room "
                f"left under the workspace quota; upload less or free room (delete files); "
                f"nothing was unpacked",
                limit=self._limits.max_bytes,
            )
        self._data_left = -(-carries // BLOCK) * BLOCK

    def _check_pax(self, kind: bytes, payload: bytes) -> None:
        at = self._offset
        records = _pax_records(payload, at)
        if any(key.startswith("GNU.sparse.") for key in records):
            raise _refuse("the archive has a sparse file; archive it without --sparse", at)
        if "size" not in records:
            return
        if kind == b"g":
            raise _refuse("a global pax header sets a size", at)
        raw = records["size"]
        try:  # as tarfile reads it: a value that does not parse counts as 0
            value = int(raw.decode("utf-8", "surrogateescape"))
        except ValueError:
            value = 0
        if value < 0:
            raise _refuse("a pax header declares a negative size", at)
        self._pax_size = value


__all__ = ["MAX_UPLOAD_ENTRIES", "BoundedTar", "TarLimits"]
