"""A worker's bundle cache kept within its limits off its tasks' way."""

from __future__ import annotations

import logging
import threading
from pathlib import Path

from gpulayer import bundles
from gpulayer.worker.threads import WORKER_THREADS

__all__ = ["CacheKeeper"]

log = logging.getLogger("gpulayer.worker")


class CacheKeeper:
    """Keeps a worker's bundle cache within its limits (:func:`gpulayer.bundles.evict_cache`)
    off its tasks' way: asked once a task extracted a new bundle, it runs in a worker thread,
    one run at a time; an ask during a run gets one more run after it."""

    def __init__(self, cache: Path) -> None:
        self.cache = cache
        self._lock = threading.Lock()
        self._running = False
        self._again = False
        self._closed = False
        #: set while no run is going on
        self._idle = threading.Event()
        self._idle.set()
        #: each run's end (tests wait on it)
        self.ran = threading.Event()

    def ask(self) -> None:
        with self._lock:
            if self._closed:
                return
            if self._running:
                self._again = True
                return
            self._running = True
            self._idle.clear()
        WORKER_THREADS.run(self._run)

    def close(self, timeout: float) -> None:
        """No more runs; wait up to ``timeout`` seconds for the one going on (a process that
        ends midway leaves a half-removed bundle, which a later run removes)."""
        with self._lock:
            self._closed = True
            self._again = False
        self._idle.wait(timeout)

    def _run(self) -> None:
        while True:
            try:
                removed = bundles.evict_cache(self.cache)
                if removed:
                    log.info("bundle cache: removed %d extracted bundle(s): %s", len(removed), ", ".join(removed))
            except Exception:  # (the next ask tries again; tasks go on meanwhile)
                log.exception("bundle cache: eviction failed")
            with self._lock:
                if not self._again:
                    self._running = False
                    self._idle.set()
                    self.ran.set()
                    return
                self._again = False
