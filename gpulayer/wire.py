"""What crosses the control plane's API besides its replies: the base of every wire record,
the limits the API enforces, and the shapes of its requests (JSON bodies and query strings),
one model per operation that takes one (:data:`gpulayer.api.ROUTES` names them).

:mod:`gpulayer.api` re-exports all of it; this module imports pydantic and GPUlayer's
records only, as that one does.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from gpulayer.hookrecords import Capabilities
from gpulayer.records import JobError, JobState, TaskState
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


@dataclass(frozen=True)
class ResultJSON:
    """A result given as its JSON text, passed on as it is: what a worker reports for a
    function that returned (the text its runner wrote), so that the worker does not parse it
    and an embedded control plane does not write it again, for what only the caller reads (a
    7 MB result: 0.6 s). ``finish_task(result=ResultJSON(text))``; over HTTP its text is put
    into the body's ``result`` as it is (the server parses the body, as any)."""

    text: str


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


class LogsQuery(Wire):
    after: int = Field(default=0, ge=0, le=2**62, description="only chunks with a larger id")
    node: int | None = Field(default=None, ge=0, le=100_000, description="one node's logs")
    limit: int = Field(default=MAX_LOG_CHUNKS, ge=1, le=MAX_LOG_CHUNKS, description="at most this many chunks")
    wait: float | None = Field(default=None, ge=0, le=MAX_LONG_POLL,
                               description=f"when there is no chunk after `after` yet, seconds to wait for one (at "
                                           f"most {MAX_LONG_POLL:g}); the page also comes, empty, when the job's "
                                           f"state changes (a follower's long poll)")


class WaitQuery(Wire):
    timeout: float = Field(default=MAX_LONG_POLL, ge=0, le=MAX_LONG_POLL,
                           description=f"seconds to wait, at most {MAX_LONG_POLL:g}")


class WaitJobsQuery(Wire):
    count: int = Field(default=1, ge=1, le=MAX_BATCH,
                       description="answer once at least this many of the jobs have ended (all, when fewer)")
    timeout: float = Field(default=MAX_LONG_POLL, ge=0, le=MAX_LONG_POLL,
                           description=f"seconds to wait, at most {MAX_LONG_POLL:g}")


class WaitJobsBody(Wire):
    job_ids: list[str] = Field(min_length=1, max_length=MAX_BATCH)


class PollQuery(Wire):
    wait: float = Field(default=0.0, ge=0, le=MAX_LONG_POLL,
                        description=f"seconds to wait for work, at most {MAX_LONG_POLL:g}")


class RegisterBody(Wire):
    capabilities: Capabilities
    name: str | None = Field(default=None, max_length=200)
    cpu_slots: int = Field(default=1, ge=0, le=100_000)
    pid: int | None = Field(default=None, ge=0, le=2**31)


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


class FinishBody(Wire):
    state: TaskState
    exit_code: int | None = Field(default=None, ge=-(2**31), le=2**31)
    result: Any = None
    error: JobError | None = None


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
