"""Schema versions and the migrations between them.

The database records its schema version in ``gl_schema``. Opening a store brings an older
database up to :data:`SCHEMA_VERSION` inside one transaction (so a failed upgrade leaves
the old schema as it was), refuses a database newer than this GPUlayer, and creates a new
one from the tables. Migrations only ever add columns and tables (indexes may be replaced):
no stored job is dropped or rewritten.

To change the schema: change ``tables.py``, bump ``SCHEMA_VERSION``, and add a step to
``MIGRATIONS`` that brings version N-1 to N with plain DDL that runs on SQLite and
PostgreSQL. Keep the DDL of every earlier version in ``HISTORY`` so tests can build one.
"""

from __future__ import annotations

from collections.abc import Callable

from sqlalchemy import Connection, inspect, text

from gpulayer.errors import GpulayerError

SCHEMA_VERSION = 15

# Version 1: the first released schema (no tokens, no idempotent submit).
SCHEMA_V1 = [
    "CREATE TABLE gl_schema (id INTEGER PRIMARY KEY, version INTEGER NOT NULL)",
    """CREATE TABLE gl_workers (id VARCHAR PRIMARY KEY, name VARCHAR NOT NULL,
        origin VARCHAR NOT NULL, capabilities TEXT NOT NULL, cpu_slots INTEGER NOT NULL,
        online BOOLEAN NOT NULL, draining BOOLEAN NOT NULL, last_heartbeat FLOAT NOT NULL,
        registered_at FLOAT NOT NULL, pid INTEGER, hostname VARCHAR NOT NULL,
        token_id VARCHAR)""",
    """CREATE TABLE gl_jobs (id VARCHAR PRIMARY KEY, kind VARCHAR NOT NULL, spec TEXT NOT NULL,
        state VARCHAR NOT NULL, priority INTEGER NOT NULL, created_at FLOAT NOT NULL,
        updated_at FLOAT NOT NULL, attempt INTEGER NOT NULL, max_attempts INTEGER NOT NULL,
        exit_code INTEGER, result TEXT, error TEXT, decision TEXT,
        cancel_requested BOOLEAN NOT NULL)""",
    """CREATE TABLE gl_tasks (id VARCHAR PRIMARY KEY, job_id VARCHAR NOT NULL,
        attempt INTEGER NOT NULL, node_rank INTEGER NOT NULL, worker_id VARCHAR NOT NULL,
        accelerator VARCHAR, devices VARCHAR NOT NULL, state VARCHAR NOT NULL,
        created_at FLOAT NOT NULL, started_at FLOAT, ended_at FLOAT, exit_code INTEGER,
        error TEXT, rendezvous VARCHAR)""",
    """CREATE TABLE gl_bundles (digest VARCHAR PRIMARY KEY, size INTEGER NOT NULL,
        data BLOB NOT NULL, created_at FLOAT NOT NULL)""",
    """CREATE TABLE gl_logs (id INTEGER PRIMARY KEY AUTOINCREMENT, job_id VARCHAR NOT NULL,
        task_id VARCHAR NOT NULL, node_rank INTEGER NOT NULL, stream VARCHAR NOT NULL,
        data TEXT NOT NULL, ts FLOAT NOT NULL)""",
    """CREATE TABLE gl_events (id INTEGER PRIMARY KEY AUTOINCREMENT, ts FLOAT NOT NULL,
        kind VARCHAR NOT NULL, job_id VARCHAR, task_id VARCHAR, worker_id VARCHAR,
        message TEXT NOT NULL)""",
    "CREATE INDEX ix_gl_jobs_state ON gl_jobs (state)",
    "CREATE INDEX ix_gl_tasks_job_id ON gl_tasks (job_id)",
    "CREATE INDEX ix_gl_tasks_worker_id ON gl_tasks (worker_id)",
    "CREATE INDEX ix_gl_tasks_state ON gl_tasks (state)",
    "CREATE INDEX ix_gl_logs_job_id ON gl_logs (job_id)",
    "INSERT INTO gl_schema (id, version) VALUES (1, 1)",
]

HISTORY: dict[int, list[str]] = {1: SCHEMA_V1}


def _v1_to_v2(conn: Connection) -> None:
    conn.execute(text("ALTER TABLE gl_jobs ADD COLUMN idempotency_key VARCHAR"))
    conn.execute(text("ALTER TABLE gl_jobs ADD COLUMN owner VARCHAR"))
    conn.execute(text("CREATE UNIQUE INDEX ix_gl_jobs_idempotency_key ON gl_jobs (idempotency_key)"))
    conn.execute(text("CREATE INDEX ix_gl_jobs_owner ON gl_jobs (owner)"))
    from gpulayer.store.tables import TokenRow

    TokenRow.__table__.create(conn, checkfirst=True)  # type: ignore[attr-defined]


def _v2_to_v3(conn: Connection) -> None:
    # a function job's arguments, apart from the spec placement reads (they may be large);
    # rows written before keep their arguments inside the spec, which reads the same
    conn.execute(text("ALTER TABLE gl_jobs ADD COLUMN args TEXT"))


def _v3_to_v4(conn: Connection) -> None:
    # who may read a bundle: the client tokens that uploaded it. Uploads before this version
    # were not recorded; the owner of a stored job that uses a bundle keeps reading it, and
    # any other client uploads it again (which proves it has the bytes) to read it
    import json

    from gpulayer.store.tables import BundleReaderRow

    BundleReaderRow.__table__.create(conn, checkfirst=True)  # type: ignore[attr-defined]
    pairs: set[tuple[str, str]] = set()
    for owner, spec in conn.execute(text("SELECT owner, spec FROM gl_jobs WHERE owner IS NOT NULL")):
        try:
            digest = json.loads(spec).get("bundle_digest")
        except (ValueError, AttributeError):
            continue
        if isinstance(digest, str):
            pairs.add((digest, owner))
    for digest, owner in sorted(pairs):
        conn.execute(text("INSERT INTO gl_bundle_readers (digest, reader, created_at) VALUES (:d, :r, 0)"),
                     {"d": digest, "r": owner})


def _v4_to_v5(conn: Connection) -> None:
    # the cloud target: the machines providers bring up, and the label they carry
    from gpulayer.store.tables import MachineRow, MetaRow

    MachineRow.__table__.create(conn, checkfirst=True)  # type: ignore[attr-defined]
    MetaRow.__table__.create(conn, checkfirst=True)  # type: ignore[attr-defined]


def _v5_to_v6(conn: Connection) -> None:
    # the queue in placement order: a pass after a task ended reads its head, not all of it
    conn.execute(text("CREATE INDEX IF NOT EXISTS ix_gl_jobs_queue ON gl_jobs (state, priority DESC, created_at, id)"))


def _v6_to_v7(conn: Connection) -> None:
    # change marks kept by triggers: a pass reads the fleet again only when it changed
    from gpulayer.store import marks
    from gpulayer.store.tables import MarkRow

    MarkRow.__table__.create(conn, checkfirst=True)  # type: ignore[attr-defined]
    marks.install(conn, lent=False, paused=False)  # (gl_tasks.lent comes in schema 9, which installs them again)


def _v7_to_v8(conn: Connection) -> None:
    # a list of one state's jobs, or of one owner's (a client token's), newest first, read in
    # the order of an index: each such list sorted all of them first (46-66 ms with 200,000
    # stored). The single-column indexes are these ones' first columns.
    conn.execute(text("CREATE INDEX IF NOT EXISTS ix_gl_jobs_state_created ON gl_jobs (state, created_at)"))
    conn.execute(text("CREATE INDEX IF NOT EXISTS ix_gl_jobs_owner_created ON gl_jobs (owner, created_at)"))
    conn.execute(text("DROP INDEX IF EXISTS ix_gl_jobs_state"))
    conn.execute(text("DROP INDEX IF EXISTS ix_gl_jobs_owner"))


def _v8_to_v9(conn: Connection) -> None:
    # a task waiting for jobs (it submitted them, usually) lends its CPU slot to the queue;
    # a lent task holds nothing, so the change marks' triggers are installed again
    from gpulayer.store import marks

    if "lent" not in {c["name"] for c in inspect(conn).get_columns("gl_tasks")}:
        conn.execute(text("ALTER TABLE gl_tasks ADD COLUMN lent BOOLEAN NOT NULL DEFAULT FALSE"))
    marks.install(conn, paused=False)  # (gl_workers.paused comes in schema 10)


def _v9_to_v10(conn: Connection) -> None:
    # a worker an admin paused (gpulayer worker pause) takes no new work while the jobs only it
    # could run wait; a pass reads the column, so the change marks' triggers are installed again
    from gpulayer.store import marks

    if "paused" not in {c["name"] for c in inspect(conn).get_columns("gl_workers")}:
        conn.execute(text("ALTER TABLE gl_workers ADD COLUMN paused BOOLEAN NOT NULL DEFAULT FALSE"))
    marks.install(conn)


def _v10_to_v11(conn: Connection) -> None:
    # jobs that run after others (spec.after): the pairs still waiting, and each job's count
    # of those it waits for (the queue's reads skip a job that waits)
    from gpulayer.store.tables import JobAfterRow

    if "waiting_for" not in {c["name"] for c in inspect(conn).get_columns("gl_jobs")}:
        conn.execute(text("ALTER TABLE gl_jobs ADD COLUMN waiting_for INTEGER NOT NULL DEFAULT 0"))
    JobAfterRow.__table__.create(conn, checkfirst=True)  # type: ignore[attr-defined]

    _bundle_column(conn)


def _bundle_column(conn: Connection) -> None:
    # whether a stored job names a bundle (deleting jobs, and the bundles no job names): a
    # column of the spec's bundle_digest, indexed, filled here for the jobs stored before,
    # in one statement (JSON read by the database; a spec is always a JSON object). Part of
    # schema 11 and, where that lacks it, of 12: schema 11 came first without it (68c3ff8)
    if "bundle_digest" not in {c["name"] for c in inspect(conn).get_columns("gl_jobs")}:
        conn.execute(text("ALTER TABLE gl_jobs ADD COLUMN bundle_digest VARCHAR"))
        if conn.dialect.name == "sqlite":
            digest = "json_extract(spec, '$.bundle_digest')"
            is_text = "json_type(spec, '$.bundle_digest') = 'text'"
        else:
            digest = "CAST(spec AS json) ->> 'bundle_digest'"
            is_text = "json_typeof(CAST(spec AS json) -> 'bundle_digest') = 'string'"
        conn.execute(text(f"UPDATE gl_jobs SET bundle_digest = {digest} WHERE {is_text}"))
    conn.execute(text("CREATE INDEX IF NOT EXISTS ix_gl_jobs_bundle_digest ON gl_jobs (bundle_digest)"))


def _v11_to_v12(conn: Connection) -> None:
    # how many characters of each task's output are stored: a worker's upload says where it
    # begins, and one sent again after its answer was lost is stored once. Tasks stored
    # before count 0: their workers' uploads (none numbered before) are stored as they come
    if "log_chars" not in {c["name"] for c in inspect(conn).get_columns("gl_tasks")}:
        conn.execute(text("ALTER TABLE gl_tasks ADD COLUMN log_chars BIGINT NOT NULL DEFAULT 0"))
    _bundle_column(conn)  # (a schema 11 from before it)
    # (and gl_job_after.any_end, which schema 11 also came without at first: 68c3ff8)
    if "any_end" not in {c["name"] for c in inspect(conn).get_columns("gl_job_after")}:
        conn.execute(text("ALTER TABLE gl_job_after ADD COLUMN any_end BOOLEAN NOT NULL DEFAULT FALSE"))


def _v12_to_v13(conn: Connection) -> None:
    # the files each task left in its artifacts folder (GPULAYER_ARTIFACTS_DIR), as a zip
    from gpulayer.store.tables import ArtifactsRow

    ArtifactsRow.__table__.create(conn, checkfirst=True)  # type: ignore[attr-defined]


def _v13_to_v14(conn: Connection) -> None:
    # what each task's processes used (CPU time, peak memory), as its worker measured it
    if "usage" not in {c["name"] for c in inspect(conn).get_columns("gl_tasks")}:
        conn.execute(text("ALTER TABLE gl_tasks ADD COLUMN usage TEXT"))


def _v14_to_v15(conn: Connection) -> None:
    # one job's output read in the order of an index of (job_id, id). With job_id's alone,
    # PostgreSQL read a page (a server-side cursor, planned for its first rows), a --tail
    # (ORDER BY id DESC LIMIT) and, once it planned them for any job, every read in the order
    # of the primary key, through the chunks other jobs stored after the job's first (38-141 ms
    # a read among 400,000 of them, not 3-25 ms: bench/log_reads.py). The index of job_id
    # alone is this one's first column (deleting a job's chunks reads it as well). SQLite's
    # plans stay as they were: its index of job_id holds the rowid (id) after it.
    conn.execute(text("CREATE INDEX IF NOT EXISTS ix_gl_logs_job_id_id ON gl_logs (job_id, id)"))
    conn.execute(text("DROP INDEX IF EXISTS ix_gl_logs_job_id"))


#: MIGRATIONS[n] brings a database at version n to version n + 1.
MIGRATIONS: dict[int, Callable[[Connection], None]] = {1: _v1_to_v2, 2: _v2_to_v3, 3: _v3_to_v4, 4: _v4_to_v5,
                                                     5: _v5_to_v6, 6: _v6_to_v7, 7: _v7_to_v8,
                                                     8: _v8_to_v9, 9: _v9_to_v10, 10: _v10_to_v11,
                                                     11: _v11_to_v12, 12: _v12_to_v13,
                                                     13: _v13_to_v14, 14: _v14_to_v15}


class SchemaTooNew(GpulayerError):
    code = "schema_too_new"


def current_version(conn: Connection) -> int | None:
    if not inspect(conn).has_table("gl_schema"):
        return None
    row = conn.execute(text("SELECT version FROM gl_schema WHERE id = 1")).first()
    return int(row[0]) if row else None


def upgrade(conn: Connection, found: int) -> None:
    if found > SCHEMA_VERSION:
        raise SchemaTooNew(
            f"the database has schema version {found}, newer than this GPUlayer understands "
            f"({SCHEMA_VERSION}); upgrade GPUlayer to use it"
        )
    for version in range(found, SCHEMA_VERSION):
        MIGRATIONS[version](conn)
        conn.execute(text("UPDATE gl_schema SET version = :v WHERE id = 1"), {"v": version + 1})
