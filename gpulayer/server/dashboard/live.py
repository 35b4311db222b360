"""Live updates: one server-sent event stream per open page.

A stream renders its page's live regions again whenever the control plane changes
something or a task starts (:meth:`Server.next_change`: woken by this process's own changes,
with no polling; a job page also by its job's output, and no page by another job's) and
sends those that changed; the job page's stream also sends new log chunks, each
``log`` event carrying the id of its last chunk so that a browser reconnecting
(``Last-Event-ID``) continues where it was. Changes that another process makes (another
server on the same database, or the CLI beside ``gpulayer dashboard``) wake nobody here, so
a stream also looks every ``recheck`` seconds.

Streams are bounded: one ends when its client goes away (Starlette cancels it), when its
session ends, when the server shuts down (``begin_shutdown`` wakes every waiting stream),
when the job it follows has ended and its logs are all sent, when what its page shows was
deleted (:class:`Gone`: the job of a job's page, the job a list page starts after), and
after :data:`MAX_SECONDS` at the latest (the browser reconnects by itself).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from starlette.concurrency import run_in_threadpool

from gpulayer.server.dashboard.views import LogPart

if TYPE_CHECKING:
    from gpulayer.server.state import Server

log = logging.getLogger("gpulayer.server.dashboard")

#: the longest one stream stays open, seconds
MAX_SECONDS = 600.0
#: after a change, wait this long before reading, so a burst of changes costs one read
COALESCE = 0.2
#: a comment line this often keeps proxies from closing a quiet stream, seconds
KEEPALIVE = 15.0
#: how long a browser waits before reconnecting, milliseconds
RETRY_MS = 3000


class Gone(Exception):
    """What the page shows was deleted (``gpulayer jobs delete``, a prune): its stream says so,
    with this message for the page (a ``deleted`` event), and ends; nothing is logged, and
    the browser does not reconnect."""


@dataclass
class Frame:
    """What a page's stream has to say after one look."""

    regions: dict[str, str]
    log: list[LogPart] = field(default_factory=list)
    log_after: int = 0
    #: more log chunks are waiting: look again at once
    more: bool = False
    #: nothing will change any more (the job ended, its logs are sent)
    end: bool = False


def event(name: str, data: object, *, event_id: str | None = None) -> str:
    # JSON has no raw newlines, so the data is one "data:" line
    lines = [f"event: {name}"]
    if event_id is not None:
        lines.append(f"id: {event_id}")
    lines.append(f"data: {json.dumps(data)}")
    return "\n".join(lines) + "\n\n"


async def stream(server: Server, look: Callable[[], Frame], *, alive: Callable[[], Awaitable[bool]],
                 recheck: float, job_id: str | None = None) -> AsyncIterator[str]:
    """The events of one page: ``look`` (blocking: run in the thread pool) says what is
    there now; ``alive`` whether the session may still watch; ``job_id``: the job whose
    output the page shows (other jobs' output does not wake it)."""
    yield f"retry: {RETRY_MS}\n\n"
    sent: dict[str, str] = {}
    started = last_sent = time.monotonic()
    while True:
        change = server.next_change(job_id)  # before looking: a change during the look still wakes us
        try:
            frame = await run_in_threadpool(look)
        except Gone as gone:
            log.debug("live stream ended: %s", gone)
            yield event("deleted", {"message": str(gone)})
            return
        except Exception:  # the database may be away for a moment: the browser reconnects
            log.warning("live stream ended: looking failed", exc_info=True)
            return
        changed = {k: v for k, v in frame.regions.items() if sent.get(k) != v}
        sent = frame.regions
        if changed:
            yield event("regions", changed)
        if frame.log:
            yield event("log", [[p.stream, p.text] for p in frame.log], event_id=str(frame.log_after))
        if changed or frame.log:
            last_sent = time.monotonic()
        if frame.end:
            yield event("end", {})
            return
        if server.shutting_down or time.monotonic() - started > MAX_SECONDS:
            return
        if not frame.more:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(change.wait(), recheck)
            if server.shutting_down:
                return
        if not await alive():
            yield event("expired", {})
            return
        if time.monotonic() - last_sent > KEEPALIVE:
            yield ": keepalive\n\n"
            last_sent = time.monotonic()
        await asyncio.sleep(COALESCE)
