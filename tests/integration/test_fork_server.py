"""FunctionJobs start from the worker's fork server where that is safe, else by a spawn;
the task's ``task_started`` event says which, and a forked task is its own process tree."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from gpulayer.client import Client
from gpulayer.control import ControlPlane
from gpulayer.records import JobRecord, JobState
from gpulayer.specs import CommandJob, FunctionJob
from gpulayer.store import Store
from gpulayer.worker.agent import Agent
from gpulayer.worker.forking import FORKED, SERVER_PATH, ForkServer, unsupported
from gpulayer.worker.task_files import OWNER
from tests.factories import make_capabilities
from tests.server_support import until
from tests.support import children_running

pytestmark = pytest.mark.skipif(unsupported() is not None, reason=f"{unsupported()}")

MODULE = '''
import os, subprocess, sys, time

def facts():
    return {"own_session": os.getsid(0) == os.getpid(), "own_group": os.getpgid(0) == os.getpid(),
            "cwd": os.getcwd(), "mine": os.environ.get("MINE"), "task": os.environ.get("GPULAYER_TASK_ID"),
            "pid": os.getpid()}

def add(a, b):
    print("adding", a, b)
    return a + b

def tree():
    subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    time.sleep(600)

def leave():
    """Start a process that leaves the task's session and outlives it; its pid."""
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True).pid

def which_gpulayer():
    import gpulayer
    return gpulayer.__file__

def traces():
    """What a spare's rehearsal (fork_server._rehearse) must not leave to the task, and
    whether this task's child rehearsed (the fork server runs as __main__)."""
    return {"module": "fork_rehearsal" in sys.modules, "importing": os.environ.get("GPULAYER_IMPORTING_JOB_MODULE"),
            "path": [p for p in sys.path if p.replace(os.sep, "/").endswith("gpulayer/worker")],
            "rehearsed": getattr(sys.modules["__main__"], "REHEARSED", None)}

def touch(path):
    open(path, "w").close()
    return path

def nap():
    time.sleep(600)

class Held:
    pass

HELD = []

def ends_as_a_process_would(folder):
    """Work left for the interpreter's exit, each piece writing a file: a thread, a pool's
    task, an atexit callback, the finalizer of an object still alive."""
    import atexit, concurrent.futures, threading, weakref

    def mark(name, delay=0.0):
        time.sleep(delay)
        with open(os.path.join(folder, name), "w") as f:
            f.write(str(os.getpid()))

    threading.Thread(target=mark, args=("thread", 0.3)).start()
    concurrent.futures.ThreadPoolExecutor(1).submit(mark, "pool", 0.3)
    atexit.register(mark, "atexit")
    HELD.append(Held())
    weakref.finalize(HELD[-1], mark, "finalizer")
    return os.getpid()
'''


@pytest.fixture
def plane(home: Path) -> Iterator[tuple[ControlPlane, Client]]:
    cp = ControlPlane(Store())
    client = Client(cp, location="embedded", default_target="local", control=cp)
    agent = Agent(cp, capabilities=make_capabilities(), cpu_slots=2)
    agent.start()
    try:
        yield cp, client
    finally:
        agent.stop(grace=0)


@pytest.fixture
def bundle(tmp_path: Path) -> Path:
    code = tmp_path / "code"
    code.mkdir()
    (code / "jobmod.py").write_text(MODULE)
    return code


def _run(cp: ControlPlane, client: Client, spec: FunctionJob | CommandJob) -> JobRecord:
    job = cp.submit(client.prepare(spec))
    return cp.wait_job(job.id, timeout=120)


def _how(cp: ControlPlane, job_id: str) -> str:
    [started] = [e.message for e in cp.events(job_id) if e.kind == "task_started"]
    return started


def test_a_function_job_is_forked_into_its_own_session_with_its_environment(plane, bundle) -> None:  # type: ignore[no-untyped-def]
    cp, client = plane
    done = _run(cp, client, FunctionJob(function="jobmod:facts", bundle=str(bundle), env={"MINE": "yes"}))
    assert done.state is JobState.SUCCEEDED, done.error
    assert _how(cp, done.id) == FORKED
    facts = done.result
    assert facts["own_session"] and facts["own_group"]
    assert facts["mine"] == "yes" and facts["task"] == done.tasks[0].id
    assert Path(facts["cwd"]).name == done.spec.bundle_digest
    # and its output reaches the job's log, its result the job
    added = _run(cp, client, FunctionJob(function="jobmod:add", args=[2, 3], bundle=str(bundle)))
    assert added.result == 5 and _how(cp, added.id) == FORKED
    assert "adding 2 3" in "".join(c.data for c in cp.logs(added.id))


def test_a_job_with_another_python_or_start_up_variables_is_spawned(plane, bundle, tmp_path) -> None:  # type: ignore[no-untyped-def]
    cp, client = plane
    other = tmp_path / "python-other"
    other.symlink_to(sys.executable)
    done = _run(cp, client, FunctionJob(function="jobmod:add", args=[1, 1], bundle=str(bundle), python=str(other)))
    assert done.result == 2
    assert _how(cp, done.id).startswith("spawned: the job's Python")
    hashed = _run(cp, client, FunctionJob(function="jobmod:add", args=[1, 2], bundle=str(bundle),
                                          env={"PYTHONHASHSEED": "7"}))
    assert hashed.result == 3
    assert _how(cp, hashed.id) == "spawned: the job sets PYTHONHASHSEED, read as an interpreter starts"
    command = _run(cp, client, CommandJob(command=[sys.executable, "-c", "pass"]))
    assert command.state is JobState.SUCCEEDED and _how(cp, command.id) == "spawned"


@pytest.mark.parametrize("env", [{}, {"PYTHONHASHSEED": "7"}], ids=["forked", "spawned"])
def test_a_function_task_ends_as_its_own_process_would(plane, bundle, tmp_path, env) -> None:  # type: ignore[no-untyped-def]
    """Before the task ends, its non-daemon threads and the work given to its pools finish,
    and its atexit callbacks and the finalizers of what is still alive run: forked (the
    child ends with os._exit, which does none of it) as spawned."""
    cp, client = plane
    marks = tmp_path / "marks"
    marks.mkdir()
    done = _run(cp, client, FunctionJob(function="jobmod:ends_as_a_process_would", args=[str(marks)],
                                        bundle=str(bundle), env=env))
    assert done.state is JobState.SUCCEEDED, done.error
    how = _how(cp, done.id)
    assert how == FORKED if not env else how.startswith("spawned: ")
    assert sorted(p.name for p in marks.iterdir()) == ["atexit", "finalizer", "pool", "thread"]
    assert {p.read_text() for p in marks.iterdir()} == {str(done.result)}


def test_a_forked_task_gets_a_small_spec_in_its_request_and_a_large_one_in_a_file(home, bundle) -> None:  # type: ignore[no-untyped-def]
    """A small spec travels in the child's request (no file); one past INLINE_SPEC_MAX
    (its arguments) in a file of the worker's private folder; either way the task is forked,
    its files are gone once it ended, and the folder once the worker stopped."""
    from gpulayer.worker import agent as agent_module

    cp = ControlPlane(Store())
    client = Client(cp, location="embedded", default_target="local", control=cp)
    worker = Agent(cp, capabilities=make_capabilities(), cpu_slots=1)
    worker.start()
    written: list[str] = []
    real_write = Path.write_text

    def write_text(path: Path, *args: Any, **kwargs: Any) -> int:
        written.append(path.name)
        return real_write(path, *args, **kwargs)

    try:
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(Path, "write_text", write_text)
            small = _run(cp, client, FunctionJob(function="jobmod:add", args=["a", "b"], bundle=str(bundle)))
            big_text = "x" * (agent_module.INLINE_SPEC_MAX + 1)
            big = _run(cp, client, FunctionJob(function="jobmod:add", args=[big_text, "y"], bundle=str(bundle)))
        assert small.result == "ab" and _how(cp, small.id) == FORKED
        assert big.result == big_text + "y" and _how(cp, big.id) == FORKED
        # the large one's alone (and the files that name the folders' worker, see task_files:
        # the private folder's, and that of the root of the tasks' artifacts folders)
        assert sorted(written) == [OWNER, OWNER, f"{big.tasks[0].id}.spec.json"]
        private = worker.task_files.folder
        assert private is not None and private.stat().st_mode & 0o777 == 0o700
        assert list(private.iterdir()) == [private / OWNER]
    finally:
        worker.stop(grace=0)
    assert not private.exists()


def test_a_task_the_fork_server_cannot_start_is_spawned_and_its_event_says_why(plane, bundle, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """No spare to be had (StartFailed): the task is spawned after all, from the spec its
    request would have carried (written to a file then), and ``task_started`` says so."""
    from gpulayer.worker.process import StartFailed

    def no_spare(self: ForkServer, **_: Any) -> None:
        raise StartFailed("no spare for this test")

    cp, client = plane
    # (its bundle in the worker's cache first: a task whose bundle is fetched is marked
    # started before the fetch, so before its fork is tried)
    assert _run(cp, client, FunctionJob(function="jobmod:add", args=[1, 1], bundle=str(bundle))).result == 2
    monkeypatch.setattr(ForkServer, "start", no_spare)
    done = _run(cp, client, FunctionJob(function="jobmod:add", args=[4, 5], bundle=str(bundle)))
    assert done.state is JobState.SUCCEEDED and done.result == 9
    assert _how(cp, done.id) == "spawned: no spare for this test"
    assert "no spare for this test; spawned instead" in "".join(c.data for c in cp.logs(done.id))


def test_a_bundle_with_its_own_copy_of_a_preloaded_module_imports_its_own(plane, bundle) -> None:  # type: ignore[no-untyped-def]
    cp, client = plane
    (bundle / "gpulayer").mkdir()
    (bundle / "gpulayer" / "__init__.py").write_text("MARK = 'the bundle'\n")
    done = _run(cp, client, FunctionJob(function="jobmod:which_gpulayer", bundle=str(bundle)))
    assert _how(cp, done.id) == FORKED
    assert Path(done.result).parent.parent.name == done.spec.bundle_digest


def test_cancel_ends_a_forked_tasks_whole_tree(plane, bundle) -> None:  # type: ignore[no-untyped-def]
    cp, client = plane
    job = cp.submit(client.prepare(FunctionJob(function="jobmod:tree", bundle=str(bundle))))

    def tree() -> list[psutil.Process]:
        procs = []
        for p in psutil.process_iter():
            try:
                if p.environ().get("GPULAYER_JOB_ID") == job.id:
                    procs.append(p)
            except (psutil.Error, OSError):
                continue
        return procs

    # the forked main process shows the server's start-up environment in /proc, so it is
    # found as the parent of the child, which carries the job's
    child = until(lambda: tree(), 60, "the task's child running")[0]
    main = child.parent()
    assert main is not None and os.getpgid(main.pid) == main.pid
    assert _how(cp, job.id) == FORKED
    cp.cancel(job.id)
    until(lambda: not any(p.is_running() and p.status() != psutil.STATUS_ZOMBIE for p in (main, child)), 30,
          "the forked task's tree gone")
    assert cp.wait_job(job.id, timeout=60).state is JobState.CANCELLED


def test_each_task_gets_a_child_of_its_own_and_a_spare_killed_while_waiting_is_replaced(plane, bundle) -> None:  # type: ignore[no-untyped-def]
    cp, client = plane
    first = _run(cp, client, FunctionJob(function="jobmod:facts", bundle=str(bundle)))
    assert first.state is JobState.SUCCEEDED and _how(cp, first.id) == FORKED
    # (this process's child, by the script's full path: its spare and tasks run the same
    # command line, and a child pytest forked holds "test_fork_server.py" until it execs)
    server = until(lambda: children_running(psutil.Process(), SERVER_PATH), 30, "the fork server")[0]
    # the server keeps one child forked ahead of the next task, waiting: kill it
    spare = until(lambda: [p for p in server.children() if p.status() != psutil.STATUS_ZOMBIE], 30,
                  "the server's spare child")[0]
    assert spare.pid != first.result["pid"]
    spare.kill()
    spare.wait(30)
    second = _run(cp, client, FunctionJob(function="jobmod:facts", bundle=str(bundle)))
    assert second.state is JobState.SUCCEEDED, second.error
    assert _how(cp, second.id) == FORKED
    assert len({first.result["pid"], second.result["pid"], spare.pid}) == 3
    assert second.result["own_session"] and second.result["own_group"]


def test_what_a_forked_task_leaves_running_is_killed_and_reaped_by_its_subreaper(plane, bundle) -> None:  # type: ignore[no-untyped-def]
    cp, client = plane
    done = _run(cp, client, FunctionJob(function="jobmod:leave", bundle=str(bundle)))
    assert done.state is JobState.SUCCEEDED, done.error
    assert _how(cp, done.id) == FORKED
    # it escaped the task's session and its parent exited, so it was re-parented to the fork
    # server (the subreaper), where the leftover scan looks; killed when the task ended, then
    # reaped by the server: no zombie stays behind

    def reaped() -> bool:
        try:
            psutil.Process(done.result)
        except psutil.NoSuchProcess:
            return True
        return False

    try:
        until(reaped, 30, "the task's leftover killed and reaped")
    except AssertionError:  # (failed once in a parallel run, not since: say what was left, and where)
        try:
            stray = psutil.Process(done.result)
            seen = f"status {stray.status()}, parent {stray.ppid()} {psutil.Process(stray.ppid()).cmdline()}"
        except psutil.Error as exc:
            seen = f"{type(exc).__name__}: {exc}"
        raise AssertionError(f"the task's leftover {done.result} was not killed and reaped: {seen}") from None


def test_the_fork_server_is_the_subreaper_of_its_tasks_and_reaps_their_strays(bundle, tmp_path) -> None:  # type: ignore[no-untyped-def]
    spec = tmp_path / "spec.json"
    spec.write_text('{"function": "jobmod:leave", "args": [], "kwargs": {}}')
    result = tmp_path / "result.json"
    server = ForkServer(sys.executable, dict(os.environ))
    try:
        assert server.ready() is None
        child, out, err = server.start(cwd=str(bundle), env={**os.environ, "PYTHONPATH": str(bundle)},
                                       spec=str(spec), result=str(result))
        assert child.within == server.subreaper and server.subreaper is not None
        assert child.wait() == 0
        for fd in (out, err):
            os.close(fd)
        stray = psutil.Process(json.loads(result.read_text())["result"])
        # its parent exited: it went to the server, not to init, which says so with the exit
        assert stray.ppid() == server.subreaper
        assert child.strays is True
        stray.kill()

        def reaped() -> bool:
            try:
                return stray.status() == "gone"
            except psutil.NoSuchProcess:
                return True

        until(reaped, 30, "the stray reaped by the server")
        # a task that leaves nothing: its worker is told there is nothing to look for
        clean = tmp_path / "clean.json"
        clean.write_text('{"function": "jobmod:add", "args": [1, 2], "kwargs": {}}')
        child, out, err = server.start(cwd=str(bundle), env={**os.environ, "PYTHONPATH": str(bundle)},
                                       spec=str(clean), result=str(result))
        assert child.wait() == 0 and child.strays is False
        for fd in (out, err):
            os.close(fd)
    finally:
        server.close()


ENVIRON = """
import os, subprocess
from gpulayer.worker import fork_server
os.environ.update({"KEPT": "1", "CHANGED": "old", "GONE": "x"})
env = {k: v for k, v in os.environ.items() if k != "GONE"}
fork_server._set_environ({**env, "CHANGED": "new", "ADDED": "2"})
print(os.environ.get("GONE"), os.environ["KEPT"], os.environ["CHANGED"], os.environ["ADDED"])
# what the task's own processes inherit: the C environment
print(subprocess.run(["sh", "-c", 'echo "${GONE-unset}" "$KEPT" "$CHANGED" "$ADDED"'], env=None,
                     capture_output=True, text=True, check=True).stdout.strip())
"""


def test_a_forked_child_takes_its_tasks_environment_in_os_environ_and_in_what_it_starts() -> None:
    # (in a process of its own: this one's environment stays as it is)
    out = subprocess.run([sys.executable, "-c", ENVIRON], capture_output=True, text=True, check=True)
    assert out.stdout.splitlines() == ["None 1 new 2", "unset 1 new 2"]


def _gated(server: ForkServer, bundle: Path, tmp_path: Path, marker: Path) -> tuple[Any, int, int]:
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps({"function": "jobmod:touch", "args": [str(marker)], "kwargs": {}}))
    return server.start(cwd=str(bundle), env={**os.environ, "PYTHONPATH": str(bundle)}, spec=str(spec),
                        result=str(tmp_path / "result.json"), gated=True)


def test_a_gated_child_runs_nothing_until_it_is_told_to_go_and_nothing_if_let_go(bundle, tmp_path) -> None:  # type: ignore[no-untyped-def]
    server = ForkServer(sys.executable, dict(os.environ))
    try:
        assert server.ready() is None
        marker = tmp_path / "ran"
        child, out, err = _gated(server, bundle, tmp_path, marker)
        # ready, and waiting: its task's code has not run
        until(lambda: psutil.Process(child.pid).status() == psutil.STATUS_SLEEPING, 30, "the child waiting")
        assert child.poll() is None and not marker.exists()
        child.go()
        assert child.wait() == 0 and marker.exists()
        for fd in (out, err):
            os.close(fd)

        let_go = tmp_path / "let-go"
        child, out, err = _gated(server, bundle, tmp_path, let_go)
        child.let_go()
        assert child.wait() == 0 and not let_go.exists()
        for fd in (out, err):
            os.close(fd)
    finally:
        server.close()


def test_the_next_spare_is_forked_when_the_task_ends_or_soon_into_a_long_one(bundle, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A gated task's go asks for the next spare ``after`` it: a short task has exited before
    the spare is forked (no fork beside it), a long one gets its spare about SPARE_AFTER
    into its run; a start that finds none asks for it at once."""
    import time

    from gpulayer.worker import fork_server

    heard: list[str] = []
    at: dict[str, float] = {}
    server = ForkServer(sys.executable, dict(os.environ))
    real_answer = server._answer
    #: cleared: a spare that comes is held back (its message not read) until it is set again
    spares_flow = threading.Event()
    spares_flow.set()

    def answer(msg: dict[str, Any], fds: list[int]) -> None:
        kind = "spare" if "spare" in msg else "exit" if "exit" in msg else "other"
        if kind == "spare":
            spares_flow.wait(60)
        heard.append(kind)
        at.setdefault(kind, time.monotonic())
        real_answer(msg, fds)

    server._answer = answer  # type: ignore[method-assign]
    try:
        assert server.ready() is None
        until(lambda: server._spares, 30, "the first spare")
        heard.clear()
        at.clear()
        child, out, err = _gated(server, bundle, tmp_path, tmp_path / "short")
        went = time.monotonic()
        child.go()
        assert child.wait() == 0
        until(lambda: server._spares, 30, "the next spare")
        # forked once the short task had ended (or, on a machine slow enough that it ran
        # past SPARE_AFTER, not before that)
        assert heard[:2] == ["exit", "spare"] or at["spare"] - went >= fork_server.SPARE_AFTER, (heard, at)
        for fd in (out, err):
            os.close(fd)

        heard.clear()
        asked: list[int | None] = []
        real_ask = server._ask

        def ask(after: int | None = None) -> None:
            asked.append(after)
            real_ask(after)
            if after is None:
                spares_flow.set()

        server._ask = ask  # type: ignore[method-assign]
        nap = {"function": "jobmod:nap", "args": [], "kwargs": {}}
        env = {**os.environ, "PYTHONPATH": str(bundle)}
        first, out, err = server.start(cwd=str(bundle), env=env, spec=nap, result=str(tmp_path / "1.json"), gated=True)
        first.go()
        until(lambda: server._spares, 30, "a spare while the long task runs")
        assert heard == ["spare"] and first.poll() is None and asked == [first.pid]
        # the next long one takes that spare, and its go defers the next; a start that comes
        # meanwhile asks for it at once rather than wait for either. (That start must come
        # while the spare is deferred: on a slow machine SPARE_AFTER may pass before it looks
        # for a spare, so a spare that comes before it asked is held back until it has.)
        second, out2, err2 = server.start(cwd=str(bundle), env=env, spec=nap, result=str(tmp_path / "2.json"),
                                          gated=True)
        spares_flow.clear()
        second.go()
        third, out3, err3 = _gated(server, bundle, tmp_path, tmp_path / "third")
        assert asked == [first.pid, second.pid, None]
        third.go()
        assert third.wait() == 0 and first.poll() is None and second.poll() is None
        assert fork_server.SPARE_AFTER < 1.0
        for fd in (out, err, out2, err2, out3, err3):
            os.close(fd)
    finally:
        spares_flow.set()
        server.close()


def test_a_forked_task_whose_start_is_refused_runs_nothing(plane, bundle, tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    cp, client = plane
    warm = _run(cp, client, FunctionJob(function="jobmod:facts", bundle=str(bundle)))
    assert _how(cp, warm.id) == FORKED  # the fork server is up: the next task is sent to its spare first
    marker = tmp_path / "ran"
    submitted: list[str] = []
    refused = threading.Event()
    start_task = cp.start_task
    children: list[Any] = []
    start = ForkServer.start

    def kept(self: ForkServer, **kw: Any) -> Any:
        out = start(self, **kw)
        children.append(out[0])
        return out

    monkeypatch.setattr(ForkServer, "start", kept)

    def cancelled_first(task_id: str, **kw: Any) -> None:
        # the job is cancelled after the worker's poll took its task, before it could start
        until(lambda: submitted, 30, "the submit")
        cp.cancel(submitted[0], reason="test")
        try:
            start_task(task_id, **kw)
        finally:
            refused.set()

    monkeypatch.setattr(cp, "start_task", cancelled_first)
    job = cp.submit(client.prepare(FunctionJob(function="jobmod:touch", args=[str(marker)], bundle=str(bundle))))
    submitted.append(job.id)
    assert refused.wait(60)
    done = cp.wait_job(job.id, timeout=60)
    assert done.state is JobState.CANCELLED
    assert not [e for e in cp.events(job.id) if e.kind == "task_started"]
    [child] = children
    assert child.wait() == 0  # it exited, let go, before it ran anything
    assert not marker.exists()


REHEARSE = """
import os, socket, sys
from gpulayer.worker import fork_server, function_runner

imported = []
real_import = fork_server.importlib.import_module
fork_server.importlib.import_module = lambda name, package=None: (imported.append(name), real_import(name, package))[1]
warm = fork_server._Warm(function_runner, [], {}, set(), None, os.getpid(), dict(os.environ), {}, {}, frozenset(), 0, None)
ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
if sys.argv[1] == "waiting":
    ours.send(b"{}")  # the task came before the spare began: no rehearsal
path, environ = list(sys.path), dict(os.environ)
fork_server._rehearse(theirs, warm)
print("fork_rehearsal" in imported, "fork_rehearsal" in sys.modules, sys.path == path, dict(os.environ) == environ)
"""


@pytest.mark.parametrize(("task", "rehearsed"), [("not yet", True), ("waiting", False)])
def test_a_spare_rehearses_an_import_while_no_task_is_there_and_forgets_it(task: str, rehearsed: bool) -> None:
    out = subprocess.run([sys.executable, "-c", REHEARSE, task], capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"})
    assert out.stdout.split() == [str(rehearsed), "False", "True", "True"]


def test_a_forked_task_sees_nothing_of_its_spares_rehearsal(plane, bundle) -> None:  # type: ignore[no-untyped-def]
    cp, client = plane

    def rehearsed() -> JobRecord | None:
        done = _run(cp, client, FunctionJob(function="jobmod:traces", bundle=str(bundle)))
        assert done.state is JobState.SUCCEEDED, done.error
        assert _how(cp, done.id) == FORKED
        return done if done.result["rehearsed"] else None

    # (a spare rehearses while no task has come: the next one is forked as this one runs)
    done = until(rehearsed, 60, "a task from a spare that rehearsed")
    assert done.result == {"module": False, "importing": None, "path": [], "rehearsed": True}
