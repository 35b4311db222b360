"""Factories for the records tests keep building: workers, devices, jobs, fleets.

Shared by the unit tests of the scheduler and the control plane::

    w = make_worker("wkr-a", devices=make_cuda_devices(8, memory_gb=80, cc="9.0"),
                    frameworks={"torch": "2.3.0"})
    job = make_job(accelerator="cuda", gpus=1, frameworks={"torch": ">=2.2"})
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from gpulayer.hookrecords import Capabilities, Device, HostInfo, SupportLevel
from gpulayer.records import WorkerRecord
from gpulayer.scheduling import Offer, QueuedJob, WorkerState
from gpulayer.scheduling.candidates import ShapeState, build_shape_state
from gpulayer.scheduling.fleet import Fleet, offer_record
from gpulayer.scheduling.shapes import shape_of
from gpulayer.specs import CommandJob, DistributedJob, FunctionJob, Placement, Requirements
from gpulayer.units import GB  # 1024**3 bytes: memory_gb=80 below is shown as "80.0 GB"


def make_host(
    *,
    os: str = "linux",
    arch: str = "x86_64",
    cpu_count: int = 8,
    memory_gb: float = 32.0,
    python_version: str = "3.11.9",
    hostname: str = "host",
    address: str = "127.0.0.1",
) -> HostInfo:
    return HostInfo(os=os, arch=arch, hostname=hostname, cpu_count=cpu_count,
                    memory_bytes=int(memory_gb * GB), python_version=python_version,
                    address=address)


def make_device(
    kind: str = "cuda",
    index: int = 0,
    *,
    memory_gb: float | None = 80.0,
    cc: str | None = "9.0",
    name: str | None = None,
    usable: bool = True,
    unusable_reason: str | None = None,
    independent: SupportLevel = SupportLevel.FIXTURE_TESTED,
    distributed: SupportLevel = SupportLevel.FIXTURE_TESTED,
    unified_memory: bool = False,
) -> Device:
    return Device(
        kind=kind, index=index, name=name or f"Fake {kind.upper()} GPU",
        memory_bytes=None if memory_gb is None else int(memory_gb * GB),
        unified_memory=unified_memory, compute_capability=cc, usable=usable,
        unusable_reason=unusable_reason, independent=independent, distributed=distributed,
    )


def make_cuda_devices(n: int, memory_gb: float | None = 80.0, cc: str | None = "9.0", **kw: Any) -> list[Device]:
    """``n`` CUDA devices with indices 0..n-1."""
    return [make_device("cuda", i, memory_gb=memory_gb, cc=cc, **kw) for i in range(n)]


def make_rocm_devices(n: int, memory_gb: float | None = 64.0, **kw: Any) -> list[Device]:
    return [make_device("rocm", i, memory_gb=memory_gb, cc=None, **kw) for i in range(n)]


def make_mps_device(memory_gb: float = 32.0, **kw: Any) -> Device:
    """An Apple GPU as the seed shows it: unified memory, distributed=unsupported."""
    kw.setdefault("independent", SupportLevel.HARDWARE_VALIDATED)
    kw.setdefault("distributed", SupportLevel.UNSUPPORTED)
    return make_device("mps", 0, memory_gb=memory_gb, cc=None, name="Apple arm64 GPU (Metal)",
                       unified_memory=True, **kw)


def make_capabilities(
    *,
    devices: Iterable[Device] = (),
    frameworks: Mapping[str, str] | None = None,
    labels: Mapping[str, str] | None = None,
    **host: Any,
) -> Capabilities:
    return Capabilities(host=make_host(**host), devices=list(devices),
                        frameworks=dict(frameworks or {}), labels=dict(labels or {}))


def make_worker(
    id: str = "wkr-000000000001",
    *,
    devices: Iterable[Device] = (),
    frameworks: Mapping[str, str] | None = None,
    labels: Mapping[str, str] | None = None,
    origin: str = "local",
    cpu_slots: int = 1,
    online: bool = True,
    draining: bool = False,
    name: str | None = None,
    **host: Any,
) -> WorkerRecord:
    """A worker record; extra keywords go to :func:`make_host` (os, cpu_count, memory_gb, ...)."""
    host.setdefault("hostname", id)
    return WorkerRecord(
        id=id, name=name or id, origin=origin,  # type: ignore[arg-type]
        capabilities=make_capabilities(devices=devices, frameworks=frameworks, labels=labels, **host),
        cpu_slots=cpu_slots, online=online, draining=draining,
    )


def make_state(record: WorkerRecord, busy: Iterable[tuple[str, int]] = (), busy_cpu_slots: int = 0) -> WorkerState:
    return WorkerState(record=record, busy_devices=set(busy), busy_cpu_slots=busy_cpu_slots)


def make_requirements(**kw: Any) -> Requirements:
    return Requirements(**kw)


def _placement(target: str, fallback: Iterable[str], on_unschedulable: str) -> Placement:
    return Placement(target=target, fallback_targets=list(fallback),  # type: ignore[arg-type]
                     on_unschedulable=on_unschedulable)  # type: ignore[arg-type]


def make_job(
    *,
    target: str = "local",
    fallback: Iterable[str] = (),
    on_unschedulable: str = "fail",
    priority: int = 0,
    command: list[str] | None = None,
    **requirements: Any,
) -> CommandJob:
    """A command job; keywords other than the placement ones are :class:`Requirements` fields."""
    return CommandJob(command=command or ["true"], requirements=Requirements(**requirements),
                      placement=_placement(target, fallback, on_unschedulable), priority=priority)


def make_function_job(function: str = "mod:fn", **kw: Any) -> FunctionJob:
    target = kw.pop("target", "local")
    fallback = kw.pop("fallback", ())
    priority = kw.pop("priority", 0)
    return FunctionJob(function=function, requirements=Requirements(**kw),
                       placement=_placement(target, fallback, "fail"), priority=priority)


def make_distributed_job(
    nodes: int = 2,
    *,
    nproc_per_node: int = 1,
    target: str = "local",
    fallback: Iterable[str] = (),
    priority: int = 0,
    **requirements: Any,
) -> DistributedJob:
    return DistributedJob(nodes=nodes, nproc_per_node=nproc_per_node, entry="train.py",
                          requirements=Requirements(**requirements),
                          placement=_placement(target, fallback, "fail"), priority=priority)


def queued(spec: Any, id: str, seq: int = 0, queued_at: float = 0.0) -> QueuedJob:
    return QueuedJob(id=id, spec=spec, seq=seq, queued_at=queued_at)


def make_queue(specs: Iterable[Any], *, prefix: str = "job", queued_at: float = 0.0) -> list[QueuedJob]:
    """Queue the specs in order: ids ``job-0000``, ``job-0001``, ..., seq = position."""
    return [QueuedJob(id=f"{prefix}-{i:04d}", spec=s, seq=i, queued_at=queued_at) for i, s in enumerate(specs)]


def make_shape_state(job: Any, *states: WorkerState, offers: Iterable[Offer] = ()) -> tuple[Fleet, ShapeState]:
    """The scheduler's view of ``states`` and its per-shape state for ``job``, as a pass builds them."""
    fleet = Fleet(list(states))
    return fleet, build_shape_state(shape_of(job), fleet.classes, [offer_record(o) for o in offers])


class Clock:
    """A control plane's clock that tests move by hand (``clock.now += 11``)."""

    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


def cuda_caps(n: int = 2) -> Capabilities:
    """A worker with ``n`` 80 GB CUDA devices of compute capability 9.0 and torch."""
    return make_capabilities(devices=make_cuda_devices(n, memory_gb=80, cc="9.0"),
                             frameworks={"torch": "2.3.0", "torch.cuda": "2.3.0"})


def gpu_job(**kw: Any) -> CommandJob:
    return CommandJob(command=["train"], requirements=Requirements(accelerator="cuda", gpus=1), **kw)


def run_handed(cp: Any, worker: str, state: Any = None) -> list[str]:
    """Start and end every task ``cp`` (a control plane) hands ``worker`` now, as ``state``
    (default succeeded, exit code 0; otherwise exit code 1); the ids of their jobs."""
    from gpulayer.records import TaskState

    state = state or TaskState.SUCCEEDED
    done = []
    for a in cp.poll_tasks(worker):
        cp.start_task(a.task_id, worker_id=worker)
        cp.finish_task(a.task_id, worker_id=worker, state=state, exit_code=0 if state is TaskState.SUCCEEDED else 1)
        done.append(a.job_id)
    return done


def running_task(cp: Any) -> tuple[str, str, str]:
    """A job of ``cp`` (a control plane) whose one task runs: (job id, task id, worker id)."""
    w = cp.register_worker(make_capabilities(), cpu_slots=1).id
    job = cp.submit(CommandJob(command=["true"]))
    [a] = cp.poll_tasks(w)
    cp.start_task(a.task_id, worker_id=w)
    return job.id, a.task_id, w
