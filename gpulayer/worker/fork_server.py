"""A warm interpreter that forks one child per FunctionJob task (the worker's fork server).

Started by :mod:`gpulayer.worker.forking` in the job's Python, with one end of an
``AF_UNIX``/``SOCK_SEQPACKET`` socket pair. It loads the function runner (and, when it
imports, ``gpulayer`` itself, which most job modules import), then keeps the worker supplied
with children forked ahead of their tasks: a spare waits detached, with nothing of this
server's open but its own socket, and the worker is handed the other end of that socket. The worker starts a task
by sending its request straight to a spare (a JSON message with the task's cwd, environment,
``sys.path`` entries, its function spec (the spec itself, or a file's path when it is large)
and where the result goes, and the write ends of the task's stdout and stderr pipes passed
as file descriptors), so a task's start is one message and no round trip through this server.
While it waits, a spare rehearses: it imports a module like a job's (see :func:`_rehearse`)
and forgets it, so the pages that import writes are copied before the task comes.
A ``gated`` request makes the child get ready (all of the list below but the runner) and
then wait for ``go`` from the worker, which marks the task started meanwhile: the durable
start write and the child's preparation overlap, and no code of the job runs before the
write. The spare then becomes the task's process tree:

* a new session (so its own process group), ``PR_SET_PDEATHSIG`` (SIGKILL when this server
  dies; this server dies with the worker the same way);
* stdin /dev/null, stdout and stderr the task's pipes, every other descriptor closed but
  those the preloads' imports left open (a log file of ``logging.basicConfig(filename=...)``:
  closed, its number would be the next file the task opens, and the module's writes would
  go there);
* the task's cwd, environment (``os.environ`` replaced, so the processes it starts see it)
  and ``sys.path`` (the task's ``PYTHONPATH`` entries before this interpreter's own);
  preloaded modules that the task's own path would shadow (a bundle with its own copy of
  ``gpulayer``) are dropped, so they are imported afresh from there (a task with its own
  copy of what the worker's preloads imported is given a server without them: the ``tops``
  of the ``ready`` message, see ``ForkServer.shadowed``); what the preloads' imports set (a
  variable, a SIGINT or SIGTERM handler) as a fresh interpreter importing them would have it,
  the timezone read again where the task's ``TZ`` differs, ``multiprocessing``'s key and
  first folder the task's own, the umask and resource limits the worker has now where it
  changed them since this server started (:mod:`.fresh`);
* then it runs the function runner, as ``python function_runner.py SPEC RESULT`` would,
  and ends as that process would: once the task's non-daemon threads have ended and the
  ``atexit`` callbacks the task registered have run (not those this server's imports
  registered: :func:`.fresh.own_exit_handlers`). Unlike an interpreter's exit, it does not then
  free the objects still alive (``os._exit``): a file the task left open at module level
  is not flushed.

This server is the children's subreaper (``PR_SET_CHILD_SUBREAPER``): whatever a task leaves
running when its main process exits is re-parented here, not to init, so the worker looks
for a task's leftovers among this server's descendants instead of every process on the
machine. It reaps those strays once they are ended.

Modules the worker was told to preload (``--preload``, ``GPULAYER_PRELOAD``: the arguments
after ``--``) are imported next, one at a time, each with the worker's environment; one that
fails to import is named in ``refused``, and one that leaves the server unsafe to fork
(a thread running, an accelerator's device open: see :func:`.preloads.unsafe`) ends the list, named
in ``offender`` (the worker starts a server without it). The ``ready`` message lists
``stamps``, the files and folders those modules came from and the paths where a missing one
would appear, so the worker can tell when one changed (see :func:`.preloads.stamps`), and
``sites``, preloads or not, what ``site`` read from each site-packages folder as this server
started (:func:`.preloads.site_stamps`).

Messages to the worker: ``{"importing": NAME}`` as each of the worker's preloads is imported
(the worker names the one that does not end); ``{"ready": ...}`` once; ``{"spare": PID}`` with the spare's socket
as a file descriptor (one at start, then one for each ``{"want": true}`` the worker sends
when it took one or found its spare dead; ``{"want": true, "after": PID}``, sent as a task's
child is told to go, is answered when that child exits or :data:`SPARE_AFTER` into its run);
``{"exit": CODE, "pid": PID, "strays": BOOL, "cpu": [USER, SYSTEM], "rss": BYTES}`` when a
child ended, whether it had a task or died waiting (negative: the signal; ``strays``: whether
this server then had children it did not fork, a task's leftovers, see :func:`_strays`;
``cpu`` and ``rss``: what it used, as ``wait4`` read it reaping it, see
:mod:`gpulayer.worker.usage`). The server exits when the worker closes
its end; its children die with it.

Unlike a fresh interpreter, a forked child shares this server's hash seed. Linux only; like
the runner, it imports only the standard library.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import importlib
import importlib.util
import itertools
import json
import os
import select
import selectors
import signal
import socket
import sys
import time
import traceback
from typing import Any, NamedTuple


def _load(name: str, path: str) -> Any:
    """The module in the file at ``path``, loaded under ``name``, a name of GPUlayer's own:
    this server runs as a script in the job's Python, which need not have GPUlayer, and a
    job's own module of the same name must not find it in ``sys.modules``."""
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise SystemExit(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module

#: what a child does to be what a fresh interpreter would be (its own file: see _load)
_fresh = _load("_gpulayer_fresh", os.path.join(os.path.dirname(os.path.abspath(__file__)), "fresh.py"))

#: what the worker sends a gated child once the task is marked started
GO = b"go"
#: a spare asked for as a task starts (``{"want": true, "after": PID}``) is forked when that
#: task's child exits, or this many seconds into its run, whichever comes first: a short
#: task runs without a fork beside it (on two cores the fork and the new spare's rehearsal
#: took CPU from the task and its worker: 0.5-1.2 ms of a no-op's round trip), a long one
#: still has a spare ready for the next task soon after it began
SPARE_AFTER = 0.02
_PR_SET_PDEATHSIG = 1
_PR_SET_CHILD_SUBREAPER = 36
_MAX_MESSAGE = 1 << 22
#: above every descriptor a child may have inherited
_MAX_FD = os.sysconf("SC_OPEN_MAX") if hasattr(os, "sysconf") else 65536


def _send(sock: socket.socket, message: dict[str, Any] | bytes) -> None:
    """A message to the worker: a dict as JSON, or one already written (the two sent each
    task, a spare and an exit, are formatted directly: each page that ``json.dumps``'s Python
    code writes after a fork is copied, 0.06-0.1 ms of this server's CPU a task)."""
    with contextlib.suppress(OSError):
        sock.send(message if isinstance(message, bytes) else json.dumps(message).encode())


def _origin(module: Any) -> str | None:
    """The ``sys.path`` entry a module was imported from."""
    file: str | None = getattr(module, "__file__", None)
    if not file:
        return None
    here = os.path.dirname(os.path.abspath(file))
    return os.path.dirname(here) if os.path.basename(file) == "__init__.py" else here


def _provides(entry: str, name: str) -> bool:
    base = os.path.join(entry or ".", name)
    return os.path.isdir(base) or os.path.exists(base + ".py")


def _shadowed(origins: dict[str, str | None], search: list[str], entries: set[str]) -> list[str]:
    """Preloaded modules that the task's ``search`` path would import from elsewhere, or
    not at all. ``entries``: this server's own path entries when it preloaded; a module it
    found through none of them came from an import hook (an editable install), which the
    task's interpreter would use the same way."""
    out = []
    for name, origin in origins.items():
        first = next((os.path.abspath(e or ".") for e in search if _provides(e, name)), None)
        if first is None and origin not in entries:
            continue
        if first != origin:
            out.append(name)
    return out


class _Warm(NamedTuple):
    """What every child needs from the server: the runner and what it knows of its path."""

    runner: Any
    base_path: list[str]
    origins: dict[str, str | None]
    entries_then: set[str]
    prctl: Any
    server: int
    #: the environment this server started with
    environ: dict[str, str]
    #: what the worker's preloads changed of it as they were imported (None: removed)
    preload_environ: dict[str, str | None]
    #: the handlers of SIGINT and SIGTERM the worker's preloads installed as they were imported
    preload_signals: dict[signal.Signals, Any]
    #: the descriptors the preloads' imports left open (above 2), kept open in each child
    preload_fds: frozenset[int]
    #: the worker (this server's parent), and its umask and resource limits as this server
    #: started with them (see :func:`.fresh.follow_worker`)
    worker: int
    worker_then: Any


def _open_fds() -> set[int]:
    """This process's open descriptors (none where they cannot be listed; not the one the
    listing itself used, closed by then)."""
    try:
        listed = [int(fd) for fd in os.listdir("/proc/self/fd") if fd.isdigit()]
    except OSError:
        return set()
    out = set()
    for fd in listed:
        with contextlib.suppress(OSError):
            os.fstat(fd)
            out.add(fd)
    return out


def _close_others(keep: list[int]) -> None:
    """Close every descriptor above 2 but ``keep`` (sorted)."""
    low = 3
    for fd in keep:
        if fd >= low:
            os.closerange(low, fd)
            low = fd + 1
    os.closerange(low, _MAX_FD)


def _detach(warm: _Warm) -> None:
    """A new child's own session, and death with the server."""
    os.setsid()
    if warm.prctl is not None:
        warm.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != warm.server:  # the server died before the call: nobody would end us
            os._exit(137)


def _set_environ(env: dict[str, str]) -> None:
    """``os.environ`` (and so the C environment the task's own processes inherit) becomes
    ``env``; only what differs is changed (a task's environment is mostly the server's, and
    replacing it whole cost 0.2 ms a task)."""
    for key in [k for k in os.environ if k not in env]:
        del os.environ[key]
    for key, value in env.items():
        if os.environ.get(key) != value:
            os.environ[key] = value


def _child(req: dict[str, Any], fds: list[int], warm: _Warm, sock: socket.socket) -> None:
    """Become the task (after :func:`_detach`): its descriptors, cwd, environment and path;
    then, when the request is ``gated``, wait for the worker's ``go`` on ``sock`` (it marks
    the task started meanwhile; anything else, or its end closed, and the child exits having
    run nothing); then the function runner, and what an interpreter does as it exits
    (:func:`.fresh.shut_down`). Never returns."""
    code = 1
    ran = False
    try:
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        os.dup2(fds[0], 1)
        os.dup2(fds[1], 2)
        _close_others(sorted({sock.fileno(), *warm.preload_fds}))
        # (each call into .fresh made only where it has something to do: every object a
        # child touches is a page of the server's copied, see bench/fork_server.py)
        if sys.stdout is None or sys.stderr is None:
            _fresh.streams()
        os.chdir(req["cwd"])
        _set_environ(req["env"])
        if warm.preload_environ or warm.preload_signals or req["env"].get("TZ") != warm.environ.get("TZ"):
            _fresh.as_imported(req["env"], warm.environ, warm.preload_environ, warm.preload_signals)
        else:  # (as in a fresh interpreter)
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            signal.signal(signal.SIGINT, signal.default_int_handler)
        if "multiprocessing.process" in sys.modules:
            _fresh.fresh_multiprocessing(req["cwd"])
        if warm.worker > 1:
            _fresh.follow_worker(warm.worker, warm.worker_then)
        entries = [p for p in req["path"] if p]
        # the runner puts the cwd first (see function_runner._setup_path)
        for name in _shadowed(warm.origins, [req["cwd"], *entries, *warm.base_path], warm.entries_then):
            for mod in [m for m in sys.modules if m == name or m.startswith(name + ".")]:
                del sys.modules[mod]
        sys.path[:] = [*entries, *warm.base_path]
        # a generator seeded from the system's entropy as it was imported would give every
        # child the server's numbers: Python reseeds its own random module at a fork, and
        # NumPy's global one (preloaded) is reseeded here, as a fresh process would seed it
        numpy_random = sys.modules.get("numpy.random")
        if numpy_random is not None:
            with contextlib.suppress(Exception):
                numpy_random.seed()
        spec = req["spec"]  # a spec file's path, or the spec itself
        sys.argv[:] = [warm.runner.__file__, spec if isinstance(spec, str) else "-", req["result"]]
        if req.get("gated") and sock.recv(16) != GO:
            os._exit(0)  # let go before it started: nothing ran
        sock.close()
        ran = True
        code = warm.runner.report(spec, req["result"])
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException:
        with contextlib.suppress(Exception):
            traceback.print_exc()
    finally:
        if ran:
            with contextlib.suppress(BaseException):
                _fresh.shut_down()
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        os._exit(code)


#: a module imported by a spare while it waits (see _rehearse), and the folder it is found in
_REHEARSAL = "fork_rehearsal"
_HERE = os.path.dirname(os.path.abspath(__file__))
#: in a child: whether it rehearsed (the tests look, from the task: ``__main__.REHEARSED``)
REHEARSED = False


def _rehearse(sock: socket.socket, warm: _Warm) -> None:
    """While no task has come yet: do once what the task's start will do, reading a request
    and importing a module like a job's (:mod:`fork_rehearsal`, found the same way through
    a ``sys.path`` entry new to this process), and forget the module. A forked child copies
    each page of the server's that it writes to, and importing a job's module wrote to ~300
    of them (its finders, loaders, the SDK's decorator): done here they are copied before the
    task arrives, not on its way (a no-op function's import 0.8 -> 0.3 ms). Skipped when the
    task is already there: under load it would only add work."""
    try:
        waiting = select.poll()
        waiting.register(sock, select.POLLIN)
        if waiting.poll(0):
            return
        json.loads(json.dumps({"cwd": _HERE, "env": {"A": "b"}, "path": [_HERE], "gated": True}))
        loaded = len(sys.modules)
        os.environ[warm.runner.IMPORTING_ENV] = _REHEARSAL
        sys.path.insert(0, _HERE)
        try:
            importlib.import_module(_REHEARSAL)
        finally:
            # it and whatever it imported first: the last entries (read from the end, as a
            # set of every name would touch, and so copy, the pages of all of them)
            for name in list(itertools.islice(reversed(sys.modules), max(0, len(sys.modules) - loaded))):
                sys.modules.pop(name, None)
            with contextlib.suppress(ValueError):
                sys.path.remove(_HERE)
            sys.path_importer_cache.pop(_HERE, None)
            os.environ.pop(warm.runner.IMPORTING_ENV, None)
        global REHEARSED
        REHEARSED = True
    except Exception:  # a rehearsal that fails changes nothing for the task
        pass


class _Spare:
    """A child forked ahead of its task: detached, every descriptor of the server's but its
    end of a socket pair closed, waiting for the request it will run. The other end goes to the worker,
    which sends the task's request there itself."""

    def __init__(self, warm: _Warm) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.pid = os.fork()
        if self.pid == 0:
            try:
                # this server's SIGCHLD wake-up is not the task's
                signal.set_wakeup_fd(-1)
                signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                _detach(warm)
                with contextlib.suppress(Exception):  # (private parts of the standard library)
                    _fresh.own_exit_handlers()
                _close_others(sorted({theirs.fileno(), *warm.preload_fds}))
                _rehearse(theirs, warm)
                msg, fds, _flags, _addr = socket.recv_fds(theirs, _MAX_MESSAGE, 2)
                if not msg or len(fds) != 2:
                    os._exit(0)  # not needed after all (the worker let it go, or ended)
                _child(json.loads(msg), fds, warm, theirs)
            finally:
                os._exit(1)
        theirs.close()
        self.sock = ours
        self.pidfd = os.pidfd_open(self.pid)


def _offer(sock: socket.socket, warm: _Warm, sel: selectors.BaseSelector) -> None:
    """Fork a spare and hand the worker its socket (or say why there is none)."""
    try:
        spare = _Spare(warm)
    except OSError as exc:
        _send(sock, {"spare": None, "error": f"{type(exc).__name__}: {exc}"})
        return
    sel.register(spare.pidfd, selectors.EVENT_READ, spare.pid)
    try:
        socket.send_fds(sock, [b'{"spare": %d}' % spare.pid], [spare.sock.fileno()])
    except OSError:
        pass  # the worker is gone: this server ends at its next read
    finally:
        spare.sock.close()


def _forked(sel: selectors.BaseSelector) -> set[int]:
    """The children this server forked and still watches (spares and tasks' children)."""
    return {k.data for k in sel.get_map().values() if isinstance(k.data, int)}


#: where the kernel lists this server's children (set in :func:`serve`)
_CHILDREN_FILE = ""
#: ``ru_maxrss`` is in kibibytes on Linux, in bytes on macOS
_MAXRSS_UNIT = 1 if sys.platform == "darwin" else 1024


def _children() -> list[int] | None:
    """This server's children (None: they cannot be listed). Read with ``os.open``, not
    ``open()``: the file object's machinery (its buffer, the encoding, the checks on a
    new file) ran twice a task, and each page of the server that Python writes after a fork
    is a page fault that copies it (shared with the spare): 0.2 ms of the server's CPU a task."""
    try:
        fd = os.open(_CHILDREN_FILE, os.O_RDONLY)
    except OSError:
        return None
    try:
        data = b""
        while chunk := os.read(fd, 65536):
            data += chunk
    except OSError:
        return None
    finally:
        os.close(fd)
    return [int(p) for p in data.split()]


def _reap_strays(known: set[int]) -> None:
    """Reap the children this server did not fork: a task's leftovers re-parented to it (its
    subreaper) that have been ended."""
    for pid in _children() or []:
        if pid not in known:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, os.WNOHANG)


def _strays(known: set[int]) -> bool:
    """Whether a child this server did not fork is there (or none can be listed). As a
    task's main process exits, whatever it leaves running is re-parented here (this server
    is the subreaper): the children of its that outlive it, and below them the rest. None
    at that moment means the task left nothing, and its worker need not look for it."""
    children = _children()
    return children is None or any(pid not in known for pid in children)


def serve(sock: socket.socket, runner_path: str, preload: list[str], user: list[str] | None = None) -> None:
    """Serve the worker on ``sock``: ``preload``, GPUlayer's own modules (skipped where the
    job's Python lacks them), ``user`` the worker's preloads (see the module's docstring)."""
    worker, worker_then = os.getppid(), _fresh.process_state(os.getpid())
    here = os.path.dirname(os.path.abspath(__file__))
    if sys.path and os.path.abspath(sys.path[0] or ".") == here:
        del sys.path[0]  # keep process.py & co. from shadowing the user's modules
    runner = _load("_gpulayer_function_runner", runner_path)
    preloads = _load("_gpulayer_preloads", os.path.join(here, "preloads.py"))
    preloaded = []
    for name in preload:
        try:
            __import__(name)
            preloaded.append(name)
        except Exception:  # not installed in this Python: the job imports what it has
            continue
    before = len(sys.modules)
    environ = dict(os.environ)
    # the preloads are imported as a fresh interpreter would import them: SIGINT raising
    # KeyboardInterrupt (a handler of theirs may chain to it), not ignored as this server has it
    signal.signal(signal.SIGINT, signal.default_int_handler)
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        mine, refused, offender, unsafe = preloads.preload(list(user or []),
                                                           lambda name: _send(sock, {"importing": name}))
    finally:
        preload_signals = {sig: signal.getsignal(sig) for sig, h in handlers.items() if signal.getsignal(sig) is not h}
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    loaded = list(itertools.islice(sys.modules, before, None))
    preload_environ: dict[str, str | None] = {k: v for k, v in os.environ.items() if environ.get(k) != v}
    preload_environ.update((k, None) for k in environ if k not in os.environ)
    preloaded += mine
    warm = getattr(sys.modules.get("gpulayer.remote_functions"), "warm", None)
    if callable(warm):  # what a job module's first @gl.remote computes, computed once here
        warm()
    # what is open now but the worker's socket and the standard streams the imports opened
    # (a preload's log file, a socket): the server's own come after (its selector, pidfds)
    preload_fds = frozenset(fd for fd in _open_fds() if fd > 2 and fd != sock.fileno())
    # the entries of the PYTHONPATH we started with are the worker's, not the task's: the
    # task's own PYTHONPATH goes in front of what is left
    started = {os.path.abspath(p) for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p}
    base_path = [p for p in sys.path if os.path.abspath(p or ".") not in started]
    tops = {name.partition(".")[0] for name in preloaded}
    origins = {name: _origin(sys.modules.get(name)) for name in tops}
    entries_then = {os.path.abspath(p or ".") for p in sys.path}
    prctl = None
    subreaper = False
    global _CHILDREN_FILE
    me = os.getpid()
    _CHILDREN_FILE = f"/proc/{me}/task/{me}/children"
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            prctl = ctypes.CDLL(None, use_errno=True).prctl
            # only where its strays can be found to be reaped (a kernel without the
            # children files would leave them as zombies)
            if os.path.exists(_CHILDREN_FILE):
                subreaper = prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    if unsafe is None:
        unsafe = preloads.unsafe()
        unsafe = None if unsafe is None else f"{unsafe} after preloading"
    elif offender is not None:
        unsafe = f"importing {offender} left {unsafe}"
    # the modules the preloads imported, by the folder each came from: a task whose own path
    # has a copy of one (its bundle) is forked from a server without them (ForkServer.shadowed)
    imported: dict[str, str] = {}
    for name in loaded if user else ():
        top = name.partition(".")[0]
        if top not in imported and top not in sys.stdlib_module_names:
            origin = _origin(sys.modules.get(top))
            if origin is not None:
                imported[top] = origin
    stamps, fixed, unstamped = preloads.stamps([n.partition(".")[0] for n in mine], loaded, list(refused)) if user \
        else ([], 0, 0)
    hello = {"ready": True, "pid": os.getpid(), "preloaded": preloaded, "subreaper": subreaper,
             "unsafe": unsafe, "offender": offender, "refused": refused, "stamps": stamps,
             "unstamped": unstamped, "tops": imported, "sites": preloads.site_stamps()}
    try:
        sock.send(json.dumps(hello).encode())
    except OSError:  # (too many stamps for one message: those always kept, see preloads.stamps)
        hello["unstamped"] = unstamped + len(stamps) - fixed
        hello["stamps"] = stamps[:fixed]
        _send(sock, hello)
    sel = selectors.DefaultSelector()
    sel.register(sock, selectors.EVENT_READ, "worker")
    # a stray (a task's leftover, re-parented here) is reaped when it ends: SIGCHLD wakes the loop
    wake_r, wake_w = os.pipe()
    for fd in (wake_r, wake_w):
        os.set_blocking(fd, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda _signum, _frame: None)
    sel.register(wake_r, selectors.EVENT_READ, "sigchld")
    warm = _Warm(runner, base_path, origins, entries_then, prctl, os.getpid(), environ, preload_environ,
                 preload_signals, preload_fds, worker, worker_then)
    # what is loaded now stays out of the collector's reach in every child: a collection in
    # a child would otherwise touch (and so copy) every object the server holds
    gc.collect()
    gc.freeze()
    _offer(sock, warm, sel)
    #: a spare asked for after a task's child: (the child's pid, when it is forked anyway)
    deferred: tuple[int, float] | None = None
    while True:
        timeout = None if deferred is None else max(0.0, deferred[1] - time.monotonic())
        ready = sel.select(timeout)
        if deferred is not None and time.monotonic() >= deferred[1]:
            deferred = None
            _offer(sock, warm, sel)
        for key, _ in ready:
            if key.data == "worker":
                try:
                    msg = sock.recv(_MAX_MESSAGE)
                except OSError:
                    return
                if not msg:
                    return  # the worker closed its end (or died): our children die with us
                want = json.loads(msg)
                after = want.get("after")
                if not want.get("want"):
                    continue
                if deferred is not None:  # (one spare at a time: the deferred one comes now)
                    deferred = None
                    _offer(sock, warm, sel)
                elif isinstance(after, int) and after in _forked(sel):
                    deferred = (after, time.monotonic() + SPARE_AFTER)
                else:
                    _offer(sock, warm, sel)
            elif key.data == "sigchld":
                with contextlib.suppress(OSError):
                    while os.read(wake_r, 512):
                        pass
                _reap_strays(_forked(sel))
            else:
                pid = key.data
                sel.unregister(key.fd)
                os.close(key.fd)
                _, status, used = os.wait4(pid, 0)  # (what it used: gpulayer.worker.usage)
                strays = not subreaper or _strays(_forked(sel))
                _send(sock, b'{"exit": %d, "pid": %d, "strays": %s, "cpu": [%.6f, %.6f], "rss": %d}'
                      % (os.waitstatus_to_exitcode(status), pid, b"true" if strays else b"false",
                         used.ru_utime, used.ru_stime, used.ru_maxrss * _MAXRSS_UNIT))
                if deferred is not None and deferred[0] == pid:
                    deferred = None
                    _offer(sock, warm, sel)


def main() -> None:
    sock = socket.socket(fileno=int(sys.argv[1]))
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C is the worker's to handle
    args = sys.argv[3:]
    cut = args.index("--") if "--" in args else len(args)
    serve(sock, sys.argv[2], args[:cut], args[cut + 1:])


if __name__ == "__main__":
    main()
