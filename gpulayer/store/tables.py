"""The tables: one SQLModel class per table, the same on SQLite and PostgreSQL.

JSON-shaped columns (capabilities, specs, decisions) are stored as text holding JSON that
the pydantic records in :mod:`gpulayer.types` validate on the way out, so a column never
holds something the code cannot read back.
"""

from __future__ import annotations

from typing import Optional

from sqlalchemy import BigInteger, Column, Integer, LargeBinary, Text
from sqlmodel import Field, SQLModel


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
    pid: Optional[int] = None
    hostname: str = ""
    token_id: Optional[str] = None


class JobRow(SQLModel, table=True):
    __tablename__ = "gl_jobs"

    id: str = Field(primary_key=True)
    kind: str
    spec: str = Field(sa_column=Column(Text, nullable=False))
    state: str = Field(index=True)
    priority: int = 0
    created_at: float = Field(index=True)
    updated_at: float = 0.0
    attempt: int = 0
    max_attempts: int = 1
    exit_code: Optional[int] = None
    result: Optional[str] = Field(default=None, sa_column=Column(Text, nullable=True))
    error: Optional[str] = Field(default=None, sa_column=Column(Text, nullable=True))
    decision: Optional[str] = Field(default=None, sa_column=Column(Text, nullable=True))
    cancel_requested: bool = False
    # added in schema 2
    idempotency_key: Optional[str] = Field(default=None, unique=True)
    owner: Optional[str] = Field(default=None, index=True)


class TaskRow(SQLModel, table=True):
    __tablename__ = "gl_tasks"

    id: str = Field(primary_key=True)
    job_id: str = Field(index=True)
    attempt: int
    node_rank: int = 0
    worker_id: str = Field(index=True)
    accelerator: Optional[str] = None
    devices: str = "[]"
    state: str = Field(index=True)
    created_at: float = 0.0
    started_at: Optional[float] = None
    ended_at: Optional[float] = None
    exit_code: Optional[int] = None
    error: Optional[str] = Field(default=None, sa_column=Column(Text, nullable=True))
    rendezvous: Optional[str] = None


class BundleRow(SQLModel, table=True):
    __tablename__ = "gl_bundles"

    digest: str = Field(primary_key=True)
    size: int
    data: bytes = Field(sa_column=Column(LargeBinary, nullable=False))
    created_at: float = 0.0


class LogRow(SQLModel, table=True):
    __tablename__ = "gl_logs"

    id: Optional[int] = Field(default=None, sa_column=Column(BigInteger().with_variant(Integer(), "sqlite"), primary_key=True, autoincrement=True))
    job_id: str = Field(index=True)
    task_id: str
    node_rank: int = 0
    stream: str = "stdout"
    data: str = Field(sa_column=Column(Text, nullable=False))
    ts: float = 0.0


class EventRow(SQLModel, table=True):
    __tablename__ = "gl_events"

    id: Optional[int] = Field(default=None, primary_key=True)
    ts: float
    kind: str
    job_id: Optional[str] = Field(default=None, index=True)
    task_id: Optional[str] = None
    worker_id: Optional[str] = None
    message: str = Field(default="", sa_column=Column(Text, nullable=False))


class TokenRow(SQLModel, table=True):
    """API tokens; added in schema 2. Only a hash of each secret is stored."""

    __tablename__ = "gl_tokens"

    id: str = Field(primary_key=True)
    hash: str = Field(unique=True)
    scope: str
    created_at: float
    expires_at: Optional[float] = None
    uses_left: Optional[int] = None
    revoked: bool = False
    worker_id: Optional[str] = None
    description: str = ""
