"""The worker's log buffer: what a task writes reaches the control plane whole and in order."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from gpulayer.worker.logbuffer import LogBuffer


def test_a_character_split_across_reads_arrives_whole() -> None:
    sent: list[tuple[str, str]] = []
    buf = LogBuffer(lambda chunks, offset: sent.extend(chunks), interval=0.0)  # flush on every write
    data = "ééééé€🙂".encode()
    for i in range(len(data)):  # one byte per read: every character is split
        buf.write("stdout", data[i:i + 1])
    buf.close()
    assert "".join(text for stream, text in sent if stream == "stdout") == "ééééé€🙂"


def test_chunks_from_several_threads_keep_their_order_per_writer() -> None:
    sent: list[tuple[str, str]] = []
    lock = threading.Lock()

    def send(chunks: list[tuple[str, str]], offset: int) -> None:
        with lock:
            sent.extend(chunks)

    buf = LogBuffer(send, interval=0.001)
    lines = [f"line {i}\n".encode() for i in range(2000)]
    for line in lines:
        buf.write("stdout", line)
    buf.close()
    assert "".join(text for _, text in sent) == b"".join(lines).decode()


def test_output_is_shipped_at_once_past_ship_at_and_runs_of_a_stream_stay_whole_and_in_order() -> None:
    from gpulayer.worker.logbuffer import SHIP_AT

    sent: list[list[tuple[str, str]]] = []
    shipped = threading.Event()

    def send(chunks: list[tuple[str, str]], offset: int) -> None:
        sent.append(chunks)
        shipped.set()

    buf = LogBuffer(send, interval=3600.0)  # (no time-based shipping in this test)
    piece = "x" * 1000 + "\n"
    buf.write("stderr", b"first\n")
    for _ in range(SHIP_AT // len(piece) + 1):  # one read more than SHIP_AT characters
        buf.write("stdout", piece.encode())
    assert shipped.wait(60)  # shipped as the run passed SHIP_AT, before the end
    assert len(sent) == 1
    assert sent[0] == [("stderr", "first\n"), ("stdout", piece * (SHIP_AT // len(piece) + 1))]
    buf.write("stdout", b"tail\n")
    buf.write("stderr", b"err\n")
    buf.write("stdout", b"more\n")
    buf.close()
    assert sent[1:] == [[("stdout", "tail\n"), ("stderr", "err\n"), ("stdout", "more\n")]]


def test_a_failing_send_does_not_break_the_task() -> None:
    def send(chunks: list[tuple[str, str]], offset: int) -> None:
        raise RuntimeError("control plane away")

    buf = LogBuffer(send, interval=0.0)
    buf.write("stderr", b"lost but harmless\n")
    buf.close()  # no exception


def test_a_write_does_not_wait_for_a_shipment_held_up_by_an_outage() -> None:
    """The task's reader must go on reading while a shipment retries through an outage of the
    control plane: once the task's process exits its pipes are read for two seconds more, and
    a reader kept waiting lost what the task wrote meanwhile."""
    held, release = threading.Event(), threading.Event()
    sent: list[tuple[str, str]] = []

    def send(chunks: list[tuple[str, str]], offset: int) -> None:
        if not sent:  # the first shipment is held up: the control plane is away
            held.set()
            release.wait(60)
        sent.extend(chunks)

    buf = LogBuffer(send, interval=0.0)  # every write would ship
    buf.write("stdout", b"one\n")
    assert held.wait(60)
    watchdog = threading.Timer(20.0, release.set)  # (a write that waits is released, to fail below)
    watchdog.start()
    try:
        buf.write("stdout", b"two\n")
        buf.write("stderr", b"three\n")
        returned_while_held = not release.is_set()
    finally:
        watchdog.cancel()
        release.set()
    buf.close()
    assert returned_while_held, "a write waited for the shipment on its way"
    assert sent == [("stdout", "one\n"), ("stdout", "two\n"), ("stderr", "three\n")]


def test_output_kept_during_an_outage_ships_in_shipments_a_server_takes() -> None:
    """What piled up while a shipment was held up goes in shipments of about SHIP_AT
    characters, not in one request past the server's limit."""
    from gpulayer.worker.logbuffer import SHIP_AT

    held, release = threading.Event(), threading.Event()
    sent: list[list[tuple[str, str]]] = []

    def send(chunks: list[tuple[str, str]], offset: int) -> None:
        if not sent:
            held.set()
            release.wait(60)
        sent.append(chunks)

    buf = LogBuffer(send, interval=0.0)
    buf.write("stdout", b"first\n")
    assert held.wait(60)
    read = b"y" * 65535 + b"\n"
    for _ in range(3 * SHIP_AT // len(read)):
        buf.write("stdout", read)
    release.set()
    buf.close()
    assert "".join(t for chunks in sent for _, t in chunks) == "first\n" + read.decode() * (3 * SHIP_AT // len(read))
    assert len(sent) >= 4 and max(sum(len(t) for _, t in chunks) for chunks in sent) <= SHIP_AT + len(read)


def test_output_that_could_not_reach_the_control_plane_is_shipped_with_the_next_shipment() -> None:
    from gpulayer.errors import ConnectionFailed

    sent: list[list[tuple[str, str]]] = []

    def send(chunks: list[tuple[str, str]], offset: int) -> None:
        if not sent and chunks[0][1] == "one\n":
            sent.append([])
            raise ConnectionFailed("cannot reach the control plane")  # (its retries ran out)
        sent.append(chunks)

    buf = LogBuffer(send, interval=3600.0)  # (no time-based shipping in this test)
    buf.write("stdout", b"one\n")
    buf.flush()
    buf.write("stdout", b"two\n")
    buf.close()
    assert [c for chunks in sent for c in chunks] == [("stdout", "one\ntwo\n")]


def test_output_the_control_plane_could_not_store_is_shipped_once_it_can() -> None:
    """A full disk under the embedded database fails a shipment with SQLite's error, not a
    ConnectionFailed: the output was dropped (a job that succeeded kept 2,301 of its 4,001
    lines), the last shipment included, while the task's report was retried until it was
    stored. Kept and tried again, it arrives whole and in order."""
    import sqlite3

    failures = iter([True, False, True, True, False])  # the first shipment, then the last twice
    sent: list[tuple[str, str]] = []

    def send(chunks: list[tuple[str, str]], offset: int) -> None:
        if next(failures, False):
            raise sqlite3.OperationalError("database or disk is full")
        sent.extend(chunks)

    buf = LogBuffer(send, interval=3600.0, retry_for=30.0)  # (no time-based shipping in this test)
    buf.write("stdout", b"one\n")
    buf.flush()
    buf.write("stdout", b"two\n")
    buf.flush()
    buf.write("stderr", b"three\n")
    buf.close()
    assert sent == [("stdout", "one\ntwo\n"), ("stderr", "three\n")]


def test_output_the_control_plane_refused_is_not_sent_again() -> None:
    from gpulayer.errors import Conflict

    calls: list[list[tuple[str, str]]] = []

    def send(chunks: list[tuple[str, str]], offset: int) -> None:
        calls.append(chunks)
        raise Conflict("task tsk-1 is already lost")

    buf = LogBuffer(send, interval=3600.0, retry_for=30.0)
    buf.write("stdout", b"late\n")
    buf.close()
    assert calls == [[("stdout", "late\n")]]


def test_the_heartbeat_thread_survives_errors_of_any_kind() -> None:
    import time

    from gpulayer.api import HeartbeatReply
    from gpulayer.errors import GpulayerError
    from gpulayer.worker.agent import Agent
    from tests.factories import make_capabilities, make_worker

    class FlakyAPI:
        def __init__(self) -> None:
            self.beats = 0

        def register_worker(self, capabilities, **kw):  # type: ignore[no-untyped-def]
            return make_worker("wkr-000000000042")

        def heartbeat(self, worker_id, *, running=()):  # type: ignore[no-untyped-def]
            self.beats += 1
            if self.beats == 1:
                raise GpulayerError("internal error: the server answered 500")
            if self.beats == 2:
                raise RuntimeError("database is locked")
            return HeartbeatReply(known=True)

        def poll_work(self, worker_id, *, running=(), wait=0.0):  # type: ignore[no-untyped-def]
            from gpulayer.api import WorkPoll

            time.sleep(min(wait, 0.05))
            return WorkPoll()

        def drain_worker(self, worker_id):  # type: ignore[no-untyped-def]
            pass

        def deregister_worker(self, worker_id):  # type: ignore[no-untyped-def]
            pass

    api = FlakyAPI()
    agent = Agent(api, capabilities=make_capabilities(), heartbeat_interval=0.05)  # type: ignore[arg-type]
    agent.start()
    try:
        deadline = time.monotonic() + 20
        while api.beats < 4 and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        agent.stop(grace=0)
    assert api.beats >= 4, "the heartbeat thread stopped after an error"


def test_a_task_does_not_inherit_the_workers_token(monkeypatch, tmp_path) -> None:  # type: ignore[no-untyped-def]
    from gpulayer.api import TaskAssignment
    from gpulayer.specs import CommandJob
    from gpulayer.worker.agent import Agent
    from tests.factories import make_capabilities

    monkeypatch.setenv("GPULAYER_HOME", str(tmp_path))
    monkeypatch.setenv("GPULAYER_TOKEN", "glt_the-workers-join-token")
    agent = Agent(object(), capabilities=make_capabilities())  # type: ignore[arg-type]
    a = TaskAssignment(task_id="tsk-1", job_id="job-1", attempt=1, node_rank=0, accelerator=None, devices=[],
                       spec=CommandJob(command=["true"], env={"MINE": "1"}))
    env = agent.task_env(a, tmp_path)
    assert "GPULAYER_TOKEN" not in env and env["MINE"] == "1" and env["GPULAYER_JOB_ID"] == "job-1"


def test_a_task_handed_over_twice_runs_once(monkeypatch, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A poll and a report's answer may both hand over the same task (Agent._take): it is
    started once, also when the second hand-over comes after it ended."""
    import threading

    from gpulayer.api import TaskAssignment
    from gpulayer.specs import CommandJob
    from gpulayer.worker.agent import Agent
    from tests.factories import make_capabilities

    monkeypatch.setenv("GPULAYER_HOME", str(tmp_path))

    class RecordingAPI:
        def __init__(self) -> None:
            self.started: list[str] = []
            self.finished = threading.Event()

        def start_task(self, task_id, *, worker_id, how=""):  # type: ignore[no-untyped-def]
            self.started.append(task_id)

        def append_logs(self, task_id, *, worker_id, chunks, offset=None):  # type: ignore[no-untyped-def]
            pass

        def finish_task(self, task_id, **kw):  # type: ignore[no-untyped-def]
            self.finished.set()
            return []

    api = RecordingAPI()
    agent = Agent(api, capabilities=make_capabilities())  # type: ignore[arg-type]
    agent.worker_id = "wkr-1"
    a = TaskAssignment(task_id="tsk-1", job_id="job-1", attempt=1, node_rank=0, accelerator=None, devices=[],
                       spec=CommandJob(command=["true"]))
    agent._take([a])
    agent._take([a])  # while it runs
    assert api.finished.wait(30)
    done = agent._done.get("tsk-1")
    assert done is None or done.wait(30)
    agent._take([a])  # after it ended
    assert api.started == ["tsk-1"]
    assert agent.running_tasks == []


def test_a_functions_result_is_read_as_the_runners_json_text(tmp_path: Path) -> None:
    """The result file of a function that returned is passed on as its text (ResultJSON),
    not parsed; None as no result; an error, or a file that is not the runner's, as before."""
    from gpulayer.api import ResultJSON
    from gpulayer.records import TaskState
    from gpulayer.worker.forking import RUNNER_PATH
    from gpulayer.worker.outcome import TaskOutcome
    from gpulayer.worker.outcome import function_outcome as _function_outcome

    path = tmp_path / "result.json"
    (tmp_path / "tasks.py").write_text("def ok():\n    return {'a': [1, 2.5, None], 'b': 'caf\\u00e9'}\n\n"
                                       "def none():\n    pass\n\n"
                                       "def bad():\n    raise ValueError('no')\n")

    def outcome(function):  # type: ignore[no-untyped-def]
        spec = tmp_path / "spec.json"
        spec.write_text(json.dumps({"function": f"tasks:{function}"}))
        subprocess.run([sys.executable, RUNNER_PATH, str(spec), str(path)], cwd=tmp_path, timeout=60,
                       capture_output=True)  # (its exit code is the task's: 1 for bad)
        return _function_outcome(TaskOutcome(TaskState.SUCCEEDED, exit_code=0), path)

    got = outcome("ok")
    assert isinstance(got.result, ResultJSON) and got.state is TaskState.SUCCEEDED
    assert json.loads(got.result.text) == {"a": [1, 2.5, None], "b": "caf\u00e9"}
    got = outcome("none")
    assert got.state is TaskState.SUCCEEDED and got.result is None  # (no result stored, as before)
    got = outcome("bad")
    assert got.state is TaskState.FAILED and got.result is None and got.error is not None
    assert (got.error.type, got.error.message) == ("ValueError", "no")
    path.write_text("not the runner's")
    got = _function_outcome(TaskOutcome(TaskState.SUCCEEDED, exit_code=0), path)
    assert got.state is TaskState.FAILED and got.error is not None
    assert got.error.message == "the function runner wrote no result"


@pytest.mark.parametrize("python, function", [("/bin/false", "ok"), (sys.executable, "leave")])
def test_a_function_process_that_failed_without_the_runners_word_says_so(
        tmp_path: Path, python: str, function: str) -> None:
    """python='/bin/false' (not a Python, or one too old to read the runner) failed with
    only "exit code 1": now the error says the runner wrote nothing and names the
    interpreter; as does a function that ends its own process."""
    from gpulayer.records import JobError, TaskState
    from gpulayer.worker.forking import RUNNER_PATH
    from gpulayer.worker.outcome import TaskOutcome, function_outcome
    from gpulayer.worker.process import exit_error

    (tmp_path / "tasks.py").write_text("import os\n\ndef ok():\n    return 1\n\ndef leave():\n    os._exit(3)\n")
    spec, path = tmp_path / "spec.json", tmp_path / "result.json"
    spec.write_text(json.dumps({"function": f"tasks:{function}"}))
    code = subprocess.run([python, RUNNER_PATH, str(spec), str(path)], cwd=tmp_path, timeout=60,
                          capture_output=True).returncode
    assert code == (1 if function == "ok" else 3)
    asked = python if function == "ok" else None  # (the job's python=, or the worker's own)
    got = function_outcome(TaskOutcome(TaskState.FAILED, exit_code=code,
                                       error=JobError.ended(TaskState.FAILED, exit_error(code))), path, asked)
    assert got.state is TaskState.FAILED and got.error is not None and got.error.type == "runner"
    assert got.error.message == f"exit code {code} before the function runner wrote a result: " + (
        f"the interpreter {python!r} did not run it (is it a Python 3.10 or newer? its output may say why), or "
        "the function ended its process" if asked else
        "the function ended its process (os._exit, or a crash with no Python exception)")
    killed = function_outcome(TaskOutcome(TaskState.FAILED, exit_code=-9, error=JobError.ended(
        TaskState.FAILED, exit_error(-9))), path, python)  # a signal's end says it already
    assert killed.error is not None and killed.error.message == "killed by signal SIGKILL"


def test_a_functions_error_the_record_could_not_hold_is_kept_cut_and_escaped(tmp_path: Path) -> None:
    """An exception's message past the record's limit (1,000,000 characters), a type name
    past 200, or a lone surrogate in any of them failed the record's validation, and the task
    ended as "worker error: ValidationError ...": the function's error was lost. Now it is
    kept: a lone surrogate as its escape (as stderr shows it), a message cut at its end, a
    traceback at its start (its last line says what was raised), each saying so."""
    from gpulayer.records import MAX_ERROR_MESSAGE, MAX_ERROR_TRACEBACK, MAX_ERROR_TYPE, TaskState
    from gpulayer.worker.outcome import TaskOutcome, function_outcome

    path = tmp_path / "result.json"

    def outcome(type_name: str, message: str, tb: str):  # type: ignore[no-untyped-def]
        path.write_text(json.dumps({"ok": False, "error": {"type": type_name, "message": message, "traceback": tb}}))
        got = function_outcome(TaskOutcome(TaskState.FAILED, exit_code=1), path)
        assert got.state is TaskState.FAILED and got.error is not None
        return got.error

    error = outcome("odd\udcff", "bad \udcff 训练 😀", "Traceback ...\nValueError: bad \udcff 训练 😀\n")
    assert (error.type, error.message) == ("odd\\udcff", "bad \\udcff 训练 😀")
    assert error.traceback == "Traceback ...\nValueError: bad \\udcff 训练 😀\n"
    error = outcome("E" * 300, "x" * (MAX_ERROR_MESSAGE + 5), "line\n" * MAX_ERROR_TRACEBACK + "ValueError: x\n")
    assert error.type == "E" * MAX_ERROR_TYPE
    assert len(error.message) == MAX_ERROR_MESSAGE
    assert error.message.endswith(f"x... ({MAX_ERROR_MESSAGE + 5} characters; the rest cut)")
    assert error.traceback is not None and len(error.traceback) == MAX_ERROR_TRACEBACK
    assert error.traceback.startswith(f"... ({MAX_ERROR_TRACEBACK * 5 + 14} characters; the start cut)\nline\n")
    assert error.traceback.endswith("line\nValueError: x\n")
