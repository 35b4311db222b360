"""Nearest misses: the distance of each reason, the ranking, the relaxations (pure, no database)."""

from __future__ import annotations

from typing import Any

import pytest

from gpulayer.records import Relaxation, closest_line
from gpulayer.scheduling import WorkerState, check, nearest
from gpulayer.specs import JobSpec
from tests.factories import (
    make_cuda_devices,
    make_device,
    make_distributed_job,
    make_job,
    make_mps_device,
    make_state,
    make_worker,
)

CPU = make_worker("wkr-10c5089a6044")
ONE_GPU = make_worker("wkr-471ad43b2467", devices=make_cuda_devices(1), frameworks={"torch": "2.3.0"})
OLD_TORCH = make_worker("wkr-old-torch", devices=make_cuda_devices(2), frameworks={"torch": "2.1.0"})
REMOTE = make_worker("wkr-remote", origin="existing", devices=make_cuda_devices(4), frameworks={"torch": "2.3.0"})


def fleet(*workers: Any) -> list[WorkerState]:
    return [w if isinstance(w, WorkerState) else make_state(w) for w in workers]


def miss(job: JobSpec, worker: Any) -> list[tuple[str, float, str]]:
    [view] = nearest.survey(job, fleet(worker)).workers
    return [(m.code, round(m.distance, 3), m.text) for m in view.misses]


MISS_CASES = [
    ("upgrade", make_job(frameworks={"torch": ">=2.2"}), make_worker(frameworks={"torch": "2.1.0"}),
     [("framework_version", 1.0, "has torch 2.1.0, needs >=2.2 (one upgrade away)")]),
    ("downgrade", make_job(frameworks={"torch": "<2"}), make_worker(frameworks={"torch": "2.1.0"}),
     [("framework_version", 1.0, "has torch 2.1.0, needs <2 (one downgrade away)")]),
    ("pinned-above", make_job(frameworks={"jax": "==0.4.*"}), make_worker(frameworks={"jax": "0.3.1"}),
     [("framework_version", 1.0, "has jax 0.3.1, needs ==0.4.* (one upgrade away)")]),
    ("excluded", make_job(frameworks={"jax": "!=0.4.30"}), make_worker(frameworks={"jax": "0.4.30"}),
     [("framework_version", 1.0, "has jax 0.4.30, needs !=0.4.30 (one another version away)")]),
    ("missing", make_job(frameworks={"jax": ""}), make_worker(),
     [("framework_missing", 1.5, "has no jax installed (one install away)")]),
    ("one-of-two-devices", make_job(accelerator="cuda", gpus=2), ONE_GPU,
     [("devices", 1.5, "has 1 of 2 cuda devices")]),
    ("no-device", make_job(accelerator="cuda"), CPU, [("devices", 2.0, "has 0 of 1 cuda device")]),
    ("unusable", make_job(accelerator="cuda"),
     make_worker(devices=make_cuda_devices(2, usable=False, unusable_reason="driver not loaded")),
     [("devices", 2.0, "has 0 of 1 cuda device (2 unusable)")]),
    ("gpu-memory", make_job(accelerator="cuda", gpus=2, min_gpu_memory_gb=80),
     make_worker(devices=[make_device("cuda", 0, memory_gb=80), make_device("cuda", 1, memory_gb=40)]),
     [("gpu_memory", 1.5, "has 1 of 2 cuda devices with >= 80.0 GB")]),
    ("compute-capability", make_job(accelerator="cuda", compute_capability="9.0"),
     make_worker(devices=make_cuda_devices(1, cc="8.6")),
     [("compute_capability", 2.0, "has 0 of 1 cuda device with compute capability >=9.0")]),
    ("both-filters", make_job(accelerator="cuda", min_gpu_memory_gb=80, compute_capability="9.0"),
     make_worker(devices=[make_device("cuda", 0, memory_gb=80, cc="8.0"), make_device("cuda", 1, memory_gb=40, cc="9.0")]),
     [("device_filters", 2.0, "has 0 of 1 cuda device with >= 80.0 GB and compute capability >=9.0")]),
    ("cpus", make_job(cpus=16), make_worker(cpu_count=8), [("cpus", 1.5, "has 8 of 16 CPUs")]),
    ("memory", make_job(memory_gb=64), make_worker(memory_gb=16), [("memory", 1.75, "has 16.0 of 64.0 GB RAM")]),
    ("python", make_job(python=">=3.11"), make_worker(python_version="3.10.12"),
     [("python", 2.0, "has python 3.10.12, needs >=3.11")]),
    ("label", make_job(labels={"zone": "us-east"}), make_worker(labels={"zone": "eu-west"}),
     [("label", 2.0, "has label zone=eu-west, needs zone=us-east")]),
    ("no-label", make_job(labels={"zone": "us-east"}), make_worker(),
     [("label", 2.0, "has no label zone, needs zone=us-east")]),
    ("no-cpu-slots", make_job(), make_worker(cpu_slots=0), [("cpu_slots", 2.0, "runs no jobs without devices (cpu_slots=0)")]),
    ("os", make_job(os="linux"), make_worker(os="darwin"), [("os", 10.0, "runs darwin, needs linux")]),
    ("target", make_job(), make_worker(origin="existing"), [("target", 10.0, "serves remote jobs, job allows local")]),
    ("distributed", make_distributed_job(2, accelerator="mps"), make_worker(devices=[make_mps_device()]),
     [("distributed", 10.0, "mps device(s) do not support distributed work (distributed=unsupported)")]),
]


@pytest.mark.parametrize(("job", "worker", "expected"), [c[1:] for c in MISS_CASES], ids=[c[0] for c in MISS_CASES])
def test_each_reason_becomes_a_miss_with_its_distance_and_words(job: JobSpec, worker: Any, expected: Any) -> None:
    assert miss(job, worker) == expected
    # the misses are the reasons check gives, one for one, in the same order
    assert [m[0] for m in expected] == [r.code for r in check(job, worker)]


def test_the_closest_rank_by_fewest_misses_then_distance_and_group_alike_workers() -> None:
    job = make_job(accelerator="cuda", gpus=2, frameworks={"torch": ">=2.2"})
    twin = make_worker("wkr-old-twin", devices=make_cuda_devices(2), frameworks={"torch": "2.1.0"})
    ranked = nearest.closest(job, fleet(CPU, ONE_GPU, OLD_TORCH, twin, REMOTE))
    assert closest_line(ranked) == (
        "closest: wkr-old-torch (+1 like it) has torch 2.1.0, needs >=2.2 (one upgrade away); "
        "wkr-471ad43b2467 has 1 of 2 cuda devices; wkr-remote serves remote jobs, job allows local")
    assert [c.like for c in ranked] == [1, 0, 0]
    # the CPU box fails two requirements: after every worker that fails one, even a far one
    everyone = nearest.closest(job, fleet(CPU, ONE_GPU, OLD_TORCH, twin, REMOTE), limit=10)
    assert [c.worker for c in everyone] == ["wkr-old-torch", "wkr-471ad43b2467", "wkr-remote", "wkr-10c5089a6044"]
    assert everyone[-1].distance == pytest.approx(2.0 + 1.5)


def test_an_unavailable_but_compatible_worker_comes_first_as_such() -> None:
    job = make_job(accelerator="cuda")
    draining = make_worker("wkr-draining", devices=make_cuda_devices(1), draining=True)
    ranked = nearest.closest(job, fleet(CPU, draining))
    assert closest_line(ranked) == "closest: wkr-draining is compatible but draining; wkr-10c5089a6044 has 0 of 1 cuda device"
    assert ranked[0].distance == 0.0


def test_the_survey_gives_every_worker_its_status_and_reasons_in_the_seed_wording() -> None:
    job = make_job(accelerator="cuda")
    free = make_worker("wkr-free", devices=make_cuda_devices(1))
    busy = make_state(make_worker("wkr-busy", devices=make_cuda_devices(1)), busy=[("cuda", 0)])
    draining = make_worker("wkr-draining", devices=make_cuda_devices(1), draining=True)
    s = nearest.survey(job, fleet(CPU, free, busy, draining))
    assert [(w.worker, w.status) for w in s.workers] == [
        ("wkr-10c5089a6044", "rejected"), ("wkr-free", "free"), ("wkr-busy", "busy"), ("wkr-draining", "draining")]
    assert [[r.render() for r in w.reasons] for w in s.workers] == [
        ["wkr-10c5089a6044: needs 1 usable cuda device(s), worker has 0"],
        [],
        ["wkr-busy: compatible but busy: no free cuda device"],
        ["wkr-draining: worker is draining"],
    ]
    assert s.compatible == 2  # free and busy: draining takes no work
    assert s.workers[0].reasons == check(job, CPU)


def test_the_busy_wording_is_the_schedulers() -> None:
    from gpulayer.scheduling import place
    from tests.factories import queued

    job = make_job(accelerator="cuda", gpus=2)
    busy = make_state(make_worker("wkr-busy", devices=make_cuda_devices(2)), busy=[("cuda", 1)])
    decision = place([queued(job, "job-1")], [busy], 0.0).decisions["job-1"]
    [view] = nearest.survey(job, [busy]).workers
    assert [r.message for r in view.reasons] == [r.message for r in decision.reasons] == [
        "compatible but busy: fewer than 2 free cuda devices"]


# ----------------------------------------------------------------------------- relaxations

EIGHT = make_worker("wkr-8x80", devices=make_cuda_devices(8, memory_gb=80, cc="9.0"), frameworks={"torch": "2.3.0"},
                    cpu_count=64, memory_gb=512, labels={"zone": "us-east"})
FOUR = make_worker("wkr-4x40", devices=make_cuda_devices(4, memory_gb=40, cc="8.0"), frameworks={"torch": "2.1.0"},
                   cpu_count=32, memory_gb=256, labels={"zone": "eu-west"})
FOUR_B = make_worker("wkr-4x40-b", devices=make_cuda_devices(4, memory_gb=40, cc="8.0"), frameworks={"torch": "2.1.0"},
                     cpu_count=32, memory_gb=256, labels={"zone": "eu-west"})
TWO = make_worker("wkr-2x24", devices=make_cuda_devices(2, memory_gb=24, cc="8.6"),
                  frameworks={"torch": "2.3.0", "jax": "0.4.30"}, cpu_count=16, memory_gb=64, python_version="3.12.1")
MAC = make_worker("wkr-mac", devices=[make_mps_device(32)], frameworks={"torch": "2.3.0"}, os="darwin", cpu_count=8,
                  memory_gb=32)
FAR_AWAY = make_worker("wkr-remote-16", origin="existing", devices=make_cuda_devices(16, memory_gb=80, cc="9.0"),
                       frameworks={"torch": "2.3.0"}, cpu_count=128, memory_gb=1024)
SHOP = [EIGHT, FOUR, FOUR_B, TWO, MAC, FAR_AWAY]


def relaxed(job: JobSpec, shop: list[Any] | None = None) -> list[tuple[str, str, str | None, str | None, int]]:
    return [(r.field, r.action, r.was, r.value, r.fits) for r in nearest.relaxations(job, fleet(*(shop or SHOP)))]


RELAX_CASES = [
    # the remote box has 16: too few for 32 even as a fallback (one change at a time)
    ("gpus", make_job(accelerator="cuda", gpus=32, frameworks={"torch": ""}),
     [("requirements.gpus", "relax", "32", "8", 1)]),
    ("gpus-with-a-filter", make_job(accelerator="cuda", gpus=9, min_gpu_memory_gb=40),
     [("requirements.gpus", "relax", "9", "8", 1), ("placement.fallback_targets", "add", None, "remote", 1)]),
    ("gpu-memory", make_job(accelerator="cuda", gpus=4, min_gpu_memory_gb=96),
     [("requirements.min_gpu_memory_gb", "relax", "96", "80", 1)]),
    ("compute-capability", make_job(accelerator="cuda", gpus=4, compute_capability="10.0"),
     [("requirements.compute_capability", "relax", ">=10.0", ">=9.0", 1)]),
    ("cpus", make_job(cpus=100), [("requirements.cpus", "relax", "100", "64", 1),
                                  ("placement.fallback_targets", "add", None, "remote", 1)]),
    ("memory", make_job(memory_gb=600), [("requirements.memory_gb", "relax", "600", "512", 1),
                                         ("placement.fallback_targets", "add", None, "remote", 1)]),
    # only the 2-GPU box has jax; without jax the 8-GPU box fits (the 4-GPU ones have an old torch)
    ("two-frameworks", make_job(accelerator="cuda", gpus=4, frameworks={"torch": ">=2.2", "jax": ""}),
     [("requirements.gpus", "relax", "4", "2", 1), ("requirements.frameworks.jax", "drop", "jax", None, 1)]),
    ("label", make_job(accelerator="cuda", labels={"zone": "ap-south"}),
     [("requirements.labels.zone", "drop", "zone=ap-south", None, 4)]),
    ("python", make_job(python=">=3.13"), [("requirements.python", "drop", ">=3.13", None, 5)]),
    ("os", make_job(os="freebsd"), [("requirements.os", "drop", "freebsd", None, 5)]),
    ("nothing-helps", make_job(accelerator="rocm"), []),
]


@pytest.mark.parametrize(("job", "expected"), [c[1:] for c in RELAX_CASES], ids=[c[0] for c in RELAX_CASES])
def test_the_least_change_per_requirement_and_how_many_workers_it_lets_in(job: JobSpec, expected: Any) -> None:
    assert relaxed(job) == expected


def test_a_framework_version_is_relaxed_and_dropped_only_when_dropping_lets_in_more() -> None:
    # any jax lets in the box with jax 0.4.30; no jax at all also the 8-GPU box: both are listed
    job = make_job(accelerator="cuda", frameworks={"torch": ">=2.2", "jax": ">=0.5"})
    assert relaxed(job) == [("requirements.frameworks.jax", "drop", "jax>=0.5", None, 2),
                            ("requirements.frameworks.jax", "relax", "jax>=0.5", "jax", 1)]
    # every CUDA box has some torch: any version lets in all four, and dropping it no more
    job = make_job(accelerator="cuda", frameworks={"torch": ">=2.5"})
    assert relaxed(job) == [("requirements.frameworks.torch", "relax", "torch>=2.5", "torch", 4)]
    job = make_job(accelerator="cuda", frameworks={"tensorflow": ">=2"})
    assert relaxed(job) == [("requirements.frameworks.tensorflow", "drop", "tensorflow>=2", None, 4)]


def test_a_gang_larger_than_the_compatible_workers_relaxes_its_nodes() -> None:
    job = make_distributed_job(5, accelerator="cuda", gpus=4)
    assert relaxed(job) == [("nodes", "relax", "5", "3", 3), ("placement.fallback_targets", "add", None, "remote", 1)]


def test_only_changes_that_let_in_more_workers_than_now_are_listed() -> None:
    # three compatible workers already; dropping the label lets in none more
    job = make_job(accelerator="cuda", gpus=4, labels={"zone": "eu-west"})
    assert [r[:2] for r in relaxed(job)] == [("requirements.labels.zone", "drop")]
    job = make_job(accelerator="cuda", gpus=2)
    assert relaxed(job) == [("placement.fallback_targets", "add", None, "remote", 1)]


def test_a_device_filter_is_relaxed_over_the_devices_that_pass_the_other() -> None:
    """A box whose 80 GB cards are cc 8.0 and whose cc 9.0 cards have 40 GB meets each filter
    of an 8 x (>= 80 GB, >= 9.0) job alone, not both. Each relaxation used to look at every
    card (the 8th best memory is 80, the 8th best cc 9.0: nothing to relax), so explain said
    no single change helps, when --min-gpu-memory 40 or --compute-capability 8.0 does."""
    mixed = make_worker("wkr-mixed", devices=[make_device("cuda", i, memory_gb=80, cc="8.0") for i in range(8)]
                        + [make_device("cuda", 8 + i, memory_gb=40, cc="9.0") for i in range(8)])
    job = make_job(accelerator="cuda", gpus=8, min_gpu_memory_gb=80, compute_capability=">=9.0")
    assert [r.code for r in check(job, mixed)] == ["device_filters"]
    relaxations = nearest.relaxations(job, fleet(mixed))
    assert [(r.field, r.value, r.fits) for r in relaxations] == [
        ("requirements.min_gpu_memory_gb", "40", 1), ("requirements.compute_capability", ">=8.0", 1)]
    assert all(not check(_apply(job, r), mixed) for r in relaxations)


def test_relaxations_count_active_workers_only() -> None:
    draining = make_worker("wkr-draining", devices=make_cuda_devices(8), draining=True)
    job = make_job(accelerator="cuda", gpus=16)
    assert relaxed(job, [draining, TWO]) == [("requirements.gpus", "relax", "16", "2", 1)]


def _apply(job: JobSpec, r: Relaxation) -> JobSpec:
    """The job with the relaxation applied, built as a user would build it."""
    req = job.requirements.model_dump(exclude_unset=True)
    placement = job.placement.model_dump()
    data = job.model_dump(exclude_unset=True)
    if r.field == "nodes":
        data["nodes"] = int(r.value or 0)
    elif r.field == "placement.fallback_targets":
        placement["fallback_targets"] = [*placement["fallback_targets"], r.value]
    elif r.field.startswith("requirements.frameworks."):
        name = r.field.rsplit(".", 1)[1]
        if r.action == "drop":
            del req["frameworks"][name]
        else:
            req["frameworks"][name] = ""
    elif r.field.startswith("requirements.labels."):
        del req["labels"][r.field.rsplit(".", 1)[1]]
    else:
        key = {"requirements.python": "python"}.get(r.field, r.field.split(".", 1)[1])
        req[key] = None if r.action == "drop" else (
            int(r.value or 0) if key in ("gpus", "cpus") else r.value if key == "compute_capability" else float(r.value or 0))
    data.update(requirements=req, placement=placement)
    return type(job).model_validate(data)


@pytest.mark.parametrize("job", [c[1] for c in RELAX_CASES] + [make_distributed_job(5, accelerator="cuda", gpus=4)],
                         ids=[c[0] for c in RELAX_CASES] + ["nodes"])
def test_every_relaxation_when_applied_lets_in_exactly_the_workers_it_counts(job: JobSpec) -> None:
    for r in nearest.relaxations(job, fleet(*SHOP)):
        changed = _apply(job, r)
        targets = changed.placement.targets if r.action != "add" else [r.value]
        fit = [w.id for w in SHOP if w.target in targets and not check(changed, w)]
        assert len(fit) == r.fits and fit[:len(r.workers)] == r.workers, r
