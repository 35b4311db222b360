"""The client side of slot lending (gpulayer/lending.py): the lender thread lends only for a
wait that goes on past the grace, takes the slot back when the waits end, tries a failed
call again, and stops asking a control plane that refused or has nothing to lend."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from gpulayer import lending
from gpulayer.api import SlotLent
from gpulayer.errors import ConnectionFailed, NotFound
from tests.support import wait_for


class FakeAPI:
    """``lend_slot`` as a control plane answers it, recording each call."""

    def __init__(self, *, holds_devices: bool = False, fail: list[BaseException] | None = None) -> None:
        self.calls: list[tuple[str, str, bool]] = []
        self.holds_devices = holds_devices
        self.fail = fail or []
        self.lock = threading.Lock()

    def lend_slot(self, job_id: str, *, task_id: str, lent: bool) -> SlotLent:
        with self.lock:
            self.calls.append((job_id, task_id, lent))
            if self.fail:
                raise self.fail.pop(0)
        return SlotLent(lent=lent and not self.holds_devices)


class FakeClient:
    """What the lender uses of a client: its ``api`` (hashable, weakly referable, as one is)."""

    def __init__(self, api: FakeAPI) -> None:
        self.api = api


def client(api: FakeAPI) -> Any:
    return FakeClient(api)


@pytest.fixture(autouse=True)
def in_a_task(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPULAYER_JOB_ID", "job-1")
    monkeypatch.setenv("GPULAYER_TASK_ID", "tsk-1")
    monkeypatch.setattr(lending, "_lender", lending._Lender())
    monkeypatch.setattr(lending, "RETRY", 0.05)


def test_a_wait_that_blocks_lends_the_slot_and_takes_it_back_after() -> None:
    api = FakeAPI()
    with lending.lent_while_waiting(client(api), None):
        wait_for(lambda: api.calls == [("job-1", "tsk-1", True)], 10, "the slot to be lent")
    wait_for(lambda: api.calls[-1:] == [("job-1", "tsk-1", False)], 10, "the slot to be taken back")
    assert len(api.calls) == 2


def test_a_wait_that_ends_within_the_grace_or_of_0_s_lends_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(lending, "GRACE", 0.5)  # (ample for a loaded machine between two lines)
    api = FakeAPI()
    for _ in range(20):
        with lending.lent_while_waiting(client(api), 5):
            pass
    with lending.lent_while_waiting(client(api), 0):  # (a look, not a wait: whatever it takes)
        time.sleep(0.7)
    time.sleep(0.2)
    assert api.calls == []


def test_waits_of_several_threads_share_one_lending() -> None:
    api = FakeAPI()
    c = client(api)
    release = threading.Event()

    def wait() -> None:
        with lending.lent_while_waiting(c, None):
            release.wait(10)

    threads = [threading.Thread(target=wait) for _ in range(3)]
    for t in threads:
        t.start()
    wait_for(lambda: api.calls == [("job-1", "tsk-1", True)], 10, "one lending")
    release.set()
    for t in threads:
        t.join()
    wait_for(lambda: len(api.calls) == 2, 10, "one taking back")
    assert api.calls[1] == ("job-1", "tsk-1", False)


def test_a_call_that_fails_is_tried_again_and_a_refusal_is_not() -> None:
    api = FakeAPI(fail=[ConnectionFailed("unreachable")])
    with lending.lent_while_waiting(client(api), None):
        wait_for(lambda: [c[2] for c in api.calls] == [True, True], 10, "the lending tried again")
    wait_for(lambda: [c[2] for c in api.calls] == [True, True, False], 10, "the slot taken back")

    refusing = FakeAPI(fail=[NotFound("POST /v1/jobs/job-1/lend: no such route")])
    c = client(refusing)
    with lending.lent_while_waiting(c, None):
        wait_for(lambda: len(refusing.calls) == 1, 10, "the one call")
        time.sleep(lending.RETRY * 4)
    with lending.lent_while_waiting(c, None):
        time.sleep(lending.GRACE * 4)
    assert len(refusing.calls) == 1  # not asked again, nothing to take back


def test_a_task_that_holds_devices_is_asked_once() -> None:
    api = FakeAPI(holds_devices=True)
    c = client(api)
    for _ in range(3):
        with lending.lent_while_waiting(c, None):
            time.sleep(lending.GRACE * 4)
    time.sleep(lending.GRACE * 2)
    assert api.calls == [("job-1", "tsk-1", True)]


def test_outside_a_task_nothing_is_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GPULAYER_TASK_ID")
    api = FakeAPI()
    with lending.lent_while_waiting(client(api), None):
        time.sleep(lending.GRACE * 4)
    assert api.calls == []
