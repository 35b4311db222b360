"""Fixtures of the control plane's unit tests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from starlette.testclient import TestClient

from gpulayer.control import ControlPlane
from gpulayer.server.app import create_app
from gpulayer.store import Store
from tests.factories import Clock


@pytest.fixture(params=["sqlite", "postgresql"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A fresh database: a SQLite file, then a PostgreSQL schema (see tests/conftest.py)."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'gpulayer.db'}"
    else:
        yield request.getfixturevalue("postgres_url")


@pytest.fixture
def store(store_url: str) -> Iterator[Store]:
    """A store on ``store_url`` (a module may define its own ``store``)."""
    s = Store(store_url)
    yield s
    s.dispose()


@pytest.fixture
def cp(store_url: str) -> Iterator[ControlPlane]:
    """A control plane on ``store_url`` with a hand-moved clock and a 10 s heartbeat timeout."""
    store = Store(store_url)
    plane = ControlPlane(store, heartbeat_timeout=10.0, clock=Clock())
    yield plane
    store.dispose()


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[ControlPlane, TestClient]]:
    """A server's app on a SQLite file, in this process (a module may define its own ``served``)."""
    control = ControlPlane(Store(f"sqlite:///{tmp_path / 'server.db'}"), heartbeat_timeout=30)
    with TestClient(create_app(control, background=False)) as tc:
        yield control, tc
    control.store.dispose()
