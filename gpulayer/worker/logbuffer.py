"""A task's output on its way to the control plane: decoded as it arrives (a character cut
between two reads waits for its other half) and shipped in chunks, at most every
``interval`` seconds and at once past :data:`SHIP_AT` characters, by the worker agent
(:mod:`.agent`).

Shipments are made by a thread of the buffer's own, never by a write: a shipment may retry
through an outage of the control plane, and meanwhile the task's output is read, and kept,
up to :data:`HOLD_AT` characters. (A reader kept waiting by a shipment lost what the task
wrote during the outage: once the task's process has exited, its worker reads the pipes for
two seconds more at most.) A shipment that fails because the control plane cannot be
reached, or cannot store it now (a full disk under its database), is kept for the next one,
and the last one is tried again for up to ``retry_for`` seconds, as the task's report is; only
one the control plane refused (the task is not the worker's, or no longer running) is
dropped.

Each shipment says where in the task's output it begins (its offset: the characters of
every stream shipped before it, in the order written), so that one sent again, whose first
sending was stored and its answer lost (a server killed between its commit and its answer),
is stored once: the control plane keeps, per task, how far its output is stored, and leaves
out what a shipment repeats (:func:`gpulayer.store.plain.claim_output`). A control plane
from before offsets refuses the field; :func:`task_sender` then sends them without it, as
before, for as long as the worker runs."""

from __future__ import annotations

import codecs
import logging
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any

from gpulayer.api import LogStream
from gpulayer.errors import AuthError, Conflict, InvalidInput, NotFound
from gpulayer.logtext import utf8_text

log = logging.getLogger(__name__)

#: output waiting to be shipped goes at once past this many characters: each chunk is a write
#: transaction, and a task that writes fast fills one in milliseconds (at 64 kB, 200 MB of
#: output were 3,200 of them). Its JSON stays far below a server's request limit (16 MB): at
#: most 12 bytes a character, escaped.
SHIP_AT = 512 * 1024
#: while a shipment is on its way, writes keep what they read up to this many characters
#: waiting; past it a write ships it itself, waiting for the shipment on its way (the task's
#: pipe fills, and the task waits too)
HOLD_AT = 32 * SHIP_AT
#: what a refusal of the control plane raises: the same shipment sent again changes nothing
REFUSED = (Conflict, NotFound, AuthError, InvalidInput)

#: what ships a task's output: its chunks, and where in the output they begin
Send = Callable[[list[tuple[LogStream, str]], int], None]
#: the control planes (their API objects) that refused a shipment's offset: from before it
#: (by identity: an embedded :class:`~gpulayer.control.ControlPlane` is not hashable)
_UNNUMBERED: list[weakref.ref[Any]] = []


def task_sender(api: Any, task_id: str, worker_id: str) -> Send:
    """Ships the output of ``task_id`` through ``api`` (a :class:`~gpulayer.api.WorkerAPI`)
    with each shipment's offset, or without it to a control plane that refused it (a server
    from before offsets: ``body.offset=0: no such field``), which is not sent one again."""
    def send(chunks: list[tuple[LogStream, str]], offset: int) -> None:
        if not any(ref() is api for ref in _UNNUMBERED):
            try:
                api.append_logs(task_id, worker_id=worker_id, chunks=chunks, offset=offset)
                return
            except InvalidInput as exc:
                if "offset" not in str(exc) or "no such field" not in str(exc):
                    raise
                _UNNUMBERED.append(weakref.ref(api))
        api.append_logs(task_id, worker_id=worker_id, chunks=chunks)
    return send


class LogBuffer:
    """Collects a task's output and ships it in chunks, at most every ``interval`` seconds."""

    def __init__(self, send: Send, interval: float = 0.1, retry_for: float = 0.0) -> None:
        self._send = send
        self._interval = interval
        self._retry_for = retry_for
        self._lock = threading.Lock()
        # taken from taking chunks to having sent them, so chunks arrive in order
        self._send_lock = threading.Lock()
        #: what is not shipped yet: runs of one stream, each a list of pieces (joined when
        #: shipped: adding each read to one string copied the run again at every read)
        self._pending: list[tuple[LogStream, list[str]]] = []
        self._decoders: dict[LogStream, codecs.IncrementalDecoder] = {
            s: codecs.getincrementaldecoder("utf-8")("replace") for s in ("stdout", "stderr")}
        self._size = 0
        #: characters taken out for shipments (not put back): where the next one begins
        self._taken = 0
        self._last = time.monotonic()
        self._closed = threading.Event()
        # the shipper: it ships what is waiting every ``interval`` seconds (output that
        # arrives in one burst and then nothing must still show up promptly), and at once when
        # a write says it is due; started with the first output (a silent task needs none)
        self._ticker: threading.Thread | None = None
        self._due = threading.Event()

    def _tick(self) -> None:
        while not self._closed.is_set():
            self._due.wait(self._interval)
            self._due.clear()
            if self._pending and not self._closed.is_set():  # (once closed, close() ships the rest)
                self.flush()

    def close(self) -> None:
        """Stop the ticker and ship everything, including a character cut off at the end."""
        self._closed.set()
        self._due.set()
        with self._lock:
            ticker = self._ticker
        if ticker is not None:
            ticker.join(5)
        with self._lock:
            for stream, dec in self._decoders.items():
                tail = dec.decode(b"", final=True)
                if tail:
                    self._append(stream, tail)
        deadline, delay = time.monotonic() + self._retry_for, 0.5
        while not self.flush() and time.monotonic() + delay < deadline:
            time.sleep(delay)  # (the control plane is away or cannot store it yet: a full disk)
            delay = min(delay * 2, 10.0)
        with self._lock:  # (its last shipment failed: nothing ships after it)
            if self._pending:
                log.warning("could not ship %d log chunk(s): the control plane could not take them",
                            len(self._pending))
            self._pending, self._size = [], 0

    def write(self, stream: str, data: bytes) -> None:
        with self._lock:
            # a multi-byte character split across two reads stays in the decoder until
            # its other half arrives
            name: LogStream = "stderr" if stream == "stderr" else "stdout"
            dec = self._decoders.setdefault(name, codecs.getincrementaldecoder("utf-8")("replace"))
            self._append(name, dec.decode(data))
            due = self._size > SHIP_AT or time.monotonic() - self._last >= self._interval
            held = self._size > HOLD_AT
            if self._ticker is None and not self._closed.is_set():
                self._ticker = threading.Thread(target=self._tick, name="gpulayer-logs", daemon=True)
                self._ticker.start()
        if held:
            self.flush()
        elif due:  # (the ticker ships it: a shipment may wait through an outage, a write must not)
            self._due.set()

    def add(self, stream: LogStream, text: str) -> None:
        """Add the worker's own ``text`` (a line saying why the task did not run): a lone
        surrogate in it (an error naming a path that is not UTF-8) becomes U+FFFD, as that byte
        written by the task does. (Sent as it was, its shipment could not be encoded: it failed
        until the worker gave up on it, and the task's output after it was lost.)"""
        with self._lock:
            self._append(stream, utf8_text(text))

    def _append(self, stream: LogStream, text: str) -> None:
        if not text:
            return
        if self._pending and self._pending[-1][0] == stream:
            self._pending[-1][1].append(text)
        else:
            self._pending.append((stream, [text]))
        self._size += len(text)

    def flush(self) -> bool:
        """Ship what is waiting (after the shipment on its way, if one is), in shipments of
        about :data:`SHIP_AT` characters (each a request, which the server bounds); False when
        a shipment failed and its output was kept for the next one."""
        with self._send_lock:
            while True:
                with self._lock:
                    offset = self._taken
                    runs = self._take(SHIP_AT)
                    self._last = time.monotonic()
                if not runs:
                    return True
                chunks = [(stream, "".join(pieces)) for stream, pieces in runs]
                try:
                    self._send(chunks, offset)
                except REFUSED as exc:  # sent again, it would be refused again
                    log.warning("could not ship %d log chunk(s): %s", len(chunks), exc)
                except Exception as exc:  # away (its retries ran out) or failing: kept for the next shipment
                    self._keep(runs, exc)
                    return False

    def _take(self, limit: int) -> list[tuple[LogStream, list[str]]]:
        """The oldest pieces waiting, up to the one that brings them to ``limit`` characters,
        taken out of the buffer (under ``_lock``)."""
        taken: list[tuple[LogStream, list[str]]] = []
        size = 0
        while self._pending and size < limit:
            stream, pieces = self._pending[0]
            n = 0
            while n < len(pieces) and size < limit:
                size += len(pieces[n])
                n += 1
            taken.append((stream, pieces[:n]))
            if n == len(pieces):
                self._pending.pop(0)
            else:
                del pieces[:n]
        self._size -= size
        self._taken += size
        return taken

    def _keep(self, runs: list[tuple[LogStream, list[str]]], exc: Exception) -> None:
        """Put ``runs``, which could not be shipped, back before what came since, unless that
        would hold more than :data:`HOLD_AT` (:meth:`close` gives up on what is left)."""
        with self._lock:
            size = sum(len(p) for _, pieces in runs for p in pieces)
            if self._size + size > HOLD_AT:
                log.warning("could not ship %d log chunk(s): %s", len(runs), exc)
                return
            if runs and self._pending and runs[-1][0] == self._pending[0][0]:
                runs[-1][1].extend(self._pending.pop(0)[1])
            self._pending[:0] = runs
            self._size += size
            self._taken -= size  # (sent again from where it began; one given up on leaves a gap)
