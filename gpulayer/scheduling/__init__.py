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
memory              ``needs 64.0 GB RAM, worker has 31.3 GB``
label               ``needs label zone=us-east, worker has zone=eu-west``
                    ``needs label zone=us-east, worker has none``
cpu_slots           ``runs no jobs without devices (cpu_slots=0)``
devices             ``needs 1 usable cuda device(s), worker has 0``; when the worker has
                    unusable devices of that kind, `` (2 unusable: <why>)`` is appended,
                    when an override hid some `` (1 hidden by override)``, and when the
                    kind's detector was in trouble `` (detection trouble: <what>)``
gpu_memory          ``needs 1 cuda device(s) with >= 80.0 GB, worker has 0``
compute_capability  ``needs 1 cuda device(s) with compute capability >=9.0, worker has 0``
device_filters      ``needs 8 cuda device(s) with >= 80.0 GB and compute capability
                    >=9.0, worker has 4`` (each filter alone is met, not both at once)
distributed         ``mps device(s) do not support distributed work (distributed=unsupported)``
framework_missing   ``framework 'jax' not installed`` (`` (removed by override)`` or the
                    framework probe's trouble appended, when there is either)
framework_version   ``torch 2.1.0 does not satisfy >=2.2`` (`` (set by override)`` appended
                    when an override set the version; so for ``cpus`` and ``memory``)
                    (``mlx 0.9.0 does not satisfy >=0.10``)
==================  ==================================================================

GB is GPUlayer's one memory unit, 1024**3 bytes (:mod:`gpulayer.units`), in comparisons and
in reasons alike, as ``resources detect`` shows sizes: a card shown as ``80.0 GB`` meets
``min_gpu_memory_gb=80`` and not ``85``.

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
machines            [offer id] ``needs 4 machines at once, its provider brings up 2 at most``
                    (an offer fits a gang, but its provider never brings up that many)
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
  eligible capacity, not already reserved by an earlier job. A reservation holds the room
  the job needs (the devices of its kind, or the CPU slots): later jobs in this pass's
  order cannot take that room, so it drains and the big job runs; the rest of the worker
  (CPU slots, other kinds) stays free for them. Only
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
  :class:`~gpulayer.records.Reason` objects, and jobs of one shape that are not assigned
  for the same reasons (and reserved nothing) share one read-only
  :class:`~gpulayer.records.PlacementDecision`.
* Memory: automatic garbage collection is paused during a pass (its full collections,
  triggered by the pass's allocations, each walked the whole heap of inputs):
  :mod:`~gpulayer.scheduling.collector`.

Modules
-------
:mod:`~gpulayer.scheduling.model` (the inputs and outputs of a pass),
:mod:`~gpulayer.scheduling.shapes` (job shapes and worker class keys),
:mod:`~gpulayer.scheduling.compat` (``check``), :mod:`~gpulayer.scheduling.fleet` (workers
and their free capacity, grouped into classes), :mod:`~gpulayer.scheduling.candidates`
(per-shape check results and candidate lists), :mod:`~gpulayer.scheduling.capacity`
(fitting, picking, granting, reserving), :mod:`~gpulayer.scheduling.reasons` (reasons of
jobs that are not assigned), :mod:`~gpulayer.scheduling.placement` (``place``),
:mod:`~gpulayer.scheduling.collector` (garbage collection paused during a pass),
:mod:`~gpulayer.scheduling.nearest` (for ``explain``: the nearest misses and relaxations).
"""

from __future__ import annotations

from gpulayer.scheduling.compat import check
from gpulayer.scheduling.model import (
    NO_ELIGIBLE_WORKER,
    Assignment,
    NodeGrant,
    Offer,
    PlacementResult,
    QueuedJob,
    WorkerState,
)
from gpulayer.scheduling.placement import place

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
