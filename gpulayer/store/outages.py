"""What a PostgreSQL failure is said as to a server's clients (:class:`~gpulayer.errors.DatabaseFailed`'s
``reason``): what happened, in words of our own, naming none of the database's host, port,
user, database name or files. The driver's own text names them (``connection to server at
"db.internal", port 5432 failed: Connection refused``, ``password authentication failed for
user "gpulayer"``, ``could not extend file "base/16384/2619"``): the server's log keeps it
whole (:meth:`gpulayer.store.Store._failed`), a client is told the kind of failure alone.

A failure the database server answered carries its SQLSTATE, which says the kind; one of
the driver's own (no answer: the server could not be reached, or the connection was lost)
carries none, and is told by the words libpq uses for each cause.

Also which SQLite failure to open a database is a full disk (:func:`cannot_open_full`).
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["FULL", "cannot_open_full", "client_reason"]

#: what is said of a SQLite database that could not be opened for a full file system
FULL = "no space left on its file system"

#: a SQLSTATE (its class, two characters, or the whole code) -> what is said
_STATES = {
    "53100": "the database server's disk is full",
    "53200": "the database server is out of memory",
    "53300": "the database server has too many connections",
    "53": "the database server is out of resources",
    "57P01": "the database server is shutting down",
    "57P02": "the database server is restarting after a crash",
    "57P03": "the database server is not accepting connections yet",
    "57014": "a statement ran past the database server's time limit",
    "55P03": "a lock of the database server was not available in time",
    "40001": "a transaction conflicted with another (serialization failure)",
    "40P01": "a transaction conflicted with another (deadlock)",
    "28": "the database server refused this server's credentials",
    "3D": "the database does not exist on the database server",
    "08": "the connection to the database server failed",
}
#: words of libpq's message (its own failures: no SQLSTATE) -> what is said
_CAUSES = (
    ("connection refused", "could not connect to the database server (connection refused)"),
    ("timeout expired", "could not connect to the database server (timed out)"),
    ("timed out", "could not connect to the database server (timed out)"),
    ("no route to host", "could not connect to the database server (no route to host)"),
    ("network is unreachable", "could not connect to the database server (network is unreachable)"),
    ("could not translate host name", "could not connect to the database server (its host name is not known)"),
    ("name or service not known", "could not connect to the database server (its host name is not known)"),
    ("authentication failed", "the database server refused this server's credentials"),
    ("no pg_hba.conf entry", "the database server refused this server's credentials"),
    ("does not exist", "the database server has no such database or user"),
    ("server closed the connection", "the connection to the database server was lost"),
    ("connection is lost", "the connection to the database server was lost"),
    ("consuming input failed", "the connection to the database server was lost"),
    ("eof detected", "the connection to the database server was lost"),
    ("connection reset", "the connection to the database server was lost"),
    ("connection is closed", "the connection to the database server was lost"),
)


def client_reason(error: BaseException) -> str:
    """What a server's client is told of ``error`` (a psycopg error under a transaction)."""
    state = getattr(error, "sqlstate", None)
    if isinstance(state, str) and state:
        said = _STATES.get(state) or _STATES.get(state[:2])
        return f"{said} (SQLSTATE {state})" if said else f"the database server failed a statement (SQLSTATE {state})"
    text = str(error).lower()
    for words, said in _CAUSES:
        if words in text:
            return said
    return "the database server could not be reached"


def cannot_open_full(error: BaseException, path: str | None) -> bool:
    """Whether SQLite could not open the database file at ``path`` (``SQLITE_CANTOPEN``,
    "unable to open database file", which says no more) because its file system is full:
    its write-ahead log and shared memory files could not be made, for want of a block or
    an inode. An outage, not a path to correct."""
    orig = getattr(error, "orig", None) or error
    if not path or getattr(orig, "sqlite_errorname", None) != "SQLITE_CANTOPEN":
        return False
    try:
        st = os.statvfs(Path(path).parent)
    except OSError:
        return False
    return st.f_bavail == 0 or (st.f_files > 0 and st.f_favail == 0)
