"""A runner object's background thread ends with its owner (runner/reaper.py; R2, E11: the
threads of limits/cgroups.py, own_mounts.py and prefix_mounts.py). Real threads; every wait
is bounded by an event the test sets, never a measured duration."""

from __future__ import annotations

import queue
import threading

import pytest

from shellyard.runner.reaper import Reaper, every

pytestmark = pytest.mark.timeout(60)


def named(name: str) -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == name]


def test_a_periodic_reaper_ends_at_stop_without_waiting_its_interval() -> None:
    """``stop`` wakes the loop's sleep: a reaper whose next round is an hour away ends within
    the join's bound (before, a stop waited out the sleep or, with no stop, never ended)."""
    rounds: list[int] = []
    reaper = every("test-every", lambda: rounds.append(1), lambda: 3600.0)
    assert named("test-every")
    assert reaper.stop() is True
    assert not named("test-every") and rounds == []
    assert reaper.stop() is True  # twice: nothing to end


def test_queued_work_is_done_before_the_thread_ends_and_a_later_start_takes_more() -> None:
    """A loop fed by a queue (the cgroup tree's removal thread): the stop item goes in behind
    the work handed over before it, which is all done when ``stop`` returns; work handed over
    after the stop starts a thread again, and the next ``stop`` ends that one too."""
    items: queue.Queue[int | None] = queue.Queue()
    gate = threading.Event()
    done: list[int] = []

    def loop(reaper: Reaper) -> None:
        while True:
            item = items.get()
            if item is None:
                if reaper.leaving():
                    return
                continue
            gate.wait(30)
            done.append(item)

    reaper = Reaper("test-queue", loop, lambda: items.put(None))
    for item in (1, 2, 3):
        items.put(item)
        reaper.start()
    assert len(named("test-queue")) == 1  # one thread, however many hand-overs
    gate.set()
    assert reaper.stop() is True
    assert done == [1, 2, 3] and not named("test-queue")
    items.put(4)
    reaper.start()
    assert reaper.stop() is True
    assert done == [1, 2, 3, 4] and not named("test-queue")


def test_a_start_while_the_thread_is_on_its_way_out_keeps_it_going() -> None:
    """Work handed over between a stop and the loop's last look (a ``remove`` racing the
    tree's ``close``) is not left with no thread: the ``start`` clears the stop, and the loop,
    deciding under the same lock, goes on and takes it."""
    items: queue.Queue[int | None] = queue.Queue()
    looking = threading.Event()
    resume = threading.Event()
    done: list[int] = []

    def loop(reaper: Reaper) -> None:
        while True:
            item = items.get()
            if item is None:
                looking.set()
                resume.wait(30)  # between the stop item and its decision
                if reaper.leaving():
                    return
                continue
            done.append(item)

    reaper = Reaper("test-race", loop, lambda: items.put(None))
    reaper.start()
    stopped: list[bool] = []
    stopper = threading.Thread(target=lambda: stopped.append(reaper.stop(0.2)))
    stopper.start()
    assert looking.wait(30)
    items.put(7)
    reaper.start()  # the thread is still there: it stays
    resume.set()
    stopper.join(30)
    assert stopped == [False]  # it went on: that stop waited its bound and gave up
    assert reaper.stop() is True
    assert done == [7] and not named("test-race")


def test_a_stop_from_the_thread_itself_does_not_wait_for_itself() -> None:
    """A callback on the thread that closes its owner (the cgroup tree runs ``when_ready``
    callbacks there): ``stop`` returns at once (a thread cannot join itself: RuntimeError)
    and the loop ends at its next look."""
    answers: list[bool] = []
    asked = threading.Event()

    def loop(reaper: Reaper) -> None:
        answers.append(reaper.stop())
        asked.set()
        answers.append(reaper.wait(30) and reaper.leaving())

    reaper = Reaper("test-self", loop)
    reaper.start()
    assert asked.wait(30)
    assert reaper.stop() is True  # from outside: joined
    assert answers == [False, True] and not named("test-self")


def test_a_stop_that_cannot_end_the_thread_gives_up_at_its_bound() -> None:
    """A round stuck in the kernel (an ``rmdir`` on cgroup_mutex): ``stop`` waits at most its
    bound, says False and leaves the daemon thread to end on its own."""
    release = threading.Event()

    def loop(reaper: Reaper) -> None:
        release.wait(30)
        reaper.wait(30)
        reaper.leaving()

    reaper = Reaper("test-stuck", loop)
    reaper.start()
    assert reaper.stop(0.01) is False
    release.set()
    assert reaper.stop() is True and not named("test-stuck")
