"""Pausing automatic garbage collection during a pass (gpulayer.scheduling.collector)."""

from __future__ import annotations

import gc
import threading

import pytest

from gpulayer.scheduling import place
from gpulayer.scheduling.collector import collection_paused
from tests.factories import make_job, make_queue, make_state, make_worker


@pytest.fixture(autouse=True)
def _collection_enabled_after():
    was = gc.isenabled()
    yield
    if was:
        gc.enable()
    else:
        gc.disable()


def test_collection_is_off_inside_and_back_on_after_even_when_the_block_raises():
    gc.enable()
    with pytest.raises(RuntimeError), collection_paused():
        assert not gc.isenabled()
        with collection_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()  # the outer block still runs
        raise RuntimeError("boom")
    assert gc.isenabled()


def test_collection_stays_off_when_it_was_off_before():
    gc.disable()
    with collection_paused():
        pass
    assert not gc.isenabled()


def test_overlapping_passes_on_threads_resume_collection_when_the_last_one_ends():
    gc.enable()
    inside, release = threading.Event(), threading.Event()

    def other() -> None:
        with collection_paused():
            inside.set()
            release.wait(10)

    t = threading.Thread(target=other)
    with collection_paused():
        t.start()
        assert inside.wait(10)
    assert not gc.isenabled()  # the other thread's pass is still running
    release.set()
    t.join(10)
    assert gc.isenabled()


def test_place_leaves_collection_as_it_found_it():
    gc.enable()
    place(make_queue([make_job()]), [make_state(make_worker("wkr-a"))], now=0.0)
    assert gc.isenabled()
