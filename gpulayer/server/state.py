"""What one serving process keeps between requests: :class:`Server` (the control plane it
serves, its metrics, the heartbeats answered and not yet written, the waiting worker polls,
the token confirmations) and :class:`Batches`, which gathers calls that arrive together into
one. The routes that use them are in :mod:`gpulayer.server.app`."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Generic, TypeVar

from starlette.concurrency import run_in_threadpool

from gpulayer.api import HeartbeatReply, TokenInfo, WorkPoll
from gpulayer.control import ControlObserver, ControlPlane, retention
from gpulayer.server.metrics import Metrics

log = logging.getLogger("gpulayer.server")

R = TypeVar("R")
V = TypeVar("V")
#: how often the server looks, in one query for all of them, whether its waiting worker
#: polls have news that it did not make itself (another server on the same database)
POLL_RECHECK = 2.0
#: heartbeats answered without a database read are written this often, in one transaction:
#: each at most this long after it arrived, plus one write (docs/server.md says 0.5 s)
HEARTBEAT_WRITE_WINDOW = 0.25
#: how long a worker poll's first look waits for others to share its database read
FIRST_LOOK_GATHER = 0.05
#: a worker poll with nothing to answer ends at a random moment in the last part of its
#: wait: the first one a worker makes on this server in the last half, later ones in the
#: last tenth (see Server.poll_wait)
FIRST_POLL_SPREAD = 0.5
POLL_SPREAD = 0.1


# ---------------------------------------------------------------------------------- state


class Server(ControlObserver):
    """What the routes share: the control plane, metrics, and the events long polls wait on."""

    def __init__(self, control: ControlPlane, *, tick: float | None = None) -> None:
        self.control = control
        self.tokens = control.tokens
        self.metrics = Metrics()
        #: how often the background loop runs a placement pass (a safety net: submits,
        #: reports and joins run one themselves)
        self.tick = tick if tick is not None else max(0.5, min(5.0, control.heartbeat_timeout / 3))
        #: how often it looks for silent workers: a cheap query, so a lost task is retried
        #: within about a second of its worker's timeout
        self.expiry_tick = min(1.0, self.tick)
        #: how often the provisioning pass runs (the cloud target; only with providers)
        self.provision_tick = 1.0
        self._loop: asyncio.AbstractEventLoop | None = None
        #: set at the control plane's next change (what the job and job list waits wait on),
        #: and at its next change or task start (what a dashboard page waits on); a job's page
        #: waits on one of its own, set by those and by the job's output alone
        self._changed: asyncio.Event | None = None
        self._pages: asyncio.Event | None = None
        self._job_pages: dict[str, asyncio.Event] = {}
        # long polls of workers wait on their own future, set only when they got a task:
        # waking a thousand polls on every change of anything would swamp the database
        self._worker_events: dict[str, asyncio.Future[bool]] = {}
        #: job id -> the futures of the long polls for its logs waiting now (Server.follow)
        self._followers: dict[str, set[asyncio.Future[bool]]] = {}
        #: worker id -> the task ids it runs, for each worker poll waiting now
        self._polling: dict[str, list[str]] = {}
        self.shutting_down = False
        #: heartbeats and first looks of worker polls: what arrives while one batch is
        #: served is served together in the next (one thread hop, one transaction)
        self._heartbeats: Batches[list[str], HeartbeatReply] = Batches(control.heartbeats)
        self._looks: Batches[list[str], WorkPoll] = Batches(control.look_for_work)
        #: a poll's first look waits FIRST_LOOK_GATHER for others to share its batch: it may
        #: wait many seconds anyway, and a fleet's polls arrive a few at a time
        self._first_looks: Batches[list[str], WorkPoll] = Batches(control.look_for_work, gather=FIRST_LOOK_GATHER)
        #: tokens the cache cannot answer for (a fleet reconnecting to a restarted server)
        self._verifies: Batches[None, TokenInfo] = Batches(self.tokens.verify_many)
        #: workers whose row this server saw (a heartbeat's reply said known): a heartbeat of
        #: one that runs nothing is answered at once and written within HEARTBEAT_WRITE_WINDOW
        self._known: set[str] = set()
        #: those heartbeats, not written yet: worker id -> when it arrived
        self._heard: dict[str, float] = {}
        #: workers that made a call other than a heartbeat since the last flush
        self._seen: set[str] = set()
        #: workers whose first poll on this server was spread (Server.poll_wait)
        self._spread: set[str] = set()
        control.observe(self)

    # -- the control plane's observer callbacks (on its threads)

    def _soon(self, fn: Callable[..., None], *args: Any) -> None:
        loop = self._loop
        if loop is not None and not loop.is_closed():
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(fn, *args)

    def on_change(self) -> None:
        self._soon(self._wake)

    def on_progress(self, job_id: str, *, output: bool) -> None:
        self._soon(self._wake_progress, job_id, output)

    def on_assigned(self, worker_ids: frozenset[str]) -> None:
        self._soon(self._wake_workers, worker_ids)

    def on_cancel(self, worker_ids: frozenset[str]) -> None:
        self._soon(self._wake_workers, worker_ids)

    def on_placement(self, seconds: float) -> None:
        self.metrics.placement(seconds)

    # -- on the event loop

    def _wake(self) -> None:
        if self._changed is not None:
            self._changed.set()
        self._changed = asyncio.Event()
        self._wake_pages()
        # (a follower answers when its job's state changed: each looks, they are few)
        followers, self._followers = self._followers, {}
        for futures in followers.values():
            _set_all(futures)

    def _wake_progress(self, job_id: str, output: bool = True) -> None:
        """The job printed (``output``: its page looks again, and its followers), or its task
        started (every page: lists show it running)."""
        if output:
            page = self._job_pages.pop(job_id, None)
            if page is not None:
                page.set()
        else:
            self._wake_pages()
        _set_all(self._followers.pop(job_id, ()))

    def _wake_pages(self) -> None:
        if self._pages is not None:
            self._pages.set()
        self._pages = None
        pages, self._job_pages = self._job_pages, {}
        for page in pages.values():
            page.set()

    def _wake_workers(self, worker_ids: frozenset[str]) -> None:
        events = self._worker_events
        _set_all(events[wid] for wid in worker_ids if wid in events)

    def _wake_all(self) -> None:
        self._wake()
        _set_all(self._worker_events.values())

    def begin_shutdown(self) -> None:
        """Answer every waiting long poll now, so a stopping server need not wait for them
        (thread-safe: called from uvicorn's signal handling)."""
        self.shutting_down = True
        self._soon(self._wake_all)

    def arm(self, worker_id: str) -> asyncio.Future[bool]:
        """A fresh future that becomes True when this server next assigns ``worker_id`` a
        task or cancels one of its tasks (or shuts down). Arm it before looking at the
        database, so an assignment in between is not missed; wait on it with
        :func:`wait_woken`."""
        woken = self._worker_events[worker_id] = asyncio.get_running_loop().create_future()
        return woken

    def disarm(self, worker_id: str, woken: asyncio.Future[bool]) -> None:
        """The poll that armed ``woken`` was answered: its entry goes (unless a newer poll of
        the worker armed its own since), so a fleet whose workers come and go leaves none."""
        if self._worker_events.get(worker_id) is woken:
            del self._worker_events[worker_id]

    def forget_worker(self, worker_id: str) -> None:
        """The worker left: what this server kept of it goes (were it to come back, its next
        heartbeat would go the long way and its next poll be spread as a first one)."""
        self._known.discard(worker_id)
        self._spread.discard(worker_id)

    def follow(self, job_id: str) -> asyncio.Future[bool]:
        """A fresh future that becomes True when the job has new output or the control
        plane changes something (or this server shuts down): what a long poll for the job's
        logs waits on (:func:`wait_woken`). Take it before reading, and give it back with
        :meth:`unfollow` after."""
        woken = asyncio.get_running_loop().create_future()
        self._followers.setdefault(job_id, set()).add(woken)
        return woken

    def unfollow(self, job_id: str, woken: asyncio.Future[bool]) -> None:
        futures = self._followers.get(job_id)
        if futures is not None:
            futures.discard(woken)
            if not futures:
                del self._followers[job_id]

    def change_event(self) -> asyncio.Event:
        """The event set at the control plane's next change: what a wait for jobs waits on
        (:meth:`changed`). Take it before reading, so a change between the read and the
        wait is not missed."""
        if self._changed is None:
            self._changed = asyncio.Event()
        return self._changed

    def next_change(self, job_id: str | None = None) -> asyncio.Event:
        """The event set at the control plane's next change or a task's start (on the event
        loop), and with ``job_id`` at that job's new output too: what a dashboard page shows
        (a list of jobs, or one job with its output). Take it before reading, so a change
        between the read and the wait is not missed. (A job that prints does not wake the
        other pages: each looked again up to five times a second, for nothing.)"""
        if job_id is not None:
            return self._job_pages.setdefault(job_id, asyncio.Event())
        if self._pages is None:
            self._pages = asyncio.Event()
        return self._pages

    async def changed(self, event: asyncio.Event, timeout: float) -> None:
        """Wait until ``event`` (:meth:`change_event`, taken before the caller's last read)
        is set, or ``timeout`` seconds. A job's output alone does not set it (a running job
        that prints woke every waiting long poll, each to read its job again)."""
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(event.wait(), timeout)

    async def heartbeat(self, worker_id: str, running: list[str]) -> HeartbeatReply:
        """Record a heartbeat. One from a worker this server knows that runs nothing needs no
        read to be answered (known, nothing to end): it is answered now and written with the
        next flush (:meth:`flush_heartbeats`); a heartbeat is liveness data, and at most
        ``HEARTBEAT_WRITE_WINDOW`` late. Any other is answered once its batch committed
        (``ControlPlane.heartbeats``)."""
        if not running and worker_id in self._known:
            self._heard[worker_id] = self.control.clock()
            return HeartbeatReply(known=True)
        try:
            reply = await self._heartbeats.submit(worker_id, running)
        except Exception:
            self._not_written()
            raise
        if reply.known:
            self._known.add(worker_id)
        else:
            self._known.discard(worker_id)
        return reply

    async def flush_heartbeats(self) -> None:
        """Write the heartbeats answered since the last flush, in one transaction."""
        heard, self._heard = self._heard, {}
        if not heard:
            return
        try:
            gone = await run_in_threadpool(self.control.heartbeats_heard, heard)
        except BaseException:  # written with the next flush (a later heartbeat wins)
            for wid, at in heard.items():
                self._heard[wid] = max(at, self._heard.get(wid, at))
            self._not_written()
            raise
        self._known.difference_update(gone)

    def _not_written(self) -> None:
        """Heartbeats were heard but could not be written (the database failed: a full disk):
        what it holds of the workers' lives is stale, so for one heartbeat timeout from now
        no worker is offline for its silence (``begin_grace``, as after the server's start).
        A worker that kept calling through the failure was written off, and its tasks lost,
        as soon as the database could be written again."""
        self.control.begin_grace()

    async def write_heartbeats(self) -> None:
        """:meth:`flush_heartbeats` every ``HEARTBEAT_WRITE_WINDOW`` seconds."""
        while True:
            await asyncio.sleep(HEARTBEAT_WRITE_WINDOW)
            try:
                await self.flush_heartbeats()
            except Exception:  # the database may be away for a moment; try again next tick
                log.exception("writing heartbeats failed")

    def poll_wait(self, worker_id: str, wait: float) -> float:
        """How long a worker poll that hears of nothing waits: a random part of ``wait``.

        A fleet that polls at once (every worker reconnecting to a restarted server) would
        otherwise have all its polls end at once, every ``wait`` seconds, for ever: at 10,000
        workers, 10,000 answers and as many new polls in one burst, which held every other
        request for up to a second (bench/server_heartbeats.py). A worker's first poll here
        ends within the last ``FIRST_POLL_SPREAD`` of its wait, which spreads such a fleet
        over that much of the wait in one round; later ones within the last ``POLL_SPREAD``
        (a few percent more polls), so clumps that a pause of the server made drift apart
        again. A poll that gets work or a cancel answers at once, as before."""
        if worker_id not in self._spread:
            if len(self._spread) >= 100_000:  # bounded: a forgotten worker is spread once more
                self._spread.clear()
            self._spread.add(worker_id)
            return wait * (1.0 - FIRST_POLL_SPREAD * random.random())
        return wait * (1.0 - POLL_SPREAD * random.random())

    async def look_for_work(self, worker_id: str, running: list[str], *, first: bool = False,
                            woken: asyncio.Future[bool] | None = None) -> WorkPoll:
        """A worker poll's look at the database (``ControlPlane.look_for_work``, batched). A
        first look waits :data:`FIRST_LOOK_GATHER` for others, unless ``woken`` (the poll's
        :meth:`arm`) is set meanwhile: work was assigned to it, and the look goes now."""
        if first:
            return await self._first_looks.submit(worker_id, running, hurry=woken)
        return await self._looks.submit(worker_id, running)

    def saw(self, worker_id: str) -> None:
        """A worker called (any call counts as a sign of life, written with the next flush)."""
        self._seen.add(worker_id)

    async def flush_seen(self) -> None:
        batch, self._seen = self._seen, set()
        if batch:
            await run_in_threadpool(self.control.seen, batch)

    async def background(self) -> None:
        """Expire silent workers every ``expiry_tick`` seconds and run a placement pass every
        ``tick`` seconds."""
        last_pass = time.monotonic()
        while True:
            await asyncio.sleep(self.expiry_tick)
            try:
                await self.flush_seen()
                await self.flush_heartbeats()  # a heartbeat answered counts before anyone is expired
                for wid in await run_in_threadpool(self.control.expire_workers):
                    self.forget_worker(wid)
                retention.when_due(self.control)  # (GPULAYER_KEEP_JOBS: on a thread of its own)
                if time.monotonic() - last_pass >= self.tick:
                    last_pass = time.monotonic()
                    await run_in_threadpool(self.control.schedule_queue)
            except Exception:  # the database may be away for a moment; try again next tick
                log.exception("background pass failed")

    async def watch_polls(self) -> None:
        """Every ``POLL_RECHECK`` seconds, one look at the database for all waiting worker
        polls (:meth:`ControlPlane.work_news`); wake those with news. This server's own
        assignments and cancels wake them at once; this is for another server's."""
        while True:
            await asyncio.sleep(POLL_RECHECK)
            polls = dict(self._polling)
            if not polls:
                continue
            try:
                news = await run_in_threadpool(self.control.work_news, polls)
            except Exception:  # the database may be away for a moment; try again next tick
                log.exception("looking for work of waiting polls failed")
                continue
            self._wake_workers(frozenset(news))

    def confirm_tokens(self, stop: threading.Event) -> None:
        """Re-confirm the remembered tokens every ``tokens.CONFIRM_EVERY`` seconds until
        ``stop`` (one query), so requests are answered without a database read and a
        revocation made by another server still takes effect within ``tokens.CACHE_SECONDS``.
        On a thread of its own: a busy event loop must not make every entry age out at once."""
        from gpulayer.tokens import CONFIRM_EVERY

        while not stop.wait(CONFIRM_EVERY):
            try:
                self.tokens.confirm()
            except Exception:  # entries then age out and requests look for themselves
                log.exception("confirming tokens failed")

    async def provisioning(self) -> None:
        """The provisioning pass (:meth:`ControlPlane.provision`) every ``provision_tick``
        seconds, on a thread: provider calls never run on the event loop or in a request."""
        while True:
            try:
                await run_in_threadpool(self.control.provision)
            except Exception:  # a provider or the database misbehaved; try again next tick
                log.exception("provisioning pass failed")
            await asyncio.sleep(self.provision_tick)


async def wait_woken(woken: asyncio.Future[bool], timeout: float) -> bool:
    """Wait until ``woken`` (from :meth:`Server.arm`) is set, at most ``timeout`` seconds:
    True if it was, False if the time ran out. One timer and no task (``asyncio.wait_for``
    makes a task, a timer and a future of its own; 10,000 polls wait at once)."""
    handle = asyncio.get_running_loop().call_later(timeout, _time_out, woken)
    try:
        return await woken
    finally:
        handle.cancel()


def _set_all(futures: Iterable[asyncio.Future[bool]]) -> None:
    """Wake these waits (those not woken or timed out already)."""
    for woken in futures:
        if not woken.done():
            woken.set_result(True)


def _time_out(woken: asyncio.Future[bool]) -> None:
    if not woken.done():
        woken.set_result(False)


class Batches(Generic[V, R]):
    """Calls of ``fn({key: value}) -> {key: reply or the error to raise}`` gathered: those
    that arrive while one batch is served (on a thread) are served together in the next.
    Under load a batch grows instead of a queue of threads; alone, a call is served at once."""

    def __init__(self, fn: Callable[[dict[str, V]], Mapping[str, R | Exception]], *, gather: float = 0.0) -> None:
        self.fn = fn
        self.gather = gather
        self._pending: list[tuple[str, V, asyncio.Future[R]]] = []
        self._serving: asyncio.Task[None] | None = None
        #: set to end the current gathering early (see submit's ``hurry``)
        self._hurried: asyncio.Event | None = None

    async def submit(self, key: str, value: V, *, hurry: asyncio.Future[Any] | None = None) -> R:
        """``fn``'s reply for ``key``. ``hurry``: once it is done, the batch this call waits in
        is served without waiting out the rest of its gathering (one that a worker's poll
        made for nothing: work has just been assigned to that worker, the poll's first look
        would have waited up to FIRST_LOOK_GATHER for it)."""
        future: asyncio.Future[R] = asyncio.get_running_loop().create_future()
        self._pending.append((key, value, future))
        if self._serving is None or self._serving.done():
            self._serving = asyncio.create_task(self._serve())
        if hurry is None:
            return await future
        if hurry.done():
            self._hurry()
        hurry.add_done_callback(self._hurry)
        try:
            return await future
        finally:
            hurry.remove_done_callback(self._hurry)

    def _hurry(self, _done: object = None) -> None:
        if self._hurried is not None:
            self._hurried.set()

    async def _serve(self) -> None:
        if self.gather:
            self._hurried = asyncio.Event()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._hurried.wait(), self.gather)
            self._hurried = None
        while self._pending:
            batch, self._pending = self._pending, []
            try:
                replies = await run_in_threadpool(self.fn, {key: value for key, value, _ in batch})
            except Exception as exc:  # each waiting request answers with the error
                for _, _, future in batch:
                    if not future.done():
                        future.set_exception(exc)
                continue
            for key, _, future in batch:
                if not future.done():
                    reply = replies[key]
                    if isinstance(reply, Exception):
                        future.set_exception(reply)
                    else:
                        future.set_result(reply)


# ---------------------------------------------------------------------------------- parsing
