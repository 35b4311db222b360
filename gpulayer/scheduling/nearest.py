"""Nearest misses: which workers come closest to running a job, and which single change to
the job would make some of them fit. Pure, like the rest of the package: the same inputs
as :func:`~gpulayer.scheduling.place` (a job and the fleet), no I/O.

What ``explain`` shows comes from here: every worker's status (:func:`survey`), the
rejected workers ranked by how little would have to change (:func:`closest`), and the
relaxations of the job that would make workers compatible (:func:`relaxations`).

Distance
--------
Each reason ``check`` gives becomes a :class:`~gpulayer.records.Miss` with a distance,
which says how much would have to change on the worker for that requirement to be met:

==================================  ========  ===============================================
code                                distance  text (``Miss.text``)
==================================  ========  ===============================================
framework_version                   1         ``has torch 2.1.0, needs >=2.2 (one upgrade away)``
                                              (``one downgrade away`` below an upper bound,
                                              ``another version away`` otherwise)
framework_missing                   1.5       ``has no jax installed (one install away)``
devices, gpu_memory,                1 + s/n   ``has 1 of 2 cuda devices``,
compute_capability, device_filters            ``has 0 of 1 cuda device with >= 80.0 GB``
                                              (``s`` of the ``n`` devices short)
cpus, memory                        1 + s/n   ``has 8 of 16 CPUs``, ``has 31.3 of 64.0 GB RAM``
python, label, cpu_slots            2         ``has python 3.10.12, needs >=3.11``,
                                              ``has label zone=eu-west, needs zone=us-east``
os, target, distributed             10 (far)  ``runs darwin, needs linux``,
                                              ``serves remote jobs, job allows local``
==================================  ========  ===============================================

Ranking: fewest failing requirements first, then the smallest sum of distances, then fleet
order. Workers whose misses read the same are one entry (``wkr-a (+3 like it) has ...``).
Availability is not compatibility: a compatible worker that is draining (or offline) has no
miss; it ranks first, as ``is compatible but draining``.

Relaxations
-----------
For each requirement the job sets, the least change that makes some worker compatible,
counting active (online, not draining) workers on the job's targets, busy ones included:

* ``gpus``, ``min_gpu_memory_gb``, ``compute_capability``, ``cpus``, ``memory_gb``: relaxed
  to the largest value (the smallest change) that some worker meets (on as many devices
  as pass the job's other device filter: memory and compute capability are met together);
* a framework with a version specifier: relaxed to any version, and dropped when dropping
  it makes more workers fit; a framework without one, a label, ``python``, ``os``: dropped;
* a target the job does not list: added as a fallback;
* a distributed job's ``nodes``: relaxed to the most compatible workers on one target.

The accelerator itself is never relaxed (a CUDA job does not become a CPU job by advice).
Only changes that make more workers compatible than now are listed, most workers first.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal, NamedTuple

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import InvalidVersion, Version

from gpulayer.records import Closest, Miss, Reason, Relaxation, WorkerExplanation, WorkerRecord
from gpulayer.scheduling.candidates import ShapeState, build_shape_state
from gpulayer.scheduling.capacity import fits
from gpulayer.scheduling.compat import RawReason, bind, compat, satisfies
from gpulayer.scheduling.fleet import Fleet, Worker, WorkerClass
from gpulayer.scheduling.model import WorkerState
from gpulayer.scheduling.reasons import busy_message, state_reason
from gpulayer.scheduling.shapes import Shape, shape_of
from gpulayer.specs import TARGETS, JobSpec
from gpulayer.units import GB, format_wanted_gb

__all__ = ["FAR", "Survey", "closest", "misses_of", "relaxations", "survey"]

FAR = 10.0
#: how many workers a relaxation names
NAMED = 5


@dataclass
class Survey:
    """Every worker's answer to one job, the closest rejected ones, and the relaxations."""

    workers: list[WorkerExplanation]
    closest: list[Closest]
    relaxations: list[Relaxation]
    compatible: int  # active compatible workers on the job's targets


# ----------------------------------------------------------------------------- misses


def _plural(n: int, word: str) -> str:
    return word if n == 1 else word + "s"


def _direction(spec: str, version: str) -> str:
    """Which way ``version`` must move to satisfy ``spec``: ``upgrade``, ``downgrade`` or
    ``another version``."""
    try:
        have = Version(version.strip())
        failing = [c for c in SpecifierSet(spec) if not c.contains(have, prereleases=True)]
    except (InvalidVersion, InvalidSpecifier):
        return "another version"
    ways = set()
    for c in failing:
        if c.operator in (">=", ">"):
            ways.add("upgrade")
        elif c.operator in ("<", "<="):
            ways.add("downgrade")
        elif c.operator in ("==", "~=", "==="):
            base = c.version.rstrip(".*")
            try:
                ways.add("upgrade" if have < Version(base) else "downgrade")
            except InvalidVersion:
                ways.add("another version")
        else:  # != : any other version
            ways.add("another version")
    return ways.pop() if len(ways) == 1 else "another version"


def _short(have: int, need: int) -> float:
    return 1.0 + (need - have) / need if need > 0 else 1.0


def misses_of(shape: Shape, rec: WorkerRecord, reasons: Sequence[RawReason]) -> list[Miss]:
    """``check``'s reasons for ``rec`` as misses with their distances (module docstring)."""
    frameworks = {f"{name}{spec}": (name, spec) for name, spec in shape.frameworks}
    kind = shape.accelerator
    need = max(shape.device_count, 1)
    out: list[Miss] = []
    for r in reasons:
        code, wanted, have = r.code, r.wanted, r.have
        field: str | None = None
        if code == "framework_version":
            name, spec = frameworks.get(wanted or "", (wanted or "", ""))
            way = _direction(spec, have or "")
            text, distance, field = (f"has {name} {have or '(unknown version)'}, needs {spec} (one {way} away)", 1.0,
                                     f"requirements.frameworks.{name}")
        elif code == "framework_missing":
            name = frameworks.get(wanted or "", (wanted or "", ""))[0]
            text, distance, field = f"has no {name} installed (one install away)", 1.5, f"requirements.frameworks.{name}"
        elif code == "devices":
            n = int(have or 0)
            unusable = sum(1 for d in rec.capabilities.devices if d.kind == kind and not d.usable)
            hidden = sum(1 for d in rec.capabilities.hidden_devices if d.kind == kind)
            text = f"has {n} of {need} {kind} {_plural(need, 'device')}"
            text += f" ({unusable} unusable)" if unusable else ""
            text += f" ({hidden} hidden by override)" if hidden else ""
            distance, field = _short(n, need), "requirements.gpus"
        elif code in ("gpu_memory", "compute_capability", "device_filters"):
            n = int(have or 0)
            what = []
            if code != "compute_capability":
                what.append(f">= {format_wanted_gb(shape.min_gpu_memory_gb or 0)} GB")
            if code != "gpu_memory":
                what.append(f"compute capability {shape.compute_capability}")
            text = f"has {n} of {need} {kind} {_plural(need, 'device')} with {' and '.join(what)}"
            distance = _short(n, need)
            field = "requirements.compute_capability" if code == "compute_capability" else "requirements.min_gpu_memory_gb"
        elif code == "cpus":
            text = f"has {have} of {wanted} CPUs"
            distance, field = _short(int(have or 0), int(wanted or 0)), "requirements.cpus"
        elif code == "memory":
            text = f"has {have} of {wanted} GB RAM"
            distance, field = 1.0 + (float(wanted or 0) - float(have or 0)) / float(wanted or 1), "requirements.memory_gb"
        elif code == "python":
            text, distance, field = f"has python {have}, needs {wanted}", 2.0, "requirements.python"
        elif code == "label":
            key = (wanted or "").split("=", 1)[0]
            has = f"label {have}" if have else f"no label {key}"
            text, distance, field = f"has {has}, needs {wanted}", 2.0, f"requirements.labels.{key}"
        elif code == "cpu_slots":
            text, distance = f"runs no jobs without devices (cpu_slots={have})", 2.0
        elif code == "os":
            text, distance, field = f"runs {have}, needs {wanted}", FAR, "requirements.os"
        elif code == "target":
            text, distance, field = f"serves {have} jobs, job allows {wanted}", FAR, "placement.target"
        else:  # distributed, and any code added later: far until someone says otherwise
            text, distance = r.message, FAR
        out.append(Miss(code=code, field=field, wanted=wanted, have=have, distance=distance, text=text))
    return out


# ----------------------------------------------------------------------------- the survey


Status = Literal["free", "busy", "draining", "offline", "rejected"]


def _status(w: Worker, compatible: bool, room: bool) -> Status:
    if not compatible:
        return "rejected"
    if w.state == "offline":
        return "offline"
    if w.state == "draining":
        return "draining"
    return "free" if room else "busy"


class _Seen(NamedTuple):
    """One worker's answer, before it is made a record (the unschedulable message needs only
    the ranking, and a pass may build it over a large fleet)."""

    worker: Worker
    status: Status
    misses: list[Miss]  # shared by the workers of a class
    distance: float


def survey(spec: JobSpec, fleet: Sequence[WorkerState], *, limit: int = 3) -> Survey:
    """Every worker of ``fleet`` (in fleet order) against ``spec``: its status, its reasons in
    the seed's wording and, when rejected, its misses; then the closest (at most ``limit``
    entries) and the relaxations. ``check`` runs once per class of workers."""
    shape, workers, st, seen = _see(spec, fleet)
    kind, k = shape.accelerator, shape.device_count
    views = []
    for v in seen:
        w = v.worker
        reasons: list[Reason] = bind(w.id, st.by_class[w.cls].reasons)
        if w.state is not None:
            reasons.append(state_reason(w))
        elif v.status == "busy":
            reasons.append(Reason(worker=w.id, code="busy", message=busy_message(kind, k)))
        views.append(WorkerExplanation(worker=w.id, name=fleet[w.pos].record.name, target=w.cls.target,
                                       status=v.status, reasons=reasons, misses=v.misses, distance=v.distance))
    return Survey(workers=views, closest=_rank(seen, limit), relaxations=_relax(spec, shape, workers, st.n_compat),
                  compatible=st.n_compat)


def closest(spec: JobSpec, fleet: Sequence[WorkerState], *, limit: int = 3) -> list[Closest]:
    """The rejected workers that come closest to running ``spec``, best first (at most
    ``limit`` entries): what the message of an unschedulable job ends with."""
    return _rank(_see(spec, fleet)[3], limit)


def relaxations(spec: JobSpec, fleet: Sequence[WorkerState]) -> list[Relaxation]:
    """The single changes to ``spec`` that make more workers compatible, most workers first."""
    shape, workers, st, _ = _see(spec, fleet)
    return _relax(spec, shape, workers, st.n_compat)


def _see(spec: JobSpec, fleet: Sequence[WorkerState]) -> tuple[Shape, Fleet, ShapeState, list[_Seen]]:
    shape = shape_of(spec)
    workers = Fleet(list(fleet))
    st = build_shape_state(shape, workers.classes, [])
    kind, k = shape.accelerator, shape.device_count
    by_class: dict[int, tuple[list[Miss], float]] = {}  # id(class) -> its misses and their sum
    out: list[_Seen] = []
    for w in workers.workers:
        res = st.by_class[w.cls]
        cand = st.eligible_of.get(w.cls)
        compatible = not res.reasons and cand is not None
        room = cand is not None and compatible and fits(w, cand, kind, k)
        misses, distance = by_class.get(id(w.cls)) or ([], 0.0)
        if res.reasons and not misses:
            misses = misses_of(shape, w.cls.rep, res.reasons)
            distance = sum(m.distance for m in misses)
            by_class[id(w.cls)] = misses, distance
        out.append(_Seen(w, _status(w, compatible, room), misses, distance))
    return shape, workers, st, out


def _rank(seen: list[_Seen], limit: int) -> list[Closest]:
    """Rejected (and compatible but unavailable) workers grouped by the words of their
    misses, ranked by (number of misses, sum of distances, fleet order)."""
    groups: dict[tuple[str, ...], list[_Seen]] = {}
    for v in seen:
        if v.status in ("free", "busy"):
            continue
        if v.misses:
            key = tuple(m.text for m in v.misses)
        else:  # compatible, but draining or offline
            key = (f"is compatible but {v.status}",)
        groups.setdefault(key, []).append(v)
    entries: list[tuple[tuple[int, float, int], Closest]] = []
    for i, (key, members) in enumerate(groups.items()):
        first = members[0]
        misses = first.misses or [Miss(code=first.status, distance=0.0, text=key[0])]
        entries.append(((len(first.misses), first.distance, i),
                        Closest(worker=first.worker.id, like=len(members) - 1, misses=misses,
                                distance=first.distance)))
    entries.sort(key=lambda e: e[0])
    return [c for _, c in entries[:limit]]


# ----------------------------------------------------------------------------- relaxations


class _Counter:
    """Counts the active workers compatible with variants of one shape, ``check`` once per
    (variant, class)."""

    def __init__(self, fleet: Fleet) -> None:
        self.classes = [c for c in fleet.classes if c.active]

    def clean(self, shape: Shape, cls: WorkerClass) -> bool:
        return cls.target in shape.targets and not compat(shape, cls.rep).reasons

    def count(self, shape: Shape, only: Callable[[WorkerClass], bool] = lambda c: True) -> tuple[int, list[str]]:
        members = [w for c in self.classes if only(c) and self.clean(shape, c) for w in c.active]
        members.sort(key=lambda w: w.pos)
        return len(members), [w.id for w in members[:NAMED]]


def _on(target: str) -> Callable[[WorkerClass], bool]:
    return lambda cls: cls.target == target


def _floor_gb(nbytes: float) -> float:
    """GB to one decimal, rounded down, so that the value shown is one the worker meets."""
    return math.floor(nbytes / GB * 10) / 10


def _numbers(shape: Shape, counter: _Counter, field: str, wanted: float,
             offer: Callable[[WorkerClass], float | None], make: Callable[[float], Shape],
             show: Callable[[float], str], out: list[Relaxation], current: int) -> None:
    """A requirement where a smaller value is easier: each class offers the value it would
    meet (``offer``), which is checked with every other requirement; the largest one wins."""
    per_class: dict[int, float] = {}
    for cls in counter.classes:
        v = offer(cls)
        if v is None or v >= wanted:
            continue
        if counter.clean(make(v), cls):
            per_class[id(cls)] = v
    if not per_class:
        return
    best = max(per_class.values())
    n, ids = counter.count(make(best), lambda c: per_class.get(id(c), -math.inf) >= best)
    if n > current:
        out.append(Relaxation(field=field, action="relax", was=show(wanted), value=show(best), fits=n, workers=ids))


def _usable(cls: WorkerClass, kind: str | None) -> list[tuple[int, str | None]]:
    """(memory bytes, compute capability) of the class's usable devices of ``kind``."""
    return [(d.memory_bytes or 0, d.compute_capability) for d in cls.rep.capabilities.devices
            if d.kind == kind and d.usable]


def _cc_ok(shape: Shape, cc: str | None) -> bool:
    """A device of this compute capability passes the shape's filter (or it has none)."""
    return not shape.compute_capability or (cc is not None and satisfies(shape.compute_capability, cc))


def _memory_ok(shape: Shape, memory_bytes: int) -> bool:
    """A device of this memory passes the shape's filter (or it has none)."""
    return not shape.min_gpu_memory_gb or memory_bytes >= shape.min_gpu_memory_gb * GB


def _gpus_offer(shape: Shape) -> Callable[[WorkerClass], float | None]:
    def offer(cls: WorkerClass) -> float | None:
        # the most devices below the job's count that this class meets with every filter
        for v in range(min(shape.device_count - 1, len(_usable(cls, shape.accelerator))), 0, -1):
            if not compat(shape._replace(device_count=v), cls.rep).reasons:
                return float(v)
        return None
    return offer


def _nth_best(values: list[float], n: int) -> float | None:
    values = sorted(values, reverse=True)
    return values[n - 1] if len(values) >= n else None


def _relax(spec: JobSpec, shape: Shape, fleet: Fleet, current: int) -> list[Relaxation]:
    counter = _Counter(fleet)
    out: list[Relaxation] = []
    kind, need = shape.accelerator, max(shape.device_count, 1)
    if kind is not None and shape.device_count > 1:
        _numbers(shape, counter, "requirements.gpus", shape.device_count, _gpus_offer(shape),
                 lambda v: shape._replace(device_count=int(v)), lambda v: str(int(v)), out, current)
    if kind is not None and shape.min_gpu_memory_gb:
        _numbers(shape, counter, "requirements.min_gpu_memory_gb", shape.min_gpu_memory_gb,
                 # (a device counts only if it passes the other filter: the devices with
                 # enough memory and those with the compute capability may not be the same)
                 lambda c: _nth_best([_floor_gb(m) for m, cc in _usable(c, kind) if _cc_ok(shape, cc)], need),
                 lambda v: shape._replace(min_gpu_memory_gb=v), lambda v: f"{v:g}", out, current)
    if kind is not None and shape.compute_capability:
        _compute_capability(shape, counter, need, out, current)
    if shape.cpus:
        _numbers(shape, counter, "requirements.cpus", shape.cpus, lambda c: float(c.rep.capabilities.host.cpu_count),
                 lambda v: shape._replace(cpus=int(v)), lambda v: str(int(v)), out, current)
    if shape.memory_gb:
        _numbers(shape, counter, "requirements.memory_gb", shape.memory_gb,
                 lambda c: _floor_gb(c.rep.capabilities.host.memory_bytes),
                 lambda v: shape._replace(memory_gb=v), lambda v: f"{v:g}", out, current)
    for i, (name, spec_text) in enumerate(shape.frameworks):
        field = f"requirements.frameworks.{name}"
        relaxed = 0
        if spec_text:
            fw = shape.frameworks[:i] + ((name, ""),) + shape.frameworks[i + 1:]
            relaxed, ids = counter.count(shape._replace(frameworks=fw))
            if relaxed > current:
                out.append(Relaxation(field=field, action="relax", was=f"{name}{spec_text}", value=name,
                                      fits=relaxed, workers=ids))
        n, ids = counter.count(shape._replace(frameworks=shape.frameworks[:i] + shape.frameworks[i + 1:]))
        if n > max(current, relaxed):
            out.append(Relaxation(field=field, action="drop", was=f"{name}{spec_text}", fits=n, workers=ids))
    for i, (key, value) in enumerate(shape.labels):
        n, ids = counter.count(shape._replace(labels=shape.labels[:i] + shape.labels[i + 1:]))
        if n > current:
            out.append(Relaxation(field=f"requirements.labels.{key}", action="drop", was=f"{key}={value}",
                                  fits=n, workers=ids))
    for field, was, without in (("requirements.python", shape.python, shape._replace(python=None)),
                                ("requirements.os", shape.os, shape._replace(os=None))):
        if was:
            n, ids = counter.count(without)
            if n > current:
                out.append(Relaxation(field=field, action="drop", was=was, fits=n, workers=ids))
    for t in TARGETS:
        if t not in shape.targets:
            n, ids = counter.count(shape._replace(targets=(*shape.targets, t)), _on(t))
            if n > 0:
                out.append(Relaxation(field="placement.fallback_targets", action="add", value=t, fits=n, workers=ids))
    _nodes(spec, shape, counter, out)
    out.sort(key=lambda r: -r.fits)  # stable: requirements in the order above among equals
    return out


def _compute_capability(shape: Shape, counter: _Counter, need: int, out: list[Relaxation], current: int) -> None:
    """Relax ``compute_capability`` to ``>=`` the best capability some worker has on enough devices."""
    spec = shape.compute_capability or ""
    per_class: dict[int, Version] = {}
    for cls in counter.classes:
        ccs = []
        for memory, cc in _usable(cls, shape.accelerator):
            if not _memory_ok(shape, memory):
                continue
            try:
                ccs.append(Version(cc or ""))
            except InvalidVersion:
                continue
        ccs.sort(reverse=True)
        if len(ccs) < need:
            continue
        v = ccs[need - 1]
        if counter.clean(shape._replace(compute_capability=f">={v}"), cls):
            per_class[id(cls)] = v
    if not per_class:
        return
    best = max(per_class.values())
    n, ids = counter.count(shape._replace(compute_capability=f">={best}"),
                           lambda c: id(c) in per_class and per_class[id(c)] >= best)
    if n > current:
        out.append(Relaxation(field="requirements.compute_capability", action="relax", was=spec, value=f">={best}",
                              fits=n, workers=ids))


def _nodes(spec: JobSpec, shape: Shape, counter: _Counter, out: list[Relaxation]) -> None:
    """A gang larger than the compatible workers of every target: relax ``nodes`` to the most
    compatible workers on one target."""
    if spec.kind != "distributed" or spec.nodes <= 1:
        return
    best, ids = 0, []
    for t in shape.targets:
        n, named = counter.count(shape, _on(t))
        if n > best:
            best, ids = n, named
    if 0 < best < spec.nodes:
        out.append(Relaxation(field="nodes", action="relax", was=str(spec.nodes), value=str(best), fits=best,
                              workers=ids))
