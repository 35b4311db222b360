"""What clients ask of the control plane: submit, read, cancel, wait, explain, bundles."""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from typing import Any

from sqlalchemy.exc import IntegrityError
from sqlmodel import Session

from gpulayer import bundles as _bundles
from gpulayer import config
from gpulayer import specs as job_specs
from gpulayer.api import (
    LOG_PAGE_TEXT,
    MAX_BATCH,
    MAX_LOG_CHUNKS,
    MAX_LONG_POLL,
    BundleStored,
    JobEvent,
    LogChunk,
    ResultJSON,
)
from gpulayer.control import after
from gpulayer.control.core import Core, Look
from gpulayer.control.tail import tail_page
from gpulayer.errors import BundleMissing, Conflict, InvalidArgument, InvalidInput, NotFound
from gpulayer.launchers import check_launch
from gpulayer.records import JobError, JobRecord, JobState, TaskState, new_id
from gpulayer.specs import JobSpec
from gpulayer.store import BundleRow, JobRow, mapping, plain, queries

#: the states of a task that its worker may be running (or about to start)
ACTIVE = frozenset({TaskState.RUNNING.value, TaskState.ASSIGNED.value})
#: why an embedded control plane refuses a job that can only run on the cloud target
CLOUD_NEEDS_SERVER = (
    "target cloud: machines that providers bring up join a control plane they can reach over the "
    "network, and this one is embedded (it lives in this process). Start one with 'gpulayer server "
    "start' (providers in $GPULAYER_HOME/providers.toml or --providers FILE) and submit to it with "
    "GPULAYER_URL=URL and GPULAYER_TOKEN=TOKEN; see docs/providers.md")


def refuse_cloud_only(serving: bool, spec: JobSpec) -> None:
    """An embedded control plane (not ``serving``) refuses a job that only the cloud target
    could run: no machine could reach it. Submit and explain say so alike."""
    if not serving and spec.placement.targets == ["cloud"]:
        raise InvalidInput(CLOUD_NEEDS_SERVER)


#: how soon a wait for a job looks at the database again on its own, first and at most: it
#: bounds how late it sees a change that no nudge announced (a process that cannot nudge
#: this one: :mod:`gpulayer.store.nudges`); changes of this process wake it at once
WAIT_FIRST_LOOK = 0.05
WAIT_LONGEST_LOOK = 0.5
#: a wait for many jobs looks again at most this often per job it still waits for (a
#: thousand: every 50 ms), so its reads stay a small share of a core however often jobs end
LOOK_PER_JOB = 50e-6


class JobOps(Core):
    def submit(self, spec: JobSpec, *, idempotency_key: str | None = None,
               owner: str | None = None, arguments: bool | None = None) -> JobRecord:
        """Store a job and run a placement pass. The spec must already be resolved
        (profile applied, bundle uploaded and named by ``bundle_digest``). Idempotency keys
        are scoped to ``owner``: one owner can never see another's job by guessing a key.
        The job's record as stored; ``arguments=False``: without a function's arguments
        (the caller has them; they are not read back)."""
        whole = arguments is not False
        args_json = self._check_submit(spec)
        key = _scoped(owner, idempotency_key)
        now = self.clock()
        started = time.perf_counter()
        with self.store.write() as s:
            if key is not None:
                existing = plain.job_id_by_key(s, key)
                if existing is not None:
                    return self._record(s, existing, arguments=whole)
            job_id = self._insert(s, spec, args_json, key, owner, now)
            # placed in the same transaction: one commit per submit
            result = self._place_too(s, new_job=job_id)
            record = self._record(s, job_id, arguments=whole)
        self._placed(result, started)
        return record

    def submit_many(self, specs: Sequence[JobSpec], *, idempotency_key: str | None = None,
                    owner: str | None = None, arguments: bool | None = None) -> list[JobRecord]:
        """:meth:`submit` for many jobs in one transaction and one placement pass: all are
        stored, in order, or none is (a bad spec is refused naming its index). With
        ``idempotency_key`` the batch as a whole is idempotent: job ``i`` gets the key
        ``KEY:i``, and a repeated batch gets its jobs back, none stored twice. ``arguments``
        as for :meth:`submit`."""
        whole = arguments is not False
        specs = list(specs)
        if not specs:
            raise InvalidInput("specs: empty; give at least one job spec")
        if len(specs) > MAX_BATCH:
            raise InvalidInput(f"specs: {len(specs)} job specs, over the limit of {MAX_BATCH} in one batch; "
                               "split it")
        args_json: list[str | None] = []
        for i, spec in enumerate(specs):
            try:
                args_json.append(self._check_submit(spec))
            except InvalidInput as exc:
                raise type(exc)(f"specs[{i}]: {exc}") from None
        key = _scoped(owner, idempotency_key)
        now = self.clock()
        started = time.perf_counter()
        with self.store.write() as s:
            if key is not None:
                existing = plain.job_id_by_key(s, f"{key}:0")
                if existing is not None:  # the batch was stored (all of it: one transaction)
                    stored = [plain.job_id_by_key(s, f"{key}:{i}") for i in range(len(specs))]
                    if None in stored or plain.job_id_by_key(s, f"{key}:{len(specs)}") is not None:
                        raise Conflict(f"idempotency_key {idempotency_key!r}: a batch of another size was "
                                       "submitted with it; use a new key for a new batch")
                    return self._records(s, [job_id for job_id in stored if job_id is not None], arguments=whole)
            ids = []
            for i, spec in enumerate(specs):
                try:
                    # a microsecond apart: the queue (in order of submission) keeps their order
                    ids.append(self._insert(s, spec, args_json[i], None if key is None else f"{key}:{i}",
                                            owner, now + i * 1e-6))
                except InvalidInput as exc:  # (none of the batch is stored: the transaction ends)
                    raise type(exc)(f"specs[{i}]: {exc}") from None
            result = self._place_too(s)  # one pass for all of them, in the same transaction
            records = self._records(s, ids, arguments=whole)
        self._placed(result, started)
        return records

    def _check_submit(self, spec: JobSpec) -> str | None:
        """What a spec must be before it is stored (beyond its own validation); a function's
        arguments as they are stored (their JSON text, None when there are none)."""
        if spec.bundle is not None:
            raise InvalidInput(
                "spec.bundle: the control plane takes bundles by address; upload the "
                "directory first and pass bundle_digest (the SDK and CLI do this)"
            )
        refuse_cloud_only(self.serving, spec)
        if spec.kind == "distributed":
            check_launch(spec)  # an entry its launcher could never start fails here, not on every node
        if spec.kind == "function" and (spec.args or spec.kwargs):
            if not self.serving:
                # an in-process caller's spec may have changed since it was built (its
                # arguments are lists the caller holds): checked here, as a server's are
                # where their request body is parsed (reads of the stored job do not check
                # them again: specs.CHECKED)
                job_specs.check_json(spec.args, "args")
                job_specs.check_json(spec.kwargs, "kwargs")
            return _check_arguments(spec.function, spec.args, spec.kwargs)
        return None

    def _insert(self, s: Session, spec: JobSpec, args_json: str | None, key: str | None, owner: str | None,
                now: float) -> str:
        """Store one queued job (its bundle readable by ``owner``; ``args_json``: what
        :meth:`_check_submit` said of it); its id."""
        if spec.bundle_digest is not None and not self._may_read_bundle(s, spec.bundle_digest, owner):
            raise BundleMissing(f"bundle_digest {spec.bundle_digest}: no bundle with that address was uploaded "
                                "(or it was deleted once no stored job named it); upload it first")
        spec_json = mapping.stored_spec(spec, args_json)
        job_id = new_id("job")
        plain.insert_job(s, plain.Job(
            id=job_id, kind=spec.kind, spec=spec_json, state=JobState.QUEUED.value, priority=spec.priority,
            created_at=now, updated_at=now, attempt=0, max_attempts=spec.retries + 1, exit_code=None,
            result=None, error=None, decision=None, cancel_requested=False, idempotency_key=key, owner=owner,
            args=args_json, bundle_digest=spec.bundle_digest))
        self._event(s, "submitted", job_id=job_id, message=spec.kind)
        if spec.after or spec.after_ended:  # it waits for them, or fails at once if one ended without success
            after.hold(s, job_id, spec.after, spec.after_ended, owner, now, self._event)
        return job_id

    def get_job(self, job_id: str, *, arguments: bool | None = None, brief: bool | None = None) -> JobRecord:
        """The job's record; ``arguments=False``: without a function's arguments (``args``
        and ``kwargs`` empty, the column not read), for a reader of the rest (the
        dashboard's live looks, ``result()``, a follower); ``brief``: as :meth:`list_jobs`
        gives it, without its tasks, result and arguments (``status()``, ``done()``)."""
        with self.store.read() as s:
            return self._record(s, job_id, arguments=arguments is not False, brief=bool(brief))

    def _record(self, s: Session, job_id: str, *, arguments: bool = True, brief: bool = False) -> JobRecord:
        """The job's record, as stored, with every task it had (NotFound if there is no such
        job); without a function's ``arguments``, or ``brief``: as :meth:`list_jobs` gives it,
        without its tasks, result and arguments (the columns not read)."""
        arguments = arguments and not brief
        return mapping.job_record(plain.job(s, job_id, result=not brief, arguments=arguments),
                                  [] if brief else plain.tasks_of(s, job_id), result=not brief,
                                  arguments=arguments, as_text=self.results_as_text)

    def _records(self, s: Session, job_ids: Sequence[str], *, arguments: bool = True,
                 brief: bool = False) -> list[JobRecord]:
        """:meth:`_record` of each of these jobs."""
        return [self._record(s, job_id, arguments=arguments, brief=brief) for job_id in job_ids]

    def job_owner(self, job_id: str) -> str | None:
        """The token id that submitted the job (None when submitted in-process)."""
        with self.store.read() as s:
            return queries.job_owner(s, job_id)

    def list_jobs(self, *, state: JobState | str | None = None, limit: int = 100,
                  owner: str | None = None, before: str | None = None) -> list[JobRecord]:
        """The newest jobs, newest first (ties in submit time by id); ``before``: only those
        listed after that job (a cursor: the last job of one page gives the next), which must
        be one the caller sees."""
        if state is not None and state not in {s.value for s in JobState}:
            raise InvalidInput(f"state {state!r}: expected one of {', '.join(s.value for s in JobState)}")
        with self.store.read() as s:
            value = JobState(state).value if state is not None else None
            after: tuple[float, str] | None = None
            if before is not None:
                cursor = queries.job(s, before)  # (NotFound for no such job)
                if owner is not None and cursor.owner != owner:
                    raise NotFound(f"job {before!r}: no such job")
                after = (cursor.created_at, cursor.id)
            return [mapping.job_record(r, result=False, arguments=False)
                    for r in queries.jobs(s, state=value, limit=limit, owner=owner, before=after)]

    def cancel(self, job_id: str, *, reason: str | None = None) -> JobRecord:
        """End the job: a queued one at once, a running one through its workers, whose long
        polls (:meth:`poll_work`) are woken to hear it at once. ``reason`` (in-process
        callers) becomes the job's error."""
        now = self.clock()
        with self.store.write() as s:
            row = queries.job(s, job_id)
            if JobState(row.state).terminal:
                return mapping.job_record(row, queries.tasks_of(s, job_id), as_text=self.results_as_text)
            running_on = self._cancel_row(s, row, reason, now)
        self._cancelled(running_on)
        return self.get_job(job_id)

    def cancel_many(self, job_ids: Sequence[str], *, owner: str | None = None,
                    reason: str | None = None, place: bool = True) -> list[JobRecord]:
        """:meth:`cancel` for many jobs (at most :data:`~gpulayer.api.MAX_BATCH`): one
        transaction and one placement pass for all of them (one each made cancelling a
        long queue quadratic: a pass over the whole queue per job). The records of those
        that exist (and are ``owner``'s), in the order given, brief (:meth:`records_of`);
        other ids are left out. ``reason`` as for :meth:`cancel`; ``place=False`` (in
        process: a caller with more batches to cancel) skips the pass: the caller's last
        batch runs it."""
        ids = job_ids_of(job_ids, "cancel")
        now = self.clock()
        running_on: set[str] = set()
        with self.store.write() as s:
            rows = queries.jobs_by_id(s, ids, light=True)
            found = [j for j in ids if j in rows and (owner is None or rows[j].owner == owner)]
            live = [rows[j] for j in found if not JobState(rows[j].state).terminal]
            for row in live:
                running_on |= self._cancel_row(s, row, reason, now)
        if live:
            self._cancelled(frozenset(running_on), place=place)
        try:
            return self.records_of(found, brief=True)
        except NotFound:  # one that had ended was deleted meanwhile (a prune): left out, as an unknown id is
            with self.store.read() as s:
                kept = queries.jobs_by_id(s, found, light=True)
            return self.records_of([j for j in found if j in kept], brief=True)

    def _cancel_row(self, s: Session, row: JobRow, reason: str | None, now: float) -> frozenset[str]:
        """Cancel a job that has not ended, in the caller's transaction: a queued one ends
        here, an assigned task that had not started ends here too; the workers whose tasks
        of it run (to be told: :meth:`_cancelled`)."""
        running_on: frozenset[str] = frozenset()
        row.cancel_requested = True
        row.updated_at = now
        if row.state == JobState.QUEUED.value:
            row.state = JobState.CANCELLED.value
            plain.note_ended(s, row.id)
            row.error = JobError.cancelled(f"{reason} (before it started)" if reason
                                           else "cancelled before it started").model_dump_json()
        else:
            if reason:
                row.error = JobError.cancelled(reason).model_dump_json()
            # assigned but not started: nothing to stop, end it here
            tasks = queries.tasks_of(s, row.id, row.attempt)
            running_on = frozenset(t.worker_id for t in tasks if t.state in ACTIVE)
            for t in tasks:
                if t.state == TaskState.ASSIGNED.value:
                    queries.transition_task(s, t.id, TaskState.CANCELLED, ended_at=now,
                                            error=JobError.cancelled())
            s.add(row)
            self._settle(s, row, now)
        s.add(row)
        self._event(s, "cancel_requested", job_id=row.id)
        return running_on

    def _cancelled(self, running_on: frozenset[str], *, place: bool = True) -> None:
        """After cancels committed: their workers told, a placement pass, the news."""
        self._cancelled_on(running_on)  # first: the workers end the processes while we go on
        if place:
            self.schedule()  # devices of cancelled unstarted tasks are free for queued jobs
        self._changed()

    def logs(self, job_id: str, *, after: int = 0, node: int | None = None, limit: int = MAX_LOG_CHUNKS,
             wait: float | None = None, tail: int | None = None) -> list[LogChunk]:
        """The job's log chunks after ``after`` (one page: see ClientAPI.logs). With ``wait``
        seconds (at most :data:`MAX_LONG_POLL`), a page that would be empty waits until the
        job has output after ``after``, its state changes or has ended, or ``wait`` seconds
        passed: a follower's long poll, woken by the append itself (here, and by a nudge from
        another process), not by a look at a growing interval. ``tail``: :mod:`.tail`, at once."""
        if tail is not None:
            return tail_page(self, job_id, lines=tail, after=after, node=node, limit=limit)
        if not wait or wait <= 0:
            return self.log_look(job_id, after=after, node=node, limit=limit)[0]
        self._hear_nudges()  # (before the first look: no other process's output goes unheard after it)
        deadline = time.monotonic() + min(wait, MAX_LONG_POLL)
        poll = WAIT_FIRST_LOOK
        first: str | None = None
        while True:
            seen = self._progress_of(job_id)
            chunks, state = self.log_look(job_id, after=after, node=node, limit=limit)
            first = first or state
            remaining = deadline - time.monotonic()
            if chunks or state != first or JobState(state).terminal or remaining <= 0:
                return chunks
            # (the look at an interval bounds how late output is seen that no nudge announced)
            self._wait_progress(job_id, seen, min(poll, remaining))
            poll = min(poll * 1.5, WAIT_LONGEST_LOOK)

    def log_look(self, job_id: str, *, after: int = 0, node: int | None = None,
                 limit: int = MAX_LOG_CHUNKS) -> tuple[list[LogChunk], str]:
        """One page of the job's log chunks after ``after``, and the job's state read before
        them (in one read: a job that had ended then has all its output in the page's reach)."""
        with self.store.read() as s:
            state = plain.job_state(s, job_id)
            if state is None:
                raise plain.not_found("job", job_id)
            return [mapping.log_chunk(r) for r in queries.logs(s, job_id, after=after, node=node, limit=limit,
                                                               text=LOG_PAGE_TEXT)], state

    def state_of(self, job_id: str) -> str | None:
        """The job's state alone (None: no such job): what a wait for its end reads while it
        waits, the record only at the end (a function's arguments may be a megabyte)."""
        with self.store.read() as s:
            return plain.job_state(s, job_id)

    def wait_job(self, job_id: str, *, timeout: float = MAX_LONG_POLL, arguments: bool | None = None) -> JobRecord:
        """The job once it is terminal, or as it is after ``timeout`` seconds; ``arguments``
        as for :meth:`get_job`."""
        deadline = time.monotonic() + timeout
        poll = WAIT_FIRST_LOOK
        while True:
            generation = self._generation
            with self.store.read() as s:  # the state alone while waiting; the record at the end
                state = plain.job_state(s, job_id)
                remaining = deadline - time.monotonic()
                if state is None or JobState(state).terminal or remaining <= 0:
                    # (NotFound for a job that does not exist)
                    return self._record(s, job_id, arguments=arguments is not False)
            self._wait_change(generation, min(poll, remaining))
            poll = min(poll * 1.5, WAIT_LONGEST_LOOK)

    def wait_jobs(self, job_ids: Sequence[str], *, count: int = 1, timeout: float = MAX_LONG_POLL,
                  owner: str | None = None, brief: bool | None = None) -> list[JobRecord]:
        """The records of those of these jobs that have ended, in the order given, once at
        least ``count`` of them have (all of them, when there are fewer), or after ``timeout``
        seconds (those ended by then, perhaps none). A job that does not exist (or is not
        ``owner``'s) is NotFound. The first look reads every state; after a change, the news
        of the changes says which ended (:meth:`ended_news`), and a look at the database
        (:meth:`jobs_ended`) comes only when it cannot; looks are spaced by :func:`look_gap`.
        (A server runs the same looks with its waits on its event loop.) ``brief``: the
        records without results and arguments (:meth:`records_of`)."""
        ids = job_ids_of(job_ids)
        waited = frozenset(ids)
        need = min(max(1, count), len(ids))
        deadline = time.monotonic() + timeout
        poll = WAIT_FIRST_LOOK
        generation, ended, looked_at = self.first_look(ids, owner)
        while True:
            remaining = deadline - time.monotonic()
            if len(ended) >= need or remaining <= 0:
                self.remember_look(waited, owner, generation, ended, looked_at)
                return self.records_of([j for j in ids if j in ended], brief=bool(brief))
            looked = time.monotonic()
            self._wait_change(generation, min(poll, remaining))
            poll = min(poll * 1.5, WAIT_LONGEST_LOOK)
            time.sleep(max(0.0, min(looked + look_gap(ids, ended), deadline) - time.monotonic()))
            seen, generation = generation, self.changes()
            news = self.ended_news(waited, seen, looked_at)
            if news is None:
                ended = self.jobs_ended(ids, ended)
                looked_at = time.monotonic()
            else:
                ended |= news

    def first_look(self, job_ids: list[str], owner: str | None = None) -> tuple[int, set[str], float]:
        """The first look of a wait for these jobs: (:meth:`changes` as of it, those of
        them that have ended, when the database was read for it), for the wait to go on
        with :meth:`ended_news`.

        Where the last wait's look (:meth:`remember_look`) was at the same jobs or more,
        for the same owner, less than :data:`WAIT_LONGEST_LOOK` ago, and the news of the
        changes since says which jobs they ended, it is that look and that news: the calls
        of ``gl.as_completed``, each on the jobs the last one left, read every state once
        in that time instead of at every call. Otherwise it reads every state
        (:meth:`jobs_ended`: NotFound for a job that does not exist or is not ``owner``'s).
        An ended job stays ended, so such a look never says one ended that has not; one
        it has not heard of yet is found by the wait's next look, as always."""
        self._hear_nudges()  # (before the first look: no other process's change goes unheard after it)
        last = self._last_look
        if last is not None and last.owner == owner and time.monotonic() - last.at < WAIT_LONGEST_LOOK \
                and last.job_ids.issuperset(job_ids):
            generation = self.changes()
            news = self._ended_since(last.generation)
            if news is not None:
                known = last.ended | news
                self.remember_look(last.job_ids, owner, generation, known, last.at)
                return generation, set(known.intersection(job_ids)), last.at
        generation = self.changes()
        ended = self.jobs_ended(job_ids, owner=owner)
        looked_at = time.monotonic()
        self.remember_look(frozenset(job_ids), owner, generation, ended, looked_at)
        return generation, ended, looked_at

    def remember_look(self, job_ids: frozenset[str], owner: str | None, generation: int, ended: set[str] | frozenset[str],
                      looked_at: float) -> None:
        """Keep what a wait knew when it answered (its last look, and the news since) for
        the next wait's :meth:`first_look`."""
        self._last_look = Look(job_ids, owner, generation, frozenset(ended), looked_at)

    def changes(self) -> int:
        """How many changes this control plane has heard of (its own, and those other
        processes nudged it about): read it before a look, and give it to
        :meth:`ended_news` after the next change."""
        return self._generation

    def ended_news(self, job_ids: frozenset[str], seen: int, looked_at: float) -> set[str] | None:
        """Which of ``job_ids`` ended in the changes after ``seen`` (:meth:`changes` before
        the caller's last look), from what those changes said of the jobs they ended; None
        when the caller must look at the database (:meth:`jobs_ended`) instead: no change came
        (it waited out its time, and a change of a process that cannot nudge this one is
        seen only there), one did not say (a nudge of an older version, or one that would
        have named too many), or the last look, at ``looked_at`` (``time.monotonic()``), is
        :data:`WAIT_LONGEST_LOOK` old (a change that ended a job without saying so: none
        should, and this bounds how late it would be seen)."""
        if seen == self._generation or time.monotonic() - looked_at >= WAIT_LONGEST_LOOK:
            return None
        ended = self._ended_since(seen)
        return None if ended is None else set(ended & job_ids)

    def jobs_ended(self, job_ids: list[str], ended: set[str] | None = None, *,
                   owner: str | None = None) -> set[str]:
        """Which of these jobs have ended. The first look (``ended`` None) reads every one's
        state (NotFound for one that does not exist, or is not ``owner``'s: another owner's
        job is not there for them); a later one adds to ``ended`` those of the others that
        ended since, reading only their rows."""
        with self.store.read() as s:
            if ended is not None:
                return ended | _ended_of(s, [j for j in job_ids if j not in ended])
            rows = plain.fetch_in(s, "SELECT id, state, owner FROM gl_jobs WHERE id IN ({})", job_ids)
        found = {job_id: state for job_id, state, job_owner in rows if owner is None or job_owner == owner}
        for job_id in job_ids:
            if job_id not in found:
                raise plain.not_found("job", job_id)
        return {job_id for job_id, state in found.items() if state in plain.ENDED_STATES}

    def records_of(self, job_ids: Sequence[str], *, brief: bool = False) -> list[JobRecord]:
        """The records of these jobs, in their order, in one read; ``brief``: as
        :meth:`list_jobs` gives them, without their tasks, results and a function's
        arguments (neither column read)."""
        with self.store.read() as s:
            return self._records(s, job_ids, brief=brief)

    def events(self, job_id: str) -> list[JobEvent]:
        with self.store.read() as s:
            return [mapping.job_event(r) for r in queries.events(s, job_id)]

    # ------------------------------------------------------------------ bundles

    # A bundle is readable by the admin (and in-process callers: ``owner`` and ``worker_id``
    # None), by each client token that uploaded it (``owner``: the token's id), and by a
    # worker while a task of a job that uses it is assigned to it. To anyone else it does not
    # exist: has_bundle says False, get_bundle and a submit naming it say it was not uploaded.

    def _may_read_bundle(self, s: Session, digest: str, owner: str | None,
                         worker_id: str | None = None) -> bool:
        if not queries.bundle_exists(s, digest):
            return False
        if worker_id is not None:
            return queries.worker_runs_bundle(s, worker_id, digest)
        return owner is None or queries.is_bundle_reader(s, digest, owner)

    def has_bundle(self, digest: str, *, owner: str | None = None, worker_id: str | None = None) -> bool:
        with self.store.read() as s:
            return self._may_read_bundle(s, digest, owner, worker_id)

    def put_bundle(self, digest: str, data: bytes, *, owner: str | None = None) -> BundleStored:
        """Store a bundle (``stored`` False when that address was already stored) and record
        ``owner`` as one of its readers. Verifies that the content hashes to its address and
        that it is a safe archive (:func:`gpulayer.bundles.check_archive`) first."""
        _bundles.verify_digest(data, digest)
        _bundles.check_archive(data, digest)
        now = self.clock()
        for _ in range(2):  # once more when the same content was uploaded concurrently
            try:
                with self.store.write(lock=False) as s:
                    stored = not queries.bundle_exists(s, digest)
                    if stored:
                        queries.add_bundle(s, BundleRow(digest=digest, size=len(data), data=data, created_at=now))
                    if owner is not None:
                        queries.add_bundle_reader(s, digest, owner, now)
                return BundleStored(digest=digest, size=len(data), stored=stored)
            except IntegrityError:
                continue
        return BundleStored(digest=digest, size=len(data), stored=False)

    def get_bundle(self, digest: str, *, owner: str | None = None, worker_id: str | None = None) -> bytes:
        with self.store.read() as s:
            if not self._may_read_bundle(s, digest, owner, worker_id):
                raise NotFound(f"bundle {digest!r}: no such bundle")
            return bytes(queries.bundle(s, digest).data)

    # ------------------------------------------------------------------ workers


def _ended_of(s: Session, job_ids: list[str]) -> set[str]:
    """Which of these jobs (known to exist) have ended: only those rows are read."""
    sql = f"SELECT id FROM gl_jobs WHERE state IN ({', '.join('?' * len(plain.ENDED_STATES))}) AND id IN ({{}})"
    out: set[str] = set()
    for i in range(0, len(job_ids), plain.IN_CHUNK):
        chunk = job_ids[i:i + plain.IN_CHUNK]
        out.update(r[0] for r in plain.fetch(s, sql.format(", ".join("?" * len(chunk))), (*plain.ENDED_STATES, *chunk)))
    return out


def look_gap(job_ids: Sequence[str], ended: set[str]) -> float:
    """How long a wait for these jobs leaves between two looks: :data:`LOOK_PER_JOB` for
    each job not ended yet."""
    return (len(job_ids) - len(ended)) * LOOK_PER_JOB


def job_ids_of(job_ids: Sequence[str], what: str = "wait") -> list[str]:
    """The ids of a ``what`` (a wait, a cancel) for many jobs, each once, in their order;
    refused when there are none or more than :data:`~gpulayer.api.MAX_BATCH`, or when they
    are one string (whose characters would be taken for ids)."""
    if isinstance(job_ids, str):
        raise InvalidInput(f"job_ids: {job_ids!r} is one string; accepted: a list of job ids")
    ids = list(dict.fromkeys(job_ids))
    if not ids:
        raise InvalidInput("job_ids: empty; give the id of at least one job")
    if len(ids) > MAX_BATCH:
        raise InvalidInput(f"job_ids: {len(ids)} jobs, over the limit of {MAX_BATCH} in one {what}; split them")
    return ids


def _scoped(owner: str | None, idempotency_key: str | None) -> str | None:
    """An idempotency key as stored: within its owner's (one owner cannot reach another's
    job by guessing a key)."""
    return f"{owner}:{idempotency_key}" if owner and idempotency_key else idempotency_key


def _check_arguments(function: str, args: list[Any], kwargs: dict[str, Any]) -> str:
    """A function job's arguments within the documented limits (the same embedded and on a
    server), counted with an early stop so that a huge list is refused in bounded time; their
    JSON text as stored (:func:`gpulayer.store.mapping.stored_spec`), written once."""
    env = config.settings()
    budget = env.max_args_values
    stack: list[Any] = [args, kwargs]
    while stack:
        value = stack.pop()
        budget -= 1
        if budget < 0:
            raise InvalidArgument(f"arguments of {function}: more than {env.max_args_values} values "
                                  "(GPULAYER_MAX_ARGS_VALUES); pass large data as a file in the bundle or a URL")
        if isinstance(value, list):
            stack.extend(value)
        elif isinstance(value, dict):
            stack.extend(value.values())
    text = mapping.arguments_json(args, kwargs)
    if len(text) > env.max_args_mb * 1024 * 1024:  # (ASCII: json.dumps escapes the rest)
        raise InvalidArgument(f"arguments of {function}: {len(text)} bytes of JSON, over the limit of "
                              f"{env.max_args_mb:g} MB (GPULAYER_MAX_ARGS_MB); pass large data as a file in "
                              "the bundle or a URL")
    return text


def _result_json(result: Any, spec: JobSpec) -> str | None:
    """A function's result as stored, or InvalidInput when it is not JSON or over the limit
    (the same embedded and on a server; the worker then fails the task with this message)."""
    if result is None:
        return None
    what = f"the result of {spec.function}" if spec.kind == "function" else "the result"
    if isinstance(result, ResultJSON):  # (the runner's own json.dumps: stored as it is)
        text = result.text
    else:
        try:
            text = json.dumps(result, allow_nan=False)
        except (TypeError, ValueError, RecursionError) as exc:
            raise InvalidInput(f"{what} is not JSON ({exc})") from None
    limit = config.settings().max_result_mb
    size = len(text.encode("utf-8", "surrogatepass"))
    if size > limit * 1024 * 1024:
        raise InvalidInput(f"{what} is {size} bytes of JSON, over the limit of {limit:g} MB "
                           "(GPULAYER_MAX_RESULT_MB); return a path or a URL to large data instead")
    return text

