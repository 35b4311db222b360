"""Run one task as its own process tree, stream its output, and end the whole tree.

:func:`run_process` starts ``argv`` in a new session (so in its own process group), streams
stdout and stderr to a callback as the bytes arrive, and ends in exactly one of four states:
``succeeded``, ``failed``, ``timed_out`` or ``cancelled``.

Ending a tree (:func:`terminate_tree`): SIGTERM to the process group and to every
descendant found, a grace period, then SIGKILL to the group and to whatever is left. A
descendant that left the group (``setsid``, ``setpgid``) is found two ways: as a descendant of
the task's process (the list is collected before any signal is sent), and by a marker
variable that :func:`run_process` adds to the task's environment (``GPULAYER_TREE_ID``), which
finds it even after its parent exited and it was re-parented to init. A task must not leave
orphans: when its main process exits, whatever is left in its group or carries its marker is
killed.

A task's processes die with their worker, even one killed with SIGKILL: on Linux the task's
main process gets ``PR_SET_PDEATHSIG`` (SIGKILL when the worker's thread that started it
dies), and every process of the tree carries a marker that names its worker process
(``<pid>.<start time>.<id>``): :func:`reap_orphans`, which every worker runs as it starts,
before a retry and every few seconds (:class:`OrphanSweep`), ends the trees whose worker is
gone (what the main process had started before it died).

How the signal is set without forking the worker: :mod:`gpulayer.worker.deathsig`; how the
processes that carry a marker are found: :mod:`gpulayer.worker.markers`.

POSIX only (Linux and macOS; the parent-death signal is Linux only).
"""

from __future__ import annotations

import contextlib
import logging
import os
import selectors
import shlex
import signal
import subprocess
import threading
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Protocol

import psutil

from gpulayer.logtext import utf8_text
from gpulayer.records import TaskUsage
from gpulayer.worker import TREE_ID_ENV, usage
from gpulayer.worker.deathsig import die_with_parent, spawn_argv
from gpulayer.worker.markers import PidMark, every_marker, marked, owner, owner_alive, process_of
from gpulayer.worker.threads import WORKER_THREADS
from gpulayer.worker.wakeups import Cancel, ExitWaiter

__all__ = ["TREE_ID_ENV", "Cancel", "OrphanSweep", "ProcessOutcome", "StartFailed", "Started", "Starter", "reap_orphans", "run_process",
           "terminate_tree"]

log = logging.getLogger(__name__)


_READ_SIZE = 65536
#: how long to keep reading output after the main process exited and its group was killed
#: (a descendant that escaped with a clean environment could hold the pipe open forever).
_DRAIN_TIMEOUT = 2.0


@dataclass
class ProcessOutcome:
    """How a task's process ended."""

    #: "succeeded" | "failed" | "timed_out" | "cancelled"
    state: str
    #: the main process's exit code as Popen reports it (negative: killed by that signal);
    #: None when it never started or was never waited for.
    exit_code: int | None
    #: a human message for every state but "succeeded": "exit code 3",
    #: "killed by signal SIGKILL", "timed out after 5.0 s", "cancelled", "cannot start ..."
    error: str | None
    #: what its processes used, as the kernel counted it when the main process was reaped
    #: (:mod:`.usage`); None when it never started or that count was not had
    usage: TaskUsage | None = None

    @property
    def ok(self) -> bool:
        return self.state == "succeeded"


def reap_orphans(grace: float = 1.0) -> int:
    """End every task process tree whose worker process is gone; returns how many trees.

    Every worker calls it as it starts, before it starts a retry, and every few seconds while
    it runs (:class:`OrphanSweep`), so what a worker killed with SIGKILL left running (the
    task's children; its main process died with it) never runs beside a retry of the task,
    nor holds a device that a worker hands out again."""
    ended = 0
    for marker, pids in every_marker().items():
        procs = [p for p in (process_of(pid) for pid in pids) if p is not None]
        if not procs or owner_alive(marker):
            continue
        ended += 1
        log.warning("ending %d process(es) left by a task whose worker is gone (%s=%s)",
                    len(procs), TREE_ID_ENV, marker)
        terminate_tree(procs[0].pid, grace, marker=marker, extra=procs)
    return ended


#: how often a running worker looks for what a dead worker on its machine left running
ORPHAN_SWEEP_EVERY = 5.0


class OrphanSweep:
    """A worker's :func:`reap_orphans`: at its start, before a retry (whose last attempt may
    have run on this machine under a worker killed since), and at most every
    :data:`ORPHAN_SWEEP_EVERY` seconds (:meth:`when_due`, from the heartbeat thread) for the
    trees of a worker that died beside a running one, which held their devices and ran on
    beside the retries of their jobs until another worker started."""

    def __init__(self, every: float = ORPHAN_SWEEP_EVERY) -> None:
        self.every = every
        self._next = 0.0
        self._lock = threading.Lock()

    def now(self) -> int:
        with self._lock:  # (two retries starting at once sweep once each, not together)
            self._next = time.monotonic() + self.every
            try:
                return reap_orphans()
            except Exception:  # a sweep must never stop a heartbeat or a task's start
                log.exception("looking for orphaned task processes failed")
                return 0

    def when_due(self) -> None:
        if time.monotonic() >= self._next:
            self.now()


# --------------------------------------------------------------------------- ending trees


def _alive(proc: psutil.Process) -> bool:
    """Running and not a zombie (a zombie has exited; only its parent's wait is missing)."""
    try:
        return bool(proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE)
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return False


def _signal(proc: psutil.Process, sig: int) -> None:
    # psutil checks that the pid was not reused by another process before signalling.
    with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied, ProcessLookupError):
        proc.send_signal(sig)


def _signal_group(pgid: int | None, sig: int) -> None:
    if pgid is None:
        return
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def _collect(pid: int, marker: str | None) -> dict[int, psutil.Process]:
    procs: dict[int, psutil.Process] = {}
    try:
        root = psutil.Process(pid)
        procs[root.pid] = root
        for child in root.children(recursive=True):
            procs[child.pid] = child
    except psutil.Error:
        pass
    if marker:
        for proc in marked(marker):
            procs.setdefault(proc.pid, proc)
    return procs


def _own_group(pid: int) -> int | None:
    """``pid``'s process group if ``pid`` leads it and it is not this process's group."""
    try:
        pgid = os.getpgid(pid)
    except (ProcessLookupError, PermissionError):
        return None
    return pgid if pgid == pid and pgid != os.getpgrp() else None


def terminate_tree(
    pid: int,
    grace: float = 5.0,
    *,
    pgid: int | None = None,
    marker: str | None = None,
    extra: Iterable[psutil.Process] = (),
) -> None:
    """End ``pid`` and every process it started: SIGTERM, up to ``grace`` seconds, SIGKILL.

    Signals go to the process group ``pgid`` (default: ``pid``'s own group when ``pid`` leads
    one that is not ours; never the caller's own group), to every descendant of ``pid``
    collected before the first signal, to every process whose environment carries
    ``TREE_ID_ENV=marker``, and to ``extra``. Returns once all of them are gone (zombies count
    as gone: the caller still reaps its own child) or, after SIGKILL, after about a second.
    It never reaps ``pid``; a caller that started it with Popen still calls ``wait()``.
    """
    if pgid is None:
        pgid = _own_group(pid)
    elif pgid == os.getpgrp():
        pgid = None  # never signal our own group
    # the descendants first (before any signal: a child whose parent dies is re-parented
    # and no longer found as a descendant), the slower scan for markers after the first
    # signals, so a tree that stayed in its group starts ending at once
    procs = _collect(pid, None)
    for proc in extra:
        procs.setdefault(proc.pid, proc)
    procs.pop(os.getpid(), None)

    _signal_group(pgid, signal.SIGTERM)
    signalled: set[int] = set()
    for proc in procs.values():
        # one SIGTERM per process: a second one can land while its handler is already
        # shutting the interpreter down (default disposition again) and kill it mid-cleanup
        if pgid is None or _group_of(proc) != pgid:
            _signal(proc, signal.SIGTERM)
        signalled.add(proc.pid)
    if marker:  # those that left the group and whose parent already exited
        for proc in marked(marker):
            if proc.pid not in signalled and proc.pid != os.getpid():
                procs[proc.pid] = proc
                if pgid is None or _group_of(proc) != pgid:
                    _signal(proc, signal.SIGTERM)

    deadline = time.monotonic() + max(grace, 0.0)
    pause = 0.001  # most trees end within a millisecond or two of SIGTERM: look soon
    while time.monotonic() < deadline and any(_alive(p) for p in procs.values()):
        time.sleep(pause)
        pause = min(pause * 2, 0.02)

    # SIGKILL the group even when everything known is gone: it catches late forks.
    _signal_group(pgid, signal.SIGKILL)
    if marker:  # and late forks that left the group
        for proc in marked(marker):
            procs.setdefault(proc.pid, proc)
    survivors = [p for p in procs.values() if _alive(p)]
    for proc in survivors:
        _signal(proc, signal.SIGKILL)
    deadline = time.monotonic() + 1.0
    while survivors and time.monotonic() < deadline:
        survivors = [p for p in survivors if _alive(p)]
        if survivors:
            time.sleep(0.01)


def _group_of(proc: psutil.Process) -> int | None:
    try:
        return os.getpgid(proc.pid)
    except (ProcessLookupError, PermissionError):
        return None


def _kill_leftovers(pgid: int, marker: str, within: int | None = None, since: PidMark | None = None,
                    strays: bool | None = None) -> None:
    """After the main process exited: SIGKILL whatever is left of its tree (its group, and
    the processes that carry its marker; ``strays`` False: its subreaper found that it left
    no process behind, so none is looked for)."""
    leftovers = [] if strays is False else [p for p in marked(marker, within, since) if p.pid != pgid]
    _signal_group(pgid, signal.SIGKILL)
    for proc in leftovers:
        _signal(proc, signal.SIGKILL)


# --------------------------------------------------------------------------- output


class _Reader:
    """Reads both pipes as bytes arrive and hands each chunk to ``on_output``, in a thread of
    the worker's (:data:`~gpulayer.worker.threads.WORKER_THREADS`) from :meth:`start`.

    It owns the two file descriptors and closes them when done: at EOF on both, or when
    :meth:`stop` was called and its deadline passed.
    """

    def __init__(self, fds: dict[int, str], on_output: Callable[[str, bytes], None]) -> None:
        self._fds = dict(fds)
        self._on_output = on_output
        self._stop_at: float | None = None
        self._callback_failed = False
        self._done = threading.Event()

    def start(self) -> None:
        WORKER_THREADS.run(self.run)

    def stop(self, drain: float) -> None:
        """Keep reading what is there for up to ``drain`` seconds, then give up."""
        self._stop_at = time.monotonic() + drain

    def join(self, timeout: float | None = None) -> None:
        self._done.wait(timeout)

    def run(self) -> None:
        try:
            self._read()
        finally:
            self._done.set()

    def _read(self) -> None:
        sel = selectors.DefaultSelector()
        try:
            for fd in self._fds:
                sel.register(fd, selectors.EVENT_READ)
            while self._fds:
                if self._stop_at is not None and time.monotonic() >= self._stop_at:
                    break
                for key, _ in sel.select(timeout=0.1):
                    fd = key.fd
                    try:
                        data = os.read(fd, _READ_SIZE)
                    except BlockingIOError:
                        continue
                    except OSError:
                        data = b""
                    if not data:
                        sel.unregister(fd)
                        os.close(fd)
                        del self._fds[fd]
                        continue
                    self._emit(self._fds[fd], data)
        finally:
            for fd in list(self._fds):
                with contextlib.suppress(Exception):
                    sel.unregister(fd)
                with contextlib.suppress(OSError):
                    os.close(fd)
            self._fds.clear()
            sel.close()

    def _emit(self, stream: str, data: bytes) -> None:
        try:
            self._on_output(stream, data)
        except Exception:
            # keep draining the pipe, or the process would block on a full pipe
            if not self._callback_failed:
                self._callback_failed = True
                log.exception("on_output raised; the rest of the output is still read")


# --------------------------------------------------------------------------- running


class Started(Protocol):
    """A task's main process started by a :data:`Starter` (a Popen offers the same, but ``exited``)."""

    pid: int

    @property
    def exited(self) -> Cancel | None:
        """Set once the process exited, when it is not this process's child (else None)."""

    @property
    def within(self) -> int | None:
        """A process below which everything the task leaves behind stays (its subreaper:
        orphans are re-parented there, not to init), so leftovers are looked for among its
        descendants only; None: every process on the machine is looked at."""

    @property
    def strays(self) -> bool | None:
        """Once it exited: False when its subreaper found that it left no process behind
        (whatever outlives a task's main process is re-parented to the subreaper), so none
        is looked for; None: unknown."""

    @property
    def usage(self) -> TaskUsage | None:
        """Once it exited: what it and the processes it waited for used, as its reaper read
        it (:mod:`.usage`); None: unknown."""

    def poll(self) -> int | None: ...

    def wait(self) -> int: ...


#: starts a task's main process from its full environment: the process and the read ends
#: of its stdout and stderr pipes; raises :class:`StartFailed` to fall back to a spawn
Starter = Callable[[dict[str, str]], tuple[Started, int, int]]


class StartFailed(Exception):
    """A :data:`Starter` could not start the task; the message says why."""


def exit_error(code: int) -> str:
    """How a process's end by ``code`` (Popen's: negative, killed by that signal) is worded."""
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = str(-code)
        return f"killed by signal {name}"
    return f"exit code {code}"


def run_process(
    argv: list[str],
    *,
    env: dict[str, str],
    cwd: str | None,
    on_output: Callable[[str, bytes], None],
    timeout: float | None = None,
    cancel: threading.Event | None = None,
    grace: float = 5.0,
    on_start: Callable[[int], None] | None = None,
    cancel_grace: float = 1.0,
    start: Starter | None = None,
) -> ProcessOutcome:
    """Run ``argv`` as its own process tree until it exits, times out or is cancelled.

    ``env`` is the whole environment (``PYTHONUNBUFFERED=1`` is added when absent, and
    ``GPULAYER_TREE_ID`` is set to a fresh id). stdin is /dev/null. ``on_output(stream,
    chunk)`` is called from a reader thread with ``"stdout"`` or ``"stderr"`` and the bytes as
    they arrive (no line buffering). ``on_start(pid)`` is called once the process started.

    ``timeout`` (seconds): the tree gets SIGTERM, ``grace`` seconds, then SIGKILL; state
    ``timed_out``. ``cancel`` set from another thread: the same with ``cancel_grace``; state
    ``cancelled`` (a :class:`Cancel` interrupts the wait at once; a plain Event is looked at
    every 10 ms). Exit code 0: ``succeeded``; anything else: ``failed``. A command that
    cannot be started: ``failed`` with exit code 127 (not found) or 126 (not executable),
    the message also written to ``on_output("stderr", ...)``.

    ``start`` starts the main process another way (a fork server: :mod:`.forking`); when it
    raises :class:`StartFailed` the task is spawned from ``argv`` after all, saying so on
    stderr. Everything else (output, cancel, timeout, ending the tree) is the same.
    """
    if cancel is not None and cancel.is_set():
        return ProcessOutcome("cancelled", None, "cancelled before it started")
    if not argv:
        message = "cannot start an empty command"
        _emit_safely(on_output, message)
        return ProcessOutcome("failed", 127, message)

    marker = f"{owner()}.{uuid.uuid4().hex}"
    full_env = dict(env)
    full_env.setdefault("PYTHONUNBUFFERED", "1")
    full_env[TREE_ID_ENV] = marker

    proc: Started | subprocess.Popen[bytes] | None = None
    since = PidMark.now()  # (before the tree's first process)
    if start is not None:
        try:
            proc, out_fd, err_fd = start(full_env)
            fds = {out_fd: "stdout", err_fd: "stderr"}
        except StartFailed as exc:  # the other way is not available now: spawn after all
            _emit_safely(on_output, f"{exc}; spawned instead")
            proc = None
    reaper: usage.Reaper | None = None
    if proc is None:
        spawn, preexec = spawn_argv(argv, full_env, cwd)
        try:
            popen = subprocess.Popen(
                spawn,
                env=full_env,
                cwd=cwd,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                start_new_session=True,
                close_fds=True,
                preexec_fn=die_with_parent(os.getpid()) if preexec else None,
            )
        except OSError as exc:
            code = 127 if isinstance(exc, FileNotFoundError) else 126
            where = f" in {cwd}" if cwd else ""
            message = f"cannot start {shlex.join(argv)}{where}: {exc}"
            _emit_safely(on_output, message)
            return ProcessOutcome("failed", code, message)
        if popen.stdout is None or popen.stderr is None:  # pragma: no cover - PIPE always gives both
            raise RuntimeError("subprocess pipes missing")
        # the reader thread owns the descriptors from here on
        fds = {os.dup(popen.stdout.fileno()): "stdout", os.dup(popen.stderr.fileno()): "stderr"}
        popen.stdout.close()
        popen.stderr.close()
        proc = popen
        # the peak its count of memory starts from (usage.usage_of): this process's once the
        # command was exec'd (Popen returns then), so that what this process's other threads
        # took meanwhile, which the command carries, is not taken for the task's
        reaper = usage.Reaper(popen, usage.own_peak())
    reader = _Reader(fds, on_output)
    reader.start()

    pgid = proc.pid  # start_new_session: the process leads its own group
    state: str | None = None
    error: str | None = None
    try:
        if on_start is not None:
            on_start(proc.pid)
        deadline = None if timeout is None else time.monotonic() + timeout
        with ExitWaiter(proc.pid, cancel, getattr(proc, "exited", None)) as waiter:
            # (a Popen is reaped by its Reaper, which reads what it used as it reaps it)
            while not (reaper.exited() if reaper is not None else proc.poll() is not None):
                if cancel is not None and cancel.is_set():
                    state, error = "cancelled", "cancelled"
                    terminate_tree(proc.pid, cancel_grace, pgid=pgid, marker=marker)
                    break
                if deadline is not None and time.monotonic() >= deadline:
                    state, error = "timed_out", f"timed out after {timeout} s"
                    terminate_tree(proc.pid, grace, pgid=pgid, marker=marker)
                    break
                waiter.wait(None if deadline is None else max(0.0, deadline - time.monotonic()))
        used = reaper.reap() if reaper is not None else getattr(proc, "usage", None)
        code = proc.wait()
    except BaseException:
        # on_start raised, or we were interrupted: do not leave the tree behind
        terminate_tree(proc.pid, 0.0, pgid=pgid, marker=marker)
        proc.wait()
        raise
    finally:
        _kill_leftovers(pgid, marker, getattr(proc, "within", None), since,
                        getattr(proc, "strays", None) if state is None else None)
        reader.stop(_DRAIN_TIMEOUT)
        reader.join(_DRAIN_TIMEOUT + 1.0)

    if state is None:
        if code == 0:
            return ProcessOutcome("succeeded", 0, None, used)
        return ProcessOutcome("failed", code, exit_error(code), used)
    return ProcessOutcome(state, code, error, used)


def _emit_safely(on_output: Callable[[str, bytes], None], message: str) -> None:
    try:  # (a lone surrogate, from a path that is not UTF-8, as U+FFFD: it does not encode)
        on_output("stderr", f"gpulayer: {utf8_text(message)}\n".encode())
    except Exception:
        log.exception("on_output raised")
