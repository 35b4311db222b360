"""What a pass groups by: job *shapes* and worker *class keys*.

``check`` runs once per (shape, class) in a pass, so a shape holds exactly the fields of a job
that :func:`~gpulayer.scheduling.compat.compat` reads and a class key exactly the fields of a
worker it reads. A field missing from either would let two jobs (or workers) that ``check``
tells apart share one answer; a field too many only costs cache hits.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import NamedTuple

from gpulayer.hookrecords import SupportLevel
from gpulayer.records import WorkerRecord
from gpulayer.specs import JobSpec

Pairs = tuple[tuple[str, str], ...]


class Shape(NamedTuple):
    """Exactly the fields of a job that ``check`` reads, normalised (see :func:`shape_of`).

    Jobs with equal shapes get equal ``check`` results on every worker; the shape is also the
    key a pass caches per-shape state under.
    """

    accelerator: str | None  # None: the job needs no device
    device_count: int  # devices per node: 0 without an accelerator, ``gpus`` (default 1) with one
    min_gpu_memory_gb: float | None  # None without an accelerator
    compute_capability: str | None  # None without an accelerator
    frameworks: Pairs  # (name, specifier), sorted by name
    python: str | None
    os: str | None
    cpus: int | None
    memory_gb: float | None
    labels: Pairs  # (key, value), sorted by key
    targets: tuple[str, ...]  # the target, then the fallback targets, in order
    distributed: bool  # a DistributedJob with more than one process in all


def _pairs(d: dict[str, str]) -> Pairs:
    if not d:
        return ()
    if len(d) == 1:
        return tuple(d.items())
    return tuple(sorted(d.items()))


_new_shape = tuple.__new__


def shape_of(spec: JobSpec) -> Shape:
    """The one encoding of a job's shape. This runs once per queued job, so it builds the
    tuple directly (``Shape(...)`` costs a Python-level call) and inlines :func:`_pairs`."""
    r = spec.requirements
    p = spec.placement
    acc = r.accelerator
    if acc is None:
        count, min_mem, cc = 0, None, None
    else:
        count = 1 if r.gpus is None else r.gpus
        min_mem, cc = r.min_gpu_memory_gb, r.compute_capability
    fw, lb, fallback = r.frameworks, r.labels, p.fallback_targets
    distributed = spec.kind == "distributed" and (spec.nodes > 1 or spec.nproc_per_node > 1)
    return _new_shape(Shape, (
        acc, count, min_mem, cc,
        (tuple(fw.items()) if len(fw) < 2 else tuple(sorted(fw.items()))) if fw else (),  # = _pairs(fw)
        r.python, r.os, r.cpus, r.memory_gb,
        (tuple(lb.items()) if len(lb) < 2 else tuple(sorted(lb.items()))) if lb else (),  # = _pairs(lb)
        (p.target, *fallback) if fallback else (p.target,), distributed,
    ))


#: One device as ``check`` reads it:
#: (kind, index, usable, unusable_reason, memory_bytes, compute_capability, distributed).
DeviceKey = tuple[str, int, bool, str | None, int | None, str | None, SupportLevel]


class ClassKey(NamedTuple):
    """Exactly the fields of a worker that ``check`` reads: workers with equal keys form one
    class (host names, addresses and device UUIDs are not part of it)."""

    origin: str
    has_cpu_slots: bool
    os: str
    python_version: str
    cpu_count: int
    memory_bytes: int
    devices: tuple[DeviceKey, ...]
    frameworks: Pairs
    labels: Pairs
    #: what a reason may add: devices hidden by override, detector and probe trouble,
    #: which values overrides set
    notes: tuple[object, ...] = ()


def class_key(rec: WorkerRecord) -> ClassKey:
    caps = rec.capabilities
    h = caps.host
    devices = tuple(
        (d.kind, d.index, d.usable, d.unusable_reason, d.memory_bytes, d.compute_capability, d.distributed)
        for d in caps.devices
    )
    notes: tuple[object, ...] = ()
    if caps.hidden_devices or caps.detector_problems or caps.probe_problems or caps.overrides:
        notes = (tuple(sorted(d.kind for d in caps.hidden_devices)), _pairs(caps.detector_problems),
                 tuple(caps.probe_problems), tuple(sorted(caps.overrides)))
    return ClassKey(rec.origin, rec.cpu_slots > 0, h.os, h.python_version, h.cpu_count, h.memory_bytes,
                    devices, _pairs(caps.frameworks), _pairs(caps.labels), notes)


#: The host fields of a class key that only some shapes read, and whether a shape does.
_SOMETIMES_READ: dict[str, Callable[[Shape], bool]] = {
    "python_version": lambda shape: shape.python is not None,
    "cpu_count": lambda shape: bool(shape.cpus),
    "memory_bytes": lambda shape: bool(shape.memory_gb),
}

BlankedKey = tuple[object, ...]


def blank_unread(shape: Shape) -> Callable[[ClassKey], BlankedKey]:
    """How to blank, in a class key, the host fields that ``shape`` does not read: a function
    from a class key to the tuple of the fields ``shape`` does read.

    Classes whose blanked keys are equal get the same ``check`` result for this shape, so it
    runs once for them: e.g. workers that differ only in RAM size, for a job that asks for no
    RAM. (One C-level getter per shape: a pass applies it to every class for every shape.)
    """
    keep = [i for i, f in enumerate(ClassKey._fields) if f not in _SOMETIMES_READ or _SOMETIMES_READ[f](shape)]
    getter: Callable[[ClassKey], BlankedKey] = operator.itemgetter(*keep)
    return getter
