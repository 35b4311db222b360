"""Database URLs as users write them: checked, said back without their password, and named
after the input they came from (``--database``, ``GPULAYER_DATABASE_URL``) in every error.

A URL that cannot be used is an :class:`~gpulayer.errors.InvalidInput` saying which input,
the URL as written (its password hidden: a server's output is its log) and what is accepted,
never SQLAlchemy's or the driver's traceback: an unknown backend or driver, a malformed
port, an in-memory SQLite database (each pooled connection would see its own, empty one),
a file that cannot be created, or a database that cannot be opened.
"""

from __future__ import annotations

import os
import re

from gpulayer.errors import InvalidInput

ACCEPTED = "accepted: sqlite:///PATH or postgresql://USER@HOST:PORT/DB"
#: the drivers GPUlayer drives each backend with (postgresql:// and postgres:// become psycopg 3)
DRIVERS = ("sqlite", "sqlite+pysqlite", "postgresql+psycopg")


#: the password of a URL as SQLAlchemy reads it (all up to the first ``@``, ``/``, ``?`` and
#: ``#`` included), and up to a later ``@`` of the host part (a password written with an
#: unescaped ``@``, which SQLAlchemy would misread: hidden all the same)
_PASSWORD = re.compile(r"^([A-Za-z][\w+.-]*://[^:/@]*):[^@]*@(?:[^@/?#]*@)*")
#: a password given as a query parameter (``?password=``, which psycopg takes too)
_QUERY_PASSWORD = re.compile(r"([?&]password=)[^&#]*", re.IGNORECASE)


def redacted(url: str) -> str:
    """``url`` as written, its password (if any, in its user part or as ``?password=``)
    shown as ``***``."""
    return _QUERY_PASSWORD.sub(r"\1***", _PASSWORD.sub(r"\1:***@", url))


def given(url: str | None, where: str | None = None) -> str:
    """How an error names the database: ``where`` (a flag such as ``--database``, or a
    variable) with the URL as written; by default ``GPULAYER_DATABASE_URL`` when the URL is
    that variable's, the home's database when there is no URL."""
    if url is None:  # (its path: the user may have several homes, and must find the file)
        from gpulayer import config

        try:
            return f"the database in GPULAYER_HOME ({config.home() / 'gpulayer.db'})"
        except Exception:  # (a home that cannot be made says so itself, elsewhere)
            return "the database in GPULAYER_HOME"
    if where is None and os.environ.get("GPULAYER_DATABASE_URL", "").strip() == url:
        where = "GPULAYER_DATABASE_URL"
    shown = redacted(url)
    if where is None:
        return f"database URL {shown!r}"
    return f"{where} {shown}" if where.startswith("-") else f"{where}={shown!r}"


def normalise_url(url: str, where: str | None = None) -> str:
    """Accept ``postgresql://`` as users write it and drive it with psycopg 3; refuse a URL
    that GPUlayer cannot use (see the module doc), naming it as :func:`given` does."""
    from sqlalchemy.engine import make_url

    written = url
    if url.startswith("postgres://"):
        url = "postgresql://" + url[len("postgres://"):]
    if url.startswith("postgresql://"):
        url = "postgresql+psycopg://" + url[len("postgresql://"):]
    name = given(written, where)
    bad_port = InvalidInput(f"{name}: its port is not a number from 1 to 65535; {ACCEPTED}")
    two_ats = InvalidInput(f"{name}: not a URL (more than one @: write an @ of the password as %40); {ACCEPTED}")
    # (read as SQLAlchemy reads it, as the engine will: a password may hold an unescaped
    # / ? or #, which a generic URL parser takes for the end of the host and port)
    try:
        parsed = make_url(url)
    except ValueError:  # (SQLAlchemy's int() of the port: all after the host's ':')
        if url.count("@") > 1:  # (a password's @, written as it is: the rest read as the port)
            raise two_ats from None
        raise bad_port from None
    except Exception:
        raise InvalidInput(f"{name}: not a URL; {ACCEPTED}") from None
    if parsed.host and "@" in parsed.host:  # (the rest of such a password, read as the host)
        raise two_ats
    if parsed.port is not None and not 0 < parsed.port < 65536:
        raise bad_port
    backend = parsed.get_backend_name()
    if backend not in ("sqlite", "postgresql"):
        raise InvalidInput(f"{name}: backend {backend!r} is not supported; {ACCEPTED}")
    if parsed.drivername not in DRIVERS:
        raise InvalidInput(f"{name}: driver {parsed.get_driver_name()!r} is not supported (GPUlayer drives "
                           f"{backend} with {'its own sqlite3' if backend == 'sqlite' else 'psycopg 3'}); "
                           f"{ACCEPTED}")
    if backend == "sqlite":
        if parsed.host or parsed.port or parsed.username:
            raise InvalidInput(f"{name}: a SQLite URL names a file, not a host (sqlite:///relative/path.db, "
                               f"sqlite:////absolute/path.db); {ACCEPTED}")
        if parsed.database in (None, "", ":memory:") or parsed.query.get("mode") == "memory":
            raise InvalidInput(f"{name}: an in-memory SQLite database is not accepted (each connection would "
                               f"see its own, empty one, and no other process any); {ACCEPTED} (a file)")
    return url
