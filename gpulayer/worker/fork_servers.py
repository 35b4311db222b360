"""A worker's fork servers (:class:`ForkServers`): which one a FunctionJob task is forked
from, or why it is spawned instead (the event message that says so), and when a server is
replaced: its preloads changed on disk, the worker's environment changed since it started.
One server is :class:`gpulayer.worker.forking.ForkServer`; see that module for the rules.
"""

from __future__ import annotations

import logging
import math
import os
import threading
import time
from typing import Any

from gpulayer.interpreter import start_variables
from gpulayer.worker import forking
from gpulayer.worker.forking import FORKED, ForkServer, unsupported

log = logging.getLogger("gpulayer.worker.forking")  # (the fork servers' one log, as it was)


def _environ_now(*, copy: bool = True) -> dict[Any, Any]:
    """This process's environment as ``os.environ`` holds it: its encoded dict, compared in
    a microsecond (a decoded copy takes ten times that)."""
    data = getattr(os.environ, "_data", None)
    if not isinstance(data, dict):
        return dict(os.environ)
    return dict(data) if copy else data


#: the modules ``site`` imports as an interpreter starts, if it finds them on its path
SITE_HOOKS = ("sitecustomize", "usercustomize")


def site_hook(folders: list[str]) -> str | None:
    """A start-up hook of ``site`` (``sitecustomize.py``, or ``usercustomize.py`` where the user
    site is on; a module or a package) in one of a job's own folders (its bundle, its ``PYTHONPATH``): a spawned
    interpreter runs it, a forked child does not (its server ran ``site`` as it started, from
    the worker's path), so the job is spawned. Its path as the event says it, or None."""
    import site

    # (site imports usercustomize only where the user site is on: not in a virtual environment)
    names = SITE_HOOKS if site.ENABLE_USER_SITE else SITE_HOOKS[:1]
    for folder in folders:
        if not folder:
            continue
        for name in names:
            for candidate in (os.path.join(folder, f"{name}.py"), os.path.join(folder, name, "__init__.py")):
                if os.path.isfile(candidate):
                    return f"{candidate.removesuffix(os.sep + '__init__.py')}"
    return None


#: a worker's server with preloads is replaced for a change of its environment once that
#: has held this many seconds (a variable set before each job never does), and not more
#: often than every FOLLOW_EVERY seconds (see ForkServers.follow_environ)
FOLLOW_SETTLE = 5.0
FOLLOW_EVERY = 30.0


class ForkServers:
    """A worker's fork servers, started on first use, for its job Python: one with the
    worker's preloads, and one without them for the tasks those would not fit (a job that
    sets an environment variable, a worker's environment changed since, a task with its own
    copy of what they imported), started when the first such task comes."""

    def __init__(self, python: str, env: dict[str, str], preload: tuple[str, ...] = (), *,
                 follow: frozenset[str] | None = None) -> None:
        self.python = python
        #: what the server starts with, and what a forked task inherits from at start-up
        self.env = env
        #: ``follow``: ``env`` is this process's ``os.environ`` but for these variables, and
        #: follows it (see :meth:`follow_environ`)
        self._follow = follow
        self._environ_seen = _environ_now() if follow is not None else None
        #: the environment a task inherits now (see :meth:`follow_environ`)
        self._environ = env
        #: when the servers were last replaced for a change of the environment, and when
        #: the environment last changed
        self._followed = -math.inf
        self._changed = -math.inf
        #: the worker's preloads (``--preload``), in order
        self.preload = tuple(preload)
        #: preloads left out from now on, and why (one that made a server unsafe to fork)
        self.refused: dict[str, str] = {}
        self._servers: dict[tuple[str, ...], ForkServer] = {}
        #: servers replaced while they still ran tasks (closed at the latest with the rest)
        self._retired: list[ForkServer] = []
        self._lock = threading.Lock()
        #: servers started so far, per preload list: one that keeps failing is not started
        #: again and again
        self._starts: dict[tuple[str, ...], int] = {}
        #: the servers whose preloads were said to be slow to import (by id: said once)
        self._slow: set[int] = set()

    def follow_environ(self) -> dict[str, str]:
        """The environment a task inherits now (:attr:`env` where the servers do not follow
        this process's). Where the worker runs in someone else's process (the SDK's, in a
        script or a notebook), that process may change its ``os.environ`` after the servers
        started (``os.environ["HF_HOME"] = ...`` in a cell), and its tasks get the new one.
        A change of a variable an interpreter reads as it starts replaces every server (once
        its tasks end); of another, the server with the preloads (which saw the old value as
        it imported them), once the environment has held for :data:`FOLLOW_SETTLE` seconds
        and not more often than every :data:`FOLLOW_EVERY` (a variable set before each job
        replaces nothing: the next job would find the new server stale already); meanwhile
        the tasks go to the server without the preloads (see :meth:`choose`), which takes a
        task's environment after the fork and goes on. One comparison of two dicts while
        nothing changed."""
        if self._follow is None:
            return self.env
        if _environ_now(copy=False) != self._environ_seen:
            now = _environ_now()  # (decoded from this copy: another thread may change os.environ)
            decoded = {os.fsdecode(k): os.fsdecode(v) for k, v in now.items()}
            with self._lock:
                self._environ_seen = now
                self._environ = {k: v for k, v in decoded.items() if k not in self._follow}
                self._changed = time.monotonic()
        env = self._environ
        if env is self.env:
            return env
        servers: list[ForkServer] = []
        with self._lock:
            if env == self.env:
                self.env = env
                return env
            changed = sorted({*env, *self.env} - {k for k in env if self.env.get(k) == env[k]})
            starting = start_variables(env, locale=True) != start_variables(self.env, locale=True)
            preloaded = [key for key in self._servers if key]
            moment = time.monotonic()
            if not starting and preloaded and (moment - self._changed < FOLLOW_SETTLE
                                               or moment - self._followed < FOLLOW_EVERY):
                return env
            gone = list(self._servers) if starting else preloaded
            servers = [self._servers.pop(key) for key in gone]
            for key in gone:
                self._starts.pop(key, None)
            self._retired = [s for s in self._retired if not s.failed] + servers
            self.env = env
            if servers:
                self._followed = moment
        if servers:
            log.info("fork server: the worker's environment changed (%s): starting a new one", ", ".join(changed))
        for server in servers:
            server.retire()
        return env

    def choose(self, python: str | None, env: dict[str, str],
               own: list[str] | None = None) -> tuple[ForkServer | None, str]:
        """The server to fork a task from (None: spawn it) and the event message saying so.
        The server is leased to the task: :meth:`ForkServer.release` it when the task ends.
        ``own``: modules the preloads imported of which the task has its own copy
        (:meth:`ForkServer.shadowed`): it is forked from a server without the preloads."""
        why = unsupported()
        if why is None and python not in (None, self.python):
            why = f"the job's Python {python} is not the worker's {self.python}"
        if why is None:
            # (the locale's too: an interpreter sets its own, and its streams' encoding, as it starts)
            changed = sorted(k for k, v in start_variables(env, locale=True).items() if self.env.get(k) != v)
            gone = sorted(k for k in start_variables(self.env, locale=True) if k not in env)
            if changed or gone:
                why = f"the job sets {', '.join(changed + gone)}, read as an interpreter starts"
        if why is not None:
            return None, f"spawned: {why}"
        note = ""
        want = tuple(name for name in self.preload if name not in self.refused)
        if want:
            # a preloaded module saw the worker's environment as it was imported
            sets = sorted(k for k, v in env.items() if k != "PYTHONPATH" and self.env.get(k) != v)
            sets += sorted(k for k in self.env if k not in env)
            mine = [k for k in sets if self._environ.get(k) != env.get(k)]
            if mine:
                want, note = (), f" (not preloaded: the job sets {', '.join(mine)})"
            elif sets:  # (see follow_environ)
                want, note = (), f" (not preloaded: the worker's environment changed since: {', '.join(sets)})"
            elif own:
                want, note = (), f" (not preloaded: the job has its own {', '.join(own)})"
        for _ in range(len(want) + 2):
            server = self._server(want)
            why = server.ready()
            if why is None:
                mine = server.user_preloaded
                return server, FORKED + (note or (f" (preloaded: {', '.join(mine)})" if mine else ""))
            server.release()
            if want and server.starting:
                # a preload whose import has not ended (it may never): tasks are forked
                # without the preloads meanwhile, not each kept waiting for it
                slow = server.importing or ", ".join(want)
                if id(server) not in self._slow:
                    self._slow.add(id(server))
                    log.warning("--preload %s: its import has not ended %g s after the fork server started: tasks "
                                "are forked without the preloads until it does", slow, forking.READY_TIMEOUT)
                want, note = (), f" (not preloaded: the import of {slow} has not ended)"
                continue
            if server.offender is None or server.offender not in want:
                break
            # a preload left the server unsafe to fork: from now on, a server without it
            self.refused[server.offender] = why
            log.warning("--preload %s: left out: %s", server.offender, why)
            want = tuple(name for name in want if name != server.offender)
        return None, f"spawned: {why}"

    def prestart(self) -> None:
        """Start the server with the preloads now, not at the first FunctionJob, so that the
        first one finds them imported too (nothing without preloads, or where forking is not
        used)."""
        want = tuple(name for name in self.preload if name not in self.refused)
        if not want or unsupported() is not None:
            return
        with self._lock:
            if want not in self._servers:
                self._starts[want] = self._starts.get(want, 0) + 1
                self._servers[want] = ForkServer(self.python, self.env, want)

    def _server(self, want: tuple[str, ...]) -> ForkServer:
        """The server with these preloads, leased: started, or started again when it failed
        (a few times) or when what it preloaded changed on disk (the old one ends after the
        tasks it was given)."""
        with self._lock:
            server = self._servers.get(want)
        # (looked at outside the lock: a thousand stamps take milliseconds)
        changed = server.stale() if server is not None and server.failed is None else None
        with self._lock:
            current = self._servers.get(want)
            if changed is not None and current is server and current is not None:
                log.info("fork server: %s changed since the server started: starting a new one", changed)
                current.retire()
                self._retired = [s for s in self._retired if not s.failed]
                self._retired.append(current)
                current = None
                self._starts[want] = 0
            if current is None or (current.failed and self._starts.get(want, 0) < 3):
                self._starts[want] = self._starts.get(want, 0) + 1
                current = self._servers[want] = ForkServer(self.python, self.env, want)
            current.lease()
            return current

    def close(self) -> None:
        with self._lock:
            servers, self._servers = [*self._servers.values(), *self._retired], {}
            self._retired = []
        for server in servers:
            server.close()
