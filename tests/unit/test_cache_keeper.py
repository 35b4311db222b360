"""A worker keeps its bundle cache within its limits off its tasks' way: one eviction at a
time, in a worker thread, and one more after it for the asks it missed."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from gpulayer import bundles
from gpulayer.worker import cache_keeper


def test_asks_during_a_run_get_one_run_after_it_and_a_failure_does_not_stop_later_ones(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    runs: list[str] = []
    entered = threading.Event()
    release = threading.Event()

    def evict(cache: Path) -> list[str]:
        runs.append(str(cache))
        if len(runs) == 1:
            entered.set()
            assert release.wait(30)
            raise OSError("the first run fails")
        return []

    monkeypatch.setattr(bundles, "evict_cache", evict)
    keeper = cache_keeper.CacheKeeper(tmp_path)
    keeper.ask()
    assert entered.wait(30)
    for _ in range(5):  # (while the first runs: one more run, not five)
        keeper.ask()
    keeper.ran.clear()
    release.set()
    assert keeper.ran.wait(30)
    assert runs == [str(tmp_path)] * 2
    keeper.ran.clear()
    keeper.ask()  # (after a failed run, the next ask runs again)
    assert keeper.ran.wait(30)
    assert len(runs) == 3


def test_a_stopped_worker_waits_for_the_run_going_on_and_starts_no_more(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    runs: list[float] = []
    release = threading.Event()

    def evict(cache: Path) -> list[str]:
        runs.append(0.0)
        assert release.wait(30)
        return []

    monkeypatch.setattr(bundles, "evict_cache", evict)
    keeper = cache_keeper.CacheKeeper(tmp_path)
    keeper.ask()
    closing = threading.Thread(target=keeper.close, args=(30,))
    closing.start()
    closing.join(0.2)
    assert closing.is_alive()  # (waiting for the run)
    release.set()
    closing.join(30)
    assert not closing.is_alive()
    keeper.ask()
    assert runs == [0.0]  # (no run after close)
