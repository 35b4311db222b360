"""What a child of the fork server needs to be what a fresh interpreter running its task
would be (:mod:`gpulayer.worker.fork_server`): what the worker's preloads set as they were
imported, a ``multiprocessing`` of its own, standard streams,
the exit handlers of its own, and an interpreter's exit. Loaded from its file by the fork
server, in the job's Python: the standard library only.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import resource
import signal
import sys
import time
import traceback
from typing import Any

__all__ = ["as_imported", "follow_worker", "fresh_multiprocessing", "own_exit_handlers", "process_state", "shut_down",
           "streams"]

#: a process's umask (None where it cannot be read) and resource limits
State = tuple[int | None, dict[int, tuple[int, int]]]
_RLIMITS = sorted(getattr(resource, name) for name in dir(resource) if name.startswith("RLIMIT_"))


def process_state(pid: int) -> State:
    """The umask and the resource limits of process ``pid`` (what cannot be read left out)."""
    umask = None
    with contextlib.suppress(OSError, ValueError):
        fd = os.open(f"/proc/{pid}/status", os.O_RDONLY)
        try:
            data = os.read(fd, 16384)
        finally:
            os.close(fd)
        at = data.find(b"\nUmask:")
        if at >= 0:
            umask = int(data[at + 7:data.index(b"\n", at + 1)], 8)
    limits = {}
    for limit in _RLIMITS:
        with contextlib.suppress(OSError, ValueError):
            limits[limit] = resource.prlimit(pid, limit)
    return umask, limits


def follow_worker(worker: int, then: State) -> None:
    """What the worker changed of its umask and resource limits since the server started (a
    script's ``os.umask(0o002)`` or ``resource.setrlimit`` after its first job), as a task
    spawned from the worker now would inherit them; what the preloads' imports changed
    stays where the worker changed nothing. (Best effort: a hard limit the worker raised
    cannot be raised here without the privilege.)"""
    umask, limits = process_state(worker)
    if umask is not None and umask != then[0]:
        os.umask(umask)
    for limit, value in limits.items():
        if value != then[1].get(limit):
            with contextlib.suppress(OSError, ValueError):
                resource.setrlimit(limit, value)


def as_imported(env: dict[str, str], environ: dict[str, str], preload_environ: dict[str, str | None],
                preload_signals: dict[signal.Signals, Any]) -> None:
    """What a fresh interpreter would have after importing the worker's preloads with the
    task's environment ``env``: the variables they set as they were imported (a library that
    sets a default for a library of its own) where the task did not set them, and the
    handlers of SIGINT and SIGTERM they installed; else SIGINT raises KeyboardInterrupt and
    SIGTERM ends the task, as in a fresh interpreter. The timezone is read again where the
    task's ``TZ`` is not the server's (``time.localtime``, ``datetime.now``)."""
    for key, value in preload_environ.items():
        if env.get(key) == environ.get(key):
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
    signal.signal(signal.SIGTERM, preload_signals.get(signal.SIGTERM, signal.SIG_DFL))
    signal.signal(signal.SIGINT, preload_signals.get(signal.SIGINT, signal.default_int_handler))
    if env.get("TZ") != environ.get("TZ"):
        time.tzset()


def fresh_multiprocessing(cwd: str) -> None:
    """What a fresh interpreter's ``multiprocessing`` would hold, where the server imported
    it (a preload's import: torch's does): an authentication key of the task's own (the
    server's would let one task's ``multiprocessing`` manager or listener take connections
    from any other task of the worker), and the task's folder as the one it started in."""
    process = sys.modules.get("multiprocessing.process")
    if process is None:
        return
    process._current_process._config["authkey"] = process.AuthenticationString(os.urandom(32))
    process.ORIGINAL_DIR = os.path.abspath(cwd)  # type: ignore[attr-defined]


def streams() -> None:
    """The standard streams over the task's descriptors where this server has none (a worker
    started with its output closed: ``python script.py >&-``), as an interpreter would make
    them, written through (``PYTHONUNBUFFERED``, as a spawned task's)."""
    for name, fd, errors in (("stdout", 1, None), ("stderr", 2, "backslashreplace")):
        if getattr(sys, name) is None:
            with contextlib.suppress(OSError):
                stream = open(fd, "w", errors=errors, closefd=False, buffering=1)
                stream.reconfigure(write_through=True)
                setattr(sys, name, stream)


def own_exit_handlers() -> None:
    """In a spare, before any task code: ``multiprocessing``'s after-fork calls run (as in a
    process it forks itself), and the exit callbacks this server's own imports
    registered are dropped (a preload's: importing torch registers six ``atexit`` callbacks
    and 134 ``weakref.finalize`` finalizers; those stay registered, and are passed over at
    the task's exit). They are the server's: one that cleans up
    something outside the process (a temporary folder made at import) would do it from the
    first task's child, under the server and every later task, and those that only tidy the
    process cost a child 27 ms (torch's, where they copy the pages they touch) before an
    exit that frees everything anyway. A fresh interpreter would have registered the
    standard library's own as the task imported those modules, so they are registered again,
    each made to see the task's own only (as ``multiprocessing`` does in the processes it
    forks itself): ``logging``'s flushes and closes the task's log handlers, and only
    flushes the server's (of what the task logged through them); ``multiprocessing``'s
    joins the task's processes, not the server's; and ``weakref.finalize``'s calls the
    task's finalizers, not the server's. What the
    task registers runs (see :func:`shut_down`). Nothing to do where the server imported
    none of it (no preloads)."""
    mp_process = sys.modules.get("multiprocessing.process")
    if mp_process is not None:
        # (else the task's exit would end, and try to join, the server's)
        mp_process._children = set()  # type: ignore[attr-defined]
    mp_util = sys.modules.get("multiprocessing.util")
    if mp_util is not None:
        mp_util._finalizer_registry.clear()
        # what multiprocessing runs in each process it forks: its locks and queues made
        # fresh (a lock the server held would be held in the task for ever)
        mp_util._run_after_forkers()
    cleared = atexit._ncallbacks() > 0
    if cleared:
        atexit._clear()
        logging = sys.modules.get("logging")
        if logging is not None:
            # the server's handlers (weak references, kept so that their ids stay theirs;
            # by id: a handler class may define __eq__ and not __hash__)
            inherited = list(logging._handlerList)
            theirs = {id(ref) for ref in inherited}
            # the records a buffering handler of the server's holds are the server's: the
            # task's exit writes only those the task logged through it (see _shutdown_logging)
            buffering = getattr(sys.modules.get("logging.handlers"), "BufferingHandler", None)
            if buffering is not None:
                for ref in inherited:
                    handler = ref()
                    if isinstance(handler, buffering) and handler.buffer:
                        handler.buffer = []

            def _shutdown_logging(_keep: list[Any] = inherited) -> None:
                logging.shutdown([ref for ref in logging._handlerList if id(ref) not in theirs])
                # the server's handlers are flushed, not closed: what the task logged through
                # a preload's buffering handler (a MemoryHandler) is written, as its own
                # interpreter's exit would have, and the handlers are left as they are
                for ref in reversed(_keep):
                    handler = ref()
                    if handler is not None:
                        with contextlib.suppress(Exception):
                            handler.flush()

            atexit.register(_shutdown_logging)
    if cleared and mp_util is not None:
        atexit.register(mp_util._exit_function)
    finalize = getattr(sys.modules.get("weakref"), "finalize", None)
    if finalize is not None and getattr(finalize, "_registered_with_atexit", False):
        # the task's first finalizer registers weakref's exit call again, where a fresh
        # interpreter would (its place among the task's atexit callbacks), and that call
        # picks the task's finalizers only, numbered from here: the server's are not
        # looked at unless the task made one (each one touched is a page copied: 0.5 ms a
        # task for torch's 134, were they all marked here)
        first = next(finalize._index_iter)

        def _select_for_exit(cls: Any) -> list[Any]:
            mine = [(f, i) for f, i in cls._registry.items() if i.atexit and i.index >= first]
            mine.sort(key=lambda item: item[1].index)
            return [f for f, _ in mine]

        finalize._select_for_exit = classmethod(_select_for_exit)
        finalize._registered_with_atexit = False


def shut_down() -> None:
    """What an interpreter does as it exits, before it frees its objects, and what
    ``os._exit`` skips: wait for the task's non-daemon threads (and run ``threading``'s own
    exit calls, where ``concurrent.futures`` waits for the work given to its pools), then the
    ``atexit`` callbacks (``weakref.finalize``'s among them), as the task run in a process of
    its own would (a log uploaded by a thread, a tracker's run closed at exit). An exception
    is printed and the next step still runs, as the interpreter does."""
    threading = sys.modules.get("threading")
    if threading is not None:
        try:
            threading._shutdown()
        except BaseException:
            with contextlib.suppress(Exception):
                traceback.print_exc()
    atexit._run_exitfuncs()
