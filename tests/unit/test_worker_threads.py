"""gpulayer.worker.threads: each call in a thread of its own, the threads reused."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from gpulayer.worker.threads import Threads


def _free(pool: Threads, n: int) -> None:
    """Until ``n`` threads are free (a thread is, once its call has returned)."""
    deadline = time.monotonic() + 10
    while pool.free != n:
        assert time.monotonic() < deadline, f"{pool.free} thread(s) free, not {n}"
        time.sleep(0.001)


def _run_and_wait(pool: Threads, fn: Callable[[], Any], free: int = 1) -> None:
    pool.run(fn)
    _free(pool, free)


def test_calls_one_after_another_reuse_one_thread() -> None:
    pool = Threads("test-reuse")
    seen: list[int] = []
    for _ in range(20):
        _run_and_wait(pool, lambda: seen.append(threading.get_ident()))
    assert len(set(seen)) == 1
    assert pool.started == 1


def test_calls_at_once_each_get_a_thread_and_none_waits_behind_another() -> None:
    pool = Threads("test-together")
    release = threading.Event()
    arrived = threading.Semaphore(0)
    idents: set[int] = set()
    lock = threading.Lock()

    def blocked() -> None:
        with lock:
            idents.add(threading.get_ident())
        arrived.release()
        release.wait(10)

    for _ in range(3):
        pool.run(blocked)
    for _ in range(3):  # all three run at once: none is queued behind a blocked one
        assert arrived.acquire(timeout=10)
    assert len(idents) == 3 and pool.started == 3
    release.set()
    _free(pool, 3)
    # once they are free, the next calls go to them: no fourth thread
    for _ in range(5):
        _run_and_wait(pool, lambda: None, free=3)
    assert pool.started == 3


def test_a_call_that_raises_leaves_its_thread_serving() -> None:
    pool = Threads("test-raise")

    def boom() -> None:
        raise RuntimeError("boom")

    _run_and_wait(pool, boom)
    seen: list[str] = []
    _run_and_wait(pool, lambda: seen.append(threading.current_thread().name))
    assert seen == ["test-raise-1"]
    assert pool.started == 1
