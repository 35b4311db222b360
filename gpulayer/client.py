"""The client the SDK, the CLI and the PyTorch API use: one class over either control plane.

A process that runs a worker of its own (embedded: the SDK and ``gpulayer submit`` start
one when a local job needs it) does not drop the jobs it submitted when it ends:

* at a normal exit it waits for the local jobs it submitted that have not ended, saying so
  on stderr; Ctrl-C during that wait cancels them ("cancelled: the process that submitted
  it was interrupted while waiting for it at exit");
* on SIGTERM (when the program has no handler of its own) it cancels them at once, ends
  their processes and exits with status 143 ("cancelled: the process that submitted it
  received SIGTERM").

A job's own process cancels the jobs it submitted when its job is ended (:mod:`gpulayer.leaving`).

:func:`connect` picks the control plane: ``GPULAYER_URL`` (and ``GPULAYER_TOKEN``) select a
server, reached through :func:`gpulayer.http_client.connect_http`; otherwise the control
plane runs embedded (:class:`~gpulayer.control.ControlPlane` on SQLite in
``$GPULAYER_HOME``). Either way :attr:`Client.api` offers every operation of
:class:`~gpulayer.api.ControlAPI`, and :class:`Client` adds only what is shared behaviour
on top of them: preparing a spec (profile, default target, bundle upload), submitting it
(starting an in-process worker when a local job needs one), explaining one, waiting past
one long poll, and following logs.
"""

from __future__ import annotations

import atexit
import os
import re
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

from gpulayer import artifacts, bundles, config, leaving, logtail, logtext
from gpulayer.api import MAX_BATCH, MAX_LOG_CHUNKS, MAX_LONG_POLL, ControlAPI, JobsRerun, LogChunk, log_page_cut
from gpulayer.artifacts import Downloaded
from gpulayer.errors import (
    BundleMissing,
    GpulayerError,
    InvalidArgument,
    InvalidInput,
    MethodNotAllowed,
    NotFound,
    SubmitWhileImporting,
)
from gpulayer.lending import lent_while_waiting
from gpulayer.records import Explanation, JobRecord, JobState, WorkerRecord
from gpulayer.specs import CommandJob, DistributedJob, FunctionJob, JobSpec
from gpulayer.unsent import entry_not_sent
from gpulayer.worker.function_runner import IMPORTING_ENV

if TYPE_CHECKING:
    from gpulayer.control import ControlPlane

#: the id ``explain`` gives the worker an embedded submit would start in its own process
IN_PROCESS = "in-process"
#: the longest a follower's long poll for output holds (output or a change of the job's state
#: ends it at once): how often a follower of a silent job looks at it anyway (a progress
#: line's queue position, ``Trainer.fit``'s deadline)
FOLLOW_WAIT = 1.0


class Client:
    """Shared behaviour over one control plane (:attr:`api`)."""

    def __init__(self, api: ControlAPI, *, location: str, default_target: str,
                 control: ControlPlane | None = None) -> None:
        #: every operation of the control plane (in this process, or over HTTP)
        self.api = api
        #: "embedded" or the server URL
        self.location = location
        #: the target of a job that names none: local embedded, remote against a server
        self.default_target = default_target
        #: the control plane itself when it runs in this process (it can host a worker)
        self.control = control
        self._agent: Any = None
        self._agent_lock = threading.Lock()
        #: local jobs this process submitted (it waits for them at exit; a task, for any
        #: job: it cancels them when it is ended: gpulayer.leaving)
        self._submitted: list[str] = []
        self._task_exit_set = False
        self._terminating = False
        #: bundles the control plane holds and lets this client read (stored bundles and
        #: their readers are never removed), so a loop of submits asks once per bundle
        self._bundles_held: set[str] = set()
        #: whether the control plane cancels a batch of jobs at once (False: one from before it)
        self._batch_cancels = True
        #: whether the control plane takes cancel_many(reason=) (False: one from before it)
        self._cancel_reasons = True
        #: whether the control plane takes wait_jobs(brief=) (False: one from before it)
        self._brief_waits = True
        #: whether it takes wait_job(arguments=False) (False: one from before it)
        self._argument_free = True
        #: whether it takes get_job(brief=True) (False: one that refuses it)
        self._brief_reads = True
        #: whether it takes logs(tail=) (False: one from before it, whose output is read whole)
        self._log_tails = True

    @property
    def embedded(self) -> bool:
        return self.control is not None

    @property
    def control_plane(self) -> str:
        """Which control plane this client reaches: the server's URL, or the embedded
        database's (two clients of one control plane, with two tokens say, name the same one:
        job handles compare by it and their job's id)."""
        return self.location if self.control is None else self.control.store.url

    # ------------------------------------------------------------------ submitting

    def resolve(self, spec: JobSpec) -> JobSpec:
        """The spec with its profile and implied accelerator resolved and the default target
        filled in: what placement reads (the bundle is left as it is)."""
        from gpulayer.profiles import resolve_requirements

        update: dict[str, Any] = {"requirements": resolve_requirements(spec.requirements)}
        if "target" not in spec.placement.model_fields_set:
            update["placement"] = spec.placement.model_copy(update={"target": self.default_target})
        return spec.model_copy(update=update)

    def prepare(self, spec: JobSpec, *, files: dict[str, Any] | None = None) -> JobSpec:
        """:meth:`resolve`, then upload the bundle; returns the spec the control plane stores
        (``files``: where the bundle's files are noted, by its folder, for specs that reuse it)."""
        spec = self.resolve(spec)
        if spec.bundle is not None:
            bundle = bundles.build_bundle(spec.bundle)
            if files is not None:
                files[spec.bundle] = bundle.files
            missing = entry_not_sent(spec, bundle.files)
            if missing is not None:
                raise InvalidInput(missing)
            if bundle.digest not in self._bundles_held:
                if not self.api.has_bundle(bundle.digest):
                    self.api.put_bundle(bundle.digest, bundle.data)
                self._bundles_held.add(bundle.digest)
            spec = spec.model_copy(update={"bundle": None, "bundle_digest": bundle.digest})
        return spec

    def submit(self, spec: CommandJob | FunctionJob | DistributedJob, *,
               idempotency_key: str | None = None, arguments: bool = True) -> JobRecord:
        """Prepare and submit; a retried submit with the same key never makes two jobs.
        ``arguments=False``: the record comes without a function's arguments (the caller has
        them), where the control plane can leave them out."""
        _refuse_while_importing(spec)
        leaving.on_main_thread()  # (a worker started from another thread: its SIGTERM handler now)
        prepared = self.prepare(spec)
        if "local" in prepared.placement.targets:
            self.ensure_local_worker()
        key = idempotency_key or uuid.uuid4().hex
        try:
            job = self.api.submit(prepared, idempotency_key=key, **_arguments(arguments))
        except BundleMissing:  # (deleted since it was uploaded: no stored job named it)
            if spec.bundle is None:
                raise
            self._upload_again([spec.bundle])
            job = self.api.submit(prepared, idempotency_key=key, **_arguments(arguments))
        if (self.control is not None and "local" in prepared.placement.targets) or leaving.in_task():
            leaving.submitted(self, [job.id])
        return job

    def submit_many(self, specs: Sequence[CommandJob | FunctionJob | DistributedJob], *,
                    idempotency_key: str | None = None, arguments: bool = True) -> list[JobRecord]:
        """:meth:`submit` for many specs: prepared here (each bundle built and uploaded once),
        stored by ``submit_many`` calls of at most :data:`~gpulayer.api.MAX_BATCH` jobs and
        :data:`BATCH_BYTES` of specs each (each call all or nothing); the records in order.
        A retried call with the same key never makes two jobs. ``arguments`` as for
        :meth:`submit`."""
        specs = list(specs)
        for spec in specs:
            _refuse_while_importing(spec)
        leaving.on_main_thread()
        digests: dict[str, str | None] = {}  # bundle -> its address (a .map()'s jobs share one)
        files: dict[str, Any] = {}  # bundle -> its files
        prepared = []
        for spec in specs:
            if spec.bundle is not None and spec.bundle in digests:
                missing = entry_not_sent(spec, files[spec.bundle])
                if missing is not None:
                    raise InvalidInput(missing)
                spec = spec.model_copy(update={"bundle": None, "bundle_digest": digests[spec.bundle]})
                prepared.append(self.resolve(spec))
                continue
            ready = self.prepare(spec, files=files)
            if spec.bundle is not None:
                digests[spec.bundle] = ready.bundle_digest
            prepared.append(ready)
        if any("local" in p.placement.targets for p in prepared):
            self.ensure_local_worker()
        key = idempotency_key or uuid.uuid4().hex
        records: list[JobRecord] = []
        for n, chunk in enumerate(_batches(prepared, measure=self.control is None)):
            try:
                try:
                    records += self.api.submit_many(chunk, idempotency_key=f"{key}/{n}", **_arguments(arguments))
                except BundleMissing:  # (deleted since it was uploaded: no stored job named it)
                    if not digests:
                        raise
                    self._upload_again(list(digests))
                    records += self.api.submit_many(chunk, idempotency_key=f"{key}/{n}", **_arguments(arguments))
            except InvalidInput as exc:  # named by its place in the whole list, not in its call's
                raise type(exc)(_renumbered(str(exc), len(records))) from None
        if self.control is not None or leaving.in_task():
            leaving.submitted(self, [r.id for r, p in zip(records, prepared, strict=True)
                                     if "local" in p.placement.targets or leaving.in_task()])
        return records

    def _upload_again(self, folders: Sequence[str]) -> None:
        """Upload these folders' bundles again, held or not: the control plane said a job's
        bundle is not stored (``gpulayer jobs prune`` deletes those no stored job names, and
        this client uploads a bundle once)."""
        for folder in folders:
            bundle = bundles.build_bundle(folder)
            self.api.put_bundle(bundle.digest, bundle.data)
            self._bundles_held.add(bundle.digest)

    # ------------------------------------------------------------------ explaining

    def explain(self, spec: CommandJob | FunctionJob | DistributedJob) -> Explanation:
        """What placement would say about ``spec`` now, nothing submitted and nothing
        uploaded. Embedded, a local job counts the worker :meth:`submit` would start here
        when none is running (named ``in-process``), so the answer is the one a submit gets."""
        resolved = self.resolve(spec)
        if self.control is not None:
            return self.control.explain(resolved, prospective=self._would_start(resolved))
        return self.api.explain(resolved)

    def explain_job(self, job_id: str) -> Explanation:
        """:meth:`explain` for a stored job."""
        if self.control is not None:
            spec = self.control.get_job(job_id, arguments=False).spec
            return self.control.explain_job(job_id, prospective=self._would_start(spec))
        return self.api.explain_job(job_id)

    def _would_start(self, spec: JobSpec) -> list[WorkerRecord]:
        """The in-process worker :meth:`ensure_local_worker` would start for ``spec``, as a
        record that is not registered; none when one runs already or the job is not local."""
        if "local" not in spec.placement.targets or self._agent is not None or self.live_local_workers():
            return []
        from gpulayer.capability_cache import cached_capabilities
        from gpulayer.worker.agent import default_cpu_slots

        caps = cached_capabilities()
        slots = config.settings().cpu_slots
        return [WorkerRecord(id=IN_PROCESS, name="the worker this process would start", origin="local",
                             capabilities=caps, cpu_slots=default_cpu_slots(caps) if slots is None else slots)]

    def cancel_jobs(self, job_ids: Sequence[str], reason: str | None = None) -> dict[str, JobRecord | GpulayerError]:
        """Cancel these jobs: each id's record after its cancel (brief: no tasks, results or
        arguments), or the error that says why there is none (no such job). A batch of up to
        :data:`~gpulayer.api.MAX_BATCH` ids at a time: one request, one transaction and one
        placement pass each (one cancel at a time ran a pass over the whole queue each);
        one at a time against a server from before ``POST /v1/jobs/cancel`` (its records
        then whole), which this client then asks no more. ``reason``: the jobs' error says it
        (``cancelled: REASON``), where the control plane takes one (not one from before it)."""
        ids = list(dict.fromkeys(job_ids))
        out: dict[str, JobRecord | GpulayerError] = {}
        for i in range(0, len(ids), MAX_BATCH):
            chunk = ids[i:i + MAX_BATCH]
            if self._batch_cancels:
                try:
                    out.update((job.id, job) for job in self._cancel_many(chunk, reason))
                except (MethodNotAllowed, NotFound):
                    # a server without the route: POST /v1/jobs/cancel is its GET /v1/jobs/{job_id}
                    # (405; the route itself never answers 404: it leaves unknown ids out)
                    self._batch_cancels = False
            if not self._batch_cancels:
                for job_id in chunk:
                    try:
                        out[job_id] = self.api.cancel(job_id)
                    except GpulayerError as exc:
                        out[job_id] = exc
            for job_id in chunk:
                out.setdefault(job_id, NotFound(f"job {job_id!r}: no such job"))
        return out

    def _cancel_many(self, job_ids: list[str], reason: str | None) -> list[JobRecord]:
        if reason is None or not self._cancel_reasons:
            return self.api.cancel_many(job_ids)
        try:
            return self.api.cancel_many(job_ids, reason=reason)
        except InvalidInput as exc:
            if "reason" not in str(exc) or "no such field" not in str(exc):
                raise
            self._cancel_reasons = False  # (a server from before reasons: they read "cancelled")
            return self.api.cancel_many(job_ids)

    # ------------------------------------------------------------------ following

    def ended(self, job_ids: list[str], timeout: float) -> set[str]:
        """The ids of those of these jobs that have ended, once one has or after ``timeout``
        seconds (one ``wait_jobs``, its records brief: no tasks, results or arguments are read,
        parsed and sent for a caller that only asks which ended)."""
        leaving.on_main_thread()
        with lent_while_waiting(self, timeout):
            if self._brief_waits:
                try:
                    return {j.id for j in self.api.wait_jobs(job_ids, count=1, timeout=timeout, brief=True)}
                except InvalidInput as exc:
                    if "brief" not in str(exc):
                        raise
                    self._brief_waits = False  # (a control plane from before brief: "no such field")
            return {j.id for j in self.api.wait_jobs(job_ids, count=1, timeout=timeout)}

    def wait(self, job_id: str, timeout: float | None = None, *, arguments: bool = True) -> JobRecord:
        """The job once it is terminal, or as it is after ``timeout`` seconds (None: no limit),
        however many bounded long polls that takes; ``arguments=False``: its record without a
        function's arguments (:meth:`job`), for a caller that wants its outcome."""
        deadline = None if timeout is None else time.monotonic() + timeout
        leaving.on_main_thread()  # (jobs submitted from another thread: SIGTERM now ends them)
        with lent_while_waiting(self, timeout):  # (in a task: its slot is lent meanwhile)
            while True:
                remaining = (MAX_LONG_POLL if deadline is None
                             else max(0.0, min(MAX_LONG_POLL, deadline - time.monotonic())))
                job = (self.api.wait_job(job_id, timeout=remaining) if arguments
                       else self._lean(self.api.wait_job, job_id, timeout=remaining))
                if job.state.terminal or (deadline is not None and time.monotonic() >= deadline):
                    return job

    def job(self, job_id: str, *, arguments: bool = True, brief: bool = False) -> JobRecord:
        """The job's record; ``arguments=False``: without a function's arguments (``args``
        and ``kwargs`` empty) where the control plane can leave them out, for a caller that
        reads the rest: arguments may be a megabyte, parsed and sent at every read.
        ``brief``: without its tasks, result and arguments too, for a caller that reads its
        state. A control plane from before ``brief`` sends more: one whose ``get_job`` takes
        no query ignores the field; one that refuses it ("no such field") is asked as
        without ``brief`` from then on."""
        if brief and self._brief_reads:
            try:
                return self.api.get_job(job_id, brief=True)
            except InvalidInput as exc:
                if "brief" not in str(exc) or "no such field" not in str(exc):
                    raise
                self._brief_reads = False
        return self.api.get_job(job_id) if arguments and not brief else self._lean(self.api.get_job, job_id)

    def _lean(self, op: Callable[..., JobRecord], job_id: str, **kw: Any) -> JobRecord:
        """``op(job_id, **kw)`` (``get_job``, ``wait_job``) with ``arguments=False``; against a
        control plane from before it, which refuses the field (a server words it "no such
        field"), as before, and it is not asked again."""
        if self._argument_free:
            try:
                return op(job_id, arguments=False, **kw)
            except InvalidInput as exc:
                if "arguments" not in str(exc) or "no such field" not in str(exc):
                    raise
                self._argument_free = False
        return op(job_id, **kw)

    def log_chunks(self, job_id: str, *, node: int | None = None, tail: int | None = None) -> Iterator[LogChunk]:
        """All of the job's log chunks so far, oldest first, read a page at a time (a long
        job writes more than one request returns: a line every 0.1 s is 10,000 chunks in 17
        minutes; see :meth:`~gpulayer.api.ControlAPI.logs`), so at most a page is held.
        ``tail``: those of its last ``tail`` lines (:meth:`log_tail`), the first one cut."""
        after = 0
        if tail is not None:
            page, more = self.log_tail(job_id, node=node, tail=tail)
            yield from (c for c in page if c.data)
            if not more:
                return
            after = page[-1].id  # (then the rest: the page's first text was cut, so read on whatever its size)
        while True:
            page = self.api.logs(job_id, after=after, node=node, limit=MAX_LOG_CHUNKS)
            yield from page
            if not page or not log_page_cut(page):
                return
            after = page[-1].id

    def log_tail(self, job_id: str, *, node: int | None = None, tail: int) -> tuple[list[LogChunk], bool]:
        """The first page of the job's last ``tail`` lines (``logs(tail=)``: its first chunk's
        text cut where they start, maybe to nothing) and whether the chunks after its last id
        are still to be read. A control plane from before ``tail`` refuses the field ("no such
        field"): its output is then read whole, only its end kept (:func:`~gpulayer.logtail.kept_end`),
        and it is not asked again."""
        tail = logtail.checked_tail(tail, f"tail={tail!r}")
        if self._log_tails:
            try:
                page = self.api.logs(job_id, node=node, tail=tail)
                return page, bool(page)
            except InvalidInput as exc:
                if "tail" not in str(exc) or "no such field" not in str(exc):
                    raise
                self._log_tails = False
        kept = logtail.kept_end(self.log_chunks(job_id, node=node), tail, lambda c: c.data)
        start = logtail.tail_start(((c.id, c.data) for c in reversed(kept)), tail)
        if start is None:
            return [], False
        kept = [c for c in kept if c.id >= start[0]]
        kept[0] = kept[0].model_copy(update={"data": kept[0].data[start[1]:]})
        return kept, False

    def follow(self, job_id: str, *, node: int | None = None, stream: bool = True,
               on_update: Any = None, tail: int | None = None) -> Iterator[LogChunk]:
        """Yield the job's log chunks as they arrive, until the job has ended and every
        chunk was read. ``on_update(job)`` is called with each fresh look at the job (for
        progress lines), at least every :data:`FOLLOW_WAIT` seconds: its record without a
        function's arguments (:meth:`job`); ``stream=False`` reads no logs, it only waits.

        Output is read by a long poll (``logs(wait=)``) that the job's output ends the
        moment it is stored, as does a change of the job's state. A control plane older
        than that poll refuses its ``wait``; then output is looked for at intervals
        (0.05 s, growing to 0.5 s while the job is silent), as before. ``tail``: the job's
        last ``tail`` lines first (:meth:`log_tail`), then what follows them, as ``tail -f``."""
        delay = 0.05
        waits = stream  # False: no long poll for output (none read, or a control plane without it)
        job = self.job(job_id, arguments=False)  # (each look: the state, the tasks; not the arguments)
        read_at = time.monotonic()
        first = self.log_tail(job_id, node=node, tail=tail)[0] if tail is not None and stream else []
        after = first[-1].id if first else 0
        while True:
            if on_update is not None:
                on_update(job)
            yield from (c for c in first if c.data)
            first = []
            ended = job.state.terminal
            try:
                chunks = self.api.logs(job_id, after=after, node=node,
                                       wait=FOLLOW_WAIT if waits and not ended else None) if stream else []
            except InvalidInput as exc:
                if not waits or "wait" not in str(exc):
                    raise
                waits = False  # (an older control plane: "no such field")
                continue
            for c in chunks:
                after = max(after, c.id)
                yield c
            if ended and not chunks:
                return
            if waits:
                # the poll came back empty: the job's state changed (or the time ran out);
                # or with output, which a job not yet seen running also changed; and while
                # output flows, the job is read again every FOLLOW_WAIT (it may have ended)
                if not chunks or job.state is not JobState.RUNNING or time.monotonic() - read_at >= FOLLOW_WAIT:
                    job = self.job(job_id, arguments=False)
                    read_at = time.monotonic()
            elif chunks:
                delay = 0.05
                job = self.job(job_id, arguments=False)
            else:
                # a long poll instead of a sleep: the job's end is seen at once, not a
                # growing delay after it; new output is read after at most `delay`
                job = self._lean(self.api.wait_job, job_id, timeout=delay if stream else FOLLOW_WAIT)
                delay = min(delay * 1.5, 0.5)

    def rerun(self, job_ids: Sequence[str], *, downstream: bool = False) -> JobsRerun:
        """Run ended jobs again as new jobs (:meth:`~gpulayer.api.ClientAPI.rerun_jobs`), on this
        process's worker where it runs local jobs (as :meth:`submit` does)."""
        self.ensure_local_worker()
        try:
            answer = self.api.rerun_jobs(list(job_ids), downstream=downstream)
        except MethodNotAllowed:  # (a server from before it: no such route)
            raise InvalidInput(f"the control plane at {self.location} does not run jobs again: its server is older "
                               "than job reruns; upgrade it") from None
        if self.control is not None or leaving.in_task():
            leaving.submitted(self, list(answer.rerun.values()))
        return answer

    def artifacts(self, job_id: str, to: str | os.PathLike[str] | None = None, *, where: str = "to") -> Downloaded:
        """Extract the job's artifacts (:func:`gpulayer.artifacts.download`) into ``to``;
        ``where``: how the caller names ``to`` in errors."""
        job = self.api.get_job(job_id, brief=True)
        try:
            return artifacts.download(self.api, job_id, to, nodes=getattr(job.spec, "nodes", 1), where=where)
        except NotFound as exc:
            if (older := artifacts.older_server(exc, self.location)) is not None:  # (a server from before them)
                raise InvalidInput(older) from None
            if not job.state.terminal:
                raise NotFound(f"{job_id} is {job.state.value}: its tasks' artifacts are stored as they end "
                               f"(gpulayer jobs wait {job_id})") from None
            raise

    # ------------------------------------------------------------------ the in-process worker

    def live_local_workers(self) -> list[str]:
        """The ids of the local workers running on this home (embedded; none otherwise)."""
        if self.control is None:
            return []
        return self.control.live_local_workers()

    def ensure_local_worker(self) -> None:
        """Start a worker in this process if local jobs need one (embedded only)."""
        if self.control is None:
            return
        with self._agent_lock:
            if self._agent is not None or self.live_local_workers():
                return
            from gpulayer.capability_cache import cached_capabilities
            from gpulayer.control import IN_PROCESS_NAME
            from gpulayer.worker.agent import Agent

            # the cached detection: a foreground submit or a script does not detect again
            self._agent = Agent(self.control, name=IN_PROCESS_NAME, capabilities=cached_capabilities(),
                                cpu_slots=config.settings().cpu_slots)
            self._agent.start()
            atexit.register(self._at_exit)
            leaving.end_on_sigterm(self)

    def _at_exit(self) -> None:
        leaving.at_exit(self)

    def _stop_agent(self) -> None:
        agent, self._agent = self._agent, None
        if agent is not None:
            agent.stop(grace=0 if self._terminating else config.settings().exit_grace)
            if self.control is not None and agent.worker_id is not None:
                try:  # its row is no use once it stopped: `worker list` shows live workers
                    self.control.prune_workers(worker_ids=[agent.worker_id])
                except GpulayerError:
                    pass

    def close(self) -> None:
        """Stop the in-process worker (if any) and release connections."""
        self._stop_agent()
        if self.control is not None:
            self.control.store.dispose()
        else:
            close = getattr(self.api, "close", None)
            if close is not None:
                close()


#: the most JSON of specs one ``submit_many`` request carries (a server takes at least 16 MiB,
#: and a spec alone always fits: see gpulayer.server.app._body_limit)
BATCH_BYTES = 8 * 1024 * 1024


#: how a refusal names a spec of a batch: ``specs[3]: ...`` (the control plane's checks) or
#: ``specs.3.command: ...`` (the shape of a request's body)
_SPEC_INDEX = re.compile(r"\bspecs(\[|\.)(\d+)")


def _arguments(arguments: bool) -> dict[str, bool]:
    """A submit's ``arguments`` keyword: none for the whole records (what a control plane from
    before it answers anyway: its submit has no query, and leaves one out)."""
    return {} if arguments else {"arguments": False}


def _renumbered(message: str, offset: int) -> str:
    """A refusal of one call of a batch, naming its spec by its place in the whole list."""
    return _SPEC_INDEX.sub(lambda m: f"specs{m[1]}{int(m[2]) + offset}", message, count=1)


def _batches(specs: list[JobSpec], *, measure: bool) -> Iterator[list[JobSpec]]:
    """``specs`` in runs of at most :data:`~gpulayer.api.MAX_BATCH` specs and, ``measure``d
    (a request's body is bounded: see gpulayer.server.app._body_limit), of at most
    :data:`BATCH_BYTES` of JSON but for a spec alone."""
    chunk: list[JobSpec] = []
    size = 0
    for spec in specs:
        n = len(spec.model_dump_json()) if measure else 0
        if chunk and (len(chunk) >= MAX_BATCH or size + n > BATCH_BYTES):
            yield chunk
            chunk, size = [], 0
        chunk.append(spec)
        size += n
    if chunk:
        yield chunk


def _refuse_while_importing(spec: JobSpec) -> None:
    importing = os.environ.get(IMPORTING_ENV)
    if not importing:
        return
    module = importing.partition(":")[0]
    raise SubmitWhileImporting(
        f"a job was submitted while a worker imported module {module!r} to run {importing}: the "
        f"module's top-level code runs again on the worker, so it would submit again, without end. "
        f"Put the code that submits under a guard at the end of the script:\n\n"
        f'    if __name__ == "__main__":\n        ...  # .remote(...), gl.submit(...)\n')


def prefixes_nodes(spec: JobSpec, node: int | None = None, *, spelled: str | None = None) -> bool:
    """Whether the job's output is shown with ``[node R]`` line prefixes: a job of several
    nodes, all of them shown. A ``node`` the job does not have is refused, named as
    ``spelled`` (``--node 5``; default ``node=5``)."""
    nodes = spec.nodes if spec.kind == "distributed" else 1
    why = logtext.node_refused(spec.kind, nodes, node)
    if why is not None:
        raise InvalidArgument(f"{spelled or f'node={node!r}'}: {why}")
    return logtext.prefixes_nodes(spec.kind, nodes, node)


def chunk_text(chunk: LogChunk, *, prefix: bool) -> str:
    """A chunk's text, each line prefixed ``[node R] `` when ``prefix``."""
    return logtext.shown_text(chunk.data, chunk.node_rank, prefix=prefix)


# the process's clients (connect, reset) and how each is made: gpulayer.connections
from gpulayer.connections import connect as connect  # noqa: E402
from gpulayer.connections import embedded_client as embedded_client  # noqa: E402
from gpulayer.connections import http_client as http_client  # noqa: E402
from gpulayer.connections import reset as reset  # noqa: E402
