"""The worker's side of its fork servers (:mod:`gpulayer.worker.fork_server`).

A FunctionJob spawned the plain way pays for a fresh interpreter and its imports on every
task. A fork server is a warm interpreter of the job's Python, with the function runner
(and ``gpulayer``'s SDK) loaded, that forks one child per task; the child is the task's process
tree, with the task's cwd, environment, ``sys.path`` and granted devices (environment
variables) applied after the fork, and it is ended, timed out and cancelled exactly like a
spawned one (:func:`gpulayer.worker.process.run_process` with a ``start``).

:meth:`.fork_servers.ForkServers.choose` says which path a task takes, and why, before it starts; the
task's ``task_started`` event records it (``started by fork server`` or ``spawned: ...``).
A task is spawned when forking is not safe or not possible:

* not Linux (pidfds and descriptor passing are needed), or the server failed to start;
* the job names a Python other than the worker's job Python;
* the job's environment changes a variable an interpreter reads as it starts (``PYTHON*``
  other than ``PYTHONPATH``, ``LD_*``, ``MALLOC_*``, the locale's ``LC_*`` and ``LANG``): a
  forked child would not see it.

A bundle with its own copy of ``gpulayer`` is no reason: the child drops that module and
imports the bundle's. Each task keeps its own process; only start-up is shared.

The worker's own preloads (``gpulayer worker start --preload``, ``GPULAYER_PRELOAD``) are
imported by the server once, with the worker's environment, so a task whose module imports
them (``torch``) finds them loaded. A task whose job sets an environment variable, or whose
worker's environment changed since (:meth:`.fork_servers.ForkServers.follow_environ`), is forked from a
server without them (a module may read a variable as it is imported), and so is one with its
own copy of a module they imported (:meth:`ForkServer.shadowed`); a module that
leaves the server unsafe to fork is dropped from the list, and a server whose preloaded
modules changed on disk is replaced (see :meth:`ForkServer.stale`); the old one ends once
its tasks have.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gpulayer.records import TaskUsage
from gpulayer.worker.deathsig import die_with_parent
from gpulayer.worker.fork_server import GO
from gpulayer.worker.preloads import ABSENT, MAX_STAMPED, site_files
from gpulayer.worker.process import StartFailed
from gpulayer.worker.wakeups import Cancel

log = logging.getLogger(__name__)

SERVER_PATH = str(Path(__file__).with_name("fork_server.py"))
RUNNER_PATH = str(Path(__file__).with_name("function_runner.py"))
#: imported by the server before it forks, when the job's Python has them: what a module
#: with ``@gl.remote`` functions imports where a worker runs it (the decorator alone, not
#: the SDK: see :mod:`gpulayer.remote_functions`; a fork of a server that imported the SDK
#: cost 1.3 ms of CPU, of one without it 0.45 ms)
PRELOAD = ("gpulayer", "gpulayer.remote_functions")
#: how long the first FunctionJob waits for a fork server to come up before it spawns
READY_TIMEOUT = 60.0
FORKED = "started by fork server"


def unsupported() -> str | None:
    """Why this platform cannot run a fork server, or None."""
    if not sys.platform.startswith("linux"):
        return f"forking is not used on {sys.platform}"
    if not (hasattr(os, "pidfd_open") and hasattr(socket, "send_fds") and hasattr(socket, "SOCK_SEQPACKET")):
        return "this Python or kernel lacks pidfds or descriptor passing"
    return None



class _Child:
    """A task's main process as a fork server started it (a :class:`~.process.Started`)."""

    def __init__(self, pid: int, within: int | None) -> None:
        self.pid = pid
        #: the fork server, when it is the subreaper of everything the task leaves behind
        self.within = within
        self.code: int | None = None
        #: whether the server had children it did not fork as this one exited (see
        #: :attr:`.process.Started.strays`); None until then, or when it did not say
        self.strays: bool | None = None
        #: what it used (see :attr:`.process.Started.usage`), as its server read it reaping it
        self.usage: TaskUsage | None = None
        self.exited = Cancel()
        #: a gated child's socket, until it is told to go (or let go), and what is done then
        self._gate: socket.socket | None = None
        self._then: Callable[[], None] | None = None

    def go(self) -> None:
        """A gated child runs its task now. (One that died meanwhile is heard of as usual:
        its exit, with what it wrote on stderr.)"""
        self._told(GO)

    def let_go(self) -> None:
        """A gated child exits without running its task."""
        self._told(None)

    def _told(self, word: bytes | None) -> None:
        gate, self._gate = self._gate, None
        then, self._then = self._then, None
        if gate is not None:
            if word is not None:
                with contextlib.suppress(OSError):
                    gate.send(word, socket.MSG_NOSIGNAL)
            gate.close()
        if then is not None:
            then()

    def poll(self) -> int | None:
        return self.code

    def wait(self) -> int:
        self.exited.wait()
        return self.code if self.code is not None else -9


def _usage(msg: dict[str, Any]) -> TaskUsage | None:
    """What a child used, from its server's word of its exit (None: a server of a job's
    Python from before it said nothing of it, or said it wrong)."""
    try:
        user, system = msg["cpu"]
        return TaskUsage(cpu_user=user, cpu_system=system, max_rss=msg["rss"])
    except (KeyError, TypeError, ValueError):
        return None


#: the preloads a server could not import that were logged, with why
_SAID: set[tuple[str, str]] = set()
#: how long a start waits for the server to fork a spare when none is waiting
SPARE_TIMEOUT = 10.0
#: spares a start tries (one that died waiting is let go, and the next one tried)
_SPARE_TRIES = 3


class ForkServer:
    """One warm interpreter of ``python``; thread-safe. The thread that starts it also reads
    its answers and lives as long as it does (the server gets ``PR_SET_PDEATHSIG`` bound to
    that thread, and forwards it to its children).

    The server keeps this side supplied with spares (children forked ahead of their tasks,
    see :mod:`.fork_server`): :meth:`start` sends the task's request straight to the one
    waiting and asks the server for the next (a gated child's, once it was told to go or let
    go), so it neither forks nor waits for an answer."""

    def __init__(self, python: str, env: dict[str, str], preload: tuple[str, ...] = ()) -> None:
        self.python = python
        self.env = env
        #: the worker's preloads this server was asked to import (after GPUlayer's own)
        self.preload = preload
        self.failed: str | None = None
        self.preloaded: list[str] = []
        #: of :attr:`preload`: those that did not import (name: why), and the one that made
        #: the server unsafe to fork (its ``failed`` says how)
        self.refused: dict[str, str] = {}
        self.offender: str | None = None
        #: (path, inode, size, mtime) of what the preloads came from (see :meth:`stale`)
        self._stamps: list[tuple[str, int, int, int]] = []
        #: the site-packages folders and what site read there as the server started (see
        #: :meth:`_site_changed`)
        self._sites: list[tuple[str, int, int, int, list[list[Any]]]] = []
        #: the top-level modules the preloads imported (not the standard library's), by the
        #: ``sys.path`` folder each came from (see :meth:`shadowed`)
        self.tops: dict[str, str] = {}
        #: once replaced: it ends when its last task has (see :meth:`retire`)
        self._retiring = False
        #: :meth:`close` was called (maybe before the server answered: see _serve)
        self._closed = False
        #: tasks that were given this server and have not ended yet (see :meth:`lease`)
        self._leases = 0
        #: the server's pid when it is its children's subreaper (see :class:`_Child`)
        self.subreaper: int | None = None
        self._ready = threading.Event()
        self._sock: socket.socket | None = None
        self._send_lock = threading.Lock()
        self._children: dict[int, _Child] = {}
        #: spares the server handed over (pid, socket), and whether one more was asked for
        self._spares: list[tuple[int, socket.socket]] = []
        self._asked = False
        #: the spare asked for is forked when a task ends (see _ask)
        self._deferred = False
        self._spare_error: str | None = None
        self._lock = threading.Condition()
        #: the worker's preload the server was importing when last heard of, until it answers
        self.importing: str | None = None
        self._born = time.monotonic()
        self._proc: subprocess.Popen[bytes] | None = None
        threading.Thread(target=self._serve, name="gpulayer-forkserver", daemon=True).start()

    def ready(self, timeout: float | None = None) -> str | None:
        """Wait until it serves, at most until ``timeout`` seconds (:data:`READY_TIMEOUT`)
        after it was started (a server whose preload hangs keeps no task waiting after that);
        None when it serves, else why not."""
        timeout = READY_TIMEOUT if timeout is None else timeout
        if not self._ready.wait(max(0.0, self._born + timeout - time.monotonic())):
            importing = self.importing
            return f"the fork server did not start within {timeout:g} s" + (
                f" (the import of {importing} has not ended)" if importing else "")
        return self.failed

    @property
    def starting(self) -> bool:
        """Whether it has not answered yet (a preload still being imported)."""
        return not self._ready.is_set()

    def _serve(self) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            proc = subprocess.Popen(
                [self.python, "-u", SERVER_PATH, str(theirs.fileno()), RUNNER_PATH, *PRELOAD, "--", *self.preload],
                env=self.env, stdin=subprocess.DEVNULL, pass_fds=(theirs.fileno(),), close_fds=True,
                start_new_session=True,  # a Ctrl-C at the terminal is the worker's, not the server's
                preexec_fn=die_with_parent(os.getpid()),
            )
        except OSError as exc:
            self.failed = f"the fork server could not start: {exc}"
            self._ready.set()
            ours.close()
            return
        finally:
            theirs.close()
        self._proc = proc
        if self._closed:  # (closed as it was started: see close)
            with contextlib.suppress(OSError):
                proc.kill()
        try:
            hello = json.loads(ours.recv(1 << 20) or b"{}")
            while isinstance(hello, dict) and hello.get("importing"):
                self.importing = str(hello["importing"])
                hello = json.loads(ours.recv(1 << 20) or b"{}")
            importing, self.importing = self.importing, None
            offender = hello.get("offender")
            if not hello.get("ready") and importing is not None and not self._closed:
                # a preload's import ended the process (os._exit, a crash in an extension
                # module): it is left out like one that leaves the server unsafe to fork
                offender = importing
                self.failed = f"the fork server exited while importing {importing}{_how_it_ended(proc)}"
            elif not hello.get("ready"):
                self.failed = "the fork server exited as it started"
            elif hello.get("unsafe"):
                self.failed = f"the fork server is not safe to fork: {hello['unsafe']}"
            self.preloaded = list(hello.get("preloaded") or [])
            self.refused = {str(k): str(v) for k, v in (hello.get("refused") or {}).items()}
            self.offender = offender if isinstance(offender, str) else None
            self._stamps = [(str(p), int(i), int(z), int(m)) for p, i, z, m in hello.get("stamps") or []]
            self._sites = [(str(p), int(i), int(z), int(m), [[str(n), int(nz), int(nm)] for n, nz, nm in f])
                           for p, i, z, m, f in hello.get("sites") or []]
            self.tops = {str(k): str(v) for k, v in (hello.get("tops") or {}).items()}
            if hello.get("unstamped"):
                log.warning("--preload: %s files the preloads imported are not watched for changes "
                            "(the first %d are)", hello["unstamped"], MAX_STAMPED)
            for name, why in self.refused.items():
                if (name, why) not in _SAID:  # (once a process: a server started again says it again)
                    _SAID.add((name, why))
                    log.warning("--preload %s: not imported by %s: %s", name, self.python, why)
            if hello.get("subreaper"):
                self.subreaper = int(hello["pid"])
        except (OSError, ValueError) as exc:
            self.failed = f"the fork server did not answer: {exc}"
        self._sock = ours
        self._asked = True  # the server offers its first spare unasked
        if self.failed:  # (unsafe to fork: it ends, with the spare it forked unasked)
            with contextlib.suppress(OSError):
                ours.shutdown(socket.SHUT_RDWR)
        self._ready.set()
        # closed, or replaced with no task given it, while it started (a worker stopped at
        # once, a worker's environment changed as its preloads were imported): it ends now
        if self._closed:
            self.close()
        else:
            self._end_if_retired()
        try:
            while True:
                data, fds, _flags, _addr = socket.recv_fds(ours, 1 << 16, 1)
                if not data:
                    for fd in fds:
                        os.close(fd)
                    break
                self._answer(json.loads(data), fds)
        except (OSError, ValueError) as exc:
            log.warning("fork server: %s", exc)
        finally:
            self.failed = self.failed or "the fork server exited"
            with self._lock:
                children, self._children = dict(self._children), {}
                spares, self._spares = self._spares, []
                self._lock.notify_all()
            for _pid, sock in spares:
                sock.close()
            for child in children.values():  # they died with it (PDEATHSIG)
                # what they left went to init, not below the server: look everywhere
                child.within = None
                child.exited.set()
            ours.close()
            with contextlib.suppress(OSError):
                proc.kill()
            proc.wait()

    def _answer(self, msg: dict[str, Any], fds: list[int]) -> None:
        if "spare" in msg:
            with self._lock:
                self._asked = self._deferred = False
                if msg["spare"] is not None and len(fds) == 1:
                    self._spares.append((int(msg["spare"]), socket.socket(fileno=fds[0])))
                    fds = []
                else:
                    self._spare_error = str(msg.get("error") or "no spare")
                self._lock.notify_all()
        elif "exit" in msg:
            pid = int(msg["pid"])
            with self._lock:
                child = self._children.pop(pid, None)
                dead = [s for s in self._spares if s[0] == pid]  # a spare that died waiting
                self._spares = [s for s in self._spares if s[0] != pid]
            for _pid, sock in dead:
                sock.close()
            if dead:
                self._ask()
            if child is not None:
                child.code = int(msg["exit"])
                strays = msg.get("strays")
                child.strays = strays if isinstance(strays, bool) else None
                child.usage = _usage(msg)
                child.exited.set()
                self._end_if_retired()
        for fd in fds:
            os.close(fd)

    def _ask(self, after: int | None = None) -> None:
        """Ask the server for one more spare, unless one waits or is on its way; ``after``:
        the child of a task just told to go, whose exit (or a moment into its run) the
        server forks it at (see :data:`.fork_server.SPARE_AFTER`)."""
        with self._lock:
            if self._sock is None or self._spares or (self._asked and not (self._deferred and after is None)):
                return  # (a deferred one is asked for again, now, by a start that finds none)
            self._asked = True
            self._deferred = after is not None
        try:
            with self._send_lock:
                self._sock.send(json.dumps({"want": True, "after": after}).encode() if after is not None
                                else b'{"want": true}')
        except OSError:
            pass  # the server is gone: its reader thread says so

    def _take_spare(self) -> tuple[int, socket.socket]:
        deadline = time.monotonic() + SPARE_TIMEOUT
        with self._lock:
            while not self._spares:
                if self.failed:
                    raise StartFailed(self.failed)
                if self._spare_error:  # it could not fork one (no memory, no processes left)
                    error, self._spare_error = self._spare_error, None
                    raise StartFailed(f"the fork server could not fork a child: {error}")
                if not self._asked or self._deferred:  # none asked for, or not before a task ends
                    self._lock.release()
                    try:
                        self._ask()
                    finally:
                        self._lock.acquire()
                    continue
                left = deadline - time.monotonic()
                if left <= 0:
                    raise StartFailed(f"the fork server had no child ready within {SPARE_TIMEOUT:g} s"
                                      + (f" ({self._spare_error})" if self._spare_error else ""))
                self._lock.wait(left)
            return self._spares.pop(0)

    def start(self, *, cwd: str, env: dict[str, str], spec: str | dict[str, Any], result: str,
              gated: bool = False) -> tuple[_Child, int, int]:
        """Start the task in a spare child; its child and the read ends of its stdout and
        stderr. ``spec``: the function runner's spec (``{"function", "args", "kwargs"}``), or
        the path of a file that holds it. ``gated``: the child gets ready, then waits for
        :meth:`_Child.go` (or :meth:`_Child.let_go`) before it runs anything of the task's."""
        if self.failed or self._sock is None:
            raise StartFailed(self.failed or "the fork server is not running")
        path = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
        request = json.dumps({"cwd": cwd, "env": env, "path": path, "spec": spec, "result": result,
                              "gated": gated}).encode()
        for _ in range(_SPARE_TRIES):
            pid, sock = self._take_spare()
            child = _Child(pid, self.subreaper)
            if not gated:
                self._ask()  # the next one is forked while this one runs (or is it: see _ask)
            with self._lock:  # known before it can end, so its exit finds it
                self._children[pid] = child
            fds: list[int] = []
            try:
                out_r, out_w = os.pipe()
                fds += [out_r, out_w]
                err_r, err_w = os.pipe()
                fds += [err_r, err_w]
                socket.send_fds(sock, [request], [out_w, err_w])
            except OSError as exc:
                sock.close()
                if gated:
                    self._ask()
                with self._lock:
                    if self._children.get(pid) is child:
                        del self._children[pid]
                for fd in fds:
                    os.close(fd)
                if exc.errno == errno.EMSGSIZE:
                    raise StartFailed(f"the task's request is too large for the fork server ({len(request)} "
                                      "bytes: its environment?)") from None
                if isinstance(exc, (BrokenPipeError, ConnectionResetError, ConnectionRefusedError)):
                    continue  # it died waiting: the next one
                raise StartFailed(f"the fork server's child could not be given its task: {exc}") from None
            if gated:  # the next one is forked once this one was told: not while it gets ready
                child._gate, child._then = sock, functools.partial(self._ask, after=pid)
            else:
                sock.close()
            for fd in (out_w, err_w):
                os.close(fd)
            return child, out_r, err_r
        raise StartFailed(f"the fork server's children exited before they got their task ({_SPARE_TRIES} tried)")

    def shadowed(self, search: list[str]) -> list[str]:
        """The modules the preloads imported (:attr:`tops`) of which a task whose path begins
        with ``search`` (its folder, its ``PYTHONPATH``) has a copy of its own, that a fresh
        interpreter would import instead (a bundle with its own ``utils`` package where a
        preload imported an installed one, a patched copy of a preload's dependency), found
        before the folder the server imported it from. One listing of each folder."""
        tops = self.tops
        if not tops:
            return []
        found: list[str] = []
        settled: set[str] = set()
        for entry in search:
            if not entry:
                continue
            here = os.path.abspath(entry)
            try:
                with os.scandir(here) as listing:
                    names = {name: e.is_dir() for e in listing if (name := _module_name(e.name, e.is_dir())) in tops}
            except OSError:
                continue
            for name, folder in names.items():
                if name in settled:
                    continue
                # (a folder without __init__.py is a namespace package's part: a regular
                # package further on the path is imported before it)
                if folder and not os.path.exists(os.path.join(here, name, "__init__.py")):
                    continue
                settled.add(name)
                if tops[name] != here:
                    found.append(name)
            settled.update(name for name, origin in tops.items() if origin == here)
        return sorted(found)

    @property
    def user_preloaded(self) -> list[str]:
        """The worker's preloads this server imported."""
        return [name for name in self.preloaded if name in self.preload]

    def stale(self) -> str | None:
        """What changed on disk since the server imported the worker's preloads (a file they
        came from: a package upgraded, a module edited, a broken preload fixed; a path where a
        missing preload appeared; a site-packages folder an install caught half way finished
        in), or what ``site`` reads as an interpreter starts (preloads or not: see
        :meth:`_site_changed`); None when nothing did."""
        for path, ino, size, mtime in self._stamps:
            try:
                st = os.stat(path)
            except OSError:
                if ino == ABSENT:  # (a path where a missing preload would appear: still missing)
                    continue
                return path
            if (st.st_ino, st.st_size, st.st_mtime_ns) != (ino, size, mtime):
                return path
        return self._site_changed()

    def _site_changed(self) -> str | None:
        """A file that ``site`` reads as an interpreter starts (a ``.pth`` file, a
        ``sitecustomize``) added, changed or removed in a site-packages folder since the
        server started (``pip install -e``: a fresh interpreter would find the package, and
        a child of this server would not), or a site-packages folder that appeared; its
        path, or None. A folder whose times moved is listed again (another package
        installed there changes nothing a task's start would read)."""
        for i, (folder, ino, size, mtime, files) in enumerate(self._sites):
            try:
                st = os.stat(folder)
            except OSError:
                if ino == ABSENT:
                    continue
                return folder
            moved = (st.st_ino, st.st_size, st.st_mtime_ns) != (ino, size, mtime)
            now = site_files(folder, None if moved else [name for name, _, _ in files])
            if now != files:
                changed = {n for n, *_ in now} ^ {n for n, *_ in files} or {
                    n for n, *rest in now if [n, *rest] not in files}
                return os.path.join(folder, min(changed)) if changed else folder
            if moved:
                self._sites[i] = (folder, st.st_ino, st.st_size, st.st_mtime_ns, files)
        return None

    def lease(self) -> None:
        """A task was given this server (:meth:`.fork_servers.ForkServers.choose`): it is not stopped by
        :meth:`retire` before :meth:`release`, though the task has no child yet."""
        with self._lock:
            self._leases += 1

    def release(self) -> None:
        """The task given this server ended (its child, if it had one, too)."""
        with self._lock:
            self._leases -= 1
        self._end_if_retired()

    def retire(self) -> None:
        """Take no more tasks; stop once the tasks given it ended (they die with the server)."""
        with self._lock:
            self._retiring = True
        self._end_if_retired()

    def _end_if_retired(self) -> None:
        with self._lock:
            done = self._retiring and self._leases <= 0 and not self._children
        if done:
            self.close()

    def close(self) -> None:
        """Stop the server (its children, if any are left, die with it); one still starting
        (a preload's import that may never end) is killed."""
        self._closed = True
        sock = self._sock
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
        elif self._proc is not None and self.starting:
            with contextlib.suppress(OSError):
                self._proc.kill()


def _how_it_ended(proc: subprocess.Popen[bytes]) -> str:
    """`` (exit code N)`` or `` (killed by SIGSEGV)`` for a process that ended (waited for
    a moment: its end of the socket closed as it exited), or ''."""
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(5)
    code = proc.returncode
    if code is None:
        return ""
    if code < 0:
        with contextlib.suppress(ValueError):
            return f" (killed by {signal.Signals(-code).name})"
        return f" (killed by signal {-code})"
    return f" (exit code {code})"


def _module_name(name: str, folder: bool) -> str:
    """The module a file or folder of a ``sys.path`` folder would be imported as (``x.py``,
    ``x.cpython-311-x86_64-linux-gnu.so``, a package ``x``), or ''."""
    if folder:
        return name if "." not in name else ""
    return name.partition(".")[0] if name.endswith((".py", ".so")) else ""
