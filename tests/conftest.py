"""Fixtures shared by every test directory.

PostgreSQL: tests that need it take the ``postgres_url`` fixture, which gives each test its
own schema in the server at ``GPULAYER_TEST_POSTGRES`` (default
``postgresql://postgres@127.0.0.1:5432/test``). Where no server answers the test is
skipped with a message, unless ``GPULAYER_REQUIRE_POSTGRES=1`` (set by ``.ci/run``), which
turns the skip into a failure.
"""

from __future__ import annotations

import atexit
import os
import secrets
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

PG_DEFAULT = "postgresql://postgres@127.0.0.1:5432/test"

# A command that finds no CLI server on its home starts one in the background, which waits
# ten minutes for the next command (gpulayer.cli.warm). Tests run commands on many homes of
# their own: they start none, but where a test sets this itself (tests/integration/test_cli_warm.py,
# and the README's snippets, which run as a user's would and stop what they started).
os.environ.setdefault("GPULAYER_CLI_SERVER_IDLE", "0")

# A test that names no home of its own (a command pointed at a server, a provider's host)
# gets one of this test process's (each xdist worker its own, not the one it inherits from
# the controller), never the home of whoever runs the tests (~/.gpulayer, or a
# GPULAYER_HOME they exported): nothing there is read by one test or run and found by the next.
os.environ["GPULAYER_HOME"] = tempfile.mkdtemp(prefix="gpulayer-tests-home-")
atexit.register(shutil.rmtree, os.environ["GPULAYER_HOME"], True)


@pytest.fixture(scope="session")
def probed_frameworks() -> Path:
    """The framework probes' cache a first detection by this interpreter leaves, made once
    per test process (:func:`tests.support.first_detection`, which says why)."""
    from tests.support import first_detection

    return first_detection()


@pytest.fixture
def probes_seeded(gpulayer_home: Path, probed_frameworks: Path) -> None:
    """``gpulayer_home`` (gpulayer.testing) starts with the framework probes' cache of
    :func:`probed_frameworks`: for tests of what detection makes of the probes' answers (the
    capability cache, overrides, the CLI's output), where another probe run on a fresh home
    would only import torch in a subprocess once more. The probes are tested on empty homes."""
    from tests.support import seed_probe_cache

    seed_probe_cache(gpulayer_home, probed_frameworks)


def _pg_base() -> str:
    return os.environ.get("GPULAYER_TEST_POSTGRES", PG_DEFAULT)


@pytest.fixture
def postgres_url() -> Iterator[str]:
    """A PostgreSQL URL whose search_path is a fresh schema, dropped after the test."""
    import sqlalchemy as sa

    base = _pg_base()
    engine = sa.create_engine(base.replace("postgresql://", "postgresql+psycopg://", 1))
    try:
        with engine.connect() as conn:
            conn.execute(sa.text("SELECT 1"))
    except Exception as exc:
        engine.dispose()
        message = f"no PostgreSQL server at {base}: {type(exc).__name__}: {exc}".splitlines()[0]
        if os.environ.get("GPULAYER_REQUIRE_POSTGRES") == "1":
            pytest.fail(message + " (GPULAYER_REQUIRE_POSTGRES=1)")
        pytest.skip(message)
    schema = f"gl_test_{secrets.token_hex(6)}"
    with engine.begin() as conn:
        conn.execute(sa.text(f"CREATE SCHEMA {schema}"))
    sep = "&" if "?" in base else "?"
    try:
        yield f"{base}{sep}options=-csearch_path%3D{schema}"
    finally:
        with engine.begin() as conn:
            conn.execute(sa.text(f"DROP SCHEMA IF EXISTS {schema} CASCADE"))
        engine.dispose()


#: what the CLI's global options write into os.environ (gpulayer.cli.root), so that a
#: command run in-process (Typer's CliRunner) leaves it for every later test of the process
_CLI_ENV = ("GPULAYER_URL", "GPULAYER_TOKEN", "GPULAYER_CA", "GPULAYER_HOME")


@pytest.fixture(autouse=True)
def _fresh_client() -> Iterator[None]:
    """Forget the process-wide SDK client after each test (it holds a database and maybe a
    worker), and put back what an in-process CLI command's --url, --token, --ca or --home
    wrote into the environment (a later test's subprocess talked to that dead server)."""
    before = {name: os.environ.get(name) for name in _CLI_ENV}
    yield
    from gpulayer import client

    client.reset()
    for name, value in before.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
