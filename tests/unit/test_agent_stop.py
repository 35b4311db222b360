"""How a worker stops: it deregisters after its last heartbeat (a heartbeat that landed after
the deregistration brought the worker back: ``draining`` instead of ``offline``); a second
stopping signal cannot hang it; each of its waits is bounded, once for all its tasks."""

from __future__ import annotations

import signal
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


class OwnLock:
    """A lock that fails when the thread that holds it asks for it again: a plain one (an
    Event's) waits for ever there, and so would this test."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._owner: int | None = None

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        if blocking and self._owner == threading.get_ident():
            raise AssertionError("the thread that holds this lock waits for it: a deadlock")
        if not self._lock.acquire(blocking, timeout):
            return False
        self._owner = threading.get_ident()
        return True

    def release(self) -> None:
        self._owner = None
        self._lock.release()

    def __enter__(self) -> bool:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()


class SignalInside(threading.Condition):
    """An Event's condition on an :class:`OwnLock` whose holder, the main thread, runs the
    SIGTERM handler once while it holds it, as Python does when a second SIGTERM lands there
    (it runs a handler between two bytecodes of the main thread, whatever that holds)."""

    def __init__(self) -> None:
        super().__init__(OwnLock())  # type: ignore[arg-type]
        self.ran = False

    def notify_all(self) -> None:
        if threading.current_thread() is threading.main_thread() and not self.ran:
            self.ran = True
            handler = signal.getsignal(signal.SIGTERM)
            assert callable(handler)
            handler(signal.SIGTERM, None)
        super().notify_all()


def test_a_second_sigterm_while_the_main_thread_holds_a_lock_leaves_the_stop_to_end(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The test of a task killed by the signal that stops its worker once saw the worker hang
    after its task ended, for ever: the test's two SIGTERMs (its own and its ``stop``'s), the
    second landing in the main thread while it held the lock of the Event that the first's
    handler was setting, whose handler then waited for that lock."""
    monkeypatch.setenv("GPULAYER_HOME", str(tmp_path / "home"))
    cp = ControlPlane(Store())
    worker = Agent(cp, capabilities=make_capabilities(), cpu_slots=1, grace=0)
    worker.start()
    conditions = [SignalInside(), SignalInside()]
    worker._stopping._cond, worker._signalled._cond = conditions  # type: ignore[attr-defined]
    before = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}

    def first_sigterm() -> None:  # (once the worker handles it: before, it would end this process)
        wait_for(lambda: signal.getsignal(signal.SIGTERM) is not before[signal.SIGTERM], what="the worker's handler")
        signal.pthread_kill(threading.main_thread().ident or 0, signal.SIGTERM)

    threading.Thread(target=first_sigterm, daemon=True).start()
    try:
        worker.run_forever()
    finally:
        for s, handler in before.items():
            signal.signal(s, handler)
        came = [c.ran for c in conditions]  # (read before the line below sets them all)
        for c in conditions:
            c.ran = True  # (no handler to run any more)
        worker.stop(grace=0)
    assert any(came)  # (the second SIGTERM came: the stop went on)
    assert not cp.get_worker(str(worker.worker_id)).online


class Clock:
    """The agent's clock, which moves only as far as the waits below run out."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.waits: list[float] = []

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)


class NeverDone:
    """A task's end that never comes: each wait for it runs out, moving ``clock`` on."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock

    def wait(self, timeout: float | None = None) -> bool:
        assert timeout is not None
        self.clock.waits.append(timeout)
        self.clock.now += timeout
        return False


def test_tasks_that_do_not_end_once_killed_are_waited_for_together(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """After the grace a stopping worker ends its tasks and waits ``kill_grace + 5`` seconds
    for them to end and report: once for them all, not once each (four slots whose reports
    could not be delivered kept a worker 40 s)."""
    import gpulayer.worker.agent as agent_module

    monkeypatch.setenv("GPULAYER_HOME", str(tmp_path / "home"))
    clock = Clock()
    monkeypatch.setattr(agent_module, "time", clock)
    worker = Agent(ControlPlane(Store()), capabilities=make_capabilities(), cpu_slots=4, grace=0, kill_grace=5)
    for task_id in ("tsk-1", "tsk-2", "tsk-3", "tsk-4"):
        worker._done[task_id] = NeverDone(clock)  # type: ignore[assignment]
    worker.stop()
    assert sum(clock.waits) == pytest.approx(worker.kill_grace + 5)


def test_a_task_still_packing_its_artifacts_as_the_stop_ends_keeps_its_files(tmp_path: Path,
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """The stop waits for a task's end a while after ending it, then removes the worker's
    folders: those of a task still at its end (packing, sending its artifacts) are left to it,
    not removed under it (what it had left went missing from its zip, unsaid)."""
    import sys

    from gpulayer.records import JobState
    from gpulayer.specs import CommandJob
    from gpulayer.worker import artifacts as worker_artifacts

    monkeypatch.setenv("GPULAYER_HOME", str(tmp_path / "home"))
    cp = ControlPlane(Store())
    worker = Agent(cp, capabilities=make_capabilities(), cpu_slots=1, kill_grace=0.1)
    worker.start()
    closed = threading.Event()
    real_close, real_pack = worker.task_files.close, worker_artifacts.pack

    def close(*args: Any) -> None:
        real_close(*args)
        closed.set()

    def pack(folder: Path) -> Any:
        assert closed.wait(30)  # (a pack of many files, still going as the stop ends)
        return real_pack(folder)

    monkeypatch.setattr(worker.task_files, "close", close)
    monkeypatch.setattr(worker_artifacts, "pack", pack)
    leave = ("import os, time\nd = os.environ['GPULAYER_ARTIFACTS_DIR']\n"
             "for n in ('a', 'b', 'c'):\n    open(os.path.join(d, n), 'w').write(n)\n"
             "open(os.path.join(d, 'ready'), 'w').close()\ntime.sleep(60)")
    job = cp.submit(CommandJob(command=[sys.executable, "-c", leave]))
    wait_for(lambda: any(p.name == "ready" for p in (tmp_path / "home").rglob("ready")), what="the files left")
    worker.stop(grace=0)
    wait_for(lambda: cp.list_artifacts(job.id), what="the artifacts stored")
    [stored] = cp.list_artifacts(job.id)
    assert stored.files == 4
    wait_for(lambda: not any((tmp_path / "home" / "tasks").rglob(f"{stored.task_id}*")), what="its folders removed")
    assert cp.get_job(job.id).state is JobState.FAILED  # (lost: its worker left before its report)
