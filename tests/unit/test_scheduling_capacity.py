"""Free capacity: fits, free_units, pick, grant, take_most_free and reserve, one at a time."""

from __future__ import annotations

import heapq
import math

from gpulayer.scheduling.candidates import ShapeState
from gpulayer.scheduling.capacity import fits, free_units, grant, pick, reserve, take_most_free
from gpulayer.scheduling.fleet import Fleet
from tests.factories import make_cuda_devices, make_device, make_job, make_shape_state, make_state, make_worker

MIXED = make_worker("wkr-mixed", devices=[make_device("cuda", 0, memory_gb=16),
                                          *make_cuda_devices(4, memory_gb=80)[1:]])  # 0 small, 1-3 big



def test_fits_and_free_units_count_only_eligible_free_devices():
    fleet, st = make_shape_state(make_job(accelerator="cuda", gpus=2, min_gpu_memory_gb=40),
                                 make_state(MIXED, busy=[("cuda", 1)]))
    (w,) = fleet.workers
    cand = st.eligible_of[w.cls]
    assert cand.eligible == (1, 2, 3) and not cand.all_usable
    assert free_units(w, cand, "cuda", 2) == 2  # 2 and 3; 0 is free but too small
    assert fits(w, cand, "cuda", 2)
    assert not fits(w, cand, "cuda", 3)
    w.free["cuda"].discard(2)
    assert free_units(w, cand, "cuda", 2) == 1 and not fits(w, cand, "cuda", 2)
    assert free_units(w, cand, "rocm", 1) == 0 and not fits(w, cand, "rocm", 1)


def test_fits_cpu_slots_and_reserved_workers():
    fleet, st = make_shape_state(make_job(), make_state(make_worker(cpu_slots=2), busy_cpu_slots=1))
    (w,) = fleet.workers
    cand = st.eligible_of[w.cls]
    assert fits(w, cand, None, 0) and free_units(w, cand, None, 0) == 1
    w.reserved["cuda"] = "job-big"  # another room: its CPU slots stay free
    assert fits(w, cand, None, 0)
    w.reserved[None] = "job-big"
    assert not fits(w, cand, None, 0)
    assert free_units(w, cand, None, 0) == 1  # reserved workers still count their room
    w.reserved, w.free_cpu = {}, 0
    assert not fits(w, cand, None, 0)


def test_pick_takes_distinct_workers_in_candidate_order_and_drops_full_ones_for_good():
    states = [make_state(make_worker(f"wkr-{i}", devices=make_cuda_devices(1)), busy=busy)
              for i, busy in enumerate([[("cuda", 0)], [], [("cuda", 0)], []])]
    fleet, st = make_shape_state(make_job(accelerator="cuda"), *states)
    (_, cands), = st.per_target
    picked, ok = pick(cands, "cuda", 1, 1)
    assert ok and [w.id for w, _ in picked] == ["wkr-1"]
    assert [w.id for w in cands[0].workers] == ["wkr-1", "wkr-2", "wkr-3"]  # wkr-0 seen full: gone
    picked, ok = pick(cands, "cuda", 1, 3)
    assert not ok and [w.id for w, _ in picked] == ["wkr-1", "wkr-3"]
    assert [w.id for w in cands[0].workers] == ["wkr-1", "wkr-3"]
    for w in fleet.workers:
        w.free.clear()
    assert pick(cands, "cuda", 1, 1) == ([], False)
    assert cands == []  # the emptied candidate is dropped from the shape's list


def test_grant_takes_lowest_eligible_devices_or_a_cpu_slot():
    fleet, st = make_shape_state(make_job(accelerator="cuda", gpus=2, min_gpu_memory_gb=40), make_state(MIXED))
    (w,) = fleet.workers
    cand = st.eligible_of[w.cls]
    (g,) = grant([(w, cand)], "cuda", 2)
    assert (g.worker_id, g.node_rank, g.accelerator, g.devices) == ("wkr-mixed", 0, "cuda", [1, 2])
    assert w.free["cuda"] == {0, 3}
    fleet, st = make_shape_state(make_job(accelerator="cuda", gpus=3), make_state(MIXED, busy=[("cuda", 1)]))
    (w,) = fleet.workers
    (g,) = grant([(w, st.eligible_of[w.cls])], "cuda", 3)
    assert g.devices == [0, 2, 3]
    a, b = (make_state(make_worker(f"wkr-{i}", cpu_slots=2)) for i in range(2))
    fleet, st = make_shape_state(make_job(), a, b)
    picked = [(w, st.eligible_of[w.cls]) for w in fleet.workers]
    grants = grant(picked, None, 0)
    assert [(g.worker_id, g.node_rank, g.accelerator, g.devices) for g in grants] == [
        ("wkr-0", 0, None, []), ("wkr-1", 1, None, [])]
    assert [w.free_cpu for w in fleet.workers] == [1, 1]


def _pool(st: ShapeState, fleet: Fleet, k: int):
    heap = [(-free_units(w, st.eligible_of[w.cls], "cuda", k), w.pos, w) for w in fleet.workers]
    heapq.heapify(heap)
    return heap


def test_take_most_free_pops_the_most_free_and_repairs_stale_entries():
    states = [make_state(make_worker(f"wkr-{i}", devices=make_cuda_devices(8)), busy=[("cuda", j) for j in range(n)])
              for i, n in enumerate([6, 2, 2, 0])]
    fleet, st = make_shape_state(make_job(accelerator="cuda", gpus=8), *states)
    heap = _pool(st, fleet, 8)
    fleet.workers[3].free["cuda"] -= {0, 1, 2, 3, 4}  # wkr-3 filled up since it was pushed
    taken = take_most_free(heap, st, "cuda", 8, 2)
    assert [w.id for w in taken or []] == ["wkr-1", "wkr-2"]  # ties in fleet order; wkr-3 now has 3
    fleet.workers[3].reserved["cuda"] = "other"
    before = sorted(heap)
    assert take_most_free(heap, st, "cuda", 8, 2) is None
    assert sorted(heap) == [e for e in before if e[2].id != "wkr-3"]  # reserved ones dropped, rest kept


def test_reserve_uses_the_first_target_with_enough_workers_and_remembers_failure():
    local = make_worker("wkr-local", devices=make_cuda_devices(8))
    remote = [make_worker(f"wkr-r{i}", origin="existing", devices=make_cuda_devices(8)) for i in range(2)]
    job = make_job(accelerator="cuda", gpus=8, target="local", fallback=["remote"])
    fleet, st = make_shape_state(job, make_state(local, busy=[("cuda", 0)]),
                                 *(make_state(r, busy=[("cuda", i)]) for i, r in enumerate(remote)))
    assert [w.id for w in reserve(st, 1) or []] == ["wkr-local"]
    assert set(st.pools) == {"local"}
    assert st.reserve_fail_n == math.inf
    fleet.workers[0].reserved["cuda"] = "job-a"
    assert [w.id for w in reserve(st, 2) or []] == ["wkr-r0", "wkr-r1"]
    assert set(st.pools) == {"local", "remote"}
    for w in fleet.workers:
        w.reserved["cuda"] = "job-a"
    assert reserve(st, 1) is None
    assert st.reserve_fail_n == 1
