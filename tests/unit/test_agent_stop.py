"""A worker that stops deregisters after its last heartbeat: a heartbeat that landed after
the deregistration brought the worker back (``draining`` instead of ``offline``)."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest

from gpulayer.control import ControlPlane
from gpulayer.store import Store
from gpulayer.worker.agent import Agent
from tests.factories import make_capabilities
from tests.support import wait_for


class SlowHeartbeats:
    """The control plane, with heartbeats that take a while; what happened, in order."""

    def __init__(self, cp: ControlPlane) -> None:
        self.cp = cp
        self.log: list[str] = []
        self.beating = threading.Event()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.cp, name)

    def heartbeat(self, worker_id: str, **kwargs: Any) -> Any:
        self.beating.set()
        time.sleep(0.3)
        reply = self.cp.heartbeat(worker_id, **kwargs)
        self.log.append("heartbeat")
        return reply

    def deregister_worker(self, worker_id: str) -> None:
        self.log.append("deregister")
        self.cp.deregister_worker(worker_id)


def test_the_deregistration_comes_after_a_heartbeat_in_flight(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPULAYER_HOME", str(tmp_path / "home"))
    cp = ControlPlane(Store())
    api = SlowHeartbeats(cp)
    worker = Agent(api, capabilities=make_capabilities(), cpu_slots=1, heartbeat_interval=0.01)  # type: ignore[arg-type]
    record = worker.start()
    assert api.beating.wait(30)
    worker.stop(grace=0)
    wait_for(lambda: "heartbeat" in api.log, what="the heartbeat in flight to end")
    assert api.log[-1] == "deregister"
    assert not cp.get_worker(record.id).online


def test_a_grace_of_centuries_lets_running_tasks_end(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Longer than one wait can be (threading.TIMEOUT_MAX): the stop raised OverflowError and
    the worker died with its task, which was lost."""
    import sys

    from gpulayer.records import JobState
    from gpulayer.specs import CommandJob

    monkeypatch.setenv("GPULAYER_HOME", str(tmp_path / "home"))
    cp = ControlPlane(Store())
    worker = Agent(cp, capabilities=make_capabilities(), cpu_slots=1)
    worker.start()
    go = tmp_path / "go"
    job = cp.submit(CommandJob(command=[sys.executable, "-c", f"import os, time\nwhile not os.path.exists({str(go)!r}): "
                                                              "time.sleep(0.05)"]))
    wait_for(lambda: cp.get_job(job.id).state is JobState.RUNNING, what="the job to run")
    threading.Timer(0.5, go.touch).start()  # (the task ends during the grace)
    worker.stop(grace=1e10)
    assert cp.get_job(job.id).state is JobState.SUCCEEDED
