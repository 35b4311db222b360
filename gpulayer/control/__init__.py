"""The control plane: the queue, the worker registry and the scheduler's I/O.

One :class:`ControlPlane` runs embedded (in the user's process, SQLite in
``$GPULAYER_HOME``) or behind the server (SQLite or PostgreSQL), and implements every
operation of :mod:`gpulayer.api` (clients, workers, admin). It only orchestrates: the SQL is
in :mod:`gpulayer.store.queries`, placement in :mod:`gpulayer.scheduling`, what a report, a
loss or a cancel does to a job in :mod:`gpulayer.lifecycle`. Several control planes may
share one database: every state change is a serialised transaction (see
:mod:`gpulayer.store`), so they never hand out the same device twice.

Every task ends in exactly one terminal state; a task whose worker goes silent becomes
``lost`` (its process may still run: execution is at-least-once).

The operations live by audience: :mod:`.jobs` (clients), :mod:`.workers` (workers),
:mod:`.machines` (the cloud target: providers, offers, machines, the provisioning pass) and
here (admin, explanations), over the shared state and steps of :mod:`.core`.

Who wants to hear about changes (the server's long polls, its metrics) registers a
:class:`ControlObserver` with :meth:`ControlPlane.observe`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from gpulayer.api import (
    JobsDeleted,
    JobsPruned,
    JobsRerun,
    NewToken,
    SlotLent,
    TaskArtifacts,
    TaskAssignment,
    TokenInfo,
)
from gpulayer.control import artifacts, explaining, lending, rerun, retention
from gpulayer.control.core import ControlObserver
from gpulayer.control.jobs import JobOps
from gpulayer.control.machines import MachineOps
from gpulayer.control.workers import IN_PROCESS_NAME, ORIGINS
from gpulayer.records import Explanation, WorkerRecord
from gpulayer.specs import JobSpec
from gpulayer.store import queries


@dataclass
class ControlPlane(JobOps, MachineOps):
    """Every operation of :mod:`gpulayer.api`: jobs (:mod:`.jobs`), workers
    (:mod:`.workers`), machines and providers (:mod:`.machines`: the cloud target) and,
    here, the admin's."""

    # ------------------------------------------------------------------ explanations
    # (they read jobs, workers and providers alike: see :mod:`.explaining`)

    def explain(self, spec: JobSpec, *, owner: str | None = None, prospective: Sequence[WorkerRecord] = ()) -> Explanation:
        """What placement would say about a resolved ``spec`` now (:mod:`.explaining`); stores nothing."""
        return explaining.explain(self, spec, owner=owner, prospective=prospective)

    def explain_job(self, job_id: str, *, owner: str | None = None,
                    prospective: Sequence[WorkerRecord] = ()) -> Explanation:
        return explaining.explain(self, None, job_id=job_id, owner=owner, prospective=prospective)

    def queue_position(self, job_id: str) -> int | None:
        return explaining.position_of(self, job_id)

    # ------------------------------------------------------------------ a waiting task's slot

    def lend_slot(self, job_id: str, *, task_id: str, lent: bool) -> SlotLent:
        """A task of the job that waits lends its CPU slot to the queue, or takes it back
        (:mod:`.lending`)."""
        return lending.lend_slot(self, job_id, task_id, lent)

    # ------------------------------------------------------------------ tasks' artifacts (:mod:`.artifacts`)

    def put_artifacts(self, task_id: str, digest: str, data: bytes, *, worker_id: str) -> TaskArtifacts:
        return artifacts.put_artifacts(self, task_id, digest, data, worker_id)

    def list_artifacts(self, job_id: str) -> list[TaskArtifacts]:
        return artifacts.list_artifacts(self, job_id)

    def get_artifacts(self, job_id: str, task_id: str) -> bytes:
        return artifacts.get_artifacts(self, job_id, task_id)

    # ------------------------------------------------------------------ deleting ended jobs (:mod:`.retention`)

    def delete_jobs(self, job_ids: Sequence[str], *, owner: str | None = None) -> JobsDeleted:
        return retention.delete_jobs(self, job_ids, owner)

    def rerun_jobs(self, job_ids: Sequence[str], *, downstream: bool = False, owner: str | None = None) -> JobsRerun:
        return rerun.rerun_jobs(self, job_ids, owner, downstream)

    def prune_jobs(self, *, older_than: float, states: Sequence[str] | None = None, dry_run: bool = False,
                   owner: str | None = None) -> JobsPruned:
        return retention.prune_jobs(self, older_than, states, dry_run, owner)

    # ------------------------------------------------------------------ tokens (admin)

    def create_token(self, *, scope: str, ttl: float | None = None, uses: int | None = None,
                     description: str = "") -> NewToken:
        info, secret = self.tokens.create(scope, ttl=ttl, uses=uses, description=description)
        return NewToken(**info.model_dump(), token=secret)

    def list_tokens(self) -> list[TokenInfo]:
        return self.tokens.list()

    def revoke_token(self, token_id: str) -> TokenInfo:
        info = self.tokens.revoke(token_id)
        if info.scope == "worker" and info.worker_id is not None:
            self.worker_credential_revoked(info.worker_id)  # (else it stays eligible until it goes silent)
        return info

    # ------------------------------------------------------------------ housekeeping (admin)

    def prune_workers(self, *, older_than: float = 0.0, worker_ids: Sequence[str] | None = None) -> list[str]:
        """Forget offline workers silent for at least ``older_than`` seconds (only those of
        ``worker_ids`` when given); their credentials are revoked. Tasks keep naming them."""
        self.expire_workers()
        with self.store.write() as s:
            gone = queries.offline_workers_silent_since(s, self.clock() - older_than)
            if worker_ids is not None:
                gone = [w for w in gone if w in set(worker_ids)]
            for wid in gone:
                queries.revoke_worker_tokens(s, wid)
                self._event(s, "worker_pruned", worker_id=wid)
            queries.delete_workers(s, gone)
        if gone:
            self.tokens.forget()
        return gone

    def pause_worker(self, worker_id: str, *, paused: bool = True) -> WorkerRecord:
        """Pause the worker (``paused``), or resume it: a paused worker takes no new work, and
        what it was handed but had not started goes back to the queue (at no cost to its
        job); what it runs goes on. It still counts as able to run what it is compatible
        with, so those jobs wait rather than fail; a pause outlives the worker's restarts."""
        now = self.clock()
        with self.store.write() as s:
            row = queries.worker(s, worker_id)
            changed = bool(row.paused) != paused
            row.paused = paused
            s.add(row)
            if paused:
                for t in queries.assigned_tasks_of_worker(s, worker_id):
                    self._lose(s, t, now, "worker was paused")
            if changed:
                self._event(s, "worker_paused" if paused else "worker_resumed", worker_id=worker_id)
        self.schedule_queue()
        return self.get_worker(worker_id)

    # ------------------------------------------------------------------ placement


__all__ = ["IN_PROCESS_NAME", "ORIGINS", "ControlObserver", "ControlPlane", "TaskAssignment"]

if TYPE_CHECKING:
    from gpulayer.api import ControlAPI

    def _implements(plane: ControlPlane) -> ControlAPI:
        return plane  # mypy checks here that ControlPlane offers every operation of the API
