"""The tables: one SQLModel class per table, the same on SQLite and PostgreSQL.

JSON-shaped columns (capabilities, specs, decisions) are stored as text holding JSON that
the pydantic records in :mod:`gpulayer.records` and :mod:`gpulayer.specs` validate on the way out, so a column never
holds something the code cannot read back.
"""

from __future__ import annotations

from sqlalchemy import BigInteger, Column, Index, Integer, LargeBinary, Text, false
from sqlmodel import Field, SQLModel, col


class SchemaRow(SQLModel, table=True):
    __tablename__ = "gl_schema"

    id: int = Field(default=1, primary_key=True)
    version: int


class WorkerRow(SQLModel, table=True):
    __tablename__ = "gl_workers"

    id: str = Field(primary_key=True)
    name: str
    origin: str = Field(index=True)
    capabilities: str = Field(sa_column=Column(Text, nullable=False))
    cpu_slots: int = 1
    online: bool = Field(default=True, index=True)
    draining: bool = False
    last_heartbeat: float = 0.0
    registered_at: float = 0.0
    pid: int | None = None
    hostname: str = ""
    token_id: str | None = None
    #: an admin paused it (schema 10): it takes no new work; the jobs only it could run wait
    paused: bool = Field(default=False, sa_column_kwargs={"server_default": false()})


class JobRow(SQLModel, table=True):
    __tablename__ = "gl_jobs"

    id: str = Field(primary_key=True)
    kind: str
    spec: str = Field(sa_column=Column(Text, nullable=False))
    state: str  # (indexed with created_at: see below)
    priority: int = 0
    created_at: float = Field(index=True)
    updated_at: float = 0.0
    attempt: int = 0
    max_attempts: int = 1
    exit_code: int | None = None
    result: str | None = Field(default=None, sa_column=Column(Text, nullable=True))
    error: str | None = Field(default=None, sa_column=Column(Text, nullable=True))
    decision: str | None = Field(default=None, sa_column=Column(Text, nullable=True))
    cancel_requested: bool = False
    # added in schema 2
    idempotency_key: str | None = Field(default=None, unique=True)
    owner: str | None = None  # (indexed with created_at: see below)
    # added in schema 3: a function job's {"args": [...], "kwargs": {...}}, kept out of
    # ``spec`` so that placement never reads or parses them
    args: str | None = Field(default=None, sa_column=Column(Text, nullable=True))
    #: added in schema 11: how many of the jobs it runs after (``spec.after``) have not
    #: succeeded yet; a queued job is placed only at 0 (see gpulayer.control.after)
    waiting_for: int = Field(default=0, sa_column_kwargs={"server_default": "0"})
    # added in schema 11: the spec's ``bundle_digest``, indexed, so that whether a stored job
    # names a bundle is a lookup, not a read of every spec (deleting jobs and their bundles)
    bundle_digest: str | None = Field(default=None, index=True)


# added in schema 6: the queue in placement order (priority, then submission), so that a
# pass after a task ended reads the queue's head alone
Index("ix_gl_jobs_queue", col(JobRow.state), col(JobRow.priority).desc(), col(JobRow.created_at), col(JobRow.id))
# added in schema 8: lists of one state's or one owner's jobs, newest first (they replace the
# indexes of state and owner alone, which they begin with)
Index("ix_gl_jobs_state_created", col(JobRow.state), col(JobRow.created_at))
Index("ix_gl_jobs_owner_created", col(JobRow.owner), col(JobRow.created_at))


class JobAfterRow(SQLModel, table=True):
    """Job ``job_id`` runs after job ``after_id`` (added in schema 11): a row is kept while
    ``after_id`` has not ended and ``job_id`` waits; both ends remove it (gpulayer.control.after)."""

    __tablename__ = "gl_job_after"

    after_id: str = Field(primary_key=True)
    job_id: str = Field(primary_key=True, index=True)
    #: any end of ``after_id`` will do (``spec.after_ended``); otherwise only its success
    any_end: bool = Field(default=False, sa_column_kwargs={"server_default": false()})


class TaskRow(SQLModel, table=True):
    __tablename__ = "gl_tasks"

    id: str = Field(primary_key=True)
    job_id: str = Field(index=True)
    attempt: int
    node_rank: int = 0
    worker_id: str = Field(index=True)
    accelerator: str | None = None
    devices: str = "[]"
    state: str = Field(index=True)
    created_at: float = 0.0
    started_at: float | None = None
    ended_at: float | None = None
    exit_code: int | None = None
    error: str | None = Field(default=None, sa_column=Column(Text, nullable=True))
    rendezvous: str | None = None
    #: a CPU-slot task whose process waits for jobs (schema 9): its slot is lent to the queue
    #: until the wait ends (it holds nothing a placement pass counts meanwhile)
    lent: bool = Field(default=False, sa_column_kwargs={"server_default": false()})
    #: how many characters of the task's output are stored (schema 12): where the next upload
    #: of its worker begins; an upload sent again (its answer lost) is stored once
    #: (:func:`gpulayer.store.plain.claim_output`)
    log_chars: int = Field(default=0, sa_column=Column(BigInteger, nullable=False, server_default="0"))
    #: what the task's processes used, as JSON (:class:`~gpulayer.records.TaskUsage`), once it
    #: ended and where its worker measured it (schema 14)
    usage: str | None = Field(default=None, sa_column=Column(Text, nullable=True))


class BundleRow(SQLModel, table=True):
    __tablename__ = "gl_bundles"

    digest: str = Field(primary_key=True)
    size: int
    data: bytes = Field(sa_column=Column(LargeBinary, nullable=False))
    created_at: float = 0.0


class BundleReaderRow(SQLModel, table=True):
    """Who may read a bundle besides the admin (added in schema 4): each client token that
    uploaded it. A worker reads it while a task of a job that uses it is assigned to it."""

    __tablename__ = "gl_bundle_readers"

    digest: str = Field(primary_key=True)
    reader: str = Field(primary_key=True)
    created_at: float = 0.0


class ArtifactsRow(SQLModel, table=True):
    """What one task left in its artifacts folder, as a zip (added in schema 13): stored by
    its worker before the task's final report, deleted with its job."""

    __tablename__ = "gl_artifacts"

    task_id: str = Field(primary_key=True)
    job_id: str = Field(index=True)
    attempt: int
    node_rank: int
    digest: str
    size: int = Field(sa_column=Column(BigInteger, nullable=False))
    unpacked: int = Field(sa_column=Column(BigInteger, nullable=False))
    files: int
    data: bytes = Field(sa_column=Column(LargeBinary, nullable=False))
    created_at: float = 0.0


class LogRow(SQLModel, table=True):
    __tablename__ = "gl_logs"

    # BIGINT on PostgreSQL; INTEGER on SQLite, where only that type aliases the rowid
    id: int | None = Field(default=None, sa_column=Column(
        BigInteger().with_variant(Integer(), "sqlite"), primary_key=True, autoincrement=True))
    job_id: str
    task_id: str
    node_rank: int = 0
    stream: str = "stdout"
    data: str = Field(sa_column=Column(Text, nullable=False))
    ts: float = 0.0


# schema 15: one job's chunks in order, read from any id on, forwards or backwards (it replaces
# the index of job_id alone, which it begins with: see migrations._v14_to_v15)
Index("ix_gl_logs_job_id_id", col(LogRow.job_id), col(LogRow.id))


class EventRow(SQLModel, table=True):
    __tablename__ = "gl_events"

    id: int | None = Field(default=None, primary_key=True)
    ts: float
    kind: str
    job_id: str | None = Field(default=None, index=True)
    task_id: str | None = None
    worker_id: str | None = None
    message: str = Field(default="", sa_column=Column(Text, nullable=False))


class TokenRow(SQLModel, table=True):
    """API tokens; added in schema 2. Only a hash of each secret is stored."""

    __tablename__ = "gl_tokens"

    id: str = Field(primary_key=True)
    hash: str = Field(unique=True)
    scope: str
    created_at: float
    expires_at: float | None = None
    uses_left: int | None = None
    revoked: bool = False
    worker_id: str | None = None
    description: str = ""


class MachineRow(SQLModel, table=True):
    """A machine a provider brings up for the cloud target; added in schema 4.

    Every step of its life is written here before the provider is called
    (:mod:`gpulayer.provisioning`): ``requested -> launching -> booting -> idle/busy ->
    terminating -> terminated``, or ``failed`` with ``reason``.
    """

    __tablename__ = "gl_machines"

    id: str = Field(primary_key=True)
    provider: str = Field(index=True)
    shape: str
    region: str | None = None
    offer: str = Field(sa_column=Column(Text, nullable=False))
    state: str = Field(index=True)
    reason: str = ""
    #: the job it was launched for (any job may then use it)
    job_id: str | None = None
    #: the machines of one distributed job, launched together: one that fails ends them all
    gang: str | None = None
    worker_id: str | None = Field(default=None, index=True)
    provider_id: str | None = None
    address: str | None = None
    data: str = Field(default="{}", sa_column=Column(Text, nullable=False))
    token_id: str | None = Field(default=None, index=True)
    price_per_hour: float | None = None
    created_at: float = 0.0
    updated_at: float = 0.0
    launched_at: float | None = None
    joined_at: float | None = None
    join_deadline: float = 0.0
    idle_since: float | None = None
    ended_at: float | None = None


class MetaRow(SQLModel, table=True):
    """Facts about this control plane (the label its machines carry); added in schema 4."""

    __tablename__ = "gl_meta"

    key: str = Field(primary_key=True)
    value: str = Field(sa_column=Column(Text, nullable=False))


class MarkRow(SQLModel, table=True):
    """The change marks of what a placement pass reads (:mod:`gpulayer.store.marks`), kept
    by triggers; added in schema 7."""

    __tablename__ = "gl_marks"

    name: str = Field(primary_key=True)
    n: int = Field(sa_column=Column(BigInteger, nullable=False))
    salt: str = Field(nullable=False)
