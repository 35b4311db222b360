"""A worker's preloads (``--preload``, ``GPULAYER_PRELOAD``): imported once by its fork
server, found loaded by each FunctionJob's forked process, and left out where that would
change what the job sees (its own environment, a module that is unsafe to fork from, a
module changed on disk, a bundle's own copy)."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from gpulayer.client import Client
from gpulayer.control import ControlPlane
from gpulayer.records import JobRecord, JobState
from gpulayer.specs import FunctionJob
from gpulayer.store import Store
from gpulayer.worker.agent import Agent
from gpulayer.worker.fork_servers import ForkServers
from gpulayer.worker.forking import FORKED, SERVER_PATH, unsupported
from tests.factories import make_capabilities
from tests.server_support import until
from tests.support import children_running, start_worker

pytestmark = pytest.mark.skipif(unsupported() is not None, reason=f"{unsupported()}")

#: a module to preload: where (which process) and with what it was imported
PRELOADED = '''
import os
PID = os.getpid()
SEEN = os.environ.get("SEEN_AT_IMPORT")
VERSION = 1
'''

JOBMOD = '''
import os
import preloadme

def where():
    return {"imported_by": preloadme.PID, "me": os.getpid(), "seen": preloadme.SEEN,
            "version": preloadme.VERSION, "file": preloadme.__file__}

def package_version():
    import pkgpre
    return [pkgpre.VERSION, pkgpre.PID, os.getpid()]

def pool():
    import pooled
    return pooled.use()

def exits(folder):
    """Exit handlers of the task's own: an atexit callback, a finalizer, a log handler that
    keeps its records until logging's own exit handler flushes it, a process that
    multiprocessing's joins."""
    import atexit, logging.handlers, multiprocessing, time, weakref
    import exiter

    pid = os.getpid()
    def later():
        time.sleep(0.3)
        open(os.path.join(folder, f"job-process-{pid}"), "w").close()
    def ran(what):
        with open(os.path.join(folder, f"job-ran-{pid}"), "a") as f:
            f.write(what + " ")
    multiprocessing.get_context("fork").Process(target=later).start()
    atexit.register(ran, "atexit")
    weakref.finalize(exiter.HELD, ran, "finalizer")
    log = logging.getLogger("buffered")
    log.addHandler(logging.handlers.MemoryHandler(100, target=logging.FileHandler(os.path.join(folder, f"job-log-{pid}"))))
    log.warning("kept until exit")
    return pid

def parent():
    return os.getppid()

def latecomer_pid():
    import latecomer
    return {"file": latecomer.__file__, "pid": getattr(latecomer, "PID", None), "me": os.getpid()}

def keepers_process():
    import keeper
    print("the task's own output")
    return keeper.PROCESS.pid

def threads_seen():
    import threader
    return threader.STARTED

def seeded():
    import numpy.random
    return numpy.random.SEEDS
'''

#: a module that registers exit handlers as it is imported (and imports logging, which
#: registers its own): the server's, which no task's process may run
EXITER = '''
import atexit, logging, multiprocessing.util, os, weakref

def _mark(name):
    open(os.path.join(os.path.dirname(__file__), "marks", f"{name}-{os.getpid()}"), "w").close()

class _Held:
    pass

HELD = _Held()
atexit.register(_mark, "preload-atexit")
weakref.finalize(HELD, _mark, "preload-finalizer")
'''

#: a module that, as it is imported, starts a process with multiprocessing and gives a log
#: handler that keeps its records until exit a record: the server's, which no task may end
#: or flush
KEEPER = '''
import logging.handlers, multiprocessing, os, time

PROCESS = multiprocessing.get_context("fork").Process(target=time.sleep, args=(600,), daemon=True)
PROCESS.start()
_log = logging.getLogger("keeper")
_log.addHandler(logging.handlers.MemoryHandler(100, target=logging.StreamHandler()))
_log.warning("a record of the server's")
'''

#: a module whose import leaves a thread running: a process that imported it is unsafe to fork
THREADER = '''
import threading
STARTED = 0
_stop = threading.Event()
threading.Thread(target=_stop.wait, daemon=True).start()
STARTED += 1
'''

#: a module whose import starts a thread pool that it ends before each fork, as OpenBLAS (which
#: NumPy loads) does in its pthread_atfork handler, and starts again when next used
POOLED = '''
import os, threading

def _start():
    global _stop
    _stop = threading.Event()
    threading.Thread(target=_stop.wait, daemon=True).start()

def _end():
    _stop.set()
    for t in threading.enumerate():
        if t is not threading.main_thread():
            t.join()

_start()
os.register_at_fork(before=_end)

def use():
    _start()
    return threading.active_count()
'''

#: a module whose after-fork handler waits for a lock a thread of its holds: a child forked
#: from a process that imported it never gets as far as its own code
HANGER = '''
import os, threading
_lock = threading.Lock()
_held = threading.Event()

def _hold():
    with _lock:
        _held.set()
        threading.Event().wait()

threading.Thread(target=_hold, daemon=True).start()
_held.wait()
os.register_at_fork(after_in_child=_lock.acquire)
'''

#: a stand-in for NumPy's global generator, seeded from the system's entropy as it is imported
NUMPY_RANDOM = '''
SEEDS = 0

def seed(value=None):
    global SEEDS
    SEEDS += 1
'''


@pytest.fixture
def lib(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A folder of modules on the worker's PYTHONPATH (as an installed package would be)."""
    folder = tmp_path / "lib"
    (folder / "numpy" / "random").mkdir(parents=True)
    (folder / "preloadme.py").write_text(PRELOADED)
    (folder / "threader.py").write_text(THREADER)
    (folder / "pooled.py").write_text(POOLED)
    (folder / "hanger.py").write_text(HANGER)
    (folder / "exiter.py").write_text(EXITER)
    (folder / "keeper.py").write_text(KEEPER)
    (folder / "marks").mkdir()
    (folder / "badpkg").mkdir()
    (folder / "badpkg" / "__init__.py").write_text("raise SystemExit('not today')\n")
    (folder / "pkgpre").mkdir()
    (folder / "pkgpre" / "__init__.py").write_text("import os\nfrom .sub import VERSION\nPID = os.getpid()\n")
    (folder / "pkgpre" / "sub.py").write_text("VERSION = 1\n")
    (folder / "numpy" / "__init__.py").write_text("")
    (folder / "numpy" / "random" / "__init__.py").write_text(NUMPY_RANDOM)
    monkeypatch.setenv("PYTHONPATH", str(folder))
    # bytecode written, as it is on most machines: what a module's cache (__pycache__) does to
    # the worker's look for changes is part of what is tested
    monkeypatch.delenv("PYTHONDONTWRITEBYTECODE", raising=False)
    monkeypatch.setenv("SEEN_AT_IMPORT", "the worker's")
    return folder


@pytest.fixture
def bundle(tmp_path: Path) -> Path:
    code = tmp_path / "code"
    code.mkdir()
    (code / "jobmod.py").write_text(JOBMOD)
    return code


@pytest.fixture
def start(home: Path, lib: Path) -> Iterator[object]:
    """Start a worker with these preloads (and ``python``, the worker's own by default) on a
    fresh control plane: (control plane, client)."""
    agents: list[Agent] = []

    def start(*preload: str, python: str | None = None) -> tuple[ControlPlane, Client]:
        cp = ControlPlane(Store())
        client = Client(cp, location="embedded", default_target="local", control=cp)
        agent = Agent(cp, capabilities=make_capabilities(), cpu_slots=2, preload=preload, python=python)
        agent.start()
        agents.append(agent)
        return cp, client

    yield start
    for agent in agents:
        agent.stop(grace=0)


def _run(cp: ControlPlane, client: Client, bundle: Path, function: str = "where",
         env: dict[str, str] | None = None, state: JobState = JobState.SUCCEEDED,
         args: list[object] | None = None) -> tuple[JobRecord, str]:
    spec = FunctionJob(function=f"jobmod:{function}", bundle=str(bundle), env=env or {}, args=args or [])
    job = cp.wait_job(cp.submit(client.prepare(spec)).id, timeout=120)
    assert job.state is state, job.error
    [how] = [e.message for e in cp.events(job.id) if e.kind == "task_started"]
    return job, how


def test_a_preloaded_module_is_imported_once_by_the_fork_server(start, bundle):
    cp, client = start("preloadme")
    first, how = _run(cp, client, bundle)
    second, how2 = _run(cp, client, bundle)
    assert how == how2 == f"{FORKED} (preloaded: preloadme)"
    # imported by the server (one process), not by either task's own
    assert first.result["imported_by"] == second.result["imported_by"]
    assert first.result["imported_by"] not in (first.result["me"], second.result["me"])
    assert first.result["seen"] == "the worker's"


def test_the_server_with_the_preloads_starts_with_the_worker(start, bundle):
    cp, client = start("preloadme")
    me = psutil.Process()
    # (by the script's full path: a child pytest forked holds "test_fork_server.py" until it execs)
    [server] = until(lambda: children_running(me, SERVER_PATH), timeout=60,
                     what="the fork server, before any job")
    assert server.cmdline()[-2:] == ["--", "preloadme"]
    job, how = _run(cp, client, bundle)
    assert how == f"{FORKED} (preloaded: preloadme)" and job.result["imported_by"] == server.pid


def test_without_preloads_the_job_imports_the_module_itself(start, bundle):
    cp, client = start()
    job, how = _run(cp, client, bundle)
    assert how == FORKED
    assert job.result["imported_by"] == job.result["me"]


def test_a_job_that_sets_a_variable_is_forked_without_the_preloads(start, bundle):
    cp, client = start("preloadme")
    job, how = _run(cp, client, bundle, env={"SEEN_AT_IMPORT": "the job's", "ANOTHER": "x"})
    assert how == f"{FORKED} (not preloaded: the job sets ANOTHER, SEEN_AT_IMPORT)"
    # its module saw the job's variable as it was imported, in the task's own process
    assert job.result["seen"] == "the job's" and job.result["imported_by"] == job.result["me"]
    # a job that sets nothing still gets the preloaded server
    plain, how = _run(cp, client, bundle)
    assert how == f"{FORKED} (preloaded: preloadme)" and plain.result["imported_by"] != plain.result["me"]


def test_a_preload_that_starts_a_thread_is_left_out(start, bundle, caplog):
    cp, client = start("threader", "preloadme", "no_such_module_here")
    with caplog.at_level(logging.WARNING, logger="gpulayer.worker.forking"):
        job, how = _run(cp, client, bundle)
    assert how == f"{FORKED} (preloaded: preloadme)"
    assert job.result["imported_by"] != job.result["me"]
    said = caplog.text
    assert "--preload threader: left out: the fork server is not safe to fork: importing threader left 2 threads " \
           "running" in said
    assert "--preload no_such_module_here: not imported by" in said
    assert "ModuleNotFoundError: No module named 'no_such_module_here'" in said
    # the task imports it in its own process, as it would without the preload
    threads, how = _run(cp, client, bundle, "threads_seen")
    assert threads.result == 1 and how == f"{FORKED} (preloaded: preloadme)"


def test_a_preloaded_module_changed_on_disk_is_imported_again(start, bundle, lib):
    cp, client = start("preloadme")
    before, _ = _run(cp, client, bundle)
    path = lib / "preloadme.py"
    path.write_text(PRELOADED.replace("VERSION = 1", "VERSION = 22"))
    after, how = _run(cp, client, bundle)
    assert (before.result["version"], after.result["version"]) == (1, 22)
    assert how == f"{FORKED} (preloaded: preloadme)"
    assert after.result["imported_by"] not in (before.result["imported_by"], after.result["me"])  # a new server


def test_an_edit_to_a_preloaded_packages_submodule_reaches_the_next_task(start, bundle, lib):
    cp, client = start("pkgpre")
    before, _ = _run(cp, client, bundle, "package_version")
    # in place, as an editor saves (another size: an edit of the same size within the second
    # would be read from the stale bytecode cache by any Python, fresh or forked)
    with open(lib / "pkgpre" / "sub.py", "r+") as f:
        f.write("VERSION = 22\n")
    after, how = _run(cp, client, bundle, "package_version")
    assert (before.result[0], after.result[0]) == (1, 22) and how == f"{FORKED} (preloaded: pkgpre)"
    assert before.result[1] != before.result[2] and after.result[1] != after.result[2]


def test_a_thread_pool_ended_before_each_fork_is_no_reason_to_leave_a_module_out(start, bundle):
    cp, client = start("pooled", "preloadme")
    job, how = _run(cp, client, bundle, "pool")
    assert how == f"{FORKED} (preloaded: pooled, preloadme)"
    assert job.result == 2  # the task started the pool again, in its own process


def test_a_preload_whose_forked_child_hangs_is_left_out(start, bundle, caplog):
    cp, client = start("hanger", "preloadme")
    with caplog.at_level(logging.WARNING, logger="gpulayer.worker.forking"):
        job, how = _run(cp, client, bundle)
    assert how == f"{FORKED} (preloaded: preloadme)" and job.result["imported_by"] != job.result["me"]
    assert "--preload hanger: left out: the fork server is not safe to fork: importing hanger left an after-fork " \
           "handler that hangs (a child forked from the server did not exit within 5 s)" in caplog.text


def test_a_preload_whose_package_exits_as_it_is_imported_is_named_and_the_rest_preloaded(start, bundle, caplog):
    cp, client = start("badpkg.sub", "preloadme")
    with caplog.at_level(logging.WARNING, logger="gpulayer.worker.forking"):
        job, how = _run(cp, client, bundle)
    assert how == f"{FORKED} (preloaded: preloadme)" and job.result["imported_by"] != job.result["me"]
    assert "--preload badpkg.sub: not imported by" in caplog.text and "SystemExit: not today" in caplog.text


def test_the_site_packages_folder_a_preloads_dependency_came_from_is_stamped_not_its_files(lib):
    # (lib taken for an installed site-packages: a package upgraded there moves its times)
    script = f"""
import json, sys
from gpulayer.worker import preloads
preloads.installed = lambda: (({str(lib) + "/"!r},), ())
before = len(sys.modules)
import pkgpre
loaded = list(sys.modules)[before:]
print(json.dumps([s[0] for s in preloads.stamps(["pkgpre"], loaded, [])[0]]))
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONPATH": os.pathsep.join([str(lib), *sys.path])}).stdout
    assert json.loads(out) == [str(lib / "pkgpre" / "__init__.py"), str(lib)]


def test_a_refused_preloads_file_is_found_without_importing_it(tmp_path):
    """Through every finder (an editable install's, on sys.meta_path), and in a dotted name
    the first part that did not import."""
    (tmp_path / "a" / "b").mkdir(parents=True)
    (tmp_path / "a" / "__init__.py").write_text("")
    (tmp_path / "a" / "b" / "__init__.py").write_text("raise ImportError('broken')\n")
    (tmp_path / "elsewhere" / "edpkg").mkdir(parents=True)
    (tmp_path / "elsewhere" / "edpkg" / "__init__.py").write_text("raise SystemExit('not today')\n")
    script = f"""
import importlib.machinery, importlib.util, sys
from gpulayer.worker import preloads

class Editable:  # as setuptools' editable finder: a name mapped to a folder, not on sys.path
    @classmethod
    def find_spec(cls, name, path=None, target=None):
        if name == "edpkg":
            return importlib.util.spec_from_file_location(
                name, {str(tmp_path / "elsewhere" / "edpkg" / "__init__.py")!r},
                submodule_search_locations=[{str(tmp_path / "elsewhere" / "edpkg")!r}])

sys.meta_path.append(Editable)
sys.path.insert(0, {str(tmp_path)!r})
try:
    import a.b.c
except ImportError:
    pass
print(preloads.found_in("a.b.c"))
print(preloads.found_in("edpkg"))
print("edpkg" in sys.modules)
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}).stdout.splitlines()
    assert out == [str(tmp_path / "a" / "b" / "__init__.py"), str(tmp_path / "elsewhere" / "edpkg" / "__init__.py"),
                   "False"]


def test_a_preload_broken_then_fixed_on_disk_is_preloaded_again(start, bundle, lib, caplog):
    path = lib / "preloadme.py"
    path.write_text(PRELOADED + "\ndef (:\n")
    cp, client = start("preloadme")
    with caplog.at_level(logging.WARNING, logger="gpulayer.worker.forking"):
        failed, how = _run(cp, client, bundle, state=JobState.FAILED)  # (its module imports it too)
    assert how == FORKED and failed.error is not None and failed.error.type == "SyntaxError"
    assert "--preload preloadme: not imported by" in caplog.text and "SyntaxError" in caplog.text
    path.write_text(PRELOADED)
    job, how = _run(cp, client, bundle)
    assert how == f"{FORKED} (preloaded: preloadme)" and job.result["imported_by"] != job.result["me"]


def test_a_preload_installed_after_the_worker_started_is_preloaded_from_the_next_task(start, bundle, lib, caplog):
    cp, client = start("latecomer")
    with caplog.at_level(logging.WARNING, logger="gpulayer.worker.forking"):
        _, how = _run(cp, client, bundle)
    assert how == FORKED and "--preload latecomer: not imported by" in caplog.text
    (lib / "latecomer.py").write_text("import os\nPID = os.getpid()\n")  # (what pip install does)
    _, how = _run(cp, client, bundle)
    assert how == f"{FORKED} (preloaded: latecomer)"


def test_a_missing_preload_does_not_restart_the_server_when_its_folders_change(start, bundle, lib):
    """What is written in a folder of the path (a task's output, a bytecode cache) is not the
    missing preload: the server, and the preloads it imported, stay."""
    cp, client = start("preloadme", "doesnotexist")
    servers = set()
    for i in range(3):
        (lib / f"written-{i}.txt").write_text("output")
        job, how = _run(cp, client, bundle)
        assert how == f"{FORKED} (preloaded: preloadme)"
        servers.add(job.result["imported_by"])
    assert len(servers) == 1


def _venv(tmp_path: Path) -> tuple[str, Path]:
    """A fresh virtual environment's Python, and its site-packages."""
    import venv

    venv.EnvBuilder(symlinks=True, with_pip=False).create(tmp_path / "venv")
    python = str(tmp_path / "venv" / "bin" / "python")
    site = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    return python, Path(site)


def test_a_preload_pip_installs_into_a_venvs_site_packages_is_preloaded_from_the_next_task(start, bundle, tmp_path):
    """The worker's Python a virtual environment's: a preload installed into its
    site-packages after the worker started (under the environment's lib/pythonX.Y, where its
    standard library is said to be too) reaches the next task."""
    python, site = _venv(tmp_path)
    cp, client = start("latecomer", python=python)
    # (the first task may write a bytecode cache on the path: after it, one server)
    servers = [_run(cp, client, bundle, "parent") for _ in range(3)]
    assert [how for _, how in servers] == [FORKED] * 3
    assert servers[1][0].result == servers[2][0].result
    # a task comes while pip unpacks the package: its __init__.py, not yet the module it imports
    package = site / "latecomer"
    package.mkdir()
    (package / "__init__.py").write_text("from .core import VERSION\n")
    _, how = _run(cp, client, bundle, "parent")
    assert how == FORKED  # (its server could not import it)
    (package / "core.py").write_text("VERSION = 1\n")
    (site / "latecomer-1.0.dist-info").mkdir()  # (what pip writes last)
    _, how = _run(cp, client, bundle, "parent")
    assert how == f"{FORKED} (preloaded: latecomer)"


def test_a_preload_in_a_namespace_package_is_not_restarted_by_an_unrelated_install(start, lib, bundle, tmp_path):
    """A preload inside a namespace package (google.protobuf, nvidia.*: the top-level name has
    no __init__.py) is no install under way: installing something else keeps its server."""
    (lib / "nsp").mkdir()
    (lib / "nsp" / "sub.py").write_text("VALUE = 1\n")
    python, site = _venv(tmp_path)
    cp, client = start("nsp.sub", python=python)
    servers = [_run(cp, client, bundle, "parent") for _ in range(3)]
    assert {how for _, how in servers} == {f"{FORKED} (preloaded: nsp.sub)"}
    (site / "unrelated-1.0.dist-info").mkdir()  # (pip installs something else)
    job, _ = _run(cp, client, bundle, "parent")
    assert job.result == servers[-1][0].result


def test_a_preload_caught_as_a_bare_folder_is_preloaded_once_its_init_is_there(start, bundle, lib):
    """A package folder made before its __init__.py (an install under way) imports as a
    namespace with nothing in it: the server that did so is replaced once __init__.py is there."""
    cp, client = start("latecomer")
    _run(cp, client, bundle)
    (lib / "latecomer").mkdir()
    _run(cp, client, bundle)  # (a server that imported the bare folder)
    (lib / "latecomer" / "__init__.py").write_text("import os\nPID = os.getpid()\n")
    job, how = _run(cp, client, bundle, "latecomer_pid")
    assert how == f"{FORKED} (preloaded: latecomer)" and job.result["file"] is not None
    assert job.result["pid"] != job.result["me"]  # (imported by the server)


def test_a_task_writing_bytecode_beside_a_preload_does_not_restart_the_server(start, bundle, lib):
    cp, client = start("pkgpre")
    assert not (lib / "__pycache__").exists()
    first, _ = _run(cp, client, bundle, "package_version")  # its module's import of preloadme
    assert (lib / "__pycache__").is_dir()  # made lib/__pycache__: lib's times moved
    second, _ = _run(cp, client, bundle, "package_version")
    assert first.result[1] == second.result[1]  # the same server


def test_a_replaced_server_serves_the_task_it_was_given_then_ends(lib, bundle, tmp_path):
    forks = ForkServers(sys.executable, dict(os.environ), ("preloadme",))
    try:
        old, how = forks.choose(None, dict(forks.env))
        assert old is not None and how == f"{FORKED} (preloaded: preloadme)"
        (lib / "preloadme.py").write_text(PRELOADED.replace("VERSION = 1", "VERSION = 22"))
        new, _ = forks.choose(None, dict(forks.env))  # another task, meanwhile: a new server
        assert new is not None and new is not old
        # the task given the old one before the change still starts there (it was leased)
        result = tmp_path / "result.json"
        child, out, err = old.start(cwd=str(bundle), env=dict(forks.env), result=str(result),
                                    spec={"function": "jobmod:where", "args": [], "kwargs": {}})
        for fd in (out, err):
            os.close(fd)
        assert child.wait() == 0 and json.loads(result.read_text())["result"]["version"] == 1
        assert old.failed is None
        old.release()  # that task ended: the old server ends too
        until(lambda: old.failed is not None, timeout=30)
        assert new.failed is None
        new.release()
    finally:
        forks.close()


def test_a_bundle_with_its_own_copy_of_a_preloaded_module_imports_its_own(start, bundle, lib):
    (bundle / "preloadme.py").write_text(PRELOADED.replace("VERSION = 1", "VERSION = 'the bundle'"))
    cp, client = start("preloadme")
    job, _ = _run(cp, client, bundle)
    assert job.result["version"] == "the bundle" and job.result["imported_by"] == job.result["me"]
    assert Path(job.result["file"]).parent != lib


def test_numpys_global_generator_is_seeded_again_in_each_task(start, bundle):
    cp, client = start("numpy.random")
    first, how = _run(cp, client, bundle, "seeded")
    second, _ = _run(cp, client, bundle, "seeded")
    # imported (SEEDS 0) by the server; each child seeded it once, as a fresh process's import would
    assert how == f"{FORKED} (preloaded: numpy.random)"
    assert first.result == second.result == 1


def test_a_task_runs_its_own_exit_handlers_not_those_the_preloads_registered(start, bundle, lib):
    """The exit handlers a preload registered as the server imported it are the server's
    (the first task's child would otherwise run them, a cleanup of the server's among them);
    those the task registers run, and the standard library's own for modules the server
    imported: logging's flushes the task's log handlers, multiprocessing's joins its processes."""
    cp, client = start("exiter")
    marks = lib / "marks"
    pids = []
    for _ in range(2):
        job, how = _run(cp, client, bundle, "exits", args=[str(marks)])
        assert how == f"{FORKED} (preloaded: exiter)"
        pids.append(job.result)
    assert sorted(p.name for p in marks.iterdir()) == sorted(
        f"job-{what}-{pid}" for pid in pids for what in ("ran", "log", "process"))
    assert all((marks / f"job-log-{pid}").read_text() == "kept until exit\n" for pid in pids)
    # in a fresh interpreter's order: weakref's exit call is registered with the first
    # finalizer, after the atexit callback, so it runs first
    assert all((marks / f"job-ran-{pid}").read_text() == "finalizer atexit " for pid in pids)


def test_a_task_leaves_the_servers_processes_and_log_handlers_alone(start, bundle):
    """multiprocessing's and logging's exit handlers, registered again in each task, see the
    task's processes and handlers only: the task's exit neither ends (nor tries to join) the
    process a preload started in the server, nor flushes the server's log handler."""
    cp, client = start("keeper")
    pid = None
    try:
        for _ in range(2):
            job, how = _run(cp, client, bundle, "keepers_process")
            assert how == f"{FORKED} (preloaded: keeper)"
            pid = job.result
            assert "".join(c.data for c in cp.logs(job.id)) == "the task's own output\n"
            assert psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    finally:
        if pid is not None:
            with contextlib.suppress(psutil.Error):
                psutil.Process(pid).kill()


def test_unsafe_sees_threads_and_open_device_nodes(tmp_path):
    script = f"""
import os, threading
from gpulayer.worker import preloads
print(preloads.unsafe())
preloads.DEVICE_NODES = ({str(tmp_path / "nvidia")!r},)
fd = os.open({str(tmp_path / "nvidia0")!r}, os.O_CREAT | os.O_RDWR)
print(preloads.unsafe())
os.close(fd)
threading.Thread(target=threading.Event().wait, daemon=True).start()
print(preloads.unsafe())
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}).stdout.splitlines()
    assert out == ["None", f"{tmp_path / 'nvidia0'} open", "2 threads running"]


@pytest.mark.parametrize("how", ["--preload", "GPULAYER_PRELOAD"])
def test_gpulayer_worker_start_preloads_what_it_is_told(home, lib, bundle, how):
    args, env = (["--preload", "preloadme"], {}) if how == "--preload" else ([], {"GPULAYER_PRELOAD": "preloadme"})
    worker = start_worker("--cpu-slots", "1", "--json", *args, env={**env, "GPULAYER_HOME": str(home)})
    try:
        assert worker.stdout is not None
        line = worker.stdout.readline()
        while line and not line.startswith("{"):  # (its log lines come first, on the same pipe)
            line = worker.stdout.readline()
        assert line, "the worker did not start"
        from gpulayer.client import connect

        cp = connect().control
        assert cp is not None
        job = cp.submit(connect().prepare(FunctionJob(function="jobmod:where", bundle=str(bundle))))
        done = cp.wait_job(job.id, timeout=120)
        assert done.state is JobState.SUCCEEDED, done.error
        [started] = [e.message for e in cp.events(job.id) if e.kind == "task_started"]
        assert started == f"{FORKED} (preloaded: preloadme)"
        assert done.result["imported_by"] != done.result["me"]
    finally:
        worker.send_signal(signal.SIGTERM)
        worker.wait(30)
