"""Wake-ups between the processes that share one SQLite database.

Several processes use one ``$GPULAYER_HOME``: a ``gpulayer worker start``, a script whose
SDK runs a worker of its own, a ``gpulayer submit`` waiting for its job. Each waits on the
database (a worker's poll for work, a caller's wait for a job's end) and is woken at once by
changes its own process commits, but a change another process commits was only seen at its
next look (every 0.2 s for a poll, up to 0.5 s for a wait). Here a process that committed a
change nudges the others, so their waits look again at once.

Each process that waits on a database (one :class:`Nudges` per database file and process,
:meth:`Nudges.of`) binds a datagram socket in Linux's abstract namespace under a random name
and registers that name as a file in ``<database>.nudges/``, which it holds with a shared
``flock`` while it lives. A process that committed a change (:meth:`Nudges.send`) sends one
datagram to every name registered there and calls the other waiters of its own process. A
nudge says only what kind of change it was (the caller's news: which waits should look
again); the woken side reads the database as it would at its next look, so one that is lost
or late costs only the old delay. A name that cannot be reached is left out from then
on; its file is removed when its ``flock`` is free (the process is gone), and kept when the
process lives in another network namespace (it keeps the old delay).

Linux only (abstract sockets); elsewhere, and for an in-memory database, :meth:`Nudges.of`
returns None and waits look again on their own schedule as before.
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import socket
import sys
import threading
import weakref
from collections.abc import Callable

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows: no nudges
    fcntl = None  # type: ignore[assignment]

__all__ = ["MAX_NEWS", "Nudges"]

log = logging.getLogger(__name__)

_PREFIX = b"\0gpulayer-nudge-"
#: the most a nudge says, in bytes (a sender that would say more says less: see
#: gpulayer.control.core, which then names no worker and wakes every poll)
MAX_NEWS = 8192


class Nudges:
    """The nudges of one database file in this process (see the module doc)."""

    _known: dict[str, Nudges] = {}
    _known_lock = threading.Lock()

    @classmethod
    def of(cls, database: str | None) -> Nudges | None:
        """The one for this database file (None where nudges are not supported)."""
        if not database or database == ":memory:" or not sys.platform.startswith("linux") or fcntl is None:
            return None
        key = os.path.realpath(database)
        with cls._known_lock:
            nudges = cls._known.get(key)
            if nudges is None or nudges._closed:
                nudges = cls._known[key] = cls(key + ".nudges")
            nudges._users += 1
            return nudges

    def __init__(self, folder: str) -> None:
        self.folder = folder
        self._users = 0
        self._closed = False
        self._lock = threading.Lock()
        #: what a nudge calls in this process with its news: the waiters' wake-ups (weakly held)
        self._subscribers: list[weakref.WeakMethod[Callable[[set[str]], None]]] = []
        self._sock: socket.socket | None = None
        self._name: str | None = None
        self._entry_fd: int | None = None
        self._owner = 0
        self._unreachable: set[str] = set()
        self._sender: socket.socket | None = None

    # ------------------------------------------------------------------ waiting side

    @property
    def listening(self) -> bool:
        """Whether this process hears other processes' nudges (it subscribed, and could)."""
        return self._sock is not None

    def subscribe(self, wake: Callable[[set[str]], None]) -> None:
        """Call ``wake(news)`` (a bound method) whenever another process, or another waiter of
        this one, committed a change; from then on this process is registered to be nudged."""
        with self._lock:
            if self._closed:
                return
            self._subscribers.append(weakref.WeakMethod(wake))
            if self._sock is None:
                self._listen()

    def _listen(self) -> None:
        name = secrets.token_hex(8)
        try:
            os.makedirs(self.folder, mode=0o700, exist_ok=True)
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
            sock.bind(_PREFIX + name.encode())
            fd = os.open(os.path.join(self.folder, f"{os.getpid()}-{name}"),
                         os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
            fcntl.flock(fd, fcntl.LOCK_SH)
        except OSError as exc:  # not nudged: waits look again on their own schedule
            log.debug("no nudges for %s: %s", self.folder, exc)
            return
        self._sock, self._name, self._entry_fd, self._owner = sock, name, fd, os.getpid()
        threading.Thread(target=self._receive, args=(sock,), name="gpulayer-nudges", daemon=True).start()

    def _receive(self, sock: socket.socket) -> None:
        while True:
            try:
                data = sock.recv(MAX_NEWS)
                if not data:
                    return
                news = set(data.decode(errors="replace").split("\n"))
                # several nudges that came together wake the waiters once
                sock.setblocking(False)
                with contextlib.suppress(BlockingIOError):
                    while more := sock.recv(MAX_NEWS):
                        news.update(more.decode(errors="replace").split("\n"))
                sock.setblocking(True)
            except OSError:
                return  # closed
            self._wake(news, None)

    def _wake(self, news: set[str], source: Callable[[set[str]], None] | None) -> None:
        with self._lock:
            alive = [(ref, ref()) for ref in self._subscribers]
            self._subscribers = [ref for ref, wake in alive if wake is not None]
        for _ref, wake in alive:
            if wake is not None and wake != source:
                wake(news)

    # ------------------------------------------------------------------ changing side

    def send(self, news: set[str], source: Callable[[set[str]], None] | None = None) -> None:
        """A change was committed: nudge every other process registered with ``news`` (short
        words without a newline: what its waits make of them is theirs), and wake this
        process's other waiters (not ``source``, which knows)."""
        self._wake(news, source)
        try:
            entries = os.listdir(self.folder)
        except OSError:
            return  # nobody ever waited on this database
        with self._lock:
            if self._closed:
                return
            if self._sender is None:
                self._sender = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
                self._sender.setblocking(False)
            sender = self._sender
            own, unreachable = self._name, self._unreachable
        data = "\n".join(sorted(news)).encode()[:MAX_NEWS]
        for entry in entries:
            name = entry.partition("-")[2]
            if not name or name == own or entry in unreachable:
                continue
            try:
                sender.sendto(data, _PREFIX + name.encode())
            except BlockingIOError:
                continue  # its queue is full: it has nudges to read already
            except OSError:
                self._forget(entry)

    def _forget(self, entry: str) -> None:
        """A name that could not be reached: its file goes when its owner is gone."""
        path = os.path.join(self.folder, entry)
        try:
            fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
        except OSError:
            return
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:  # alive, where our nudges do not reach (another network namespace)
            with self._lock:
                self._unreachable.add(entry)
        else:
            with contextlib.suppress(OSError):
                os.unlink(path)
        finally:
            os.close(fd)

    # ------------------------------------------------------------------ closing

    def close(self) -> None:
        """One Store fewer uses it; the last one stops listening and unregisters."""
        with self._known_lock:
            self._users -= 1
            if self._users > 0:
                return
            if self._known.get(self.folder[: -len(".nudges")]) is self:
                del self._known[self.folder[: -len(".nudges")]]
        with self._lock:
            self._closed = True
            sock, self._sock = self._sock, None
            sender, self._sender = self._sender, None
            fd, self._entry_fd = self._entry_fd, None
            name = self._name
        if fd is not None and name is not None:
            entry = os.path.join(self.folder, f"{self._owner}-{name}")
            if os.getpid() == self._owner:  # (a forked child's copy leaves its parent registered)
                with contextlib.suppress(OSError):
                    os.unlink(entry)
            os.close(fd)
        for s in (sock, sender):
            if s is not None:
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)
                s.close()
