"""Change marks: what a placement pass reads of the fleet, summed up in two rows of
``gl_marks`` that the database itself changes, in the same transaction as the change.

* ``workers`` changes with every insert and delete of a worker and with every update of a
  column a pass reads (:data:`WORKER_COLUMNS`: not the heartbeat's time, so a heartbeat
  changes it only when it brings a worker back online);
* ``tasks`` changes with every task that starts or stops holding devices or a CPU slot
  (inserted, deleted or updated into or out of ``assigned``/``running``, or lent: a task
  that waits for jobs lends its CPU slot to the queue and holds nothing meanwhile, schema 9;
  ``assigned`` to ``running`` changes nothing a pass reads, so it does not count). A change of what an
  active task holds (its worker, accelerator or devices: the control plane makes none)
  moves ``workers`` instead, so that a reader may follow ``tasks`` by the set of active
  task ids alone (:func:`active_task_ids`).

Each mark is ``(n, salt)``: ``n`` counts its changes, ``salt`` is drawn at random by each
change. Triggers write them (SQLite and PostgreSQL alike, schema 7), so every writer is
covered, whichever process, thread, server or version of the code it is, and however it
reaches the tables: nothing needs to remember to call anything. A reader that saw a mark
and then the rows knows the rows are still what it saw as long as the mark is the same.
The salt makes a mark that a rolled-back transaction wrote impossible to meet again (its
``n`` will be counted again by the next change, with another salt); ``n`` lets a pass tell
its own changes from anyone else's (:class:`gpulayer.control.placement.Cache`).
"""

from __future__ import annotations

from typing import NamedTuple

from sqlalchemy import Connection, text
from sqlmodel import Session

from gpulayer.store import plain, queries

# the columns of a worker a placement pass reads (an update that changes none of them
# leaves the mark alone) and the task states that hold a worker's devices or CPU slot.
# The triggers are written with them when installed: a change to either needs a migration
# that installs them again (tests/unit/test_placement_marks.py pins the DDL to the schema)
WORKER_COLUMNS = queries.WORKER_COLUMNS
ACTIVE = queries.ACTIVE_TASK_STATES


_ACTIVE_SQL = "(" + ", ".join(f"'{state}'" for state in ACTIVE) + ")"


def _holds(row: str, lent: bool = True) -> str:
    """SQL: the task ``row`` (OLD, NEW or none) holds room on its worker: active, not lent
    (``lent``: the column is there, schema 9 on; the triggers of schemas 7 and 8 have no
    such test). Bare: a caller puts it in parentheses where it needs them."""
    prefix = f"{row}." if row else ""
    return f"{prefix}state IN {_ACTIVE_SQL}" + (f" AND NOT {prefix}lent" if lent else "")


class Mark(NamedTuple):
    n: int
    salt: str


class Marks(NamedTuple):
    workers: Mark
    tasks: Mark


def read(s: Session) -> Marks | None:
    """The marks as this transaction sees them (after flushing what the session holds, so
    its own pending changes count); None where they are missing (nothing may be trusted)."""
    rows = {name: Mark(int(n), str(salt)) for name, n, salt in plain.fetch(s, "SELECT name, n, salt FROM gl_marks")}
    if "workers" not in rows or "tasks" not in rows:
        return None
    return Marks(rows["workers"], rows["tasks"])


def active_holdings(s: Session, task_ids: list[str] | None = None) -> list[tuple[str, str, str | None, str]]:
    """What the active tasks (or those of ``task_ids`` that are active) hold, as plain
    tuples ``(task id, worker id, accelerator, devices JSON)``; a lent task holds nothing."""
    sql = f"SELECT id, worker_id, accelerator, devices FROM gl_tasks WHERE {_holds('')}"
    if task_ids is None:
        return plain.fetch(s, sql)
    return plain.fetch_in(s, sql + " AND id IN ({})", task_ids)


def active_task_ids(s: Session) -> set[str]:
    """The ids of the active tasks that hold room (not lent): what a pass reads when only
    ``tasks`` moved (then the holdings of the ids it did not know)."""
    return {r[0] for r in plain.fetch(s, f"SELECT id FROM gl_tasks WHERE {_holds('')}")}


# --------------------------------------------------------------------------- the DDL

def _worker_changed(differs: str, paused: bool = True) -> str:
    """SQL: a column a pass reads changed (``paused``: the column is there, schema 10 on)."""
    return " OR ".join(f"OLD.{c} {differs} NEW.{c}" for c in WORKER_COLUMNS if paused or c != "paused")


def _task_changed(lent: bool) -> str:
    return f"({_holds('OLD', lent)}) <> ({_holds('NEW', lent)})"


def _task_held_changed(differs: str, lent: bool) -> str:
    held = " OR ".join(f"OLD.{c} {differs} NEW.{c}" for c in ("worker_id", "accelerator", "devices"))
    return f"{_holds('OLD', lent)} AND {_holds('NEW', lent)} AND ({held})"


def _sqlite_ddl(lent: bool = True, paused: bool = True) -> list[str]:
    def bump(name: str) -> str:
        return f"UPDATE gl_marks SET n = n + 1, salt = hex(randomblob(8)) WHERE name = '{name}';"

    return [
        f"CREATE TRIGGER gl_mark_workers_insert AFTER INSERT ON gl_workers BEGIN {bump('workers')} END",
        f"CREATE TRIGGER gl_mark_workers_delete AFTER DELETE ON gl_workers BEGIN {bump('workers')} END",
        f"CREATE TRIGGER gl_mark_workers_update AFTER UPDATE ON gl_workers WHEN {_worker_changed('IS NOT', paused)} "
        f"BEGIN {bump('workers')} END",
        f"CREATE TRIGGER gl_mark_tasks_insert AFTER INSERT ON gl_tasks WHEN {_holds('NEW', lent)} "
        f"BEGIN {bump('tasks')} END",
        f"CREATE TRIGGER gl_mark_tasks_delete AFTER DELETE ON gl_tasks WHEN {_holds('OLD', lent)} "
        f"BEGIN {bump('tasks')} END",
        f"CREATE TRIGGER gl_mark_tasks_update AFTER UPDATE ON gl_tasks WHEN {_task_changed(lent)} "
        f"BEGIN {bump('tasks')} END",
        f"CREATE TRIGGER gl_mark_tasks_held AFTER UPDATE ON gl_tasks WHEN {_task_held_changed('IS NOT', lent)} "
        f"BEGIN {bump('workers')} END",
    ]


def _postgres_ddl(lent: bool = True, paused: bool = True) -> list[str]:
    out = []
    for name in ("workers", "tasks"):
        out.append(
            f"CREATE OR REPLACE FUNCTION gl_mark_{name}() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
            f"UPDATE gl_marks SET n = n + 1, salt = md5(random()::text || clock_timestamp()::text) "
            f"WHERE name = '{name}'; RETURN NULL; END $$")
    return [
        *out,
        "CREATE TRIGGER gl_mark_workers_insert_delete AFTER INSERT OR DELETE ON gl_workers "
        "FOR EACH ROW EXECUTE FUNCTION gl_mark_workers()",
        f"CREATE TRIGGER gl_mark_workers_update AFTER UPDATE ON gl_workers FOR EACH ROW "
        f"WHEN ({_worker_changed('IS DISTINCT FROM', paused)}) EXECUTE FUNCTION gl_mark_workers()",
        f"CREATE TRIGGER gl_mark_tasks_insert AFTER INSERT ON gl_tasks FOR EACH ROW "
        f"WHEN ({_holds('NEW', lent)}) EXECUTE FUNCTION gl_mark_tasks()",
        f"CREATE TRIGGER gl_mark_tasks_delete AFTER DELETE ON gl_tasks FOR EACH ROW "
        f"WHEN ({_holds('OLD', lent)}) EXECUTE FUNCTION gl_mark_tasks()",
        f"CREATE TRIGGER gl_mark_tasks_update AFTER UPDATE ON gl_tasks FOR EACH ROW "
        f"WHEN ({_task_changed(lent)}) EXECUTE FUNCTION gl_mark_tasks()",
        f"CREATE TRIGGER gl_mark_tasks_held AFTER UPDATE ON gl_tasks FOR EACH ROW "
        f"WHEN ({_task_held_changed('IS DISTINCT FROM', lent)}) EXECUTE FUNCTION gl_mark_workers()",
    ]


def install(conn: Connection, *, lent: bool = True, paused: bool = True) -> None:
    """The two marks and the triggers that keep them (``gl_marks`` exists already). Safe to
    run again: a mark that exists is kept, the triggers are made anew. ``lent=False``: as
    schema 7 made them, before ``gl_tasks.lent`` (a migration from 6 runs before that column);
    ``paused=False``: before ``gl_workers.paused`` (schema 10)."""
    for name in ("workers", "tasks"):
        conn.execute(text("INSERT INTO gl_marks (name, n, salt) VALUES (:name, 0, '') ON CONFLICT (name) DO NOTHING"),
                     {"name": name})
    sqlite = conn.dialect.name == "sqlite"
    for statement in _sqlite_ddl(lent, paused) if sqlite else _postgres_ddl(lent, paused):
        if statement.startswith("CREATE TRIGGER"):
            trigger = statement.split()[2]
            conn.exec_driver_sql(f"DROP TRIGGER IF EXISTS {trigger}" + ("" if sqlite else f" ON {_table(statement)}"))
        conn.exec_driver_sql(statement)


def _table(statement: str) -> str:
    words = statement.split()
    return words[words.index("ON") + 1]


__all__ = ["ACTIVE", "WORKER_COLUMNS", "Mark", "Marks", "active_holdings", "active_task_ids", "install", "read"]
