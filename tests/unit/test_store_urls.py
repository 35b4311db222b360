"""A database URL that cannot be used is refused naming the input it came from, the URL as
written (its password hidden) and what is accepted: an in-memory SQLite URL raised
SQLAlchemy's TypeError about pool arguments, a file that could not be created raised
FileNotFoundError, another driver ModuleNotFoundError, a database that could not be opened
SQLAlchemy's DatabaseError or OperationalError, each with a traceback; the URL errors named
neither ``--database`` nor ``GPULAYER_DATABASE_URL``, showed ``postgresql+psycopg://`` where
the user wrote ``postgresql://``, and the password in clear."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpulayer.errors import InvalidInput
from gpulayer.store import Store
from gpulayer.store.urls import redacted


@pytest.mark.parametrize(("url", "says"), [
    ("sqlite://", "an in-memory SQLite database is not accepted"),
    ("sqlite:///:memory:", "an in-memory SQLite database is not accepted"),
    ("sqlite:///file:x?mode=memory&uri=true", "an in-memory SQLite database is not accepted"),
    ("sqlite://host/x.db", "a SQLite URL names a file, not a host"),
    ("sqlite+aiosqlite:///x.db", "driver 'aiosqlite' is not supported"),
    ("postgresql+psycopg2://u:s3cret@127.0.0.1/test", "driver 'psycopg2' is not supported"),
    ("postgresql://u:s3cret@127.0.0.1:notaport/test", "its port is not a number from 1 to 65535"),
    ("mysql://u:s3cret@127.0.0.1/test", "backend 'mysql' is not supported"),
    ("foo", "not a URL"),
])
def test_a_url_it_cannot_use_names_its_variable_hides_its_password_and_says_what_is_accepted(
        url: str, says: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("GPULAYER_DATABASE_URL", url)
    with pytest.raises(InvalidInput) as caught:
        Store(url)
    message = str(caught.value)
    assert message.startswith(f"GPULAYER_DATABASE_URL={redacted(url)!r}: {says}"), message
    assert "accepted: sqlite:///PATH or postgresql://USER@HOST:PORT/DB" in message
    assert "s3cret" not in message and "psycopg://" not in message


def test_a_flag_is_named_as_the_caller_says(tmp_path: Path) -> None:
    with pytest.raises(InvalidInput, match=r"^--database sqlite://: an in-memory"):
        Store("sqlite://", where="--database")


def test_a_file_it_cannot_create_or_open_is_said_not_raised_from_deep_inside(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    with pytest.raises(InvalidInput, match=r"^database URL '.*': cannot create the database file .*a-file/x\.db: .*a-file: File exists"):
        Store(f"sqlite:///{blocker}/x.db")
    not_a_database = tmp_path / "notes.txt"
    not_a_database.write_text("hello\n" * 1000)
    with pytest.raises(InvalidInput, match=r"cannot open the database: file is not a database"):
        Store(f"sqlite:///{not_a_database}")


def test_a_database_server_it_cannot_reach_is_said(postgres_url: str) -> None:
    with pytest.raises(InvalidInput, match=r"^database URL 'postgresql://u:\*\*\*@127\.0\.0\.1:1/x': cannot open the "
                                           r"database: connection failed"):
        Store("postgresql://u:s3cret@127.0.0.1:1/x")


def test_a_usable_url_is_opened(tmp_path: Path) -> None:
    store = Store(f"sqlite:///{tmp_path / 'ok.db'}")
    try:
        assert store.schema_version() > 0
    finally:
        store.dispose()


def test_redacted_keeps_the_url_as_written_but_its_password() -> None:
    assert redacted("postgresql://me:p@ss:w%2Frd@db.example:5432/gl") == "postgresql://me:***@db.example:5432/gl"
    assert redacted("postgres://me@db/gl") == "postgres://me@db/gl"
    assert redacted("sqlite:////tmp/x.db") == "sqlite:////tmp/x.db"


def test_a_password_with_characters_a_url_reserves_is_read_as_the_engine_reads_it(postgres_url: str) -> None:
    """A password written with an unescaped /, ? or # (SQLAlchemy, and so the engine, reads
    it whole; it opened before the URL checks) was refused as "its port is not a number",
    and the error printed the password in clear."""
    for password in ("pa/ss", "pa#ss", "pa?ss"):
        url = postgres_url.replace("://postgres@", f"://postgres:{password}@", 1)
        assert url != postgres_url and redacted(url) == postgres_url.replace("://postgres@", "://postgres:***@", 1)
        store = Store(url)  # (trust auth: the password is not checked)
        try:
            assert store.schema_version() > 0
        finally:
            store.dispose()
    with pytest.raises(InvalidInput) as caught:
        Store("postgresql://u:s3/cret@127.0.0.1:1/x")
    assert str(caught.value).startswith("database URL 'postgresql://u:***@127.0.0.1:1/x': cannot open the database")
    for url in ("postgresql://u:s3@cret@h:5432/x", "postgresql://u:s3@cr:et@h:5432/x"):  # (read: host 'cret@h')
        with pytest.raises(InvalidInput) as caught:
            Store(url)
        assert str(caught.value).startswith("database URL 'postgresql://u:***@h:5432/x': not a URL (more than one @: "
                                            "write an @ of the password as %40)"), caught.value


def test_a_password_given_as_a_query_parameter_is_hidden_too() -> None:
    assert redacted("postgresql://db/gl?sslmode=require&password=s3cret&x=1") == \
        "postgresql://db/gl?sslmode=require&password=***&x=1"
    with pytest.raises(InvalidInput) as caught:
        Store("postgresql://u@127.0.0.1:70000/x?password=s3cret")
    assert "s3cret" not in str(caught.value) and "its port is not a number from 1 to 65535" in str(caught.value)
