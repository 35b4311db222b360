"""The reasons a pass gives for a job it does not assign, shared across jobs of one shape.

Wordings are tabled in :mod:`gpulayer.scheduling`. Both builders cap what they list at
``limit`` workers and end with a ``more`` line that counts the rest.
"""

from __future__ import annotations

from gpulayer.records import Reason
from gpulayer.scheduling.candidates import ShapeState
from gpulayer.scheduling.capacity import fits
from gpulayer.scheduling.compat import RawReason, bind
from gpulayer.scheduling.fleet import Fleet, Worker, room_of


def busy_message(kind: str | None, k: int) -> str:
    """Why a compatible worker cannot take a job needing ``k`` devices of ``kind`` now."""
    if k == 0:
        return "compatible but busy: no free CPU slot"
    if k == 1:
        return f"compatible but busy: no free {kind} device"
    return f"compatible but busy: fewer than {k} free {kind} devices"


def state_reason(w: Worker) -> Reason:
    """``worker is offline`` / ``worker is draining`` / ``worker is paused: ...`` for a worker
    that takes no new work."""
    resume = f": it takes no new work until resumed (gpulayer worker resume {w.id})" if w.state == "paused" else ""
    return Reason(worker=w.id, code=w.state or "", wanted="online", have=w.state,
                  message=f"worker is {w.state}{resume}")


def too_few_workers(st: ShapeState, nodes: int) -> list[Reason]:
    """One ``too_few_workers`` line per listed target that has some compatible workers."""
    return [
        Reason(worker=t, code="too_few_workers", wanted=str(nodes), have=str(n),
               message=f"{n} compatible {t} worker(s), the job needs {nodes} at once")
        for t in st.shape.targets
        if (n := st.n_in_target[t])
    ]


class UnschedulableReasons:
    """Why no worker can run jobs of a shape: ``no_workers`` lines for listed targets without
    any worker, each rejected worker's reasons (offline and draining ones included), then why
    each provider offer does not fit. Built once per shape."""

    __slots__ = ("_cache", "_fleet", "_has_offers", "_limit")

    def __init__(self, fleet: Fleet, *, has_offers: bool, limit: int) -> None:
        self._fleet = fleet
        self._has_offers = has_offers
        self._limit = limit
        self._cache: dict[ShapeState, list[Reason]] = {}

    def of(self, st: ShapeState) -> list[Reason]:
        out = self._cache.get(st)
        if out is None:
            out = self._cache[st] = self._build(st)
        return out

    def _build(self, st: ShapeState) -> list[Reason]:
        out = [self._no_workers(t) for t in st.shape.targets if self._fleet.registered.get(t, 0) == 0]
        rejected = [(w, base) for w in self._fleet.workers
                    if (base := st.by_class[w.cls].reasons) or w.state is not None]
        listed, more, all_classes = self._cap(rejected)
        for w, base in listed:
            out.extend(bind(w.id, base))
            if w.state is not None:
                out.append(state_reason(w))
        if more:
            tail = ("each with the same reasons as a listed worker with the same capabilities"
                    if all_classes else "not listed")
            out.append(Reason(worker="...", code="more", have=str(more),
                              message=f"and {more} more worker(s), {tail}"))
        out.extend(st.offer_reasons)
        return out

    def _no_workers(self, target: str) -> Reason:
        if target == "cloud":
            msg = ("no cloud worker registered" if self._has_offers
                   else "no cloud worker registered and no provider offered a machine")
        else:
            msg = f"no {target} worker registered"
        return Reason(worker=target, code="no_workers", wanted=target, have="0", message=msg)

    def _cap(self, rejected: list[tuple[Worker, list[RawReason]]]
             ) -> tuple[list[tuple[Worker, list[RawReason]]], int, bool]:
        """At most ``limit`` of the rejected workers: the first of every class first, then the
        rest in fleet order; how many were left out; whether every class is listed."""
        limit = self._limit
        if len(rejected) <= limit:
            return rejected, 0, True
        chosen: set[int] = set()
        seen_cls: set[int] = set()
        for w, _ in rejected:
            if id(w.cls) not in seen_cls:
                seen_cls.add(id(w.cls))
                if len(chosen) < limit:
                    chosen.add(w.pos)
        all_classes = len(chosen) == len(seen_cls)
        for w, _ in rejected:
            if len(chosen) >= limit:
                break
            chosen.add(w.pos)
        listed = [(w, b) for w, b in rejected if w.pos in chosen]
        return listed, len(rejected) - len(listed), all_classes


class WaitingReasons:
    """Why a compatible job is not assigned: one line per compatible worker (``busy``,
    ``reserved`` or, for gangs, ``free``).

    The list of a single-node job is cached per shape; a cached list that shows a worker is
    dropped when that worker gets reserved (:meth:`forget`). Gang lists name the job's own
    size, so they are built each time. Per-worker ``Reason`` objects are shared.
    """

    __slots__ = ("_by_message", "_cache", "_limit", "_listed_in")

    def __init__(self, *, limit: int) -> None:
        self._limit = limit
        self._cache: dict[ShapeState, list[Reason]] = {}
        self._listed_in: dict[int, list[ShapeState]] = {}  # worker pos -> shapes whose cached list shows it
        self._by_message: dict[tuple[str, str], Reason] = {}

    def worker_reason(self, w: Worker, code: str, message: str) -> Reason:
        key = (w.id, message)
        r = self._by_message.get(key)
        if r is None:
            r = self._by_message[key] = Reason(worker=w.id, code=code, message=message)
        return r

    def of(self, st: ShapeState, nodes: int, job_id: str) -> list[Reason]:
        gang = nodes > 1
        if not gang:
            cached = self._cache.get(st)
            if cached is not None:
                return cached
        kind, k = st.shape.accelerator, st.shape.device_count
        busy_msg = busy_message(kind, k)
        room = room_of(kind, k)
        limit = self._limit
        out: list[Reason] = []
        ws = st.compatible_workers()
        for w in ws[:limit]:
            by = w.reserved.get(room) if w.reserved else None
            if w.state == "paused":
                out.append(self.worker_reason(w, "paused", "compatible but paused: it takes no new work until "
                                                           f"resumed (gpulayer worker resume {w.id})"))
            elif by is not None and by != job_id:
                out.append(self.worker_reason(w, "reserved", f"compatible but reserved for job {by}"))
            elif gang and fits(w, st.eligible_of[w.cls], kind, k):
                out.append(self.worker_reason(w, "free", f"free, but the job needs {nodes} workers at once"))
            else:
                out.append(self.worker_reason(w, "busy", busy_msg))
        if len(ws) > limit:
            more = len(ws) - limit
            out.append(Reason(worker="...", code="more", have=str(more),
                              message=f"and {more} more compatible worker(s)"))
        if not gang:
            self._cache[st] = out
            for w in ws[:limit]:
                self._listed_in.setdefault(w.pos, []).append(st)
        return out

    def forget(self, w: Worker) -> None:
        """``w`` was just reserved: cached lists that show it as busy are stale."""
        for st in self._listed_in.pop(w.pos, ()):
            self._cache.pop(st, None)
