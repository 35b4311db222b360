"""The scheduler: ``check`` (exact reason wording) and ``place`` (one pass over a queue)."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpulayer.hookrecords import MachineOffer, SupportLevel
from gpulayer.scheduling import (
    NO_ELIGIBLE_WORKER,
    PlacementResult,
    QueuedJob,
    check,
    place,
)
from tests.factories import (
    make_capabilities,
    make_cuda_devices,
    make_device,
    make_distributed_job,
    make_function_job,
    make_job,
    make_mps_device,
    make_queue,
    make_state,
    make_worker,
    queued,
)

CPU = make_worker("wkr-cpu")
ONE_GPU_OLD_TORCH = make_worker("wkr-1gpu", devices=make_cuda_devices(1, memory_gb=24, cc="8.6"),
                                frameworks={"torch": "2.1.0", "torch.cuda": "2.1.0"})
H100x8 = make_worker("wkr-h100", devices=make_cuda_devices(8, memory_gb=80, cc="9.0"),
                     frameworks={"torch": "2.13.0+cpu", "torch.cuda": "2.13.0", "jax": "0.4.30"})
MAC = make_worker("wkr-mac", devices=[make_mps_device(32)], frameworks={"mlx": "0.9.0", "torch": "2.3.0"},
                  os="darwin", arch="arm64", python_version="3.10.12", cpu_count=8, memory_gb=31.3)
REMOTE = make_worker("wkr-remote", origin="existing")
CLOUD = make_worker("wkr-cloud", origin="provider")
UNUSABLE = make_worker("wkr-broken", devices=make_cuda_devices(2, usable=False, unusable_reason="driver not loaded"))
LABELLED = make_worker("wkr-eu", labels={"zone": "eu-west"})
NO_SLOTS = make_worker("wkr-noslots", devices=make_cuda_devices(1), cpu_slots=0)
MIXED = make_worker("wkr-mixed", devices=[make_device("cuda", 0, memory_gb=80, cc="8.0"),
                                          make_device("cuda", 1, memory_gb=40, cc="9.0")])

CHECK_CASES = [
    # (id, job, worker, [(code, message), ...])
    ("compatible", make_job(accelerator="cuda", frameworks={"torch": ">=2.2"}), H100x8, []),
    ("cpu-job-anywhere", make_job(), H100x8, []),
    ("no-devices", make_job(accelerator="cuda"), CPU,
     [("devices", "needs 1 usable cuda device(s), worker has 0")]),
    ("too-few-devices", make_job(accelerator="cuda", gpus=8), ONE_GPU_OLD_TORCH,
     [("devices", "needs 8 usable cuda device(s), worker has 1")]),
    ("unusable-devices", make_job(accelerator="cuda"), UNUSABLE,
     [("devices", "needs 1 usable cuda device(s), worker has 0 (2 unusable: driver not loaded)")]),
    ("other-kind", make_job(accelerator="cuda"), MAC,
     [("devices", "needs 1 usable cuda device(s), worker has 0")]),
    ("framework-version", make_job(accelerator="cuda", frameworks={"torch": ">=2.2"}), ONE_GPU_OLD_TORCH,
     [("framework_version", "torch 2.1.0 does not satisfy >=2.2")]),
    ("framework-missing", make_job(frameworks={"jax": ""}), CPU,
     [("framework_missing", "framework 'jax' not installed")]),
    ("framework-mlx", make_job(accelerator="mps", frameworks={"mlx": ">=0.10"}), MAC,
     [("framework_version", "mlx 0.9.0 does not satisfy >=0.10")]),
    ("local-version-ok", make_job(frameworks={"torch": ">=2.2"}), H100x8, []),
    ("prerelease-ok", make_job(frameworks={"torch": ">=2.2"}),
     make_worker("wkr-nightly", frameworks={"torch": "2.4.0.dev20240501+cu121"}), []),
    ("subprobe-missing", make_job(frameworks={"torch": "", "torch.cuda": ""}), MAC,
     [("framework_missing", "framework 'torch.cuda' not installed")]),
    ("subprobe-version", make_job(frameworks={"torch.cuda": ">=2.2"}), ONE_GPU_OLD_TORCH,
     [("framework_version", "torch.cuda 2.1.0 does not satisfy >=2.2")]),
    ("gpu-memory", make_job(accelerator="cuda", min_gpu_memory_gb=80), ONE_GPU_OLD_TORCH,
     [("gpu_memory", "needs 1 cuda device(s) with >= 80.0 GB, worker has 0")]),
    ("compute-capability", make_job(accelerator="cuda", compute_capability="9.0"), ONE_GPU_OLD_TORCH,
     [("compute_capability", "needs 1 cuda device(s) with compute capability >=9.0, worker has 0")]),
    ("memory-and-cc-apart", make_job(accelerator="cuda", min_gpu_memory_gb=80, compute_capability=">=9.0"), MIXED,
     [("device_filters", "needs 1 cuda device(s) with >= 80.0 GB and compute capability >=9.0, worker has 0")]),
    ("os", make_job(os="linux"), MAC, [("os", "needs os linux, worker has darwin")]),
    ("os-alias", make_job(os="macos"), CPU, [("os", "needs os darwin, worker has linux")]),
    ("python", make_job(python=">=3.11"), MAC, [("python", "python 3.10.12 does not satisfy >=3.11")]),
    ("cpus", make_job(cpus=16), MAC, [("cpus", "needs 16 CPUs, worker has 8")]),
    ("ram", make_job(memory_gb=64), MAC, [("memory", "needs 64.0 GB RAM, worker has 31.3 GB")]),
    ("label-other-value", make_job(labels={"zone": "us-east"}), LABELLED,
     [("label", "needs label zone=us-east, worker has zone=eu-west")]),
    ("label-missing", make_job(labels={"zone": "us-east"}), CPU,
     [("label", "needs label zone=us-east, worker has none")]),
    ("target-remote", make_job(target="local"), REMOTE,
     [("target", "serves remote jobs (origin existing), job allows local")]),
    ("target-with-fallback", make_job(target="local", fallback=["cloud"]), REMOTE,
     [("target", "serves remote jobs (origin existing), job allows local, cloud")]),
    ("target-cloud", make_job(target="remote"), CLOUD,
     [("target", "serves cloud jobs (origin provider), job allows remote")]),
    ("fallback-ok", make_job(target="local", fallback=["remote"]), REMOTE, []),
    ("distributed-mps", make_distributed_job(2, accelerator="mps"), MAC,
     [("distributed", "mps device(s) do not support distributed work (distributed=unsupported)")]),
    ("distributed-nproc-mps", make_distributed_job(1, nproc_per_node=2, accelerator="mps"), MAC,
     [("distributed", "mps device(s) do not support distributed work (distributed=unsupported)")]),
    ("single-node-mps-ok", make_distributed_job(1, accelerator="mps"), MAC, []),
    ("no-cpu-slots", make_job(), NO_SLOTS, [("cpu_slots", "runs no jobs without devices (cpu_slots=0)")]),
    ("no-cpu-slots-gpu-job-ok", make_job(accelerator="cuda"), NO_SLOTS, []),
    ("function-job", make_function_job(accelerator="cuda", frameworks={"cupy": ">=13"}), H100x8,
     [("framework_missing", "framework 'cupy' not installed")]),
    ("several-in-order", make_job(target="remote", os="linux", python=">=3.11", accelerator="cuda",
                                  frameworks={"mlx": ">=0.10", "jax": ""}), MAC,
     [("target", "serves local jobs (origin local), job allows remote"),
      ("os", "needs os linux, worker has darwin"),
      ("python", "python 3.10.12 does not satisfy >=3.11"),
      ("devices", "needs 1 usable cuda device(s), worker has 0"),
      ("framework_missing", "framework 'jax' not installed"),
      ("framework_version", "mlx 0.9.0 does not satisfy >=0.10")]),
]


@pytest.mark.parametrize("job,worker,expected", [c[1:] for c in CHECK_CASES], ids=[c[0] for c in CHECK_CASES])
def test_check_reasons(job, worker, expected):
    reasons = check(job, worker)
    assert [(r.code, r.message) for r in reasons] == expected
    assert all(r.worker == worker.id for r in reasons)


def test_check_reason_is_data():
    (r,) = check(make_job(accelerator="cuda", frameworks={"torch": ">=2.2"}), ONE_GPU_OLD_TORCH)
    assert (r.worker, r.code, r.wanted, r.have) == ("wkr-1gpu", "framework_version", "torch>=2.2", "2.1.0")
    assert r.render() == "wkr-1gpu: torch 2.1.0 does not satisfy >=2.2"


def test_check_ignores_availability():
    offline = make_worker("wkr-off", online=False, draining=True)
    assert check(make_job(), offline) == []


# --------------------------------------------------------------------------- place


def one(result: PlacementResult, job_id: str):
    return result.decisions[job_id]


def grants(result: PlacementResult) -> dict[str, list[tuple[str, tuple[int, ...]]]]:
    return {a.job_id: [(n.worker_id, tuple(n.devices)) for n in a.nodes] for a in result.assignments}


def test_seed_unschedulable_rendering():
    w1 = make_worker("wkr-10c5089a6044", frameworks={"torch": "2.3.0"})
    w2 = make_worker("wkr-471ad43b2467", devices=make_cuda_devices(1), frameworks={"torch": "2.1.0"})
    job = make_job(accelerator="cuda", frameworks={"torch": ">=2.2"})
    result = place(make_queue([job]), [make_state(w1), make_state(w2)], now=5.0)
    d = one(result, "job-0000")
    assert d.outcome == "unschedulable"
    assert d.at == 5.0
    assert d.render() == (
        "scheduling: no eligible worker\n"
        "wkr-10c5089a6044: needs 1 usable cuda device(s), worker has 0\n"
        "wkr-471ad43b2467: torch 2.1.0 does not satisfy >=2.2"
    )
    assert result.assignments == []


def test_cpu_slots():
    w = make_worker("wkr-a", cpu_slots=2)
    result = place(make_queue([make_job()] * 3), [make_state(w)], now=0.0)
    assert grants(result) == {"job-0000": [("wkr-a", ())], "job-0001": [("wkr-a", ())]}
    assert one(result, "job-0000").summary == "assigned to wkr-a (CPU slot)"
    d = one(result, "job-0002")
    assert d.outcome == "waiting"
    assert d.render() == "waiting: 1 compatible worker(s) busy\nwkr-a: compatible but busy: no free CPU slot"
    result = place(make_queue([make_job()]), [make_state(w, busy_cpu_slots=2)], now=0.0)
    assert one(result, "job-0000").outcome == "waiting"


def test_eight_one_gpu_jobs_on_an_eight_gpu_worker():
    job = make_job(accelerator="cuda", gpus=1)
    result = place(make_queue([job] * 9), [make_state(H100x8)], now=0.0)
    got = grants(result)
    assert len(got) == 8
    devices = sorted(d for nodes in got.values() for _, ds in nodes for d in ds)
    assert devices == list(range(8))
    assert got["job-0000"] == [("wkr-h100", (0,))]
    assert one(result, "job-0000").summary == "assigned to wkr-h100 (cuda 0)"
    assert one(result, "job-0008").outcome == "waiting"
    assert all(n.accelerator == "cuda" for a in result.assignments for n in a.nodes)


def test_busy_devices_are_not_granted_again():
    job = make_job(accelerator="cuda", gpus=2)
    state = make_state(H100x8, busy=[("cuda", 0), ("cuda", 2), ("cuda", 3)])
    result = place(make_queue([job] * 3), [state], now=0.0)
    assert grants(result) == {"job-0000": [("wkr-h100", (1, 4))], "job-0001": [("wkr-h100", (5, 6))]}
    assert one(result, "job-0002").render() == (
        "waiting: 1 compatible worker(s) busy\nwkr-h100: compatible but busy: fewer than 2 free cuda devices")


def test_grants_only_eligible_devices():
    job = make_job(accelerator="cuda", min_gpu_memory_gb=60)
    result = place(make_queue([job] * 2), [make_state(MIXED)], now=0.0)
    assert grants(result) == {"job-0000": [("wkr-mixed", (0,))]}
    assert one(result, "job-0001").outcome == "waiting"


def test_smallest_box_first():
    small = make_worker("wkr-small", devices=make_cuda_devices(1))
    result = place(make_queue([make_job(accelerator="cuda")]), [make_state(H100x8), make_state(small)], now=0.0)
    assert grants(result) == {"job-0000": [("wkr-small", (0,))]}
    cpu = make_worker("wkr-cpu2")
    result = place(make_queue([make_job()]), [make_state(H100x8), make_state(cpu)], now=0.0)
    assert grants(result) == {"job-0000": [("wkr-cpu2", ())]}


def test_nobody_unschedulable_with_one_reason_per_worker():
    job = make_job(accelerator="cuda", gpus=8, frameworks={"torch": ">=2.2"})
    fleet = [make_state(CPU), make_state(ONE_GPU_OLD_TORCH), make_state(MAC)]
    d = one(place(make_queue([job]), fleet, now=1.0), "job-0000")
    assert d.outcome == "unschedulable"
    assert d.summary == NO_ELIGIBLE_WORKER
    assert d.render().splitlines() == [
        "scheduling: no eligible worker",
        "wkr-cpu: needs 8 usable cuda device(s), worker has 0",
        "wkr-cpu: framework 'torch' not installed",
        "wkr-1gpu: needs 8 usable cuda device(s), worker has 1",
        "wkr-1gpu: torch 2.1.0 does not satisfy >=2.2",
        "wkr-mac: needs 8 usable cuda device(s), worker has 0",
    ]


def test_empty_fleet():
    d = one(place(make_queue([make_job()]), [], now=0.0), "job-0000")
    assert d.outcome == "unschedulable"
    assert d.render() == "scheduling: no eligible worker\nlocal: no local worker registered"


def test_offline_and_draining_workers_are_ignored():
    off = make_worker("wkr-off", devices=make_cuda_devices(8), online=False)
    drain = make_worker("wkr-drain", devices=make_cuda_devices(8), draining=True)
    job = make_job(accelerator="cuda")
    result = place(make_queue([job]), [make_state(off), make_state(drain)], now=0.0)
    d = one(result, "job-0000")
    assert result.assignments == []
    assert d.outcome == "unschedulable"
    assert d.render() == ("scheduling: no eligible worker\n"
                          "wkr-off: worker is offline\n"
                          "wkr-drain: worker is draining")
    # with an online one too, only the online one is used
    on = make_worker("wkr-on", devices=make_cuda_devices(1))
    result = place(make_queue([job] * 2), [make_state(off), make_state(drain), make_state(on)], now=0.0)
    assert grants(result) == {"job-0000": [("wkr-on", (0,))]}
    assert one(result, "job-0001").summary == "waiting: 1 compatible worker(s) busy"


def test_fallback_only_when_no_free_local_worker():
    local = make_worker("wkr-local", cpu_slots=1)
    remote = make_worker("wkr-remote", origin="existing", cpu_slots=4)
    fleet = [make_state(remote), make_state(local)]
    with_fallback = make_job(target="local", fallback=["remote"])
    result = place(make_queue([with_fallback] * 3), fleet, now=0.0)
    assert grants(result) == {"job-0000": [("wkr-local", ())], "job-0001": [("wkr-remote", ())],
                              "job-0002": [("wkr-remote", ())]}
    assert one(result, "job-0001").summary == "assigned to wkr-remote (CPU slot) on remote, fallback from local"
    # without a fallback, never remote: the second job waits for the local worker
    result = place(make_queue([make_job(target="local")] * 2), fleet, now=0.0)
    assert grants(result) == {"job-0000": [("wkr-local", ())]}
    assert one(result, "job-0001").outcome == "waiting"
    # and with only remote workers it is unschedulable, the remote one named
    d = one(place(make_queue([make_job(target="local")]), [make_state(remote)], now=0.0), "job-0000")
    assert d.render() == ("scheduling: no eligible worker\n"
                          "local: no local worker registered\n"
                          "wkr-remote: serves remote jobs (origin existing), job allows local")


def test_fallback_to_compatible_target_when_local_is_incompatible():
    remote_gpu = make_worker("wkr-rgpu", origin="existing", devices=make_cuda_devices(1))
    job = make_job(target="local", fallback=["remote"], accelerator="cuda")
    result = place(make_queue([job]), [make_state(CPU), make_state(remote_gpu)], now=0.0)
    assert grants(result) == {"job-0000": [("wkr-rgpu", (0,))]}


def test_cloud_job_without_cloud_worker():
    d = one(place(make_queue([make_job(target="cloud")]), [make_state(CPU)], now=0.0), "job-0000")
    assert d.outcome == "unschedulable"
    assert d.reasons[0].model_dump() == {
        "worker": "cloud", "code": "no_workers", "wanted": "cloud", "have": "0",
        "message": "no cloud worker registered and no provider offered a machine"}
    assert d.render() == ("scheduling: no eligible worker\n"
                          "cloud: no cloud worker registered and no provider offered a machine\n"
                          "wkr-cpu: serves local jobs (origin local), job allows cloud")


def test_cloud_job_with_an_offer_waits_for_it():
    caps = make_capabilities(devices=make_cuda_devices(1))
    gpu_offer = MachineOffer(provider="fakecloud", shape="gpu-1", capabilities=caps)
    cpu_offer = ("fakecloud:cpu-4", make_capabilities())
    job = make_job(target="cloud", accelerator="cuda")
    result = place(make_queue([job]), [], now=0.0, offers=[cpu_offer, gpu_offer])
    d = one(result, "job-0000")
    assert d.outcome == "waiting"
    assert "fakecloud:gpu-1" in d.summary
    assert result.offer_requests == {"job-0000": "fakecloud:gpu-1"}
    # no offer fits: unschedulable, the offer's reasons listed
    result = place(make_queue([job]), [], now=0.0, offers=[cpu_offer])
    assert one(result, "job-0000").render() == (
        "scheduling: no eligible worker\n"
        "cloud: no cloud worker registered\n"
        "fakecloud:cpu-4: needs 1 usable cuda device(s), worker has 0")
    # offers never serve a local-only job
    result = place(make_queue([make_job()]), [], now=0.0, offers=[cpu_offer])
    assert one(result, "job-0000").outcome == "unschedulable"


def test_priority_then_fifo():
    w = make_worker("wkr-a", cpu_slots=2)
    queue = [
        queued(make_job(priority=0), "low-early", seq=0),
        queued(make_job(priority=5), "high-late", seq=3),
        queued(make_job(priority=5), "high-early", seq=2),
        queued(make_job(priority=0), "low-late", seq=1),
    ]
    result = place(queue, [make_state(w)], now=0.0)
    assert [a.job_id for a in result.assignments] == ["high-early", "high-late"]
    assert {one(result, j).outcome for j in ("low-early", "low-late")} == {"waiting"}
    result = place(queue, [make_state(make_worker("wkr-a", cpu_slots=3))], now=0.0)
    assert [a.job_id for a in result.assignments] == ["high-early", "high-late", "low-early"]


def _starvation_pass(now: float, busy: set[int], queue: list[QueuedJob], reserve_after: float = 60.0):
    state = make_state(H100x8, busy=[("cuda", i) for i in busy])
    return place(queue, [state], now=now, reserve_after=reserve_after)


def test_big_job_is_not_starved_by_small_ones():
    """Simulate passes: 1-GPU jobs keep arriving; once the 8-GPU job waited long enough the
    worker is held for it, drains, and the big job runs."""
    big = queued(make_job(accelerator="cuda", gpus=8), "big", seq=0, queued_at=0.0)
    running: dict[int, float] = {i: 50.0 for i in range(4)}  # device -> finishes at
    seq = 1
    placed_big_at = None
    for now in range(0, 400, 10):
        for i, end in list(running.items()):
            if end <= now:
                del running[i]
        small = [queued(make_job(accelerator="cuda"), f"s{seq + j}", seq=seq + j, queued_at=float(now))
                 for j in range(3)]
        seq += 3
        result = _starvation_pass(float(now), set(running), [big, *small])
        for a in result.assignments:
            if a.job_id == "big":
                placed_big_at = now
            for d in a.nodes[0].devices:
                running[d] = now + 45.0
        if placed_big_at is not None:
            break
        d = result.decisions["big"]
        assert d.outcome == "waiting"
        if now > 60:
            assert result.reservations == {"big": ["wkr-h100"]}
            assert "reserved wkr-h100 for it" in d.summary
            assert all(a.job_id == "big" for a in result.assignments)
            assert result.decisions[small[0].id].reasons[0].message == "compatible but reserved for job big"
        else:
            assert result.reservations == {}
    assert placed_big_at is not None and placed_big_at <= 60 + 50
    # without the rule (reserve_after=inf) the stream keeps it waiting forever
    result = _starvation_pass(1000.0, {0}, [big, queued(make_job(accelerator="cuda"), "s", seq=1)],
                              reserve_after=float("inf"))
    assert [a.job_id for a in result.assignments] == ["s"]


def test_single_unit_jobs_do_not_reserve():
    job = queued(make_job(accelerator="cuda"), "one", seq=0, queued_at=0.0)
    result = _starvation_pass(1000.0, set(range(8)), [job])
    assert result.reservations == {}


def test_reservation_picks_the_most_free_worker_and_leaves_others():
    a = make_worker("wkr-a", devices=make_cuda_devices(8))
    b = make_worker("wkr-b", devices=make_cuda_devices(8))
    c = make_worker("wkr-c", devices=make_cuda_devices(2))
    fleet = [make_state(a, busy=[("cuda", i) for i in range(7)]),
             make_state(b, busy=[("cuda", i) for i in range(3)]),
             make_state(c)]
    big = queued(make_job(accelerator="cuda", gpus=8), "big", seq=0, queued_at=0.0)
    small = [queued(make_job(accelerator="cuda"), f"s{i}", seq=i + 1, queued_at=0.0) for i in range(4)]
    result = place([big, *small], fleet, now=100.0)
    assert result.reservations == {"big": ["wkr-b"]}
    # the small ones use wkr-c first (smallest), then wkr-a's free device; wkr-b is held
    assert grants(result) == {"s0": [("wkr-c", (0,))], "s1": [("wkr-c", (1,))], "s2": [("wkr-a", (7,))]}
    assert result.decisions["s3"].outcome == "waiting"


def test_a_reservation_holds_only_the_room_the_big_job_needs():
    """An 8-GPU job that reserved a worker holds its GPUs, not its CPU slots: a CPU job (or
    a job on an accelerator with gpus=0) still runs there, and a CPU gang that reserved CPU
    slots leaves the workers' GPUs to GPU jobs. Holding them would help nobody, and kept a
    CPU job waiting next to idle slots until every GPU drained."""
    h100 = make_state(make_worker("wkr-h100", devices=make_cuda_devices(8), cpu_slots=2), busy=[("cuda", 0)])
    big = queued(make_job(accelerator="cuda", gpus=8), "big", seq=0, queued_at=0.0)
    cpu = queued(make_job(), "cpu", seq=1, queued_at=100.0)
    zero = queued(make_job(accelerator="cuda", gpus=0), "zero", seq=2, queued_at=100.0)
    one = queued(make_job(accelerator="cuda"), "one", seq=3, queued_at=100.0)
    result = place([big, cpu, zero, one], [h100], now=100.0)
    assert result.reservations == {"big": ["wkr-h100"]}
    assert grants(result) == {"cpu": [("wkr-h100", ())], "zero": [("wkr-h100", ())]}
    assert result.decisions["one"].reasons[0].message == "compatible but reserved for job big"
    gang_workers = [make_state(make_worker(f"wkr-{i}", devices=make_cuda_devices(2), cpu_slots=1), busy_cpu_slots=1)
                    for i in range(2)]
    gang = queued(make_distributed_job(2), "gang", seq=0, queued_at=0.0)
    gpu = queued(make_job(accelerator="cuda"), "gpu", seq=1, queued_at=100.0)
    result = place([gang, gpu], gang_workers, now=100.0)
    assert result.reservations == {"gang": ["wkr-0", "wkr-1"]}
    assert grants(result) == {"gpu": [("wkr-0", (0,))]}


def test_gang_all_or_nothing_on_distinct_workers():
    w = [make_worker(f"wkr-{i}", devices=make_cuda_devices(8)) for i in range(3)]
    gang = make_distributed_job(3, accelerator="cuda", gpus=8)
    result = place(make_queue([gang]), [make_state(x) for x in w], now=0.0)
    (a,) = result.assignments
    assert [(n.worker_id, n.node_rank, n.accelerator, n.devices) for n in a.nodes] == [
        (f"wkr-{i}", i, "cuda", list(range(8))) for i in range(3)]
    assert result.decisions["job-0000"].summary.startswith("assigned to 3 workers: wkr-0 (cuda 0,1,2,3,4,5,6,7)")
    # one worker busy: nothing is granted at all, a later small job still runs
    fleet = [make_state(w[0]), make_state(w[1], busy=[("cuda", 0)]), make_state(w[2])]
    result = place(make_queue([gang, make_job(accelerator="cuda")]), fleet, now=0.0)
    assert [a.job_id for a in result.assignments] == ["job-0001"]
    d = result.decisions["job-0000"]
    assert d.summary == "waiting: needs 3 workers at once, 2 of 3 compatible worker(s) free"
    assert [(r.worker, r.code) for r in d.reasons] == [("wkr-0", "free"), ("wkr-1", "busy"), ("wkr-2", "free")]
    assert d.reasons[0].message == "free, but the job needs 3 workers at once"
    # the gang cannot share one worker even if it has room for all nodes
    gang2 = make_distributed_job(2, accelerator="cuda", gpus=1)
    result = place(make_queue([gang2]), [make_state(w[0])], now=0.0)
    d = result.decisions["job-0000"]
    assert d.outcome == "unschedulable"
    assert d.summary == "scheduling: needs 2 eligible workers on one target, found 1"
    assert d.render().splitlines()[1] == "local: 1 compatible local worker(s), the job needs 2 at once"


def test_cpu_gang_uses_cpu_slots():
    w = [make_worker(f"wkr-{i}", cpu_slots=1) for i in range(2)]
    result = place(make_queue([make_distributed_job(2)]), [make_state(x) for x in w], now=0.0)
    assert grants(result) == {"job-0000": [("wkr-0", ()), ("wkr-1", ())]}
    assert all(n.accelerator is None for n in result.assignments[0].nodes)


def test_every_job_gets_a_decision_and_waiting_reasons_list_busy_workers():
    fleet = [make_state(H100x8, busy=[("cuda", i) for i in range(8)]), make_state(CPU)]
    queue = make_queue([make_job(accelerator="cuda"), make_job(), make_job(accelerator="rocm")])
    result = place(queue, fleet, now=3.0)
    assert set(result.decisions) == {"job-0000", "job-0001", "job-0002"}
    assert [result.decisions[j].outcome for j in sorted(result.decisions)] == ["waiting", "assigned", "unschedulable"]
    assert result.decisions["job-0000"].render() == (
        "waiting: 1 compatible worker(s) busy\nwkr-h100: compatible but busy: no free cuda device")
    assert all(d.at == 3.0 for d in result.decisions.values())


def test_reasons_are_capped():
    fleet = [make_state(make_worker(f"wkr-{i:03d}")) for i in range(120)]
    fleet.append(make_state(make_worker("wkr-mac", os="darwin")))
    d = one(place(make_queue([make_job(accelerator="cuda")]), fleet, now=0.0, reason_limit=10), "job-0000")
    workers = [r.worker for r in d.reasons]
    assert len(workers) == 11
    assert "wkr-mac" in workers  # every class of worker is shown
    assert d.reasons[-1].worker == "..."
    assert d.reasons[-1].message == ("and 111 more worker(s), each with the same reasons as a listed "
                                     "worker with the same capabilities")


def test_jobs_not_assigned_for_the_same_reasons_share_one_decision():
    queue = make_queue([make_job(accelerator="cuda")] * 3 + [make_job(accelerator="cuda", gpus=2)])
    result = place(queue, [make_state(CPU)], now=0.0)
    a, b, c, other = (result.decisions[f"job-000{i}"] for i in range(4))
    assert a is b is c and a.outcome == "unschedulable"
    assert other is not a and other.reasons[0].message == "needs 2 usable cuda device(s), worker has 0"
    busy = make_state(ONE_GPU_OLD_TORCH, busy=[("cuda", 0)])
    result = place(make_queue([make_job(accelerator="cuda")] * 2), [busy], now=0.0)
    assert result.decisions["job-0000"] is result.decisions["job-0001"]
    assert result.decisions["job-0000"].summary == "waiting: 1 compatible worker(s) busy"


def test_a_reservation_gives_the_jobs_after_it_their_own_decision():
    """A shared decision never shows a worker as busy once a job before it reserved it."""
    h100 = make_state(H100x8, busy=[("cuda", 0)])
    small = make_job(accelerator="cuda", gpus=8)
    queue = [queued(small, "s0", seq=0, queued_at=100.0), queued(small, "big", seq=1, queued_at=0.0),
             queued(small, "s2", seq=2, queued_at=100.0), queued(small, "s3", seq=3, queued_at=100.0)]
    result = place(queue, [h100], now=100.0, reserve_after=60.0)
    assert result.reservations == {"big": ["wkr-h100"]}
    before, big, after, last = (result.decisions[j] for j in ("s0", "big", "s2", "s3"))
    assert before.reasons[0].message == "compatible but busy: fewer than 8 free cuda devices"
    assert "reserved wkr-h100 for it" in big.summary and big is not before
    assert after is last and after is not before
    assert after.reasons[0].message == "compatible but reserved for job big"


def test_accelerator_with_zero_gpus_takes_a_cpu_slot_on_a_worker_of_that_kind():
    job = make_job(accelerator="cuda", gpus=0)
    result = place(make_queue([job]), [make_state(CPU), make_state(H100x8)], now=0.0)
    assert grants(result) == {"job-0000": [("wkr-h100", ())]}
    assert result.assignments[0].nodes[0].accelerator == "cuda"


# --------------------------------------------------------------------------- properties

KINDS = ["cuda", "rocm", "mps"]


@st.composite
def fleets(draw):
    n = draw(st.integers(0, 6))
    states = []
    for i in range(n):
        devices = []
        for kind in draw(st.lists(st.sampled_from(KINDS), max_size=2, unique=True)):
            for idx in range(draw(st.integers(0, 4))):
                devices.append(make_device(
                    kind, idx, memory_gb=draw(st.sampled_from([16, 40, 80])),
                    cc=draw(st.sampled_from([None, "8.0", "9.0"])), usable=draw(st.booleans()) or idx > 0,
                    distributed=draw(st.sampled_from([SupportLevel.UNSUPPORTED, SupportLevel.FIXTURE_TESTED]))))
        rec = make_worker(
            f"wkr-{i}", devices=devices, origin=draw(st.sampled_from(["local", "existing", "provider"])),
            cpu_slots=draw(st.integers(0, 3)), online=draw(st.booleans()) or i % 2 == 0,
            draining=draw(st.booleans()) and i % 3 == 0,
            frameworks=draw(st.sampled_from([{}, {"torch": "2.1.0"}, {"torch": "2.3.0+cu121"}])))
        usable = [(d.kind, d.index) for d in devices]
        busy = draw(st.lists(st.sampled_from(usable), unique=True)) if usable else []
        states.append(make_state(rec, busy=busy, busy_cpu_slots=draw(st.integers(0, 3))))
    return states


@st.composite
def job_specs(draw):
    acc = draw(st.sampled_from([None, *KINDS]))
    target = draw(st.sampled_from(["local", "remote", "cloud"]))
    fallback = draw(st.lists(st.sampled_from([t for t in ("local", "remote", "cloud") if t != target]),
                             unique=True, max_size=2))
    req = dict(accelerator=acc, frameworks=draw(st.sampled_from([{}, {"torch": ">=2.2"}])))
    if acc:
        req["gpus"] = draw(st.integers(0, 4))
        req["min_gpu_memory_gb"] = draw(st.sampled_from([None, 30]))
        req["compute_capability"] = draw(st.sampled_from([None, ">=9.0"]))
    prio = draw(st.integers(-1, 1))
    if draw(st.booleans()):
        return make_distributed_job(draw(st.integers(1, 3)), target=target, fallback=fallback,
                                    priority=prio, **req)
    return make_job(target=target, fallback=fallback, priority=prio, **req)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(fleet=fleets(), specs=st.lists(job_specs(), max_size=12),
       ages=st.lists(st.floats(0, 200), min_size=12, max_size=12))
def test_placement_invariants(fleet, specs, ages):
    queue = [QueuedJob(id=f"j{i}", spec=s, seq=i, queued_at=ages[i]) for i, s in enumerate(specs)]
    result = place(queue, fleet, now=200.0, reserve_after=60.0)
    by_id = {ws.record.id: ws for ws in fleet}
    # every job gets exactly one decision, and assigned <=> has an assignment
    assert set(result.decisions) == {q.id for q in queue}
    assigned = [a.job_id for a in result.assignments]
    assert len(assigned) == len(set(assigned))
    assert {j for j, d in result.decisions.items() if d.outcome == "assigned"} == set(assigned)
    used_devices: set[tuple[str, str, int]] = set()
    used_slots: dict[str, int] = {}
    specs_by_id = {q.id: q.spec for q in queue}
    for a in result.assignments:
        spec = specs_by_id[a.job_id]
        nodes = spec.nodes if spec.kind == "distributed" else 1
        # gangs: all nodes, distinct workers, ranks 0..N-1
        assert len(a.nodes) == nodes
        assert len({n.worker_id for n in a.nodes}) == nodes
        assert [n.node_rank for n in a.nodes] == list(range(nodes))
        for n in a.nodes:
            ws = by_id[n.worker_id]
            rec = ws.record
            assert rec.online and not rec.draining
            assert check(spec, rec) == []  # never an incompatible worker
            assert n.accelerator == spec.requirements.accelerator
            assert len(n.devices) == spec.requirements.device_count
            if not n.devices:
                used_slots[rec.id] = used_slots.get(rec.id, 0) + 1
            for d in n.devices:
                key = (n.accelerator, d)
                assert key not in ws.busy_devices  # not granted while already in use
                assert (rec.id, *key) not in used_devices  # not granted twice
                used_devices.add((rec.id, *key))
                dev = next(x for x in rec.capabilities.devices if (x.kind, x.index) == key)
                assert dev.usable
    for wid, n in used_slots.items():
        ws = by_id[wid]
        assert n <= max(0, ws.record.cpu_slots - ws.busy_cpu_slots)
    # an unschedulable job has no online compatible worker
    for q in queue:
        d = result.decisions[q.id]
        if d.outcome == "unschedulable":
            assert d.reasons
            nodes = q.spec.nodes if q.spec.kind == "distributed" else 1
            if nodes == 1:
                assert not any(check(q.spec, ws.record) == [] and ws.record.online and not ws.record.draining
                               for ws in fleet)
        elif d.outcome == "waiting":  # someone online could run it, once free
            assert any(check(q.spec, ws.record) == [] and ws.record.online and not ws.record.draining
                       for ws in fleet)
