"""S1: ``max_output_length`` caps the characters of ALL output of a ``shell_call`` together.

The output is seen as one character stream made of segments in a fixed order (command 1's
stdout, command 1's stderr, command 2's stdout, ...). When the stream is longer than the cap,
its head and its tail are kept and one marker stands where the characters were left out; the
marker counts toward the cap, so the whole output never exceeds it (the Agents SDK cuts
anything longer again, head only, which would lose the tail). Text is fed in pages and memory
stays bounded by twice the cap, whatever the logs hold.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

#: The cap when a ``shell_call`` names none (the inline default of ``run_shell``, E12).
DEFAULT_CAP = 30_000
#: The most characters held in memory for one call, whatever ``max_output_length`` says.
MAX_CAP = 10_000_000


def omission_marker(omitted: int) -> str:
    return f"\n[... {omitted} characters omitted ...]\n"


def _marker_for(total: int, cap: int) -> str | None:
    """The marker whose own length is included in what it reports as omitted, or None when the
    cap is too small to hold a marker and a character on each side."""
    omitted = total - cap
    for _ in range(8):  # the marker's digit count settles within a step or two
        marker = omission_marker(omitted)
        settled = total - (cap - len(marker))
        if settled == omitted:
            break
        omitted = settled
    if cap - len(marker) < 2:
        return None
    return marker


@dataclass
class _Piece:
    segment: int
    start: int  # position of the piece's first character in the whole stream
    text: str


@dataclass
class OutputCap:
    """Collects the segments of a call's output within ``cap`` characters."""

    cap: int
    total: int = 0
    _head: list[_Piece] = field(default_factory=list)
    _head_len: int = 0
    _tail: deque[_Piece] = field(default_factory=deque)
    _tail_len: int = 0
    _bounds: dict[int, tuple[int, int]] = field(default_factory=dict)

    def add(self, segment: int, text: str) -> None:
        """Append ``text`` to ``segment``; segments must be fed in their final order."""
        start, _end = self._bounds.get(segment, (self.total, self.total))
        if not text:
            self._bounds[segment] = (start, self.total)
            return
        if self._head_len < self.cap:
            kept = text[: self.cap - self._head_len]
            self._head.append(_Piece(segment, self.total, kept))
            self._head_len += len(kept)
        self._tail.append(_Piece(segment, self.total, text))
        self._tail_len += len(text)
        while self._tail_len - len(self._tail[0].text) >= self.cap:
            self._tail_len -= len(self._tail.popleft().text)
        extra = self._tail_len - self.cap
        if extra > 0:
            first = self._tail[0]
            self._tail[0] = _Piece(first.segment, first.start + extra, first.text[extra:])
            self._tail_len -= extra
        self.total += len(text)
        self._bounds[segment] = (start, self.total)

    @property
    def cut(self) -> bool:
        return self.total > self.cap

    def texts(self, segments: int) -> list[str]:
        """The kept text of segments ``0 .. segments-1``."""
        parts: list[list[str]] = [[] for _ in range(segments)]
        if not self.cut:
            for piece in self._head:
                parts[piece.segment].append(piece.text)
            return ["".join(p) for p in parts]
        marker = _marker_for(self.total, self.cap)
        room = self.cap - len(marker) if marker is not None else self.cap
        head_len = room if marker is None else room // 2
        tail_from = self.total - (room - head_len)
        for piece in self._head:
            if piece.start < head_len:
                parts[piece.segment].append(piece.text[: head_len - piece.start])
        if marker is not None:
            parts[self._segment_at(head_len)].append(marker)
        for piece in self._tail:
            end = piece.start + len(piece.text)
            if end > tail_from:
                parts[piece.segment].append(piece.text[max(0, tail_from - piece.start) :])
        return ["".join(p) for p in parts]

    def _segment_at(self, position: int) -> int:
        """The segment holding the character at ``position`` (the first one left out)."""
        for segment, (start, end) in sorted(self._bounds.items()):
            if start <= position < end:
                return segment
        return max(self._bounds)
