"""Pausing Python's automatic garbage collection while a pass builds its output.

A pass allocates objects that outlive it (a decision per job, a grant per node) on top of a
heap that its inputs already fill (10,000 worker records and 100,000 queued specs are some
400,000 tracked objects). The cyclic collector counts allocations, not garbage: every few
tens of thousands of new objects it runs a full collection over the whole heap, which in a
100,000-job pass was four full collections and 60% of the pass's time. Nothing a pass
drops needs the cyclic collector (reference counting frees it), so automatic collection
is paused for the pass's duration and resumed after; the collection it deferred runs once,
later, over the objects that are still alive then.

The pause is process-wide (``gc.disable``), so it is counted: with passes on several
threads, collection resumes when the last one ends, and only if it was enabled when the
first one began.
"""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator
from contextlib import contextmanager

_lock = threading.Lock()
_depth = 0
_was_enabled = False


@contextmanager
def collection_paused() -> Iterator[None]:
    """Automatic garbage collection is off inside the block (nested and threaded uses count)."""
    global _depth, _was_enabled
    with _lock:
        if _depth == 0:
            _was_enabled = gc.isenabled()
            gc.disable()
        _depth += 1
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0 and _was_enabled:
                gc.enable()
