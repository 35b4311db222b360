"""Free capacity: whether a worker fits a job now, picking workers, granting and reserving them.

A job of a shape with accelerator ``kind`` needs ``k`` free eligible devices of that kind per
node (``k == 0``: one free CPU slot). Capacity only shrinks during a pass.
"""

from __future__ import annotations

import heapq

from gpulayer.scheduling.candidates import Candidate, ShapeState
from gpulayer.scheduling.fleet import Worker, room_of
from gpulayer.scheduling.model import NodeGrant

#: A reservation pool entry: (-free units when pushed, fleet position, worker).
PoolEntry = tuple[int, int, Worker]


def fits(w: Worker, cand: Candidate, kind: str | None, k: int) -> bool:
    """``w`` (of ``cand``'s class) has room for one node now, and that room (the devices of
    the kind, or its CPU slots) is not reserved."""
    if w.reserved and room_of(kind, k) in w.reserved:
        return False
    if k == 0:
        return w.free_cpu > 0
    free = w.free.get(kind)  # type: ignore[arg-type]
    if not free or len(free) < k:
        return False
    if cand.all_usable:
        return True
    c = 0
    for i in cand.eligible:
        if i in free:
            c += 1
    return c >= k


def free_units(w: Worker, cand: Candidate, kind: str | None, k: int) -> int:
    """Free eligible devices of the kind (``k == 0``: free CPU slots) on ``w``."""
    if k == 0:
        return w.free_cpu
    free = w.free.get(kind)  # type: ignore[arg-type]
    if not free:
        return 0
    if cand.all_usable:
        return len(free)
    return sum(1 for i in cand.eligible if i in free)


def pick(cands: list[Candidate], kind: str | None, k: int, nodes: int) -> tuple[list[tuple[Worker, Candidate]], bool]:
    """Up to ``nodes`` distinct workers that fit, in candidate order, and whether there were
    ``nodes`` of them. Workers seen not to fit are dropped from their candidate for good
    (and emptied candidates from ``cands``); nothing is taken yet (see :func:`grant`)."""
    picked: list[tuple[Worker, Candidate]] = []
    ci = 0
    while ci < len(cands):
        cand = cands[ci]
        ws = cand.workers
        keep = 0
        i = 0
        n = len(ws)
        done = False
        while i < n:
            w = ws[i]
            i += 1
            if fits(w, cand, kind, k):
                ws[keep] = w
                keep += 1
                picked.append((w, cand))
                if len(picked) == nodes:
                    done = True
                    break
        del ws[keep:i]
        if not ws:
            del cands[ci]
        else:
            ci += 1
        if done:
            return picked, True
    return picked, False


def grant(picked: list[tuple[Worker, Candidate]], kind: str | None, k: int) -> list[NodeGrant]:
    """Take one node's room on each picked worker (node ranks in pick order): ``k`` devices,
    lowest eligible indices first, or one CPU slot."""
    grants: list[NodeGrant] = []
    for rank, (w, cand) in enumerate(picked):
        if k == 0:
            w.free_cpu -= 1
            devices: list[int] = []
        else:
            free = w.free[kind]  # type: ignore[index]
            if cand.all_usable:
                devices = sorted(free)[:k]
            else:
                devices = [i for i in cand.eligible if i in free][:k]
            free.difference_update(devices)
        grants.append(NodeGrant(worker_id=w.id, node_rank=rank, accelerator=kind, devices=devices))
    return grants


def take_most_free(heap: list[PoolEntry], st: ShapeState, kind: str | None, k: int, nodes: int) -> list[Worker] | None:
    """Pop the ``nodes`` workers whose room for the shape is not reserved with the most free
    units, or None (heap unchanged).

    Free units only shrink during a pass, so a stale entry is re-pushed with its new key
    (lazy decrease-key); workers whose room is reserved are dropped for good.
    """
    out: list[PoolEntry] = []
    room = room_of(kind, k)
    while heap and len(out) < nodes:
        neg, pos, w = heapq.heappop(heap)
        if w.reserved and room in w.reserved:
            continue
        units = free_units(w, st.eligible_of[w.cls], kind, k)
        if -neg != units:
            heapq.heappush(heap, (-units, pos, w))
            continue
        out.append((neg, pos, w))
    if len(out) < nodes:
        for item in out:
            heapq.heappush(heap, item)
        return None
    return [w for _, _, w in out]


def reserve(st: ShapeState, nodes: int) -> list[Worker] | None:
    """The ``nodes`` workers a blocked job of ``st``'s shape should hold: on its first target
    with enough compatible workers whose room for it is not reserved, those with the most free
    units (ties in fleet order); None when no target has enough. Marking them reserved is the
    caller's business.

    A failure is remembered (``st.reserve_fail_n``): workers only get reserved, never
    released, in a pass, so a later job of the shape needing as many nodes fails too.
    """
    kind, k = st.shape.accelerator, st.shape.device_count
    for target, _ in st.per_target:
        heap = st.pools.get(target)
        if heap is None:
            heap = [(-free_units(w, c, kind, k), w.pos, w)
                    for c in st.eligible_of.values() if c.cls.target == target
                    for w in c.cls.active]
            heapq.heapify(heap)
            st.pools[target] = heap
        taken = take_most_free(heap, st, kind, k, nodes)
        if taken is not None:
            return taken
    st.reserve_fail_n = nodes
    return None
