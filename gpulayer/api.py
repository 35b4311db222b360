"""The control plane's operations, declared once.

Three audiences use a control plane, each through a typed Protocol:

* :class:`ClientAPI`: users (the SDK, the CLI, the PyTorch API): submit and follow jobs,
  upload bundles, look at workers;
* :class:`WorkerAPI`: worker agents: join, heartbeat, take tasks, report them;
* :class:`AdminAPI`: tokens.

:class:`~gpulayer.control.ControlPlane` implements all three in this process.
:class:`~gpulayer.http_client.HttpAPI` implements them over HTTP, generically, from
:data:`ROUTES`, the table the server (:mod:`gpulayer.server`) also serves and documents
(OpenAPI). The replies below, and the request shapes and limits of :mod:`gpulayer.wire`
(re-exported here), are what both sides exchange.

Adding an operation is a method on the Protocol and on ``ControlPlane``, and one
:class:`Route` (with its body or query model in :mod:`gpulayer.wire`); nothing else
repeats its path, body or errors. Errors cross HTTP as codes
(:mod:`gpulayer.errors`) and come back as the same classes.

This module imports pydantic and GPUlayer's records only (no database, no HTTP stack), so a
remote worker or a client pays for neither.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from gpulayer.hookrecords import Capabilities, MachineOffer
from gpulayer.records import (
    Explanation,
    JobError,
    JobRecord,
    JobState,
    MachineRecord,
    ProviderInfo,
    TaskState,
    TaskUsage,
    WorkerRecord,
)
from gpulayer.specs import JobSpec, Requirements
from gpulayer.wire import (  # (re-exported: what goes over the wire is part of the API)
    DIGEST_PATTERN,
    LOG_PAGE_TEXT,
    MAX_BATCH,
    MAX_LOG_CHUNKS,
    MAX_LONG_POLL,
    SCOPES,
    BundleStored,
    CancelManyBody,
    DeleteJobsBody,
    ExplainBody,
    FinishBody,
    HeartbeatBody,
    HeartbeatReply,
    JobEvent,
    JobQuery,
    JobsDeleted,
    JobsPruned,
    JobsRerun,
    JoinBody,
    JoinReply,
    LendBody,
    ListJobsQuery,
    LogChunk,
    LogsBody,
    LogsQuery,
    LogStream,
    NewToken,
    OffersBody,
    PauseBody,
    PollQuery,
    PruneJobsBody,
    PruneQuery,
    RegisterBody,
    RerunJobsBody,
    ResultJSON,
    Route,
    SlotLent,
    StartQuery,
    SubmitBody,
    SubmitManyBody,
    SubmitQuery,
    TaskArtifacts,
    TaskAssignment,
    TokenBody,
    TokenInfo,
    WaitJobsBody,
    WaitJobsQuery,
    WaitQuery,
    Wire,
    WorkerUsage,
    WorkPoll,
    deleted_again,
    log_page_cut,
    pruned_again,
)

__all__ = [
    "DIGEST_PATTERN",
    "LOG_PAGE_TEXT",
    "MAX_BATCH",
    "MAX_LOG_CHUNKS",
    "MAX_LONG_POLL",
    "ROUTES",
    "SCOPES",
    "AdminAPI",
    "BundleStored",
    "CancelManyBody",
    "ClientAPI",
    "ControlAPI",
    "DeleteJobsBody",
    "ExplainBody",
    "FinishBody",
    "HeartbeatBody",
    "HeartbeatReply",
    "JobEvent",
    "JobQuery",
    "JobsDeleted",
    "JobsPruned",
    "JobsRerun",
    "JoinBody",
    "JoinReply",
    "LendBody",
    "ListJobsQuery",
    "LogChunk",
    "LogStream",
    "LogsBody",
    "LogsQuery",
    "NewToken",
    "OffersBody",
    "PauseBody",
    "PollQuery",
    "PruneJobsBody",
    "PruneQuery",
    "RegisterBody",
    "RerunJobsBody",
    "ResultJSON",
    "Route",
    "SlotLent",
    "StartQuery",
    "SubmitBody",
    "SubmitManyBody",
    "SubmitQuery",
    "TaskArtifacts",
    "TaskAssignment",
    "TokenBody",
    "TokenInfo",
    "WaitJobsBody",
    "WaitJobsQuery",
    "WaitQuery",
    "Wire",
    "WorkPoll",
    "WorkerAPI",
    "WorkerUsage",
    "log_page_cut",
    "route_for",
]

# --------------------------------------------------------------------------- the Protocols


class ClientAPI(Protocol):
    """What users do with a control plane."""

    def submit(self, spec: JobSpec, *, idempotency_key: str | None = None,
               arguments: bool | None = None) -> JobRecord:
        """Store a resolved spec (profile applied, bundle uploaded) and place it; the job as
        stored (``arguments=False``: without a function's arguments, which the caller has:
        what the SDK asks for)."""
        ...

    def submit_many(self, specs: list[JobSpec], *, idempotency_key: str | None = None,
                    arguments: bool | None = None) -> list[JobRecord]:
        """:meth:`submit` for up to :data:`MAX_BATCH` resolved specs at once: one transaction
        and one placement pass; all are stored, in order, or none is."""
        ...

    def get_job(self, job_id: str, *, arguments: bool | None = None, brief: bool | None = None) -> JobRecord:
        """The job with its tasks. ``arguments=False``: its spec without a function's
        arguments (``args`` and ``kwargs`` empty), for a caller that reads the rest (its
        state, its result): arguments may be a megabyte, parsed and sent at every read.
        ``brief=True``: as :meth:`list_jobs` gives it, without its tasks, result and
        arguments (what ``handle.status()`` and ``handle.done()`` ask for)."""
        ...

    def list_jobs(self, *, state: JobState | None = None, limit: int = 100, before: str | None = None) -> list[JobRecord]:
        """The newest jobs (at most ``limit``; submitted ``before`` that job: the next page), each
        without its tasks, its result and a function's arguments (``tasks`` empty, ``result``
        None, the spec's ``args`` and ``kwargs`` empty): :meth:`get_job` has them."""
        ...

    def cancel(self, job_id: str) -> JobRecord: ...

    def cancel_many(self, job_ids: list[str], *, reason: str | None = None) -> list[JobRecord]:
        """:meth:`cancel` for many jobs (at most :data:`MAX_BATCH`; ``reason``: their error's) in one
        transaction and one placement pass: the records of those that exist, in the order given, as
        :meth:`list_jobs` gives them (no tasks, results or arguments); an id that names no
        job (or, on a server, not one of the caller's) is left out of the answer. What
        ``gpulayer jobs cancel`` with many ids, ``gl.cancel`` and a script's Ctrl-C at exit ask:
        one :meth:`cancel` each ran a placement pass over the whole queue each."""
        ...

    def delete_jobs(self, job_ids: list[str]) -> JobsDeleted:
        """Delete ended jobs (at most :data:`MAX_BATCH`) with their tasks, output and events,
        and the bundles no stored job names any more; a job that has not ended is left as
        it is (``not_ended``); an id that names no job (or, on a server, not one of the
        caller's) is left out of the answer."""
        ...

    def rerun_jobs(self, job_ids: list[str], *, downstream: bool = False) -> JobsRerun:
        """Submit ended jobs again as new jobs (at most :data:`MAX_BATCH`), each with its spec
        and arguments; ``downstream``: and the ended jobs that run after them, naming the new
        ones. A job that has not ended is left (``not_ended``); an id that names no job (or,
        on a server, not one of the caller's) is left out of the answer."""
        ...

    def prune_jobs(self, *, older_than: float, states: list[str] | None = None,
                   dry_run: bool = False) -> JobsPruned:
        """Delete the jobs (the caller's, for a client token) that ended at least
        ``older_than`` seconds ago, in ``states`` (default: every ended state), as
        :meth:`delete_jobs` does; ``dry_run``: count them only. Sent again after a try whose
        answer was lost, the counts are a lower bound (``at_least``)."""
        ...

    def logs(self, job_id: str, *, after: int = 0, node: int | None = None,
             limit: int = MAX_LOG_CHUNKS, wait: float | None = None, tail: int | None = None) -> list[LogChunk]:
        """The job's log chunks with an id above ``after``, oldest first: one page, at most
        ``limit`` chunks and ending with the one that brings its text to
        :data:`LOG_PAGE_TEXT` characters (:func:`log_page_cut` says whether more may follow;
        :meth:`gpulayer.client.Client.log_chunks` reads every page). With ``wait`` seconds
        (at most :data:`MAX_LONG_POLL`), a long poll: a page that would be empty comes once
        the job has output after ``after``, or empty when its state changed (or it had
        ended) or the time ran out (:meth:`gpulayer.client.Client.follow`). With ``tail``, the
        first page of the last ``tail`` lines (:mod:`gpulayer.logtail`), read from the newest
        chunk back: its first chunk's text starts where they do (empty for ``tail=0``: the id
        a follower goes on after); the chunks after its last id are the rest."""
        ...

    def wait_job(self, job_id: str, *, timeout: float = MAX_LONG_POLL, arguments: bool | None = None) -> JobRecord:
        """The job once it is terminal, or as it is after ``timeout`` seconds (one bounded
        wait); ``arguments=False`` as for :meth:`get_job` (what ``result()`` asks for)."""
        ...

    def wait_jobs(self, job_ids: list[str], *, count: int = 1, timeout: float = MAX_LONG_POLL,
                  brief: bool | None = None) -> list[JobRecord]:
        """Those of these jobs (at most :data:`MAX_BATCH`) that have ended, once at least
        ``count`` of them have, or after ``timeout`` seconds (one bounded wait): what
        ``gl.wait`` and ``gl.as_completed`` ask of many jobs at once. ``brief``: each record
        without its tasks, result and a function's arguments, as :meth:`list_jobs` gives them (what
        ``gl.as_completed`` asks for: it only hands out which ended)."""
        ...

    def events(self, job_id: str) -> list[JobEvent]: ...

    def explain(self, spec: JobSpec) -> Explanation:
        """What placement would say about a resolved spec now, nothing submitted: every
        worker's status and reasons, the offers that fit, the nearest misses, the relaxations."""
        ...

    def explain_job(self, job_id: str) -> Explanation:
        """:meth:`explain` for a stored job, with its state, last decision and queue position."""
        ...

    def queue_position(self, job_id: str) -> int | None:
        """Queued jobs a pass places before this one, plus one (None: not queued). Cheap,
        unlike :meth:`explain_job`: what a waiting ``gpulayer submit`` polls."""
        ...

    def lend_slot(self, job_id: str, *, task_id: str, lent: bool) -> SlotLent:
        """A task of the job lends its CPU slot while it waits (:mod:`gpulayer.control.lending`)."""
        ...

    def list_artifacts(self, job_id: str) -> list[TaskArtifacts]:
        """The artifacts stored for the job's tasks (each task's, of every attempt), oldest first."""
        ...

    def get_artifacts(self, job_id: str, task_id: str) -> bytes:
        """One task's artifacts: the zip of what it left in ``GPULAYER_ARTIFACTS_DIR``."""
        ...

    def has_bundle(self, digest: str) -> bool: ...

    def put_bundle(self, digest: str, data: bytes) -> BundleStored: ...

    def get_bundle(self, digest: str) -> bytes: ...

    def list_workers(self) -> list[WorkerRecord]: ...

    def worker_usage(self) -> dict[str, WorkerUsage]: ...


class WorkerAPI(Protocol):
    """What a worker agent does with a control plane."""

    def join_worker(self, capabilities: Capabilities, *, join_token: str, name: str | None = None,
                    cpu_slots: int = 1, pid: int | None = None, machine_id: str | None = None) -> JoinReply:
        """Spend a join (or bootstrap) token: register a new worker, get its credential. A
        bootstrap token binds the worker to the machine it was made for (``machine_id``)."""
        ...

    def register_worker(self, capabilities: Capabilities, *, worker_id: str | None = None,
                        name: str | None = None, cpu_slots: int = 1,
                        pid: int | None = None) -> WorkerRecord:
        """Register (again): a new worker without ``worker_id`` (in-process only), or an
        existing one that the control plane forgot or that restarted."""
        ...

    def heartbeat(self, worker_id: str, *, running: Sequence[str] = ()) -> HeartbeatReply: ...

    def poll_tasks(self, worker_id: str, *, wait: float = 0.0) -> list[TaskAssignment]:
        """Tasks assigned to the worker and not started; waits up to ``wait`` seconds for one."""
        ...

    def poll_work(self, worker_id: str, *, running: Sequence[str] = (), wait: float = 0.0) -> WorkPoll:
        """Tasks to start, and which of ``running`` to end (a cancel); waits up to ``wait``
        seconds for either, so a worker hears of a cancel at once, not at its next heartbeat."""
        ...

    def start_task(self, task_id: str, *, worker_id: str, how: str = "") -> None:
        """The worker started the task. Idempotent for the worker that owns it. ``how`` says
        how its process was started (``started by fork server``, ``spawned: ...``); it is the
        message of the task's ``task_started`` event."""
        ...

    def append_logs(self, task_id: str, *, worker_id: str,
                    chunks: Sequence[tuple[LogStream, str]], offset: int | None = None) -> None:
        """Store an upload of the task's output. ``offset``: where in the task's output the
        upload begins (characters, every stream together, in the order written): an upload
        sent again after its answer was lost is acknowledged and stored once (what it repeats
        is left out). Without it (a worker from before), every upload is stored as it comes."""
        ...

    def finish_task(self, task_id: str, *, worker_id: str, state: TaskState,
                    exit_code: int | None = None, result: Any = None,
                    error: JobError | None = None, usage: TaskUsage | None = None) -> list[TaskAssignment]:
        """The task's final report, with what its processes used (``usage``, where its worker
        measured it); a report for a task that already ended is a Conflict.
        Answers the tasks assigned to the worker and not started (what the slot the task
        freed was given): the worker may start them without waiting for its poll. A
        ``result`` may be a :class:`ResultJSON`: its JSON text, stored as it is by an embedded
        control plane, and sent as it is in the request's body over HTTP (where the server
        parses the body, as it does any)."""
        ...

    def put_artifacts(self, task_id: str, digest: str, data: bytes, *, worker_id: str) -> TaskArtifacts:
        """Store the task's artifacts (a zip addressed by its SHA-256, ``digest``) before its
        final report; sent again, it replaces what was stored."""
        ...

    def get_bundle(self, digest: str) -> bytes: ...

    def drain_worker(self, worker_id: str) -> None:
        """The worker takes no new work; tasks handed to it and not started go back."""
        ...

    def deregister_worker(self, worker_id: str) -> None:
        """The worker leaves: offline, its unfinished tasks lost, its credential revoked."""
        ...


class AdminAPI(Protocol):
    """Tokens, and the worker registry's housekeeping."""

    def create_token(self, *, scope: str, ttl: float | None = None, uses: int | None = None,
                     description: str = "") -> NewToken: ...

    def list_tokens(self) -> list[TokenInfo]: ...

    def revoke_token(self, token_id: str) -> TokenInfo: ...

    def prune_workers(self, *, older_than: float = 0.0) -> list[str]:
        """Forget offline workers silent for at least ``older_than`` seconds (any origin);
        their credentials are revoked. Returns their ids."""
        ...

    def pause_worker(self, worker_id: str, *, paused: bool = True) -> WorkerRecord:
        """Pause a worker (no new work; the jobs only it could run wait; what it was handed and
        had not started goes back to the queue), or resume it (``paused=False``)."""
        ...

    def list_providers(self) -> list[ProviderInfo]:
        """The providers of providers.toml (and installed adapters no section configures)."""
        ...

    def offers(self, requirements: Requirements) -> list[MachineOffer]:
        """Every provider offer that fits, cheapest first (from the offers cache)."""
        ...

    def list_machines(self) -> list[MachineRecord]:
        """Every machine providers brought up for this control plane, oldest first."""
        ...

    def terminate_machine(self, machine_id: str) -> MachineRecord:
        """Drain the machine's worker and terminate the machine (idempotent)."""
        ...


class ControlAPI(ClientAPI, WorkerAPI, AdminAPI, Protocol):
    """Everything a control plane offers (what :class:`~gpulayer.control.ControlPlane` and
    :class:`~gpulayer.http_client.HttpAPI` both are)."""


# --------------------------------------------------------------------------- the route table

#: who may call what
READERS = ("admin", "client")
WORKERS = ("worker",)
BUNDLE_READERS = ("admin", "client", "worker")


_DIGEST = {"digest": DIGEST_PATTERN}
#: who reads a bundle: a client token's id, or a worker credential's worker
_BUNDLE_READER = {"owner": "owner", "worker_id": "worker"}

ROUTES: tuple[Route, ...] = (
    # ---------------------------------------------------------------- jobs
    Route("submit", "POST", "/v1/jobs", READERS,
          "Submit a job; idempotent with idempotency_key (per token)",
          response=JobRecord, status=201, query=SubmitQuery, body=SubmitBody, context={"owner": "owner"}),
    Route("submit_many", "POST", "/v1/jobs/batch", READERS,
          f"Submit up to {MAX_BATCH} jobs at once, all or none; idempotent with idempotency_key (per token)",
          response=list[JobRecord], status=201, query=SubmitQuery, body=SubmitManyBody, context={"owner": "owner"},
          errors=(409,)),
    Route("list_jobs", "GET", "/v1/jobs", READERS,
          "Jobs, newest first, without their tasks, results and arguments (a client token sees its own)",
          response=list[JobRecord], query=ListJobsQuery, context={"owner": "owner"}, errors=(404,)),
    Route("get_job", "GET", "/v1/jobs/{job_id}", READERS, "One job with its tasks",
          response=JobRecord, query=JobQuery, own_job=True, errors=(404,)),
    Route("cancel", "POST", "/v1/jobs/{job_id}/cancel", READERS, "Cancel a job",
          response=JobRecord, own_job=True, errors=(404,)),
    Route("cancel_many", "POST", "/v1/jobs/cancel", READERS,
          f"Cancel up to {MAX_BATCH} jobs at once: the records (without tasks, results and arguments) of "
          "those that exist and are yours, in the order given; other ids are left out",
          response=list[JobRecord], body=CancelManyBody, context={"owner": "owner"}),
    Route("delete_jobs", "POST", "/v1/jobs/delete", READERS,
          f"Delete up to {MAX_BATCH} ended jobs with their tasks, output and events (those that exist and are "
          "yours); jobs that have not ended are named and left; other ids are left out",
          response=JobsDeleted, body=DeleteJobsBody, context={"owner": "owner"}, again=deleted_again),
    Route("rerun_jobs", "POST", "/v1/jobs/rerun", READERS,
          f"Submit up to {MAX_BATCH} ended jobs (yours) again as new jobs; with downstream, the jobs after them too",
          response=JobsRerun, body=RerunJobsBody, context={"owner": "owner"}, safe=False),
    Route("prune_jobs", "POST", "/v1/jobs/prune", READERS,
          "Delete the jobs (yours, for a client token) that ended at least older_than seconds ago",
          response=JobsPruned, body=PruneJobsBody, context={"owner": "owner"}, again=pruned_again),
    Route("lend_slot", "POST", "/v1/jobs/{job_id}/lend", READERS,
          "A running task of the job lends its CPU slot to the queue while it waits, or takes it back",
          response=SlotLent, body=LendBody, own_job=True, errors=(404,)),
    Route("logs", "GET", "/v1/jobs/{job_id}/logs", READERS,
          "Log chunks after an id, oldest first: a page of at most limit chunks, ending with the one "
          f"that brings its text to {LOG_PAGE_TEXT // 2**20} Mi characters",
          response=list[LogChunk], query=LogsQuery, own_job=True, long_poll="wait", errors=(404,)),
    Route("wait_job", "GET", "/v1/jobs/{job_id}/wait", READERS,
          f"The job once it is terminal, or after at most {MAX_LONG_POLL:g} s (long poll)",
          response=JobRecord, query=WaitQuery, own_job=True, long_poll="timeout", errors=(404,)),
    Route("wait_jobs", "POST", "/v1/jobs/wait", READERS,
          f"Those of these jobs that have ended, once at least count of them have, or after at most "
          f"{MAX_LONG_POLL:g} s (long poll)",
          response=list[JobRecord], query=WaitJobsQuery, body=WaitJobsBody, context={"owner": "owner"},
          long_poll="timeout", errors=(404,)),
    Route("events", "GET", "/v1/jobs/{job_id}/events", READERS, "The job's event history",
          response=list[JobEvent], own_job=True, errors=(404,)),
    Route("explain_job", "GET", "/v1/jobs/{job_id}/explain", READERS,
          "Could the job run now, where, and if not, what comes closest",
          response=Explanation, own_job=True, context={"owner": "owner"}, errors=(404,)),
    Route("queue_position", "GET", "/v1/jobs/{job_id}/position", READERS,
          "The job's place in the queue (1 is next; null when it is not queued)",
          response=int | None, own_job=True, errors=(404,)),
    Route("explain", "POST", "/v1/explain", READERS,
          "Could a job with this (resolved) spec run now, and if not, what comes closest; nothing is stored",
          response=Explanation, body=ExplainBody, context={"owner": "owner"}),
    Route("list_artifacts", "GET", "/v1/jobs/{job_id}/artifacts", READERS,
          "The artifacts stored for the job's tasks (what each left in GPULAYER_ARTIFACTS_DIR), oldest first",
          response=list[TaskArtifacts], own_job=True, errors=(404,)),
    Route("get_artifacts", "GET", "/v1/jobs/{job_id}/artifacts/{task_id}", READERS,
          "Download one task's artifacts (a zip)", response=bytes, raw_response="application/zip",
          own_job=True, errors=(404,)),
    # ---------------------------------------------------------------- bundles
    Route("has_bundle", "HEAD", "/v1/bundles/{digest}", BUNDLE_READERS,
          "Whether a bundle you may read is stored (200 or 404)",
          response=bool, exists=True, path_patterns=_DIGEST, context=_BUNDLE_READER, errors=(404,)),
    Route("get_bundle", "GET", "/v1/bundles/{digest}", BUNDLE_READERS,
          "Download a bundle (its uploaders, workers running a job that uses it, admins)",
          response=bytes, raw_response="application/zip", path_patterns=_DIGEST, context=_BUNDLE_READER,
          errors=(404,)),
    Route("put_bundle", "PUT", "/v1/bundles/{digest}", ("admin", "client"),
          "Upload a bundle; the body must hash to the digest, fit GPULAYER_MAX_BUNDLE_MB and be a safe archive",
          response=BundleStored, status=201, also_ok=(200,), raw_body="application/zip",
          path_patterns=_DIGEST, context={"owner": "owner"}, errors=(413,)),
    # ---------------------------------------------------------------- workers
    Route("list_workers", "GET", "/v1/workers", READERS, "Registered workers", response=list[WorkerRecord]),
    Route("worker_usage", "GET", "/v1/workers/usage", READERS, "Busy devices and CPU slots per online worker",
          response=dict[str, WorkerUsage]),
    Route("join_worker", "POST", "/v1/workers/join", ("join", "bootstrap"),
          "Spend a join or bootstrap token: register a worker and get its credential",
          response=JoinReply, status=201, body=JoinBody, context={"join_token": "bearer"}, safe=False),
    Route("register_worker", "POST", "/v1/workers/{worker_id}/register", WORKERS,
          "Register again (after a restart, or when the control plane forgot the worker)",
          response=WorkerRecord, body=RegisterBody, own_worker=True, context={"origin": "remote_origin"}),
    Route("heartbeat", "POST", "/v1/workers/{worker_id}/heartbeat", WORKERS,
          "Heartbeat with the tasks the worker runs; answers the tasks to end",
          response=HeartbeatReply, body=HeartbeatBody, own_worker=True),
    Route("poll_tasks", "GET", "/v1/workers/{worker_id}/tasks", WORKERS,
          f"Assigned tasks not started yet; waits at most {MAX_LONG_POLL:g} s for one (long poll)",
          response=list[TaskAssignment], query=PollQuery, own_worker=True, long_poll="wait"),
    Route("poll_work", "POST", "/v1/workers/{worker_id}/work", WORKERS,
          f"Tasks to start and running tasks to end; waits at most {MAX_LONG_POLL:g} s for either (long poll)",
          response=WorkPoll, query=PollQuery, body=HeartbeatBody, own_worker=True, long_poll="wait"),
    Route("drain_worker", "POST", "/v1/workers/{worker_id}/drain", ("worker", "admin"), "Take no new work",
          status=204, own_worker=True, errors=(404,)),
    Route("deregister_worker", "DELETE", "/v1/workers/{worker_id}", ("worker", "admin"),
          "Leave: offline now, unfinished tasks lost, the credential revoked", status=204, own_worker=True,
          errors=(404,)),
    # ---------------------------------------------------------------- tasks
    Route("start_task", "POST", "/v1/tasks/{task_id}/start", WORKERS, "The worker started the task",
          status=204, query=StartQuery, context={"worker_id": "worker"}, errors=(404, 409)),
    Route("append_logs", "POST", "/v1/tasks/{task_id}/logs", WORKERS, "Append log chunks",
          status=204, body=LogsBody, context={"worker_id": "worker"}, safe=False, errors=(404, 409)),
    Route("put_artifacts", "PUT", "/v1/tasks/{task_id}/artifacts/{digest}", WORKERS,
          "Store a task's artifacts before its final report; the body must hash to the digest, fit "
          "GPULAYER_MAX_ARTIFACTS_MB and be a safe archive", response=TaskArtifacts, status=201,
          raw_body="application/zip", path_patterns=_DIGEST, context={"worker_id": "worker"},
          errors=(404, 409, 413)),
    Route("finish_task", "POST", "/v1/tasks/{task_id}/finish", WORKERS,
          "The task's final report (409 when it already ended); answers the worker's tasks not started",
          response=list[TaskAssignment], body=FinishBody, context={"worker_id": "worker"}, errors=(404, 409)),
    # ---------------------------------------------------------------- tokens
    Route("create_token", "POST", "/v1/tokens", ("admin",), "Create a token; the secret is in this reply only",
          response=NewToken, status=201, body=TokenBody, safe=False),
    Route("list_tokens", "GET", "/v1/tokens", ("admin",), "Tokens (never their secrets)",
          response=list[TokenInfo]),
    Route("prune_workers", "POST", "/v1/workers/prune", ("admin",),
          "Forget offline workers (their credentials are revoked); answers their ids",
          response=list[str], query=PruneQuery, safe=False),
    Route("pause_worker", "POST", "/v1/workers/{worker_id}/pause", ("admin",),
          "Pause a worker (no new work; jobs only it could run wait) or, with paused false, resume it",
          response=WorkerRecord, body=PauseBody, errors=(404,)),
    Route("revoke_token", "DELETE", "/v1/tokens/{token_id}", ("admin",), "Revoke a token",
          response=TokenInfo, errors=(404,)),
    # ---------------------------------------------------------------- providers and machines (the cloud target)
    Route("list_providers", "GET", "/v1/providers", ("admin",),
          "Providers: configured?, credentials ok?, disabled reason, machines running, caps",
          response=list[ProviderInfo]),
    Route("offers", "POST", "/v1/offers", ("admin",), "Every provider offer that fits the requirements, cheapest first",
          response=list[MachineOffer], body=OffersBody),
    Route("list_machines", "GET", "/v1/machines", ("admin",), "Machines brought up by providers, oldest first",
          response=list[MachineRecord]),
    Route("terminate_machine", "POST", "/v1/machines/{machine_id}/terminate", ("admin",),
          "Drain a machine's worker and terminate the machine (idempotent)", response=MachineRecord,
          errors=(404,)),
)

_BY_OP = {r.op: r for r in ROUTES}


def route_for(op: str) -> Route:
    return _BY_OP[op]
