"""The baselines' spawner (common.CleanTable): a process in a mount namespace of its own,
copied from the host's before any plane of the benchmark mounted anything and made private,
so the workspace overlays and network namespaces the planes mount later never reach it. A
bwrap spawn copies its parent's whole mount table and reads it again at each bind; spawned
beside busy planes, the minimal spawn took 4.9-6.0 ms instead of 4.0 (p50, 8 more mounts)
and the product-argv spawn 2 in parallel 121 instead of 215 /s (49 more): the baselines would
have been a host slowed by the product, not a host without it (docs/benchmarks.md §77).

Protocol, one line each way: ``minimal`` or ``bare TAG`` in, the spawn's seconds (timed here,
spawn to exit, as ``MinimalBwrap.run`` and ``BareBwrap.run`` time it) or ``error TEXT`` out;
``mounts`` in, this namespace's table size out.

    python bench/clean_table.py BARE_ROOT
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import BareBwrap, MinimalBwrap, mount_count

_CLONE_NEWNS = 0x20000
_MS_REC = 0x4000
_MS_PRIVATE = 1 << 18


def own_private_namespace() -> None:
    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    if libc.unshare(_CLONE_NEWNS) != 0:
        raise OSError(ctypes.get_errno(), "unshare(CLONE_NEWNS): the baselines need root")
    if libc.mount(None, b"/", None, _MS_REC | _MS_PRIVATE, None) != 0:
        raise OSError(ctypes.get_errno(), "making / private in the baselines' namespace")


def serve(bare_root: Path) -> None:
    own_private_namespace()
    bare, minimal = BareBwrap(bare_root), MinimalBwrap()
    print("ready", flush=True)
    for line in sys.stdin:
        what, _, tag = line.strip().partition(" ")
        try:
            if what == "minimal":
                answer = repr(minimal.run())
            elif what == "bare":
                answer = repr(bare.run(tag=tag or "0"))
            elif what == "mounts":
                answer = str(mount_count())
            else:
                answer = f"error unknown request {what!r}"
        except Exception as error:  # the asking benchmark raises it, with this text
            answer = f"error {error}".replace("\n", " ")
        print(answer, flush=True)


if __name__ == "__main__":
    serve(Path(sys.argv[1]))
