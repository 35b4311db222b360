"""Python's full garbage collections in a serving process: on a schedule of the server's own
(:func:`full_collections`, run by the app's lifespan)."""

from __future__ import annotations

import asyncio
import gc
import threading

#: how often a serving process runs a full garbage collection itself (see full_collections)
FULL_COLLECTION_EVERY = 600.0
_full_lock = threading.Lock()
_full_depth = 0
_full_threshold = 10


async def full_collections(every: float = FULL_COLLECTION_EVERY) -> None:
    """While it runs: Python runs no full garbage collection on its own; this task runs one
    every ``every`` seconds instead (young collections go on as usual).

    A server's objects live long: a connection and a long poll per worker. The collector's
    own full collections walk all of them, and answer nothing meanwhile: at 10,000 workers
    every few seconds, 0.5-0.9 s each (bench/server_heartbeats.py), which was the whole of
    the heartbeats' p99. Reference counting frees almost all of a server's garbage; what
    only a full collection frees (cycles that got old) waits for the next one here. What
    start-up built is frozen (never walked again). Counted, so that several apps in one
    process (tests) restore the collector's settings when the last one stops."""
    global _full_depth, _full_threshold
    with _full_lock:
        if _full_depth == 0:
            gc.collect()
            gc.freeze()
            young, middle, _full_threshold = gc.get_threshold()
            gc.set_threshold(young, middle, 1_000_000)  # a full collection after 10^6 middle ones: never
        _full_depth += 1
    try:
        while True:
            await asyncio.sleep(every)
            gc.collect()
    finally:
        with _full_lock:
            _full_depth -= 1
            if _full_depth == 0:
                young, middle, _ = gc.get_threshold()
                gc.set_threshold(young, middle, _full_threshold)
                gc.unfreeze()
