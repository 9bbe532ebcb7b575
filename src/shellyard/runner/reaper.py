"""A runner object's background thread, ended by its owner's ``close``: the removal thread
of the cgroup tree (``cgroup-remove``, limits/cgroups.py) and the unmount threads of the
workspace and prefix overlays (``own-mounts``, own_mounts.py; ``prefixes``,
prefix_mounts.py).

Each was a daemon thread that nothing ended: a closed runner left its ``cgroup-remove``
thread behind (11 in one test process of test_cold_spawn.py and test_attack_pass_48.py),
holding the closed tree alive. Here the owner's ``close`` calls ``stop``: the stop is set,
``wake`` rouses a loop that waits on something else than the stop (the cgroup tree's queue:
its stop item goes in behind the work queued before it), and the thread is joined for at
most ``STOP_WAIT_S``. What an owner leaves undone at its close is the owner's to say
(docs/limits.md "Groups go with their execution", docs/security.md "Host paths").

Never joined from itself (a callback on the thread that closes its owner): it ends when its
loop next looks. An owner used after its close (the next ``remove`` of a closed cgroup tree)
calls ``start`` again: a thread still on its way out goes on instead (its stop cleared under
the lock its loop decides under, ``leaving``), otherwise a new one starts; so no work handed
over is left with no thread, and no two threads take the same work.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

log = logging.getLogger(__name__)

#: How long ``stop`` waits for the thread (a round in progress: an ``rmdir`` waiting on the
#: kernel's cgroup_mutex, 18 ms at p90 under load; an unmount, 8-20 ms). Past it the thread
#: is left to end on its own (a daemon) and the stop says so (logged).
STOP_WAIT_S = 5.0


class Reaper:
    """One owner's thread named ``name`` running ``loop(self)`` from ``start`` until
    ``stop``. The loop ends when ``leaving()`` says so: it asks after ``wait`` returns True
    or after the item ``wake`` gave it."""

    def __init__(
        self,
        name: str,
        loop: Callable[[Reaper], None],
        wake: Callable[[], None] | None = None,
    ) -> None:
        self.name = name
        self._loop = loop
        self._wake = wake
        #: guards the three below: ``start``, ``stop`` and ``leaving`` decide under it
        self._lock = threading.Lock()
        self._stop = threading.Event()
        #: the last thread started (kept after it left: ``stop`` still joins its last steps)
        self._thread: threading.Thread | None = None
        #: whether that thread has decided to end (a ``start`` then makes a new one)
        self._left = True

    def start(self) -> None:
        """Running from now on (a no-op while it runs; again after a ``stop``)."""
        with self._lock:
            self._stop.clear()  # one on its way out that has not left yet stays
            if not self._left:
                return
            self._left = False
            self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
            self._thread.start()

    def _run(self) -> None:
        try:
            self._loop(self)
        finally:  # a loop that raised: the next ``start`` makes a new thread
            with self._lock:
                if self._thread is threading.current_thread():
                    self._left = True

    def wait(self, timeout: float | None) -> bool:
        """Sleep ``timeout`` seconds or until ``stop``; True: stopped (then ask ``leaving``)."""
        return self._stop.wait(timeout)

    def leaving(self) -> bool:
        """Whether the loop ends now (its last decision: a ``start`` after it makes a new
        thread; one before it keeps this one going)."""
        with self._lock:
            if not self._stop.is_set():
                return False
            if self._thread is threading.current_thread():
                self._left = True
            return True

    def stop(self, timeout: float = STOP_WAIT_S) -> bool:
        """The thread ends; True once it has (at once if none ran). From the thread itself:
        False, not waited for (it ends when its loop next looks)."""
        with self._lock:
            thread, running = self._thread, not self._left
            if running:
                self._stop.set()
        if thread is None:
            return True
        if running and self._wake is not None:
            self._wake()
        if thread is threading.current_thread():
            return False
        thread.join(timeout)
        if thread.is_alive():
            log.warning(
                "the %s thread did not end within %.1f s of its owner's close", self.name, timeout
            )
            return False
        return True


def every(name: str, reap: Callable[[], object], interval: Callable[[], float]) -> Reaper:
    """A started ``Reaper`` that calls ``reap`` every ``interval()`` seconds until ``stop``
    (which wakes its sleep); an ``OSError`` from one round is logged and the next round
    tries again (an unmount refused now, a hold adopts the overlay meanwhile)."""

    def loop(reaper: Reaper) -> None:
        while True:
            if reaper.wait(interval()):
                if reaper.leaving():
                    return
                continue
            try:
                reap()
            except OSError:
                log.exception("the %s thread: a round failed (the next one tries again)", name)

    reaper = Reaper(name, loop)
    reaper.start()
    return reaper
