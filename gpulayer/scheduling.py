"""Placement, as pure functions: no I/O, no clock, no database.

``check(job, worker)`` says why one worker cannot run one job (a list of reasons, empty
when it can); ``place(queue, fleet, now)`` decides a whole placement pass.
The control plane loads the inputs, calls these, and writes the outcome.

Compatibility and availability are separate questions
-----------------------------------------------------
*Compatibility* (``check``) never changes with load: target, OS, Python, CPUs, RAM, labels,
devices (count, memory, compute capability, distributed support) and frameworks.
*Availability* is what ``place`` adds: whether the worker is online and not draining, and
whether it has free capacity right now. A worker has one slot per usable device (a job
needing ``k`` devices of a kind takes ``k`` free devices of that kind on one worker, lowest
indices first) and ``record.cpu_slots`` slots for jobs that need no device.

Reason wordings (``Reason.message``; tests check the exact text)
----------------------------------------------------------------

==================  ==================================================================
code                message
==================  ==================================================================
target              ``serves remote jobs (origin existing), job allows local``
                    (targets joined by ``, `` in the job's order, e.g. ``local, cloud``)
os                  ``needs os linux, worker has darwin``
python              ``python 3.10.12 does not satisfy >=3.11``
cpus                ``needs 16 CPUs, worker has 8``
memory              ``needs 64.0 GB RAM, worker has 31.3 GB``  (GB = 10**9 bytes)
label               ``needs label zone=us-east, worker has zone=eu-west``
                    ``needs label zone=us-east, worker has none``
cpu_slots           ``runs no jobs without devices (cpu_slots=0)``
devices             ``needs 1 usable cuda device(s), worker has 0``; when the worker has
                    unusable devices of that kind, `` (2 unusable: <why>)`` is appended
gpu_memory          ``needs 1 cuda device(s) with >= 80.0 GB, worker has 0``
compute_capability  ``needs 1 cuda device(s) with compute capability >=9.0, worker has 0``
device_filters      ``needs 8 cuda device(s) with >= 80.0 GB and compute capability
                    >=9.0, worker has 4`` (each filter alone is met, not both at once)
distributed         ``mps device(s) do not support distributed work (distributed=unsupported)``
framework_missing   ``framework 'jax' not installed``
framework_version   ``torch 2.1.0 does not satisfy >=2.2``
                    (``mlx 0.9.0 does not satisfy >=0.10``)
==================  ==================================================================

``place`` adds these, which are about availability or the fleet, not one worker's fit:

==================  ==================================================================
code                message (``Reason.worker`` in brackets when it is not a worker id)
==================  ==================================================================
offline             ``worker is offline``
draining            ``worker is draining``
no_workers          [target] ``no cloud worker registered and no provider offered a
                    machine``; ``no cloud worker registered`` (offers were given but none
                    fits); ``no local worker registered``; ``no remote worker registered``
busy                ``compatible but busy: no free cuda device`` /
                    ``compatible but busy: fewer than 8 free cuda devices`` /
                    ``compatible but busy: no free CPU slot``
reserved            ``compatible but reserved for job <job id>``
free                ``free, but the job needs 4 workers at once`` (gang jobs only)
too_few_workers     [target] ``1 compatible local worker(s), the job needs 2 at once``
                    (a gang larger than the compatible workers of every target)
more                [``...``] ``and 950 more worker(s), each with the same reasons as a
                    listed worker with the same capabilities`` (or ``... not listed``)
==================  ==================================================================

Rules of a pass
---------------
* Order: ``spec.priority`` (higher first), then ``seq`` (FIFO).
* Targets: ``placement.targets`` in order (the target, then the fallbacks); the first
  target with a compatible free worker wins. A job never runs on an unlisted target.
  Within a target, classes of workers are tried smallest first (fewest devices of the
  job's kind, then fewest devices), then in fleet order (first fit), so one-GPU jobs fill
  one-GPU boxes and partly used boxes before they break into a whole eight-GPU box.
* Outcomes: ``assigned``; ``waiting`` (some online, non-draining worker is compatible,
  none has room now, or a provider offer could run it once booted); ``unschedulable``
  (summary ``scheduling: no eligible worker``, one line per rejected worker). Offline and
  draining workers never get work and never count as able to run a job.
* Gangs (``DistributedJob`` with ``nodes=N``): all N nodes at once on N distinct workers of
  one target, each node with ``device_count`` devices (or one CPU slot), or nothing.
  A gang larger than the number of compatible workers on every target is unschedulable.
* Starvation: a job that is blocked (compatible, no room) and has been queued longer than
  ``reserve_after`` seconds (``now - queued_at > reserve_after``) *reserves* workers: the
  ``N`` compatible workers (one per node) of its first target that have the most free
  eligible capacity, not already reserved by an earlier job. Later jobs in this pass's
  order cannot be placed on a reserved worker, so it drains and the big job runs. Only
  jobs needing more than one unit (``device_count > 1`` or ``nodes > 1``) reserve: a job
  that needs one device or one CPU slot always gets the first free one it can use, because
  it is placed before every later job in each pass, so it cannot be starved by them.
  Reservations are recomputed from scratch every pass (nothing is stored).
* Scale: workers are grouped into classes by a fingerprint of exactly the fields
  ``check`` reads (origin, OS, Python, CPUs, RAM, devices, frameworks, labels, whether it
  has CPU slots); jobs are grouped into shapes by exactly the fields of the job it reads.
  ``check`` runs once per (shape, class). Capacity only shrinks during a pass, so each
  shape keeps per-class candidate lists from which workers that can no longer take it are
  dropped for good: a pass is about O(jobs + shapes x workers), not O(jobs x workers).
* Reasons are capped: a decision lists at most ``reason_limit`` workers (every class of
  rejected worker first, then the rest in fleet order) and ends with a ``more`` line that
  says how many were left out. Jobs of the same shape share the same (read-only)
  :class:`~gpulayer.records.Reason` objects.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import InvalidVersion, Version

from gpulayer.hookrecords import Capabilities, MachineOffer, SupportLevel
from gpulayer.records import TARGET_FOR_ORIGIN, PlacementDecision, Reason, WorkerRecord
from gpulayer.specs import JobSpec

__all__ = [
    "NO_ELIGIBLE_WORKER",
    "Assignment",
    "NodeGrant",
    "Offer",
    "PlacementResult",
    "QueuedJob",
    "WorkerState",
    "check",
    "place",
]

NO_ELIGIBLE_WORKER = "scheduling: no eligible worker"


@dataclass
class WorkerState:
    """A worker as the scheduler sees it: its record plus what is in use right now."""

    record: WorkerRecord
    busy_devices: set[tuple[str, int]] = field(default_factory=set)  # (kind, index) in use
    busy_cpu_slots: int = 0  # CPU-only tasks running


@dataclass
class QueuedJob:
    id: str
    spec: JobSpec  # requirements already resolved (profile applied)
    seq: int  # FIFO order: smaller = submitted earlier
    queued_at: float  # seconds (same clock as ``now``)


@dataclass
class NodeGrant:
    worker_id: str
    node_rank: int
    accelerator: str | None
    devices: list[int]  # device indices of ``accelerator`` on that worker


@dataclass
class Assignment:
    job_id: str
    nodes: list[NodeGrant]


@dataclass
class PlacementResult:
    assignments: list[Assignment]
    decisions: dict[str, PlacementDecision]  # every job of the queue -> its decision
    #: job id -> ids of the workers it reserved in this pass (starvation rule)
    reservations: dict[str, list[str]] = field(default_factory=dict)
    #: job id -> id of a provider offer that could run it once booted (job is "waiting")
    offer_requests: dict[str, str] = field(default_factory=dict)


#: A provider offer standing in for a worker-to-be: ``(offer_id, capabilities)``, where the
#: capabilities may be given as :class:`Capabilities`, a :class:`WorkerRecord` or a
#: :class:`MachineOffer`; a bare :class:`MachineOffer` is named ``provider:shape``.
Offer = tuple[str, Capabilities | WorkerRecord | MachineOffer] | MachineOffer


# --------------------------------------------------------------------------- versions


@lru_cache(maxsize=8192)
def _satisfies(spec: str, version: str) -> bool:
    """``version`` is in ``spec`` (pre-releases and local versions allowed: 2.13.0+cpu >= 2.2)."""
    if not spec.strip():
        return True
    try:
        v = Version(version.strip())
    except InvalidVersion:
        return False
    try:
        return SpecifierSet(spec).contains(v, prereleases=True)
    except InvalidSpecifier:
        return False


def _norm_name(name: str) -> str:
    return name.strip().lower().replace("-", "_")


# --------------------------------------------------------------------------- shapes


@dataclass(frozen=True)
class _Shape:
    """Exactly the fields of a job that ``check`` reads."""

    accelerator: str | None
    count: int
    min_gpu_memory_gb: float | None
    compute_capability: str | None
    frameworks: tuple[tuple[str, str], ...]
    python: str | None
    os: str | None
    cpus: int | None
    memory_gb: float | None
    labels: tuple[tuple[str, str], ...]
    targets: tuple[str, ...]
    distributed: bool


def _items(d: dict[str, str]) -> tuple[tuple[str, str], ...]:
    if not d:
        return ()
    if len(d) == 1:
        return tuple(d.items())
    return tuple(sorted(d.items()))


def _shape_key(spec: Any) -> tuple[Any, ...]:
    """A cheap hashable key of exactly the fields of a job that ``check`` reads."""
    r = spec.requirements
    p = spec.placement
    fw = r.frameworks
    lb = r.labels
    return (
        r.accelerator, r.gpus, r.min_gpu_memory_gb, r.compute_capability,
        (tuple(fw.items()) if len(fw) < 2 else tuple(sorted(fw.items()))) if fw else (),
        r.python, r.os, r.cpus, r.memory_gb,
        (tuple(lb.items()) if len(lb) < 2 else tuple(sorted(lb.items()))) if lb else (),
        p.target, tuple(p.fallback_targets) if p.fallback_targets else (),
        spec.kind == "distributed" and (spec.nodes > 1 or spec.nproc_per_node > 1),
    )


def _shape_of(spec: Any) -> _Shape:
    r = spec.requirements
    p = spec.placement
    acc = r.accelerator
    distributed = spec.kind == "distributed" and (spec.nodes > 1 or spec.nproc_per_node > 1)
    return _Shape(
        accelerator=acc,
        count=0 if acc is None else (1 if r.gpus is None else r.gpus),
        min_gpu_memory_gb=r.min_gpu_memory_gb if acc is not None else None,
        compute_capability=r.compute_capability if acc is not None else None,
        frameworks=_items(r.frameworks),
        python=r.python,
        os=r.os,
        cpus=r.cpus,
        memory_gb=r.memory_gb,
        labels=_items(r.labels),
        targets=(p.target, *p.fallback_targets),
        distributed=distributed,
    )


# A reason before it is bound to a worker id: (code, wanted, have, message).
_R = tuple[str, str | None, str | None, str]


def _gb(nbytes: float) -> str:
    return f"{nbytes / 1e9:.1f}"


def _compat(shape: _Shape, rec: WorkerRecord) -> tuple[list[_R], tuple[int, ...], bool]:
    """Reasons ``rec`` cannot run jobs of ``shape``; the eligible device indices; whether
    those are all of the worker's usable devices of the kind."""
    out: list[_R] = []
    caps = rec.capabilities
    host = caps.host
    target = TARGET_FOR_ORIGIN[rec.origin]
    if target not in shape.targets:
        allowed = ", ".join(shape.targets)
        out.append(("target", allowed, target,
                    f"serves {target} jobs (origin {rec.origin}), job allows {allowed}"))
    if shape.os and host.os.strip().lower() != shape.os:
        out.append(("os", shape.os, host.os, f"needs os {shape.os}, worker has {host.os}"))
    if shape.python and not _satisfies(shape.python, host.python_version):
        out.append(("python", shape.python, host.python_version,
                    f"python {host.python_version} does not satisfy {shape.python}"))
    if shape.cpus and host.cpu_count < shape.cpus:
        out.append(("cpus", str(shape.cpus), str(host.cpu_count),
                    f"needs {shape.cpus} CPUs, worker has {host.cpu_count}"))
    if shape.memory_gb and host.memory_bytes < shape.memory_gb * 1e9:
        want = f"{shape.memory_gb:.1f}"
        have = _gb(host.memory_bytes)
        if have == want:
            have = f"{host.memory_bytes / 1e9:.3f}"
        out.append(("memory", want, have, f"needs {want} GB RAM, worker has {have} GB"))
    for key, value in shape.labels:
        hv = caps.labels.get(key)
        if hv != value:
            has = f"{key}={hv}" if hv is not None else None
            out.append(("label", f"{key}={value}", has,
                        f"needs label {key}={value}, worker has {has or 'none'}"))
    if shape.count == 0 and rec.cpu_slots <= 0:
        out.append(("cpu_slots", "1", str(rec.cpu_slots),
                    f"runs no jobs without devices (cpu_slots={rec.cpu_slots})"))

    eligible: tuple[int, ...] = ()
    all_usable = True
    kind = shape.accelerator
    if kind is not None:
        need = max(shape.count, 1)
        devs = [d for d in caps.devices if d.kind == kind]
        usable = [d for d in devs if d.usable]
        if len(usable) < need:
            msg = f"needs {need} usable {kind} device(s), worker has {len(usable)}"
            unusable = [d for d in devs if not d.usable]
            if unusable:
                whys = sorted({d.unusable_reason or "no reason given" for d in unusable})
                msg += f" ({len(unusable)} unusable: {'; '.join(whys)})"
            out.append(("devices", str(need), str(len(usable)), msg))
        else:
            ok = usable
            bad = False
            want_mem = f">= {shape.min_gpu_memory_gb:.1f} GB" if shape.min_gpu_memory_gb else None
            if shape.min_gpu_memory_gb:
                floor = shape.min_gpu_memory_gb * 1e9
                mem_ok = [d for d in usable if d.memory_bytes is not None and d.memory_bytes >= floor]
                if len(mem_ok) < need:
                    bad = True
                    out.append(("gpu_memory", f"{need} x {want_mem}", str(len(mem_ok)),
                                f"needs {need} {kind} device(s) with {want_mem}, worker has {len(mem_ok)}"))
                ok = mem_ok
            if shape.compute_capability:
                spec = shape.compute_capability
                cc_ok = [d for d in usable
                         if d.compute_capability and _satisfies(spec, d.compute_capability)]
                if len(cc_ok) < need:
                    bad = True
                    out.append(("compute_capability", f"{need} x {spec}", str(len(cc_ok)),
                                f"needs {need} {kind} device(s) with compute capability {spec}, "
                                f"worker has {len(cc_ok)}"))
                cc_idx = {d.index for d in cc_ok}
                ok = [d for d in ok if d.index in cc_idx]
                if not bad and len(ok) < need:
                    bad = True
                    out.append(("device_filters", f"{need} x {want_mem} and {spec}", str(len(ok)),
                                f"needs {need} {kind} device(s) with {want_mem} and compute "
                                f"capability {spec}, worker has {len(ok)}"))
            if not bad and shape.distributed:
                dist_ok = [d for d in ok if d.distributed != SupportLevel.UNSUPPORTED]
                if len(dist_ok) < need:
                    bad = True
                    out.append(("distributed", "distributed work", SupportLevel.UNSUPPORTED.value,
                                f"{kind} device(s) do not support distributed work "
                                f"(distributed={SupportLevel.UNSUPPORTED.value})"))
                ok = dist_ok
            if not bad:
                eligible = tuple(sorted(d.index for d in ok))
                all_usable = len(ok) == len(usable)

    fw = caps.frameworks
    for name, spec in shape.frameworks:
        version = fw.get(name)
        if version is None:
            n = _norm_name(name)
            for have_name, have_version in fw.items():
                if _norm_name(have_name) == n:
                    version = have_version
                    break
        wanted = f"{name}{spec}"
        if version is None:
            out.append(("framework_missing", wanted, None, f"framework '{name}' not installed"))
        elif spec and not _satisfies(spec, version):
            shown = version or "(unknown version)"
            out.append(("framework_version", wanted, version, f"{name} {shown} does not satisfy {spec}"))
    return out, eligible, all_usable


def _bind(worker_id: str, reasons: list[_R]) -> list[Reason]:
    return [Reason(worker=worker_id, code=c, wanted=w, have=h, message=m) for c, w, h, m in reasons]


def check(job: JobSpec, worker: WorkerRecord) -> list[Reason]:
    """Why ``worker`` can never run ``job``: an empty list when it is compatible.

    Compatibility only: availability (online, draining, busy) is ``place``'s business.
    The wordings are listed in this module's docstring.
    """
    reasons, _, _ = _compat(_shape_of(job), worker)
    return _bind(worker.id, reasons)


# --------------------------------------------------------------------------- place


def _class_key(rec: WorkerRecord) -> tuple[Any, ...]:
    """A fingerprint of exactly the fields of a worker that ``_compat`` reads.

    Layout (``place`` relies on it): origin, has CPU slots, os, python, cpu_count,
    memory_bytes, devices, frameworks, labels.
    """
    caps = rec.capabilities
    h = caps.host
    devs = tuple(
        (d.kind, d.index, d.usable, d.unusable_reason, d.memory_bytes, d.compute_capability, d.distributed)
        for d in caps.devices
    )
    return (rec.origin, rec.cpu_slots > 0, h.os, h.python_version, h.cpu_count, h.memory_bytes,
            devs, _items(caps.frameworks), _items(caps.labels))


class _Class:
    __slots__ = ("active", "devices_by_kind", "first_pos", "key", "n_devices", "rep", "target")

    def __init__(self, key: tuple[Any, ...], rep: WorkerRecord, pos: int) -> None:
        self.key = key
        self.rep = rep
        self.target = TARGET_FOR_ORIGIN[rep.origin]
        self.active: list[_Worker] = []
        self.first_pos = pos
        self.devices_by_kind: dict[str, int] = {}
        for d in rep.capabilities.devices:
            if d.usable:
                self.devices_by_kind[d.kind] = self.devices_by_kind.get(d.kind, 0) + 1
        self.n_devices = len(rep.capabilities.devices)


class _Worker:
    __slots__ = ("cls", "free", "free_cpu", "id", "pos", "rec", "reserved_by", "state")

    def __init__(self, ws: WorkerState, pos: int, cls: _Class, state: str | None) -> None:
        rec = ws.record
        self.rec = rec
        self.id = rec.id
        self.pos = pos
        self.cls = cls
        self.state = state  # None (active), "offline" or "draining"
        self.reserved_by: str | None = None
        busy = ws.busy_devices
        free: dict[str, set[int]] = {}
        for d in rec.capabilities.devices:
            if d.usable and (d.kind, d.index) not in busy:
                free.setdefault(d.kind, set()).add(d.index)
        self.free = free
        self.free_cpu = max(0, rec.cpu_slots - ws.busy_cpu_slots)


class _Cand:
    """One compatible class of workers for one shape: the workers that may still fit."""

    __slots__ = ("all_usable", "cls", "eligible", "workers")

    def __init__(self, cls: _Class, eligible: tuple[int, ...], all_usable: bool) -> None:
        self.cls = cls
        self.eligible = eligible
        self.all_usable = all_usable
        self.workers = list(cls.active)


class _ShapeState:
    __slots__ = (
        "by_class",
        "compat_workers",
        "eligible_of",
        "max_in_target",
        "n_compat",
        "offer",
        "offer_reasons",
        "per_target",
        "pools",
        "reserve_fail_n",
        "shape",
        "unsched",
        "wait_cache",
    )
    pools: dict[str, list[tuple[int, int, _Worker]]]

    def __init__(self, shape: _Shape) -> None:
        self.shape = shape
        self.per_target: list[tuple[str, list[_Cand]]] = []
        self.pools = {}  # target -> max-heap of (-free units, pos, worker) for reservations
        self.compat_workers: list[_Worker] | None = None
        self.n_compat = 0
        self.max_in_target = 0
        self.offer: str | None = None
        self.offer_reasons: list[Reason] = []
        self.unsched: list[Reason] | None = None
        self.wait_cache: list[Reason] | None = None  # dropped when a listed worker is reserved
        self.reserve_fail_n = math.inf
        self.eligible_of: dict[int, _Cand] = {}  # id(class) -> candidate entry (compatible only)
        self.by_class: dict[int, tuple[list[_R], tuple[int, ...], bool]] = {}  # id(class) -> _compat


def _offer_record(offer: Offer) -> WorkerRecord:
    caps_like: Any
    if isinstance(offer, MachineOffer):
        oid, caps_like = f"{offer.provider}:{offer.shape}", offer
    else:
        oid, caps_like = offer
    if isinstance(caps_like, MachineOffer):
        caps = caps_like.capabilities
    elif isinstance(caps_like, WorkerRecord):
        caps = caps_like.capabilities
    else:
        caps = caps_like
    return WorkerRecord(id=oid, name=oid, origin="provider", capabilities=caps)


def _fits(w: _Worker, cand: _Cand, kind: str | None, k: int) -> bool:
    if w.reserved_by is not None:
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


def _free_units(w: _Worker, cand: _Cand, kind: str | None, k: int) -> int:
    if k == 0:
        return w.free_cpu
    free = w.free.get(kind)  # type: ignore[arg-type]
    if not free:
        return 0
    if cand.all_usable:
        return len(free)
    return sum(1 for i in cand.eligible if i in free)


def _pick(cands: list[_Cand], kind: str | None, k: int, nodes: int) -> tuple[list[tuple[_Worker, _Cand]], bool]:
    """Up to ``nodes`` distinct workers that fit, dropping for good those that no longer do."""
    picked: list[tuple[_Worker, _Cand]] = []
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
            if _fits(w, cand, kind, k):
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


def _take_most_free(heap: list[tuple[int, int, _Worker]], st: _ShapeState, kind: str | None,
                    k: int, nodes: int) -> list[_Worker] | None:
    """Pop the ``nodes`` unreserved workers with the most free units, or None (heap unchanged).

    Free units only shrink during a pass, so a stale entry is re-pushed with its new key
    (lazy decrease-key); reserved workers are dropped for good.
    """
    out: list[tuple[int, int, _Worker]] = []
    while heap and len(out) < nodes:
        neg, pos, w = heapq.heappop(heap)
        if w.reserved_by is not None:
            continue
        units = _free_units(w, st.eligible_of[id(w.cls)], kind, k)
        if -neg != units:
            heapq.heappush(heap, (-units, pos, w))
            continue
        out.append((neg, pos, w))
    if len(out) < nodes:
        for item in out:
            heapq.heappush(heap, item)
        return None
    return [w for _, _, w in out]


def _describe_grant(worker_id: str, kind: str | None, devices: list[int]) -> str:
    if devices:
        return f"{worker_id} ({kind} {','.join(map(str, devices))})"
    return f"{worker_id} (CPU slot)"


def place(
    queue: list[QueuedJob],
    fleet: list[WorkerState],
    now: float,
    *,
    reserve_after: float | None = 60.0,
    offers: Sequence[Offer] = (),
    reason_limit: int = 50,
) -> PlacementResult:
    """One placement pass: decide every queued job against the fleet.

    ``reserve_after``: seconds a blocked multi-unit job waits before it reserves workers
    (``None`` or ``math.inf``: never). ``offers``: provider machines that could be booted;
    a job that fits one and is not assigned waits (``offer_requests`` names the offer).
    ``reason_limit``: most workers listed in one decision's reasons.
    See the module docstring for the rules.
    """
    if reserve_after is None:
        reserve_after = math.inf
    reason_limit = max(1, reason_limit)

    # ---- the fleet, grouped into classes
    classes: dict[tuple[Any, ...], _Class] = {}
    workers: list[_Worker] = []
    registered: dict[str, int] = {"local": 0, "remote": 0, "cloud": 0}
    for pos, ws in enumerate(fleet):
        rec = ws.record
        key = _class_key(rec)
        cls = classes.get(key)
        if cls is None:
            cls = classes[key] = _Class(key, rec, pos)
        state = "offline" if not rec.online else ("draining" if rec.draining else None)
        w = _Worker(ws, pos, cls, state)
        workers.append(w)
        registered[cls.target] = registered.get(cls.target, 0) + 1
        if state is None:
            cls.active.append(w)
    class_list = list(classes.values())
    offer_records = [_offer_record(o) for o in offers]

    shapes: dict[tuple[Any, ...], _ShapeState] = {}
    shape_states: dict[_Shape, _ShapeState] = {}

    def shape_state(shape: _Shape) -> _ShapeState:
        st = _ShapeState(shape)
        kind = shape.accelerator
        by_target: dict[str, list[_Cand]] = {t: [] for t in shape.targets}
        # Fields of the class key this shape does not read are blanked, so classes that
        # differ only there (e.g. RAM size, for a job with no RAM requirement) share a result.
        keep_py, keep_cpus, keep_mem = shape.python is not None, bool(shape.cpus), bool(shape.memory_gb)
        seen: dict[tuple[Any, ...], tuple[list[_R], tuple[int, ...], bool]] = {}
        for cls in class_list:
            ck = cls.key
            pk = (ck[0], ck[1], ck[2], ck[3] if keep_py else None, ck[4] if keep_cpus else None,
                  ck[5] if keep_mem else None, ck[6], ck[7], ck[8])
            res = seen.get(pk)
            if res is None:
                res = seen[pk] = _compat(shape, cls.rep)
            st.by_class[id(cls)] = res
            reasons, eligible, all_usable = res
            if reasons or cls.target not in by_target:
                continue
            cand = _Cand(cls, eligible, all_usable)
            st.eligible_of[id(cls)] = cand
            if cand.workers:
                by_target[cls.target].append(cand)
        for t in shape.targets:
            cands = by_target[t]
            if kind is None:
                cands.sort(key=lambda c: (c.cls.n_devices, c.cls.first_pos))
            else:
                cands.sort(key=lambda c: (len(c.eligible), c.cls.n_devices, c.cls.first_pos))
            count = sum(len(c.workers) for c in cands)
            st.n_compat += count
            st.max_in_target = max(st.max_in_target, count)
            st.per_target.append((t, cands))
        for orec in offer_records:
            reasons, _, _ = _compat(shape, orec)
            if not reasons:
                if st.offer is None:
                    st.offer = orec.id
            else:
                st.offer_reasons.extend(_bind(orec.id, reasons))
        return st

    def compatible_workers(st: _ShapeState) -> list[_Worker]:
        if st.compat_workers is None:
            ws = [w for c in st.eligible_of.values() for w in c.cls.active]
            ws.sort(key=lambda w: w.pos)
            st.compat_workers = ws
        return st.compat_workers

    # ---- reasons, shared across jobs of one shape
    def unschedulable_reasons(st: _ShapeState) -> list[Reason]:
        if st.unsched is not None:
            return st.unsched
        shape = st.shape
        out: list[Reason] = []
        for t in shape.targets:
            if registered.get(t, 0) == 0:
                if t == "cloud":
                    msg = ("no cloud worker registered" if offer_records
                           else "no cloud worker registered and no provider offered a machine")
                else:
                    msg = f"no {t} worker registered"
                out.append(Reason(worker=t, code="no_workers", wanted=t, have="0", message=msg))
        rejected: list[tuple[_Worker, list[_R]]] = []
        for w in workers:
            base = st.by_class[id(w.cls)][0]
            if base or w.state is not None:
                rejected.append((w, base))
        if len(rejected) > reason_limit:
            chosen: set[int] = set()
            seen_cls: set[int] = set()
            for w, _ in rejected:
                if id(w.cls) not in seen_cls:
                    seen_cls.add(id(w.cls))
                    if len(chosen) < reason_limit:
                        chosen.add(w.pos)
            all_classes = len(chosen) == len(seen_cls)
            for w, _ in rejected:
                if len(chosen) >= reason_limit:
                    break
                chosen.add(w.pos)
            listed = [(w, b) for w, b in rejected if w.pos in chosen]
            more = len(rejected) - len(listed)
        else:
            listed, more, all_classes = rejected, 0, True
        for w, base in listed:
            out.extend(_bind(w.id, base))
            if w.state is not None:
                out.append(Reason(worker=w.id, code=w.state, wanted="online", have=w.state,
                                  message=f"worker is {w.state}"))
        if more:
            tail = ("each with the same reasons as a listed worker with the same capabilities"
                    if all_classes else "not listed")
            out.append(Reason(worker="...", code="more", have=str(more),
                              message=f"and {more} more worker(s), {tail}"))
        out.extend(st.offer_reasons)
        st.unsched = out
        return out

    busy_reasons: dict[tuple[str, str], Reason] = {}

    def worker_reason(w: _Worker, code: str, message: str) -> Reason:
        key = (w.id, message)
        r = busy_reasons.get(key)
        if r is None:
            r = busy_reasons[key] = Reason(worker=w.id, code=code, message=message)
        return r

    listed_in: dict[int, list[_ShapeState]] = {}  # worker pos -> shapes whose cached list shows it

    def waiting_reasons(st: _ShapeState, nodes: int, job_id: str) -> list[Reason]:
        gang = nodes > 1
        if not gang and st.wait_cache is not None:
            return st.wait_cache
        shape = st.shape
        kind, k = shape.accelerator, shape.count
        if k == 0:
            busy_msg = "compatible but busy: no free CPU slot"
        elif k == 1:
            busy_msg = f"compatible but busy: no free {kind} device"
        else:
            busy_msg = f"compatible but busy: fewer than {k} free {kind} devices"
        out: list[Reason] = []
        ws = compatible_workers(st)
        for w in ws[:reason_limit]:
            if w.reserved_by is not None and w.reserved_by != job_id:
                out.append(worker_reason(w, "reserved", f"compatible but reserved for job {w.reserved_by}"))
            elif gang and _fits(w, st.eligible_of[id(w.cls)], kind, k):
                out.append(worker_reason(w, "free", f"free, but the job needs {nodes} workers at once"))
            else:
                out.append(worker_reason(w, "busy", busy_msg))
        if len(ws) > reason_limit:
            more = len(ws) - reason_limit
            out.append(Reason(worker="...", code="more", have=str(more),
                              message=f"and {more} more compatible worker(s)"))
        if not gang:
            st.wait_cache = out
            for w in ws[:reason_limit]:
                listed_in.setdefault(w.pos, []).append(st)
        return out

    # ---- the pass
    result = PlacementResult(assignments=[], decisions={})
    decisions = result.decisions
    order = sorted(queue, key=lambda q: (-q.spec.priority, q.seq))
    for qj in order:
        spec = qj.spec
        skey = _shape_key(spec)
        st = shapes.get(skey)
        if st is None:
            shape = _shape_of(spec)
            st = shape_states.get(shape)
            if st is None:
                st = shape_states[shape] = shape_state(shape)
            shapes[skey] = st
        shape = st.shape
        nodes = spec.nodes if spec.kind == "distributed" else 1
        kind, k = shape.accelerator, shape.count

        if st.n_compat == 0 or st.max_in_target < nodes:
            if st.offer is not None:
                result.offer_requests[qj.id] = st.offer
                decisions[qj.id] = PlacementDecision(
                    outcome="waiting", at=now,
                    summary=f"waiting: no compatible worker registered yet; offer {st.offer} could run it once booted",
                )
                continue
            if st.n_compat == 0:
                summary = NO_ELIGIBLE_WORKER
                reasons = list(unschedulable_reasons(st))
            else:
                summary = (f"scheduling: needs {nodes} eligible workers on one target, "
                           f"found {st.max_in_target}")
                reasons = [
                    Reason(worker=t, code="too_few_workers", wanted=str(nodes), have=str(n),
                           message=f"{n} compatible {t} worker(s), the job needs {nodes} at once")
                    for t, n in ((t, sum(len(c.cls.active) for c in st.eligible_of.values()
                                         if c.cls.target == t)) for t in shape.targets)
                    if n
                ]
                reasons.extend(unschedulable_reasons(st))
            decisions[qj.id] = PlacementDecision(outcome="unschedulable", summary=summary, reasons=reasons, at=now)
            continue

        best_partial = 0
        placed = False
        for ti, (target, cands) in enumerate(st.per_target):
            if not cands:
                continue
            picked, ok = _pick(cands, kind, k, nodes)
            if not ok:
                best_partial = max(best_partial, len(picked))
                continue
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
            result.assignments.append(Assignment(job_id=qj.id, nodes=grants))
            shown = [_describe_grant(g.worker_id, kind, g.devices) for g in grants[:8]]
            if len(grants) > 8:
                shown.append(f"+{len(grants) - 8} more")
            summary = (f"assigned to {shown[0]}" if nodes == 1
                       else f"assigned to {nodes} workers: {', '.join(shown)}")
            if ti > 0:
                summary += f" on {target}, fallback from {shape.targets[0]}"
            decisions[qj.id] = PlacementDecision(outcome="assigned", summary=summary, at=now)
            placed = True
            break
        if placed:
            continue

        # blocked: compatible workers exist, none (or too few) has room
        reasons = list(waiting_reasons(st, nodes, qj.id))
        if nodes > 1:
            summary = (f"waiting: needs {nodes} workers at once, {best_partial} of "
                       f"{st.n_compat} compatible worker(s) free")
        else:
            summary = f"waiting: {st.n_compat} compatible worker(s) busy"
        age = now - qj.queued_at
        if age > reserve_after and (k > 1 or nodes > 1) and nodes < st.reserve_fail_n:
            chosen: list[_Worker] | None = None
            for target, _ in st.per_target:
                heap = st.pools.get(target)
                if heap is None:
                    heap = [(-_free_units(w, c, kind, k), w.pos, w)
                            for c in st.eligible_of.values() if c.cls.target == target
                            for w in c.cls.active]
                    heapq.heapify(heap)
                    st.pools[target] = heap
                taken = _take_most_free(heap, st, kind, k, nodes)
                if taken is not None:
                    chosen = taken
                    break
            if chosen is None:
                st.reserve_fail_n = nodes
            else:
                for w in chosen:
                    w.reserved_by = qj.id
                    for other in listed_in.pop(w.pos, ()):
                        other.wait_cache = None
                ids = [w.id for w in chosen]
                result.reservations[qj.id] = ids
                names = ", ".join(ids[:5]) + (f" +{len(ids) - 5} more" if len(ids) > 5 else "")
                summary += f"; reserved {names} for it (queued longer than reserve_after={reserve_after:g}s)"
        if st.offer is not None:
            result.offer_requests[qj.id] = st.offer
            summary += f"; offer {st.offer} could run it once booted"
        decisions[qj.id] = PlacementDecision(outcome="waiting", summary=summary, reasons=reasons, at=now)
    return result
