"""The long poll and the heartbeat of workers (their handlers of :data:`gpulayer.server.app.SPECIAL`).

A worker's poll waits on a future of its own (:meth:`Server.arm`), woken only when this
server assigns it a task or cancels one of its tasks; the future goes when the poll is
answered (:meth:`Server.disarm`), so a fleet whose workers come and go over weeks leaves
no entry behind.
"""

from __future__ import annotations

import time
from typing import Any

from starlette.requests import Request

from gpulayer import api
from gpulayer.server.state import Server, wait_woken

__all__ = ["heartbeat", "poll_tasks", "poll_work"]


async def poll_tasks(server: Server, request: Request, kw: dict[str, Any]) -> Any:
    poll = await poll_work(server, request, {**kw, "running": ()})
    return poll.tasks


async def poll_work(server: Server, request: Request, kw: dict[str, Any]) -> Any:
    wid = kw["worker_id"]
    running = list(kw["running"])
    deadline = time.monotonic() + server.poll_wait(wid, kw["wait"])
    first = True
    while True:
        woken = server.arm(wid)
        try:
            out = await server.look_for_work(wid, running, first=first, woken=woken)
            remaining = deadline - time.monotonic()
            # (a request that just came is not asked whether its caller left: that costs more
            # than the look itself, for 500 polls a second)
            if out.tasks or out.cancel or remaining <= 0 or server.shutting_down or \
                    (not first and await request.is_disconnected()):
                return out
            first = False
            # woken at once by this server's assignments and cancels; another server sharing
            # the database is noticed by watch_polls, at most POLL_RECHECK seconds later
            server._polling[wid] = running
            try:
                woke = await wait_woken(woken, remaining)
            finally:
                if server._polling.get(wid) is running:
                    del server._polling[wid]
            if not woke:
                # the wait ran out and nothing woke it (this server's assignments and cancels,
                # watch_polls for another server's, a shutdown): answered empty without a look;
                # the worker polls again at once, and that poll's first look sees anything newer
                return api.WorkPoll()
        finally:  # (the next look arms a fresh one; a worker that left keeps none)
            server.disarm(wid, woken)


async def heartbeat(server: Server, request: Request, kw: dict[str, Any]) -> Any:
    return await server.heartbeat(kw["worker_id"], list(kw["running"]))
