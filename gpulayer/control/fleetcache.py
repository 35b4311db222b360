"""The fleet a placement pass decides on, kept between passes and trusted by the database's
change marks (:mod:`gpulayer.store.marks`).

A pass reads the two marks first (one small row each). Both as last time: the fleet it
kept is the fleet, and it reads nothing else. Only ``tasks`` changed: it reads the active
tasks' ids, and the holdings of the new ones; only the workers whose tasks came or went
are counted again. ``workers`` changed: it reads the online workers' rows, parses
those whose row changed, and counts every worker's holdings again.

A pass's own assignments are added to what it kept, and the marks it leaves are kept with
them when they differ from the marks it started from by exactly those tasks (one change of
``tasks`` per task it inserted, none of ``workers``); any other change (another writer's,
or more of this transaction's) means the next pass reads again. Marks read in a
transaction that is later rolled back are never met again (their salts die with it), so
nothing a rolled-back pass kept is used. Passes of one control plane run one at a time
(in write transactions, which :class:`~gpulayer.store.Store` serialises).
"""

from __future__ import annotations

import json
from typing import Any

from sqlmodel import Session

from gpulayer import scheduling
from gpulayer.records import WorkerRecord
from gpulayer.scheduling.shapes import ClassKey, class_key
from gpulayer.store import mapping, marks, queries

#: an active task's holding: (worker id, accelerator, devices JSON)
Holding = tuple[str, str | None, str]


class FleetCache:
    """The online workers' records and states, and the active tasks' holdings, as of
    :attr:`marks` (None: read everything again)."""

    def __init__(self) -> None:
        self.marks: marks.Marks | None = None
        #: the online workers' rows as read, and worker id -> (its row, its record, the
        #: record's class key, (draining, CPU slots, devices) of the record)
        self._rows: list[tuple[Any, ...]] = []
        self._parsed: dict[str, tuple[tuple[Any, ...], WorkerRecord, ClassKey, tuple[bool, int, int]]] = {}
        self._states: dict[str, scheduling.WorkerState] = {}
        self._listed: list[scheduling.WorkerState] = []
        self._holdings: dict[str, Holding] = {}  # active task id -> its holding
        self._room: bool | None = None
        self._class_keys: dict[ClassKey, ClassKey] = {}

    def fleet(self, s: Session) -> tuple[list[scheduling.WorkerState], bool]:
        """The online workers with what their active tasks hold, and whether any has room
        (:func:`gpulayer.control.placement.has_room`). Treat the states as read-only: they
        are kept for the next pass."""
        now = marks.read(s)
        if now is None or now != self.marks:
            known, self.marks = self.marks, None  # until the fleet below agrees with ``now``
            if known is None or now is None or known.workers != now.workers:
                self._read_workers(s)
                self._holdings = {}
                self._set_holdings(marks.active_holdings(s))
            else:  # only tasks came or went (what an active task holds never changes alone)
                self._follow_tasks(s)
            self.marks = now
        if self._room is None:
            self._room = any(not draining and (slots > ws.busy_cpu_slots or n > len(ws.busy_devices))
                             for ws, (_, _, _, (draining, slots, n)) in zip(self._listed, self._parsed.values(),
                                                                             strict=True))
        return self._listed, self._room

    def assigned(self, s: Session, added: list[tuple[str, Holding]]) -> None:
        """This pass inserted the tasks ``added`` (task id, holding): count them, and keep
        the marks they left if nothing else changed since :meth:`fleet`."""
        before = self.marks
        if not added or before is None:
            return
        self.marks = None
        for task_id, holding in added:
            self._holdings[task_id] = holding
        add_holdings(self._states, [h for _, h in added])
        self._room = None
        after = marks.read(s)
        if after is not None and after.workers == before.workers and after.tasks.n == before.tasks.n + len(added):
            self.marks = after

    def _read_workers(self, s: Session) -> None:
        """The online workers again; only those whose row changed are parsed again. Their
        states start with nothing held."""
        rows = queries.online_worker_rows(s)
        if rows != self._rows:
            fresh = {}
            for row in rows:
                hit = self._parsed.get(row[0])
                if hit is None or hit[0] != row:
                    rec = mapping.worker_record(dict(zip(queries.WORKER_COLUMNS, row, strict=True)))
                    key = class_key(rec)
                    key = self._class_keys.setdefault(key, key)  # one object per class (see Fleet)
                    hit = (row, rec, key, (rec.draining or rec.paused, rec.cpu_slots, len(rec.capabilities.devices)))
                fresh[row[0]] = hit
            self._rows, self._parsed = rows, fresh
            if len(self._class_keys) > 2 * len(fresh) + 64:  # keys of classes that left
                self._class_keys = {k: k for _, _, k, _ in fresh.values()}
        self._states = {wid: scheduling.WorkerState(record=rec, class_key=key)
                        for wid, (_, rec, key, _) in self._parsed.items()}
        self._listed = list(self._states.values())
        self._room = None

    def _follow_tasks(self, s: Session) -> None:
        """The active tasks by id: those that left are dropped, the holdings of those that
        came are read; only their workers are counted again."""
        ids = marks.active_task_ids(s)
        old = self._holdings
        gone = old.keys() - ids
        came = ids - old.keys()
        if not gone and not came:
            return
        new = {t: h for t, h in old.items() if t not in gone}
        new.update((r[0], (r[1], r[2], r[3])) for r in marks.active_holdings(s, sorted(came)))
        self._set_holdings(new)

    def _set_holdings(self, rows: list[tuple[str, str, str | None, str]] | dict[str, Holding]) -> None:
        """What the active tasks hold now: the workers whose tasks came, went or changed
        are counted again from ``rows``; the others keep their counts."""
        new = rows if isinstance(rows, dict) else {r[0]: (r[1], r[2], r[3]) for r in rows}
        old = self._holdings
        affected = {h[0] for t in old.keys() ^ new.keys() for h in (old.get(t), new.get(t)) if h is not None}
        affected.update(w for t in old.keys() & new.keys() if old[t] != new[t] for w in (old[t][0], new[t][0]))
        if affected:
            for wid in affected:
                ws = self._states.get(wid)
                if ws is not None:
                    ws.busy_devices = set()
                    ws.busy_cpu_slots = 0
            add_holdings(self._states, [h for h in new.values() if h[0] in affected])
            self._room = None
        self._holdings = new


def add_holdings(states: dict[str, scheduling.WorkerState], holdings: list[Holding]) -> None:
    held: dict[tuple[str | None, str], list[tuple[str, int]]] = {}  # a few distinct values: parsed once
    for worker_id, accelerator, devices_json in holdings:
        ws = states.get(worker_id)
        if ws is None:
            continue
        devices = held.get((accelerator, devices_json))
        if devices is None:
            indices = json.loads(devices_json)
            devices = held[accelerator, devices_json] = [(accelerator, i) for i in indices] if accelerator else []
        if devices:
            ws.busy_devices.update(devices)
        else:
            ws.busy_cpu_slots += 1


__all__ = ["FleetCache", "Holding", "add_holdings"]
