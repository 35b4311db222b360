"""A FunctionJob forked from the worker's fork server sees what the same job spawned as a
fresh interpreter would: each test runs a job both ways (a start-up variable in the job's
``env`` makes it spawn) and compares, where the fork server has to do something for it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from gpulayer.client import Client
from gpulayer.control import ControlPlane
from gpulayer.records import JobState
from gpulayer.specs import FunctionJob
from gpulayer.store import Store
from gpulayer.worker.agent import Agent
from gpulayer.worker.fork_servers import ForkServers
from gpulayer.worker.forking import FORKED, SERVER_PATH, ForkServer, unsupported
from tests.factories import make_capabilities
from tests.server_support import until
from tests.support import children_running

pytestmark = pytest.mark.skipif(unsupported() is not None, reason=f"{unsupported()}")

#: a job's env that makes its task spawn (an interpreter reads it as it starts)
SPAWN = {"PYTHONHASHSEED": "0"}

JOBMOD = '''
import multiprocessing.process, os, signal, sys, time

def clock():
    return [time.tzname[0], time.localtime(0).tm_hour, time.strftime("%Z", time.localtime(0))]

def warnoptions():
    return sys.warnoptions

def seen_at_import():
    import lateenv
    return lateenv.SEEN

def multiprocessing_state():
    import multiprocessing
    return [multiprocessing.current_process().authkey.hex(), multiprocessing.process.ORIGINAL_DIR == os.getcwd()]

def as_imported():
    import setter
    return {"env": os.environ.get("SET_BY_PRELOAD"), "dropped": os.environ.get("DROPPED_BY_PRELOAD"),
            "sigterm": signal.getsignal(signal.SIGTERM) is setter.on_term,
            "sigint": signal.getsignal(signal.SIGINT) is setter.on_int,
            "chained": setter.PREVIOUS_SIGINT is signal.default_int_handler,
            "after_fork": setter.AFTER_FORK == [os.getpid()]}

def server():
    return os.getppid()

def copies():
    import helperdep, prelo
    return [helperdep.WHO, prelo.WHO]

def logs_through_a_buffer():
    import buffered
    buffered.log.warning("logged by the task")
    return os.getpid()

def import_newmod():
    try:
        import newmod
    except ImportError:
        return None
    return newmod.WHO

def process_state():
    import resource
    mask = os.umask(0)
    os.umask(mask)
    return [mask, resource.getrlimit(resource.RLIMIT_NOFILE)]

def logs_beside_a_file(folder):
    import logging, logfile
    path = os.path.join(folder, f"data-{os.getpid()}.txt")
    with open(path, "w") as f:
        logfile.log.warning("logged by the task")
        f.write("data\\n")
    with open(path) as f:
        return f.read()
'''

#: modules to preload: one that reads the environment as it is imported, one that sets a
#: variable and a SIGTERM handler and registers an after-fork call of multiprocessing's
LIB = {
    "lateenv.py": "import os\nSEEN = os.environ.get('LATE_VARIABLE')\n",
    "prelo.py": "import helperdep\nWHO = helperdep.WHO\n",
    "helperdep.py": "WHO = \"the worker's copy\"\n",
    "slowpre.py": "import time\ntime.sleep(1.5)\n",
    "buffered.py": "import logging.handlers, os\nlog = logging.getLogger('buffered')\nlog.propagate = False\n"
                   "log.addHandler(logging.handlers.MemoryHandler(100, target=logging.FileHandler(os.environ['LOG_FILE'],"
                   " delay=True)))\nlog.warning('logged as it was imported')\n",
    "logfile.py": "import logging, os\nlogging.basicConfig(filename=os.environ['LOG_FILE'], format='%(message)s')\n"
                  "log = logging.getLogger('logfile')\n",
    "setter.py": '''
import multiprocessing.util, os, signal
os.environ.setdefault("SET_BY_PRELOAD", "yes")
os.environ.pop("DROPPED_BY_PRELOAD", None)

def on_term(signum, frame):
    raise SystemExit(0)

signal.signal(signal.SIGTERM, on_term)
PREVIOUS_SIGINT = signal.getsignal(signal.SIGINT)

def on_int(signum, frame):
    PREVIOUS_SIGINT(signum, frame)  # (chained to what was there: a fresh interpreter's KeyboardInterrupt)

signal.signal(signal.SIGINT, on_int)

class _Held:
    pass

HELD = _Held()
AFTER_FORK = []
multiprocessing.util.register_after_fork(HELD, lambda _held: AFTER_FORK.append(os.getpid()))
''',
}


@pytest.fixture
def bundle(tmp_path: Path) -> Path:
    code = tmp_path / "code"
    code.mkdir()
    (code / "jobmod.py").write_text(JOBMOD)
    return code


@pytest.fixture
def start(home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[..., Any]]:
    """Start an in-process worker with these preloads (found on its PYTHONPATH); returns a
    ``run(function, env=...)`` that runs ``jobmod:function`` and gives (result, how it started)."""
    lib = tmp_path / "lib"
    lib.mkdir()
    for name, text in LIB.items():
        (lib / name).write_text(text)
    monkeypatch.setenv("PYTHONPATH", str(lib))
    agents: list[Agent] = []

    def start(*preload: str) -> Callable[..., tuple[Any, str]]:
        cp = ControlPlane(Store())
        client = Client(cp, location="embedded", default_target="local", control=cp)
        agent = Agent(cp, capabilities=make_capabilities(), cpu_slots=2, preload=preload)
        agent.start()
        agents.append(agent)

        def run(function: str, env: dict[str, str] | None = None, bundle: Path | None = None,
                args: list[Any] | None = None) -> tuple[Any, str]:
            spec = FunctionJob(function=f"jobmod:{function}", bundle=str(bundle or tmp_path / "code"), env=env or {},
                               args=args or [])
            job = cp.wait_job(cp.submit(client.prepare(spec)).id, timeout=120)
            assert job.state is JobState.SUCCEEDED, job.error
            [how] = [e.message for e in cp.events(job.id) if e.kind == "task_started"]
            return job.result, how

        return run

    yield start
    for agent in agents:
        agent.stop(grace=0)


def test_the_jobs_timezone_is_read_again(start, bundle) -> None:  # type: ignore[no-untyped-def]
    """``TZ`` in the job's env (a POSIX rule: no zone files needed) sets the task's local
    time: the server read its own as it started."""
    run = start()
    forked, how = run("clock", env={"TZ": "GLT-3"})
    spawned, how_spawned = run("clock", env={"TZ": "GLT-3", **SPAWN})
    assert how == FORKED and how_spawned.startswith("spawned: ")
    assert forked == spawned == ["GLT", 3, "GLT"]


def test_a_job_that_sets_the_locale_is_spawned(start, bundle, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """An interpreter sets its locale, and its streams' encoding, as it starts."""
    monkeypatch.delenv("LC_ALL", raising=False)
    run = start()
    _, how = run("clock", env={"LC_ALL": "C"})
    assert how == "spawned: the job sets LC_ALL, read as an interpreter starts"


def test_a_change_to_the_workers_environment_reaches_the_next_forked_task(start, bundle, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """A worker in someone's process (the SDK's, in a notebook) sees that process's
    ``os.environ`` change after its fork servers started: the next task is forked from a
    server started with the new one (its start-up variables, its preloads' imports), as a
    spawned task would start with it."""
    monkeypatch.delenv("PYTHONWARNINGS", raising=False)
    monkeypatch.delenv("LATE_VARIABLE", raising=False)
    run = start("lateenv")
    assert run("warnoptions") == ([], f"{FORKED} (preloaded: lateenv)")
    assert run("seen_at_import")[0] is None
    monkeypatch.setenv("PYTHONWARNINGS", "error::DeprecationWarning")
    monkeypatch.setenv("LATE_VARIABLE", "set later")
    assert run("warnoptions") == (["error::DeprecationWarning"], f"{FORKED} (preloaded: lateenv)")
    assert run("seen_at_import") == ("set later", f"{FORKED} (preloaded: lateenv)")
    assert run("seen_at_import", env=SPAWN)[0] == "set later"


def test_a_change_the_server_need_not_see_replaces_nothing(start, bundle, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Without preloads, a variable an interpreter does not read as it starts reaches the
    task through its environment: the server goes on (a variable set before each job would
    otherwise start a server for each)."""
    run = start()
    first, _ = run("server")
    for n in range(3):
        monkeypatch.setenv("RUN_NAME", f"run-{n}")
        assert run("server") == (first, FORKED)


def test_a_worker_whose_environment_keeps_changing_replaces_its_preloads_at_most_so_often(
        start, bundle, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """A change replaces the server with preloads once it has held a while (a variable set
    before each job never does), and not more often than every FOLLOW_EVERY seconds;
    meanwhile tasks are forked without the preloads, and see the new value."""
    monkeypatch.delenv("LATE_VARIABLE", raising=False)
    run = start("lateenv")
    preloaded = f"{FORKED} (preloaded: lateenv)"
    changed = f"{FORKED} (not preloaded: the worker's environment changed since: LATE_VARIABLE)"
    assert run("seen_at_import") == (None, preloaded)
    monkeypatch.setenv("LATE_VARIABLE", "first")
    assert run("seen_at_import") == ("first", changed)  # (just changed: not replaced yet)
    monkeypatch.setattr("gpulayer.worker.fork_servers.FOLLOW_SETTLE", 0.0)
    assert run("seen_at_import") == ("first", preloaded)  # (held: a new server)
    monkeypatch.setenv("LATE_VARIABLE", "second")
    assert run("seen_at_import") == ("second", changed)  # (replaced too recently)
    monkeypatch.setattr("gpulayer.worker.fork_servers.FOLLOW_EVERY", 0.0)
    assert run("seen_at_import") == ("second", preloaded)


def test_a_server_replaced_or_closed_as_it_starts_ends_once_it_answers(home, tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """A worker stopped at once, or whose environment changed while its preloads were
    imported, leaves no server running."""
    lib = tmp_path / "lib"
    lib.mkdir()
    (lib / "slowpre.py").write_text(LIB["slowpre.py"])
    monkeypatch.setenv("PYTHONPATH", str(lib))
    me = psutil.Process()
    forks = ForkServers(sys.executable, {k: v for k, v in os.environ.items()}, ("slowpre",), follow=frozenset())
    forks.prestart()
    monkeypatch.setenv("PYTHONWARNINGS", "error")  # (read as an interpreter starts: every server goes)
    forks.follow_environ()
    server, how = forks.choose(None, forks.follow_environ())
    assert server is not None and how == f"{FORKED} (preloaded: slowpre)"
    until(lambda: len(children_running(me, SERVER_PATH)) == 1, timeout=60, what="the old server to end")
    server.release()
    closed = ForkServer(sys.executable, dict(os.environ), ("slowpre",))
    closed.close()
    closed.ready(60)  # (it answered, and ends: ready() may already say it exited)
    assert closed._ready.is_set()
    until(lambda: len(children_running(me, SERVER_PATH)) == 1, timeout=60, what="the closed one to end")
    forks.close()


def test_a_preload_whose_import_hangs_keeps_no_task_waiting(home, tmp_path, monkeypatch, caplog) -> None:  # type: ignore[no-untyped-def]
    """Once a server's preloads have not been imported within READY_TIMEOUT of its start,
    tasks are forked from a server without them, the one whose import has not ended named
    (each task waited READY_TIMEOUT, then was spawned, for as long as the worker ran); the
    server that hangs is killed as the worker stops."""
    lib = tmp_path / "lib"
    lib.mkdir()
    (lib / "hangs.py").write_text("import time\ntime.sleep(3600)\n")
    monkeypatch.setenv("PYTHONPATH", str(lib))
    monkeypatch.setattr("gpulayer.worker.forking.READY_TIMEOUT", 1.0)
    me = psutil.Process()
    forks = ForkServers(sys.executable, {k: v for k, v in os.environ.items()}, ("numbers", "hangs"),
                        follow=frozenset())
    forks.prestart()
    for _ in range(2):
        server, how = forks.choose(None, forks.follow_environ())
        assert server is not None and how == f"{FORKED} (not preloaded: the import of hangs has not ended)"
        assert server.preload == ()
        server.release()
    assert [r.getMessage() for r in caplog.records if "--preload" in r.getMessage()] == [
        "--preload hangs: its import has not ended 1 s after the fork server started: tasks are forked "
        "without the preloads until it does"]
    forks.close()
    until(lambda: not children_running(me, SERVER_PATH), timeout=60, what="every server to end")


@pytest.mark.parametrize("env", [{}, SPAWN], ids=["forked", "spawned"])
def test_what_a_task_logs_through_a_preloads_buffering_handler_is_written(start, bundle, tmp_path, monkeypatch,
                                                                         env) -> None:  # type: ignore[no-untyped-def]
    """A preload's ``MemoryHandler`` (records kept until exit): what the task logged through
    it is written as the task ends, as logging's own exit handler does in the task's own
    interpreter; a forked task's was lost (the server's handlers were left alone). The
    record the module logged as it was imported is written by whoever imported it: the
    spawned task, and not a forked one (it was the server's)."""
    log_file = tmp_path / "buffered.log"
    monkeypatch.setenv("LOG_FILE", str(log_file))
    run = start("buffered")
    _, how = run("logs_through_a_buffer", env=env)
    assert how == f"{FORKED} (preloaded: buffered)" if not env else how.startswith("spawned: ")
    imported = "" if not env else "logged as it was imported\n"
    assert log_file.read_text() == f"{imported}logged by the task\n"


def test_a_package_installed_with_a_pth_file_after_the_server_started_is_found(home, tmp_path, bundle) -> None:  # type: ignore[no-untyped-def]
    """``pip install -e`` while the worker runs adds a ``.pth`` file to site-packages, which
    an interpreter reads as it starts: a spawned task found the package, and a forked one
    did not (its server had read site-packages long before). Another install there (a new
    ``.dist-info`` folder) changes nothing a start reads, and keeps the server."""
    import venv

    venv.EnvBuilder(symlinks=True, with_pip=False).create(tmp_path / "venv")
    python = str(tmp_path / "venv" / "bin" / "python")
    site = Path(subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True).stdout.strip())
    (tmp_path / "newlib").mkdir()
    (tmp_path / "newlib" / "newmod.py").write_text("WHO = 'installed'\n")
    forks = ForkServers(python, dict(os.environ), ())
    env = {**os.environ, "PYTHONPATH": str(bundle)}
    spec = {"function": "jobmod:import_newmod", "args": [], "kwargs": {}}

    def forked() -> tuple[Any, ForkServer]:
        server, how = forks.choose(None, env)
        assert server is not None and how == FORKED
        try:
            child, out, err = server.start(cwd=str(bundle), env=env, spec=spec, result=str(tmp_path / "result.json"))
            assert child.wait() == 0
            for fd in (out, err):
                os.close(fd)
        finally:
            server.release()
        return json.loads((tmp_path / "result.json").read_text())["result"], server

    try:
        before, first = forked()
        assert before is None
        (site / "unrelated-1.0.dist-info").mkdir()
        assert forked() == (None, first)
        (site / "__editable__.newmod-1.0.pth").write_text(f"{tmp_path / 'newlib'}\n")
        after, second = forked()
        assert second is not first
        spec_file = tmp_path / "spec.json"
        spec_file.write_text(json.dumps(spec))
        subprocess.run([python, str(Path(SERVER_PATH).with_name("function_runner.py")), str(spec_file),
                        str(tmp_path / "spawned.json")], cwd=bundle, env=env, check=True)
        spawned = json.loads((tmp_path / "spawned.json").read_text())["result"]
        assert after == spawned == "installed"
    finally:
        forks.close()


def test_a_preload_whose_import_ends_the_server_is_left_out(home, tmp_path, monkeypatch, caplog) -> None:  # type: ignore[no-untyped-def]
    """A preload whose import ends the process (``os._exit``, a crash in an extension
    module) is left out, named, and the others are preloaded: the server exited before it
    answered, and every task of the worker was spawned ('the fork server exited as it
    started'), none of the preloads named."""
    lib = tmp_path / "lib"
    lib.mkdir()
    (lib / "lateenv.py").write_text(LIB["lateenv.py"])
    (lib / "ends.py").write_text("import os\nos._exit(3)\n")
    monkeypatch.setenv("PYTHONPATH", str(lib))
    forks = ForkServers(sys.executable, {k: v for k, v in os.environ.items()}, ("ends", "lateenv"),
                        follow=frozenset())
    try:
        for _ in range(2):
            server, how = forks.choose(None, forks.follow_environ())
            assert server is not None and how == f"{FORKED} (preloaded: lateenv)"
            server.release()
        assert forks.refused == {"ends": "the fork server exited while importing ends (exit code 3)"}
        assert [r.getMessage() for r in caplog.records if "--preload" in r.getMessage()] == [
            "--preload ends: left out: the fork server exited while importing ends (exit code 3)"]
    finally:
        forks.close()


def test_each_task_has_its_own_multiprocessing_key(start, bundle) -> None:  # type: ignore[no-untyped-def]
    """Where the server imported multiprocessing (torch's import does), a task's
    authentication key is its own, not the server's (shared, it would let one task's
    manager or listener take another task's connections), and it started in its own folder."""
    run = start("multiprocessing")
    (first, ok1), how = run("multiprocessing_state")
    (second, ok2), _ = run("multiprocessing_state")
    assert how == f"{FORKED} (preloaded: multiprocessing)"
    assert first != second and ok1 and ok2


@pytest.mark.parametrize("env", [{}, SPAWN], ids=["forked", "spawned"])
def test_what_a_preload_set_as_it_was_imported_is_the_tasks(start, bundle, monkeypatch, env) -> None:  # type: ignore[no-untyped-def]
    """A preload's import that sets a variable, removes one, and installs handlers of
    SIGTERM and SIGINT (this one chained to the one before it, a fresh interpreter's): a
    spawned task imports it and has all of it, and so has a forked one; multiprocessing's
    after-fork calls run in the task's process, as in a process multiprocessing forks."""
    monkeypatch.setenv("DROPPED_BY_PRELOAD", "the worker's")
    run = start("setter")
    seen, how = run("as_imported", env=env)
    assert how == f"{FORKED} (preloaded: setter)" if not env else how.startswith("spawned: ")
    assert seen == {"env": "yes", "dropped": None, "sigterm": True, "sigint": True, "chained": True,
                    "after_fork": bool(not env)}


def test_a_umask_and_limits_the_worker_set_after_its_servers_started_are_the_tasks(start, bundle) -> None:  # type: ignore[no-untyped-def]
    """A script whose in-process worker already runs sets its umask or a resource limit (a
    notebook's ``os.umask(0o002)`` for a shared folder): a spawned task inherits them from
    the worker, and a forked one had the server's, as that started."""
    import resource

    run = start()
    mask, nofile = os.umask(0o022), resource.getrlimit(resource.RLIMIT_NOFILE)
    try:
        assert run("process_state") == ([0o022, list(nofile)], FORKED)
        os.umask(0o027)
        resource.setrlimit(resource.RLIMIT_NOFILE, (nofile[0] - 1, nofile[1]))
        forked, how = run("process_state")
        spawned, how_spawned = run("process_state", env=SPAWN)
        assert how == FORKED and how_spawned.startswith("spawned: ")
        assert forked == spawned == [0o027, [nofile[0] - 1, nofile[1]]]
    finally:
        os.umask(mask)
        resource.setrlimit(resource.RLIMIT_NOFILE, nofile)


@pytest.mark.parametrize("env", [{}, SPAWN], ids=["forked", "spawned"])
def test_a_file_a_preload_opened_stays_its_own_in_the_task(start, bundle, tmp_path, monkeypatch, env) -> None:  # type: ignore[no-untyped-def]
    """A preload that logs to a file (``logging.basicConfig(filename=...)`` as it is
    imported) logs there from the task too: the child closed the server's descriptors, the
    log file's among them, whose number the task's next ``open`` got, and the module's log
    lines went into the task's own file."""
    monkeypatch.setenv("LOG_FILE", str(tmp_path / "preload.log"))
    run = start("logfile")
    data, how = run("logs_beside_a_file", env=env, args=[str(tmp_path)])
    assert how == f"{FORKED} (preloaded: logfile)" if not env else how.startswith("spawned: ")
    assert data == "data\n"
    assert (tmp_path / "preload.log").read_text() == "logged by the task\n"


SCRIPT = '''
import json, sys
import gpulayer as gl

@gl.remote
def speak():
    print("spoken")
    sys.stdout.write("written\\n")
    return sys.stdout is not None

if __name__ == "__main__":
    handle = speak.remote()
    result = handle.result()
    with open(sys.argv[1], "w") as f:
        json.dump({"result": result, "logs": handle.logs()}, f)
'''


def test_a_task_of_a_worker_started_without_stdout_has_its_own(home, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A script run with its output closed (``python script.py >&-``): its worker's fork
    server has no ``sys.stdout``, and a forked task makes its own over the task's pipe."""
    code = tmp_path / "proj"
    code.mkdir()
    (code / "script.py").write_text(SCRIPT)
    out = tmp_path / "out.json"
    subprocess.run(["bash", "-c", f'exec "{sys.executable}" script.py "{out}" >&- 2>&-'], cwd=code, check=True,
                   timeout=120, env={**os.environ, "GPULAYER_HOME": str(home)})
    seen = json.loads(out.read_text())
    assert seen["result"] is True
    assert "spoken\n" in seen["logs"] and "written\n" in seen["logs"]


@pytest.mark.parametrize(("copy", "own"), [
    ("helperdep.py", "helperdep"),  # a module a preload imported
    ("prelo.py", "prelo"),  # the preload itself
    ("helperdep/__init__.py", "helperdep"),  # a package
    ("helperdep/part.py", None),  # a namespace package's part: the installed module comes first
    ("helperdep", None),  # a file of that name that is no module (data)
])
def test_a_bundle_with_its_own_copy_of_what_the_preloads_imported_gets_its_own(start, bundle, copy, own) -> None:  # type: ignore[no-untyped-def]
    """A fresh interpreter imports the bundle's copy (its folder comes first on its path), and
    the preload that imports it uses that copy too: such a task is forked from the server
    without the preloads, and imports them itself, as a spawned one would."""
    (bundle / copy).parent.mkdir(exist_ok=True)
    if copy.startswith("helperdep"):
        (bundle / copy).write_text("WHO = \"the bundle's own\"\n")
    else:
        (bundle / copy).write_text("import helperdep\nWHO = \"the bundle's own preload\"\n")
    run = start("prelo")
    forked, how = run("copies")
    spawned, _ = run("copies", env=SPAWN)
    assert forked == spawned
    if own is None:
        assert how == f"{FORKED} (preloaded: prelo)" and forked == ["the worker's copy"] * 2
    else:
        assert how == f"{FORKED} (not preloaded: the job has its own {own})"


def test_a_bundle_with_a_sitecustomize_is_spawned_so_that_it_runs(start, bundle) -> None:  # type: ignore[no-untyped-def]
    """``site`` imports a ``sitecustomize`` it finds on the path as an interpreter starts; a
    forked child's server did that long before, from the worker's path: the job spawns."""
    (bundle / "sitecustomize.py").write_text("import os\nos.environ['SITE_HOOK_RAN'] = 'yes'\n")
    (bundle / "jobmod.py").write_text(JOBMOD + "\ndef hooked():\n    return os.environ.get('SITE_HOOK_RAN')\n")
    run = start()
    result, how = run("hooked")
    assert result == "yes"
    assert how.startswith("spawned: ") and how.endswith("/sitecustomize.py would not run in a forked process"), how
    # (a package of that name too, and in a folder of the job's PYTHONPATH)
    (bundle / "sitecustomize.py").unlink()
    hooks = bundle.parent / "hooks" / "sitecustomize"
    hooks.mkdir(parents=True)
    (hooks / "__init__.py").write_text("")
    assert run("server", env={"PYTHONPATH": str(hooks.parent)})[1] == \
        f"spawned: {hooks} would not run in a forked process"
    # usercustomize: only where site imports it (not in a virtual environment, as here)
    import shutil
    import site

    shutil.rmtree(hooks)
    (hooks.parent / "usercustomize.py").write_text("")
    assert run("server", env={"PYTHONPATH": str(hooks.parent)})[1] == (
        f"spawned: {hooks.parent / 'usercustomize.py'} would not run in a forked process" if site.ENABLE_USER_SITE
        else FORKED)
