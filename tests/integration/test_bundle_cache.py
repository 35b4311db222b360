"""A worker's extracted bundles: each new one extracted for a task, and the cache kept within
its limits afterwards, off the task's way."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from gpulayer import config
from gpulayer.client import Client
from gpulayer.control import ControlPlane
from gpulayer.records import JobState
from gpulayer.specs import CommandJob
from gpulayer.store import Store
from gpulayer.worker.agent import Agent
from tests.factories import make_capabilities


def test_a_new_bundle_evicts_the_least_recently_used_past_the_limit(home: Path, tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPULAYER_BUNDLE_CACHE_MB", "0.05")  # (about 52 kB: one of these bundles)
    cp = ControlPlane(Store())
    client = Client(cp, location="embedded", default_target="local", control=cp)
    worker = Agent(cp, capabilities=make_capabilities(), cpu_slots=1)
    worker.start()
    digests = []
    try:
        for name in ("first", "second"):
            code = tmp_path / name
            code.mkdir()
            (code / "data.txt").write_text(name * 10_000)  # (40-60 kB)
            (code / "run.py").write_text(f"print({name!r})\n")
            worker._cache_keeper.ran.clear()
            job = cp.submit(client.prepare(CommandJob(command=[sys.executable, "run.py"], bundle=str(code))))
            assert cp.wait_job(job.id, timeout=120).state is JobState.SUCCEEDED
            assert worker._cache_keeper.ran.wait(60)  # (asked once the bundle was extracted)
            digests.append(cp.get_job(job.id).spec.bundle_digest)
    finally:
        worker.stop(grace=0)
    cache = config.home() / "bundles"
    assert not (cache / digests[0]).exists()  # (the least recently used, over the limit)
