"""The reasons of jobs a pass does not assign, built alone from a fleet and a shape state."""

from __future__ import annotations

from gpulayer.scheduling.reasons import UnschedulableReasons, WaitingReasons, too_few_workers
from tests.factories import make_capabilities, make_cuda_devices, make_distributed_job, make_job, make_shape_state, make_state, make_worker


def _lines(reasons):
    return [r.render() for r in reasons]


def test_too_few_workers_names_targets_with_some():
    _, st = make_shape_state(make_distributed_job(3, target="local", fallback=["remote", "cloud"]),
                             make_state(make_worker("wkr-a")), make_state(make_worker("wkr-b", origin="existing")),
                             make_state(make_worker("wkr-c", origin="existing")))
    assert _lines(too_few_workers(st, 3)) == [
        "local: 1 compatible local worker(s), the job needs 3 at once",
        "remote: 2 compatible remote worker(s), the job needs 3 at once",
    ]
    assert too_few_workers(st, 3)[0].model_dump() == {
        "worker": "local", "code": "too_few_workers", "wanted": "3", "have": "1",
        "message": "1 compatible local worker(s), the job needs 3 at once"}


def test_unschedulable_reasons_list_targets_workers_states_and_offers():
    fleet, st = make_shape_state(
        make_job(accelerator="cuda", target="remote", fallback=["cloud"]),
        make_state(make_worker("wkr-cpu", origin="existing")),
        make_state(make_worker("wkr-off", origin="existing", devices=make_cuda_devices(1), online=False)),
        make_state(make_worker("wkr-local", devices=make_cuda_devices(1))),
        offers=[("p:cpu", make_capabilities())],
    )
    reasons = UnschedulableReasons(fleet, has_offers=True, limit=50)
    out = reasons.of(st)
    assert _lines(out) == [
        "cloud: no cloud worker registered",
        "wkr-cpu: needs 1 usable cuda device(s), worker has 0",
        "wkr-off: worker is offline",
        "wkr-local: serves local jobs (origin local), job allows remote, cloud",
        "p:cpu: needs 1 usable cuda device(s), worker has 0",
    ]
    assert reasons.of(st) is out  # once per shape
    no_offers = UnschedulableReasons(fleet, has_offers=False, limit=50)
    assert _lines(no_offers.of(st))[0] == "cloud: no cloud worker registered and no provider offered a machine"


def test_unschedulable_reasons_are_capped_with_every_class_first():
    states = [make_state(make_worker(f"wkr-{i}")) for i in range(6)]
    states.insert(4, make_state(make_worker("wkr-mac", os="darwin")))
    fleet, st = make_shape_state(make_job(accelerator="cuda"), *states)
    out = UnschedulableReasons(fleet, has_offers=False, limit=3).of(st)
    assert [r.worker for r in out] == ["wkr-0", "wkr-1", "wkr-mac", "..."]
    assert out[-1].model_dump() == {
        "worker": "...", "code": "more", "wanted": None, "have": "4",
        "message": "and 4 more worker(s), each with the same reasons as a listed worker with the same capabilities"}
    # fewer slots than classes: not every class is shown
    fleet, st = make_shape_state(make_job(accelerator="cuda"), *states[:2], states[4],
                                 make_state(make_worker("wkr-eu", labels={"zone": "eu"})))
    out = UnschedulableReasons(fleet, has_offers=False, limit=2).of(st)
    assert [r.worker for r in out] == ["wkr-0", "wkr-mac", "..."]
    assert out[-1].message == "and 2 more worker(s), not listed"


def test_waiting_reasons_busy_wordings():
    gpu8 = make_worker("wkr-8", devices=make_cuda_devices(8))
    for job, message in [
        (make_job(), "compatible but busy: no free CPU slot"),
        (make_job(accelerator="cuda"), "compatible but busy: no free cuda device"),
        (make_job(accelerator="cuda", gpus=4), "compatible but busy: fewer than 4 free cuda devices"),
    ]:
        _, st = make_shape_state(job, make_state(gpu8))
        (r,) = WaitingReasons(limit=50).of(st, 1, "job-0")
        assert (r.worker, r.code, r.message) == ("wkr-8", "busy", message)


def test_waiting_reasons_gangs_name_free_workers_and_are_not_cached():
    states = [make_state(make_worker(f"wkr-{i}", devices=make_cuda_devices(1)), busy=busy)
              for i, busy in enumerate([[], [("cuda", 0)], []])]
    _, st = make_shape_state(make_distributed_job(4, accelerator="cuda"), *states)
    waiting = WaitingReasons(limit=50)
    out = waiting.of(st, 4, "job-0")
    assert [(r.worker, r.code, r.message) for r in out] == [
        ("wkr-0", "free", "free, but the job needs 4 workers at once"),
        ("wkr-1", "busy", "compatible but busy: no free cuda device"),
        ("wkr-2", "free", "free, but the job needs 4 workers at once"),
    ]
    again = waiting.of(st, 4, "job-1")
    assert again is not out and again == out
    assert all(a is b for a, b in zip(again, out, strict=True))  # per-worker reasons are shared


def test_waiting_reasons_cache_is_dropped_when_a_listed_worker_is_reserved():
    fleet, st = make_shape_state(make_job(accelerator="cuda", gpus=2),
                                 *(make_state(make_worker(f"wkr-{i}", devices=make_cuda_devices(2)), busy=[("cuda", 0)])
                                   for i in range(3)))
    waiting = WaitingReasons(limit=2)
    out = waiting.of(st, 1, "job-0")
    assert [(r.worker, r.code) for r in out] == [("wkr-0", "busy"), ("wkr-1", "busy"), ("...", "more")]
    assert out[-1].message == "and 1 more compatible worker(s)"
    assert waiting.of(st, 1, "job-1") is out
    unlisted = fleet.workers[2]
    unlisted.reserved["cuda"] = "job-0"
    waiting.forget(unlisted)
    assert waiting.of(st, 1, "job-1") is out  # wkr-2 is not listed: the cache stands
    fleet.workers[1].reserved["cuda"] = "job-0"
    waiting.forget(fleet.workers[1])
    out = waiting.of(st, 1, "job-1")
    assert [(r.worker, r.code, r.message) for r in out[:2]] == [
        ("wkr-0", "busy", "compatible but busy: fewer than 2 free cuda devices"),
        ("wkr-1", "reserved", "compatible but reserved for job job-0"),
    ]
    # the job that holds the reservation sees its own worker as busy, not reserved
    fresh = WaitingReasons(limit=2)
    assert [r.code for r in fresh.of(st, 1, "job-0")[:2]] == ["busy", "busy"]
