"""The steps of ``place`` one at a time: order, assign, the starvation rule, the decisions."""

from __future__ import annotations

import math

from gpulayer.scheduling.model import NodeGrant
from gpulayer.scheduling.placement import (
    assign,
    assigned_decision,
    hold,
    queue_order,
    unplaceable_decision,
    waiting_decision,
    wants_reservation,
)
from gpulayer.scheduling.reasons import UnschedulableReasons, WaitingReasons
from tests.factories import (
    make_capabilities,
    make_cuda_devices,
    make_distributed_job,
    make_job,
    make_shape_state,
    make_state,
    make_worker,
    queued,
)


def test_queue_order():
    jobs = [queued(make_job(priority=0), "a", seq=0), queued(make_job(priority=3), "b", seq=2),
            queued(make_job(priority=3), "c", seq=1)]
    assert [q.id for q in queue_order(jobs)] == ["c", "b", "a"]
    ties = [queued(make_job(priority=p), f"j{i}", seq=s) for i, (p, s) in enumerate([(0, 1), (1, 1), (0, 0), (1, 1)])]
    assert [q.id for q in queue_order(ties)] == ["j1", "j3", "j2", "j0"]
    assert queue_order(ties) == sorted(ties, key=lambda q: (-q.spec.priority, q.seq))


def test_assign_grants_on_the_first_target_with_room_for_every_node():
    local = make_worker("wkr-local", devices=make_cuda_devices(1))
    remote = [make_worker(f"wkr-r{i}", origin="existing", devices=make_cuda_devices(1)) for i in range(2)]
    fleet, st = make_shape_state(make_distributed_job(2, accelerator="cuda", target="local", fallback=["remote"]),
                                 make_state(local), *map(make_state, remote))
    grants, target_index, best_partial = assign(st, 2)
    assert (target_index, best_partial) == (1, 1)
    assert [(g.worker_id, g.node_rank, g.devices) for g in grants or []] == [("wkr-r0", 0, [0]), ("wkr-r1", 1, [0])]
    assert fleet.workers[0].free == {"cuda": {0}}  # nothing taken on the target that was too small
    assert assign(st, 2) == (None, -1, 1)  # local could take one node, remote none


def test_wants_reservation():
    _, st = make_shape_state(make_job(accelerator="cuda", gpus=2), make_state(make_worker(devices=make_cuda_devices(2))))
    old = queued(make_job(accelerator="cuda", gpus=2), "old", queued_at=0.0)
    assert wants_reservation(old, st, 1, now=61.0, reserve_after=60.0)
    assert not wants_reservation(old, st, 1, now=60.0, reserve_after=60.0)  # strictly longer
    assert not wants_reservation(old, st, 1, now=1e9, reserve_after=math.inf)
    st.reserve_fail_n = 1
    assert not wants_reservation(old, st, 1, now=61.0, reserve_after=60.0)
    _, one = make_shape_state(make_job(accelerator="cuda"), make_state(make_worker(devices=make_cuda_devices(2))))
    assert not wants_reservation(old, one, 1, now=61.0, reserve_after=60.0)  # one unit never reserves
    assert wants_reservation(old, one, 2, now=61.0, reserve_after=60.0)  # ... a gang of them does


def test_hold_marks_the_reserved_workers_and_drops_stale_waiting_reasons():
    states = [make_state(make_worker(f"wkr-{i}", devices=make_cuda_devices(2)), busy=[("cuda", i % 2)])
              for i in range(2)]
    fleet, st = make_shape_state(make_job(accelerator="cuda", gpus=2), *states)
    waiting = WaitingReasons(limit=50)
    before = waiting.of(st, 1, "job-small")
    assert [r.code for r in before] == ["busy", "busy"]
    assert hold(st, 1, "job-big", waiting) == ["wkr-0"]  # most free, ties in fleet order
    assert [w.reserved for w in fleet.workers] == [{"cuda": "job-big"}, {}]
    after = waiting.of(st, 1, "job-small")
    assert [r.code for r in after] == ["reserved", "busy"] and [r.code for r in before] == ["busy", "busy"]
    assert hold(st, 2, "job-gang", waiting) == []  # one unreserved worker left: nothing held
    assert fleet.workers[1].reserved == {} and st.reserve_fail_n == 2


def test_assigned_decision_summaries():
    _, st = make_shape_state(make_job(accelerator="cuda", target="local", fallback=["remote"]))
    one = [NodeGrant(worker_id="wkr-a", node_rank=0, accelerator="cuda", devices=[0, 1])]
    d = assigned_decision(st, one, 0, 1, now=7.0)
    assert (d.outcome, d.summary, d.reasons, d.at) == ("assigned", "assigned to wkr-a (cuda 0,1)", [], 7.0)
    assert assigned_decision(st, one, 1, 1, 0.0).summary == (
        "assigned to wkr-a (cuda 0,1) on remote, fallback from local")
    many = [NodeGrant(worker_id=f"w{i}", node_rank=i, accelerator="cuda", devices=[0]) for i in range(10)]
    assert assigned_decision(st, many, 0, 10, 0.0).summary == (
        "assigned to 10 workers: " + ", ".join(f"w{i} (cuda 0)" for i in range(8)) + ", +2 more")
    _, cpu = make_shape_state(make_job())
    cpu_grant = [NodeGrant(worker_id="wkr-c", node_rank=0, accelerator=None, devices=[])]
    assert assigned_decision(cpu, cpu_grant, 0, 1, 0.0).summary == "assigned to wkr-c (CPU slot)"


def test_unplaceable_decision():
    cpu = make_worker("wkr-cpu")
    fleet, st = make_shape_state(make_job(accelerator="cuda"), make_state(cpu))
    d = unplaceable_decision(st, 1, 3.0, UnschedulableReasons(fleet, has_offers=False, limit=50))
    assert d.render() == "scheduling: no eligible worker\nwkr-cpu: needs 1 usable cuda device(s), worker has 0"
    assert d.at == 3.0
    fleet, st = make_shape_state(make_distributed_job(2), make_state(cpu))
    d = unplaceable_decision(st, 2, 0.0, UnschedulableReasons(fleet, has_offers=False, limit=50))
    assert d.render() == ("scheduling: needs 2 eligible workers on one target, found 1\n"
                          "local: 1 compatible local worker(s), the job needs 2 at once")
    offer = ("p:gpu", make_capabilities(devices=make_cuda_devices(1)))
    fleet, st = make_shape_state(make_job(accelerator="cuda", target="cloud"), offers=[offer])
    d = unplaceable_decision(st, 1, 0.0, UnschedulableReasons(fleet, has_offers=True, limit=50))
    assert (d.outcome, d.summary, d.reasons) == (
        "waiting", "waiting: no compatible worker registered yet; offer p:gpu could run it once booted", [])


def test_waiting_decision_summaries():
    states = [make_state(make_worker(f"w{i}", devices=make_cuda_devices(1))) for i in range(3)]
    _, st = make_shape_state(make_job(accelerator="cuda"), *states)
    d = waiting_decision(st, 1, 0, [], [], 60.0, 1.0)
    assert (d.outcome, d.summary, d.at) == ("waiting", "waiting: 3 compatible worker(s) busy", 1.0)
    assert waiting_decision(st, 3, 2, [], [], 60.0, 0.0).summary == (
        "waiting: needs 3 workers at once, 2 of 3 compatible worker(s) free")
    held = [f"w{i}" for i in range(7)]
    assert waiting_decision(st, 1, 0, [], held, 90.5, 0.0).summary == (
        "waiting: 3 compatible worker(s) busy; reserved w0, w1, w2, w3, w4 +2 more for it "
        "(queued longer than reserve_after=90.5s)")
    st.offers_fit = [("p:gpu", math.inf)]
    assert waiting_decision(st, 1, 0, [], ["w0"], 60.0, 0.0).summary == (
        "waiting: 3 compatible worker(s) busy; reserved w0 for it (queued longer than reserve_after=60s)"
        "; offer p:gpu could run it once booted")


def test_until_full_stops_once_no_worker_has_room_and_decides_the_same_up_to_there():
    from gpulayer.scheduling import place

    fleet = [make_state(make_worker("wkr-a", cpu_slots=2), busy_cpu_slots=1),
             make_state(make_worker("wkr-b", devices=make_cuda_devices(1), cpu_slots=0))]
    queue = [queued(make_job(accelerator="cuda", gpus=1), "gpu", seq=0),
             *(queued(make_job(), f"cpu{i}", seq=i + 1) for i in range(5))]
    whole = place(queue, fleet, now=0.0)
    part = place(queue, fleet, now=0.0, until_full=True)
    assert [a.job_id for a in part.assignments] == [a.job_id for a in whole.assignments] == ["gpu", "cpu0"]
    # the jobs behind the last one that fitted are not reached: they keep their last decision
    assert set(part.decisions) == {"gpu", "cpu0"}
    assert all(part.decisions[j].summary == whole.decisions[j].summary for j in part.decisions)
    assert set(whole.decisions) == {q.id for q in queue}


def _mixed_pass_inputs():
    fleet = [make_state(make_worker("wkr-8", devices=make_cuda_devices(8), cpu_slots=1), busy=[("cuda", 0)]),
             make_state(make_worker("wkr-1a", devices=make_cuda_devices(1), cpu_slots=0)),
             make_state(make_worker("wkr-1b", devices=make_cuda_devices(1), cpu_slots=0), busy=[("cuda", 0)]),
             make_state(make_worker("wkr-cpu", cpu_slots=2))]
    shapes = [make_job(accelerator="cuda"), make_job(accelerator="cuda", gpus=8), make_job(),
              make_job(accelerator="cuda", gpus=4, priority=2), make_distributed_job(2, accelerator="cuda"),
              make_job(accelerator="rocm")]
    queue = [queued(shapes[i % len(shapes)], f"j{i:02d}", seq=i, queued_at=0.0 if i % 4 == 0 else 95.0)
             for i in range(30)]
    return fleet, queue


def test_a_pass_over_the_head_of_the_queue_decides_it_as_a_pass_over_the_whole_queue():
    """What the control plane's pass after a task ended relies on to read only the head."""
    from gpulayer.scheduling import place

    fleet, queue = _mixed_pass_inputs()
    ordered = queue_order(queue)
    whole = place(queue, fleet, now=100.0, reserve_after=60.0)
    assert whole.reservations  # the head includes jobs that reserve workers
    for n in (1, 3, 7, 12, 30):
        head = place(ordered[:n], fleet, now=100.0, reserve_after=60.0)
        assert {j: d.render() for j, d in head.decisions.items()} == {
            q.id: whole.decisions[q.id].render() for q in ordered[:n]}
        assert head.reservations == {j: w for j, w in whole.reservations.items() if j in head.decisions}


def test_class_keys_given_by_the_caller_decide_as_keys_computed_by_the_pass():
    from dataclasses import replace

    from gpulayer.scheduling import place
    from gpulayer.scheduling.shapes import class_key

    fleet, queue = _mixed_pass_inputs()
    computed = place(queue, fleet, now=100.0, reserve_after=60.0)
    shared: dict = {}
    for keys in ([class_key(ws.record) for ws in fleet],  # equal keys as distinct objects
                 [shared.setdefault(k, k) for k in (class_key(ws.record) for ws in fleet)]):  # one per class
        given = place(queue, [replace(ws, class_key=k) for ws, k in zip(fleet, keys, strict=True)],
                      now=100.0, reserve_after=60.0)
        assert {j: d.render() for j, d in given.decisions.items()} == {
            j: d.render() for j, d in computed.decisions.items()}
        assert given.assignments == computed.assignments
