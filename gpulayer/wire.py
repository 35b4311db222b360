"""What crosses the control plane's API besides its replies: the base of every wire record,
the limits the API enforces, and the shapes of its requests (JSON bodies and query strings),
one model per operation that takes one (:data:`gpulayer.api.ROUTES` names them).

:mod:`gpulayer.api` re-exports all of it; this module imports pydantic and GPUlayer's
records only, as that one does.
"""

from __future__ import annotations

import json
import re
import secrets
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from gpulayer.hookrecords import Capabilities, Rendezvous
from gpulayer.logtail import MAX_TAIL
from gpulayer.records import JobError, JobState, TaskState, TaskUsage, WorkerRecord
from gpulayer.specs import JobSpec, Requirements

#: the longest a long poll (``wait_job``, ``poll_tasks``) may wait in one request, seconds
MAX_LONG_POLL = 30.0
#: the most jobs one ``submit_many`` stores (one transaction: it holds the database's write
#: lock while it runs); the SDK splits a larger batch
MAX_BATCH = 1000
#: the most log chunks one ``logs`` request returns; a reader of all of a job's output asks
#: again after the last id it got (``Client.log_chunks``)
MAX_LOG_CHUNKS = 10_000
#: and a page ends with the chunk whose text brings it to this many characters (a chunk may be
#: as large as a request), so that neither side holds a long log in memory at once
LOG_PAGE_TEXT = 4 * 1024 * 1024


def log_page_cut(page: Sequence[Any], limit: int = MAX_LOG_CHUNKS) -> bool:
    """Whether a page of log chunks (each with its ``data``) was cut short by the page's
    limits, so that more may follow it (a page that was not is the end, for now)."""
    return len(page) >= limit or sum(len(c.data) for c in page) >= LOG_PAGE_TEXT


#: token scopes (see :mod:`gpulayer.tokens`)
SCOPES = ("admin", "client", "worker", "join", "bootstrap")
DIGEST_PATTERN = r"^[0-9a-f]{64}$"
LogStream = Literal["stdout", "stderr", "system"]


class ResultJSON:
    """A result given as its JSON text, passed on as it is: what a worker reports for a
    function that returned (the text its runner wrote), so that the worker does not parse it
    and an embedded control plane does not write it again, for what only the caller reads (a
    7 MB result: 0.6 s). ``finish_task(result=ResultJSON(text))``; over HTTP its text is put
    into the body's ``result`` as it is; a server keeps the text it was sent (its body read
    with :func:`json_members`) and, with ``results_as_text``, writes the stored text into its
    answers as it is (:class:`Splice`). Not a dataclass: pydantic would write one as an object
    (``{"text": ...}``); it writes this one only through a ``fallback`` (:meth:`Splice.mark`),
    and refuses it otherwise."""

    __slots__ = ("text",)

    def __init__(self, text: str) -> None:
        self.text = text

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ResultJSON) and other.text == self.text

    def __hash__(self) -> int:
        return hash(self.text)

    def __repr__(self) -> str:
        return f"ResultJSON({self.text[:60]!r}{'...' if len(self.text) > 60 else ''})"


_WHITESPACE = re.compile(r"[ \t\n\r]*")


def json_members(raw: bytes | str, keep: Collection[str], *, parse_constant: Callable[[str], Any] | None = None,
                 parse_float: Callable[[str], Any] | None = None) -> tuple[Any, dict[str, str]]:
    """``json.loads(raw)`` (the same value, the same errors), and the source text of the
    members named in ``keep`` of the object it is, as they are written in ``raw``: each one
    a JSON text of its own (it was parsed), whose value the caller need not write again.

    The top-level object is read member by member with the :mod:`json` module's own scanner
    (in C), which gives where each value ends. A document that is not an object, a bytes
    one that is not UTF-8, or one with an error anywhere is read by ``json.loads`` instead,
    for its value or its error, and keeps no text. ``parse_constant`` and ``parse_float`` are
    ``json.loads``'s."""
    decoder = json.JSONDecoder(parse_constant=parse_constant, parse_float=parse_float)
    if isinstance(raw, bytes):
        if json.detect_encoding(raw) != "utf-8":
            return json.loads(raw, parse_constant=parse_constant, parse_float=parse_float), {}
        text = raw.decode("utf-8", "surrogatepass")  # (as json.loads decodes bytes)
    else:
        text = raw
    try:
        found = _object_members(text, decoder, frozenset(keep))
    except ValueError:  # (a malformed member: json.loads words the error, with its position)
        found = None
    return found if found is not None else (json.loads(raw, parse_constant=parse_constant, parse_float=parse_float), {})


def _object_members(text: str, decoder: json.JSONDecoder, keep: frozenset[str]) -> tuple[Any, dict[str, str]] | None:
    """:func:`json_members` for a ``text`` that is an object, or None."""
    def space(at: int) -> int:  # (where the whitespace from ``at`` on ends)
        return _WHITESPACE.match(text, at).end()  # type: ignore[union-attr]  # (it always matches)

    i = space(0)
    if text[i:i + 1] != "{":
        return None
    i = space(i + 1)
    obj: dict[str, Any] = {}
    kept: dict[str, str] = {}
    if text[i:i + 1] == "}":
        i += 1
    else:
        while True:
            if text[i:i + 1] != '"':
                return None
            key, i = json.decoder.scanstring(text, i + 1)  # type: ignore[attr-defined]
            i = space(i)
            if text[i:i + 1] != ":":
                return None
            i = space(i + 1)
            try:
                value, end = decoder.scan_once(text, i)  # type: ignore[attr-defined]
            except StopIteration:
                return None
            obj[key] = value
            if key in keep:
                kept[key] = text[i:end]
            i = space(end)
            if text[i:i + 1] == ",":
                i = space(i + 1)
                continue
            if text[i:i + 1] != "}":
                return None
            i += 1
            break
    if space(i) != len(text):
        return None
    return obj, {k: v for k, v in kept.items() if obj[k] is not None}


#: what stands for a :class:`ResultJSON` while the rest of a value is encoded (with a random
#: part of each :class:`Splice`'s own, which no other text of the value holds)
_TEXT_MARK = "\0gpulayer-json-text:"


class Splice:
    """Encodes a value in which :class:`ResultJSON` objects stand for JSON texts, each text
    written as it is: :meth:`mark` stands a string in for each (pydantic's ``fallback``, or
    by hand), and :meth:`splice` puts the texts in place of those strings in the encoded
    bytes, in one pass."""

    def __init__(self) -> None:
        self._tag = ""
        self._texts: list[str] = []

    def __bool__(self) -> bool:
        return bool(self._texts)

    def mark(self, value: Any) -> str:
        if not isinstance(value, ResultJSON):
            raise TypeError(f"{type(value).__name__} is not JSON")
        if not self._tag:
            self._tag = f"{_TEXT_MARK}{secrets.token_hex(8)}:"
        self._texts.append(value.text)
        return f"{self._tag}{len(self._texts) - 1}"

    def splice(self, encoded: bytes) -> bytes:
        """``encoded`` (JSON, UTF-8, the marks written as ``json.dumps`` writes them) with
        the texts in place of their marks."""
        if not self._texts:
            return encoded
        quoted = re.escape(json.dumps(self._tag)[:-1].encode())  # (its opening quote, \u0000, the tag)
        texts = self._texts
        return re.sub(quoted + rb'(\d+)"', lambda m: texts[int(m.group(1))].encode("utf-8", "surrogatepass"), encoded)


class Wire(BaseModel):
    """A record that crosses the API; unknown fields are an error, not ignored."""

    model_config = ConfigDict(extra="forbid")


# --------------------------------------------------------------------------- requests


class SubmitBody(Wire):
    spec: JobSpec
    idempotency_key: str | None = Field(default=None, max_length=200)


class SubmitManyBody(Wire):
    specs: list[JobSpec] = Field(min_length=1, max_length=MAX_BATCH)
    idempotency_key: str | None = Field(default=None, max_length=200)


class ExplainBody(Wire):
    spec: JobSpec


class ListJobsQuery(Wire):
    state: JobState | None = Field(default=None, description="only jobs in this state")
    limit: int = Field(default=100, ge=1, le=1000, description="at most this many, newest first")
    before: str | None = Field(default=None, min_length=1, max_length=200,
                               description="only jobs submitted before this one (a job id: the last of the "
                                           "page before, for the next page)")


class LogsQuery(Wire):
    after: int = Field(default=0, ge=0, le=2**62, description="only chunks with a larger id")
    node: int | None = Field(default=None, ge=0, le=100_000, description="one node's logs")
    limit: int = Field(default=MAX_LOG_CHUNKS, ge=1, le=MAX_LOG_CHUNKS, description="at most this many chunks")
    wait: float | None = Field(default=None, ge=0, le=MAX_LONG_POLL,
                               description=f"when there is no chunk after `after` yet, seconds to wait for one (at "
                                           f"most {MAX_LONG_POLL:g}); the page also comes, empty, when the job's "
                                           f"state changes (a follower's long poll)")
    tail: int | None = Field(default=None, ge=0, le=MAX_TAIL, description="the page from where the last tail lines "
                             "start (found from the newest chunk back; its first text cut there), at once, no `wait`")


#: what ``arguments=false`` says of a job's record (``get_job``, ``wait_job``)
ARGUMENTS_FIELD = ("false: the spec without a function's arguments (args and kwargs empty), for a caller that "
                   "reads the rest of the record (its state, its result)")


class JobQuery(Wire):
    arguments: bool | None = Field(default=None, description=ARGUMENTS_FIELD)
    brief: bool | None = Field(default=None, description=(
        "true: without its tasks, result and a function's arguments, as a list gives it (for a caller that "
        "asks its state)"))


class SubmitQuery(Wire):
    arguments: bool | None = Field(default=None, description=(
        "false: the answer's records without a function's arguments (args and kwargs empty), which the "
        "caller sent"))


class WaitQuery(Wire):
    timeout: float = Field(default=MAX_LONG_POLL, ge=0, le=MAX_LONG_POLL,
                           description=f"seconds to wait, at most {MAX_LONG_POLL:g}")
    arguments: bool | None = Field(default=None, description=ARGUMENTS_FIELD)


class WaitJobsQuery(Wire):
    count: int = Field(default=1, ge=1, le=MAX_BATCH,
                       description="answer once at least this many of the jobs have ended (all, when fewer)")
    timeout: float = Field(default=MAX_LONG_POLL, ge=0, le=MAX_LONG_POLL,
                           description=f"seconds to wait, at most {MAX_LONG_POLL:g}")
    brief: bool | None = Field(default=None, description=(
        "true: each record without its tasks, result and a function's arguments, as a list gives them "
        "(for a caller that only asks which ended)"))


class WaitJobsBody(Wire):
    job_ids: list[str] = Field(min_length=1, max_length=MAX_BATCH)


class CancelManyBody(Wire):
    job_ids: list[str] = Field(min_length=1, max_length=MAX_BATCH)
    reason: str | None = Field(default=None, min_length=1, max_length=500, description=(
        "why, as the jobs' error says it (cancelled: REASON); what a task's process that was cancelled says of the "
        "jobs it submitted"))


class PauseBody(Wire):
    paused: bool = Field(default=True, strict=True,
                         description="true: the worker takes no new work (the jobs only it could run wait); false: resume it")


class DeleteJobsBody(Wire):
    job_ids: list[str] = Field(min_length=1, max_length=MAX_BATCH)


class JobsDeleted(Wire):
    #: the jobs deleted (with their tasks, output and events), in the order given
    deleted: list[str]
    #: those that exist (and are the caller's) but have not ended: left as they are
    not_ended: dict[str, JobState] = Field(default_factory=dict)


def deleted_again(body: dict[str, Any], answer: JobsDeleted) -> JobsDeleted:
    """A delete sent again after a try whose answer was lost (a connection that broke, a
    server killed after its commit): that try may have deleted any of the ids, which this one
    then finds no job for. Each id not found ended as asked, no such job stored: it reads as
    deleted, as a cancel sent again reads as cancelled. (An id that never named a job reads
    so too, in this case alone: the client cannot tell the two apart.)"""
    gone = [job_id for job_id in dict.fromkeys(body["job_ids"]) if job_id not in answer.not_ended]
    return JobsDeleted(deleted=gone, not_ended=answer.not_ended)


class RerunJobsBody(Wire):
    job_ids: list[str] = Field(min_length=1, max_length=MAX_BATCH)
    downstream: bool = Field(default=False, strict=True, description=(
        "and every ended job that runs after one of them (after, after_ended), down the chain, naming the new jobs"))


class JobsRerun(Wire):
    #: each job run again -> its new job, in the order given (then the jobs after them, with ``downstream``)
    rerun: dict[str, str]
    #: those that exist (and are the caller's) but have not ended: left as they are
    not_ended: dict[str, JobState] = Field(default_factory=dict)


class TaskArtifacts(Wire):
    """The files one task left in its artifacts folder (``GPULAYER_ARTIFACTS_DIR``), stored
    as a zip when the task ended (the zip itself: :meth:`~gpulayer.api.ClientAPI.get_artifacts`)."""

    task_id: str
    job_id: str
    attempt: int
    node_rank: int
    #: SHA-256 of the zip
    digest: str
    #: bytes of the zip, and of its files unpacked
    size: int
    unpacked: int
    files: int
    created_at: float


class BundleStored(Wire):
    digest: str
    size: int
    #: False when a bundle with that address was already stored
    stored: bool


class TokenInfo(Wire):
    """A token as the server sees it; never carries the secret."""

    id: str
    scope: str
    created_at: float
    expires_at: float | None = None
    uses_left: int | None = None
    revoked: bool = False
    worker_id: str | None = None
    description: str = ""


class NewToken(TokenInfo):
    #: the secret, shown in this reply only (the server keeps a hash)
    token: str


#: the states a job may be deleted in
EndedState = Literal["succeeded", "failed", "cancelled", "timed_out", "unschedulable"]


class PruneJobsBody(Wire):
    older_than: float = Field(ge=0, le=10 * 365 * 86400, allow_inf_nan=False,
                              description="delete jobs that ended at least this many seconds ago")
    states: list[EndedState] | None = Field(default=None, min_length=1, max_length=5,
                                            description="only jobs in these ended states (default: every ended state)")
    dry_run: bool = Field(default=False, strict=True, description="count them, delete nothing")


class JobsPruned(Wire):
    #: jobs deleted (or, with ``dry_run``, that would be)
    jobs: int
    #: bundles deleted because no stored job names them any more (none with ``dry_run``,
    #: and none for a client token: only an admin's or an embedded prune removes bundles)
    bundles: int = 0
    dry_run: bool = False
    #: the counts are a lower bound: the prune was sent again after a try whose answer was
    #: lost, and what that try deleted the last one found gone (set by the client: a
    #: server's answer counts what its request deleted, exactly, and says false). Written only
    #: when true: an older client refuses an answer with a field it does not know
    at_least: bool = Field(default=False, exclude_if=lambda at_least: not at_least)


def pruned_again(body: dict[str, Any], answer: JobsPruned) -> JobsPruned:
    """A prune sent again after a try whose answer was lost: that try may have deleted jobs
    (and bundles), which this one finds gone and does not count, and which no one can count
    now. The counts are said as what they are, a lower bound, not made up. (A dry run
    deletes nothing: its count is exact.)"""
    return answer if body.get("dry_run") else answer.model_copy(update={"at_least": True})


class LendBody(Wire):
    task_id: str = Field(min_length=1, max_length=200, description="a task of the job (its GPULAYER_TASK_ID)")
    lent: bool = Field(strict=True, description="true: the task waits, its CPU slot goes to the queue; false: it takes it back")


class SlotLent(Wire):
    #: whether the task's CPU slot is lent to the queue now (a task that holds devices, or
    #: has ended, lends nothing)
    lent: bool


class PollQuery(Wire):
    wait: float = Field(default=0.0, ge=0, le=MAX_LONG_POLL,
                        description=f"seconds to wait for work, at most {MAX_LONG_POLL:g}")


class RegisterBody(Wire):
    capabilities: Capabilities
    name: str | None = Field(default=None, max_length=200)
    cpu_slots: int = Field(default=1, ge=0, le=100_000)
    pid: int | None = Field(default=None, ge=0, le=2**31)

    @field_validator("capabilities")
    @classmethod
    def _storable(cls, value: Capabilities) -> Capabilities:
        # (a path that is not UTF-8 as its escape: httpx could not encode it, and no server store it)
        return value.storable()


class StartQuery(Wire):
    how: str = Field(default="", max_length=500,
                     description="how the task's process was started: the task_started event's message")


class JoinBody(RegisterBody):
    #: the machine a provider booted this worker on (``GPULAYER_MACHINE_ID``); with a
    #: bootstrap token it must be the token's machine
    machine_id: str | None = Field(default=None, max_length=200)


class OffersBody(Wire):
    requirements: Requirements = Field(default_factory=Requirements)


class HeartbeatBody(Wire):
    running: list[str] = Field(default_factory=list, max_length=100_000)


class LogsBody(Wire):
    chunks: list[tuple[LogStream, str]] = Field(max_length=100_000)
    #: where in the task's output the upload begins (schema 12; left out by older workers)
    offset: int | None = Field(default=None, ge=0)


class FinishBody(Wire):
    #: members a server keeps as the JSON text it was sent (:func:`json_members`): a
    #: function's result, stored as it came (:class:`ResultJSON`), not written again
    json_text: ClassVar[tuple[str, ...]] = ("result",)

    state: TaskState
    exit_code: int | None = Field(default=None, ge=-(2**31), le=2**31)
    result: Any = None
    error: JobError | None = None
    #: what the task's processes used (a server from before schema 14 refuses the field: its
    #: worker sends the report again without it)
    usage: TaskUsage | None = None


class PruneQuery(Wire):
    older_than: float = Field(default=0.0, ge=0, le=10 * 365 * 86400,
                              description="only workers silent for at least this many seconds")


class TokenBody(Wire):
    scope: Literal["admin", "client", "join", "bootstrap"]
    ttl: float | None = Field(default=None, gt=0, le=10 * 365 * 86400, description="seconds")
    uses: int | None = Field(default=None, ge=1, le=10**9, description="join tokens only")
    description: str = Field(default="", max_length=500)

    @model_validator(mode="after")
    def _uses_for_join_only(self) -> TokenBody:
        if self.uses is not None and self.scope != "join":
            raise ValueError(f"uses: only join tokens have a number of uses (bootstrap tokens have one); "
                             f"a {self.scope} token is limited by ttl or revocation")
        return self


# --------------------------------------------------------------------------- one operation over HTTP


@dataclass(frozen=True)
class Route:
    """One operation over HTTP.

    The Python call ``op(*args, **kwargs)`` of the Protocol maps to the request by name:
    arguments named in ``path`` go into the path, the fields of ``query`` into the query
    string, the fields of ``body`` into a JSON object, and the argument ``data`` (with
    ``raw_body``) is the body itself. Arguments named in ``context`` are not sent: the server
    derives them from the caller's token (``owner``: the client token's id, or none for an
    admin; ``worker``: the worker credential's worker id; ``bearer``: the presented token;
    ``remote_origin``: ``existing``, the origin of a worker that reaches the server over HTTP
    when the control plane has no record of it).
    """

    op: str
    method: str
    path: str
    scopes: tuple[str, ...]
    summary: str
    response: Any = None  # a type for pydantic; None: 204 No Content
    status: int = 200
    #: other success statuses with the same response (put_bundle: 200 when already stored)
    also_ok: tuple[int, ...] = ()
    query: type[Wire] | None = None
    body: type[Wire] | None = None
    raw_body: str | None = None  # media type of a non-JSON body (the ``data`` argument)
    raw_response: str | None = None  # media type of a non-JSON response (bytes)
    exists: bool = False  # HEAD: 200 answers True, 404 False
    path_patterns: Mapping[str, str] = field(default_factory=dict)
    context: Mapping[str, str] = field(default_factory=dict)
    #: a client token may only use it on its own job (the ``job_id`` path argument)
    own_job: bool = False
    #: the ``worker_id`` path argument must be the caller's own worker (worker tokens)
    own_worker: bool = False
    #: safe to repeat after a lost answer (so the client retries it through outages)
    safe: bool = True
    #: how the answer to a request sent again reads, given the request's JSON body, where an
    #: earlier try of it may have been carried out and its answer lost (a delete: what that
    #: try deleted, this one finds gone)
    again: Callable[[Any, Any], Any] | None = None
    #: the query field that bounds how long the server may hold the request
    long_poll: str | None = None
    #: error statuses this route may answer besides 400/401/403/422 (documented)
    errors: tuple[int, ...] = ()
    auth: bool = True

    def __post_init__(self) -> None:
        if (self.response is None) != (self.status == 204):
            raise ValueError(f"route {self.op}: a route without a response answers 204, and only it")

    @property
    def path_params(self) -> list[str]:
        return re.findall(r"\{(\w+)\}", self.path)


# --------------------------------------------------------------------------- replies


class LogChunk(Wire):
    id: int
    task_id: str
    node_rank: int
    stream: LogStream
    data: str
    ts: float


class TaskAssignment(Wire):
    """What a worker needs to start one task."""

    task_id: str
    job_id: str
    attempt: int
    node_rank: int
    accelerator: str | None
    devices: list[int]
    spec: JobSpec
    rendezvous: Rendezvous | None = None


class HeartbeatReply(Wire):
    #: False when the control plane has no such worker: register again
    known: bool = True
    #: task ids the worker must end now
    cancel: list[str] = Field(default_factory=list)


class WorkPoll(Wire):
    """What a worker's long poll answers: tasks to start, and running tasks to end."""

    #: tasks assigned to the worker and not started yet
    tasks: list[TaskAssignment] = Field(default_factory=list)
    #: of the task ids the worker said it runs, those it must end now (as a heartbeat's reply)
    cancel: list[str] = Field(default_factory=list)


class JobEvent(Wire):
    ts: float
    kind: str
    task_id: str | None = None
    worker_id: str | None = None
    message: str = ""


class WorkerUsage(Wire):
    """What an online worker has in use now: ``kind:index`` of busy devices, busy CPU slots."""

    busy_devices: list[str] = Field(default_factory=list)
    busy_cpu_slots: int = 0


class JoinReply(Wire):
    worker_id: str
    #: the worker's own credential: every later call of this worker uses it
    token: str
    token_id: str
    worker: WorkerRecord
