"""A process's memory as /proc reports it, for the tests that bound it (imported from
tests/support, on sys.path)."""

from __future__ import annotations


def _status_bytes(pid: int | str, field: str) -> int:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise AssertionError(f"no {field} in /proc/{pid}/status")


def resident(pid: int | str = "self") -> int:
    """The process's resident size now (VmRSS), in bytes."""
    return _status_bytes(pid, "VmRSS")


def peak_resident(pid: int | str = "self") -> int:
    """The process's peak resident size (VmHWM), in bytes."""
    return _status_bytes(pid, "VmHWM")


def reset_peak(pid: int | str = "self") -> None:
    """Start VmHWM again from the resident size now (Linux >= 4.0): a peak read after is the
    caller's."""
    with open(f"/proc/{pid}/clear_refs", "w") as refs:
        refs.write("5")
