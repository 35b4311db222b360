"""The steps of ``place`` one at a time: order, assign, the starvation rule, the decisions."""

from __future__ import annotations

import math

from gpulayer.scheduling.model import NodeGrant
from gpulayer.scheduling.placement import (
    Attempt,
    assign,
    assigned_decision,
    nodes_of,
    queue_order,
    unplaceable_decision,
    waiting_decision,
    wants_reservation,
)
from gpulayer.scheduling.reasons import UnschedulableReasons
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


def test_queue_order_and_nodes_of():
    jobs = [queued(make_job(priority=0), "a", seq=0), queued(make_job(priority=3), "b", seq=2),
            queued(make_job(priority=3), "c", seq=1)]
    assert [q.id for q in sorted(jobs, key=queue_order)] == ["c", "b", "a"]
    assert nodes_of(make_job()) == 1
    assert nodes_of(make_distributed_job(3)) == 3


def test_assign_grants_on_the_first_target_with_room_for_every_node():
    local = make_worker("wkr-local", devices=make_cuda_devices(1))
    remote = [make_worker(f"wkr-r{i}", origin="existing", devices=make_cuda_devices(1)) for i in range(2)]
    fleet, st = make_shape_state(make_distributed_job(2, accelerator="cuda", target="local", fallback=["remote"]),
                                 make_state(local), *map(make_state, remote))
    attempt = assign(st, 2)
    assert attempt.target_index == 1
    assert [(g.worker_id, g.node_rank, g.devices) for g in attempt.grants or []] == [
        ("wkr-r0", 0, [0]), ("wkr-r1", 1, [0])]
    assert fleet.workers[0].free == {"cuda": {0}}  # nothing taken on the target that was too small
    again = assign(st, 2)
    assert again == Attempt(None, -1, 1)  # local could take one node, remote none


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


def test_assigned_decision_summaries():
    _, st = make_shape_state(make_job(accelerator="cuda", target="local", fallback=["remote"]))
    one = Attempt([NodeGrant(worker_id="wkr-a", node_rank=0, accelerator="cuda", devices=[0, 1])], 0, 0)
    d = assigned_decision(st, one, 1, now=7.0)
    assert (d.outcome, d.summary, d.reasons, d.at) == ("assigned", "assigned to wkr-a (cuda 0,1)", [], 7.0)
    fallback = one._replace(target_index=1)
    assert assigned_decision(st, fallback, 1, 0.0).summary == (
        "assigned to wkr-a (cuda 0,1) on remote, fallback from local")
    many = [NodeGrant(worker_id=f"w{i}", node_rank=i, accelerator="cuda", devices=[0]) for i in range(10)]
    assert assigned_decision(st, Attempt(many, 0, 0), 10, 0.0).summary == (
        "assigned to 10 workers: " + ", ".join(f"w{i} (cuda 0)" for i in range(8)) + ", +2 more")
    _, cpu = make_shape_state(make_job())
    cpu_grant = Attempt([NodeGrant(worker_id="wkr-c", node_rank=0, accelerator=None, devices=[])], 0, 0)
    assert assigned_decision(cpu, cpu_grant, 1, 0.0).summary == "assigned to wkr-c (CPU slot)"


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
    st.offer = "p:gpu"
    assert waiting_decision(st, 1, 0, [], ["w0"], 60.0, 0.0).summary == (
        "waiting: 3 compatible worker(s) busy; reserved w0 for it (queued longer than reserve_after=60s)"
        "; offer p:gpu could run it once booted")
