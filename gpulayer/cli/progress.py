"""What ``gpulayer submit`` shows on stderr while someone waits for a job.

On a terminal: one live status line, redrawn in place by rich (state, queue position, why
the job waits, elapsed time), with a permanent line each time the state changes; the job's
own output is written as it comes, untouched, with the status line lifted out of its way.
Not on a terminal (a pipe, a log file, CI): the same facts as plain lines, one each time
they change, so a log says when the job was queued, where it ran and for how long.

rich draws the line (cursor movement, erasing, terminal width, spinners) because getting
that right by hand across terminals is a known trap.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import IO, TYPE_CHECKING, Any

from gpulayer.explanations import elapsed_text
from gpulayer.progress import is_terminal
from gpulayer.records import JobRecord, JobState

if TYPE_CHECKING:
    from rich.console import RenderableType
    from rich.live import Live
    from rich.spinner import Spinner

#: how often, at most, a queued job's place in the queue is looked up
POSITION_EVERY = 5.0


def where(job: JobRecord) -> str:
    """`` on wkr-a (cuda 0)`` for the current attempt's tasks."""
    tasks = [t for t in job.tasks if t.attempt == job.attempt]
    if not tasks:
        return ""
    return " on " + ", ".join(
        t.worker_id + (f" ({t.accelerator} {','.join(map(str, t.devices))})" if t.devices else "") for t in tasks)


class JobStatus:
    """The status of one job on ``stream``: live on a terminal, plain lines otherwise.

    ``position(job_id)`` looks up the job's place in the queue (None when unknown); it is
    called at most every :data:`POSITION_EVERY` seconds while the job is queued.
    """

    def __init__(self, stream: IO[str], *, live: bool,
                 position: Callable[[str], int | None] | None = None) -> None:
        self.stream = stream
        self.started = time.monotonic()
        self._position = position
        self._asked_at = -POSITION_EVERY
        self._queue_position: int | None = None
        self._state: str | None = None
        self._facts: tuple[str, ...] | None = None
        self._text = ""
        self._live: Live | None = None
        self._spinner: Spinner | None = None
        self._wants_live = live
        self._last: str | None = None  # the line of the job's end, written by close()

    # ------------------------------------------------------------------ what is shown

    def _facts_of(self, job: JobRecord) -> tuple[str, ...]:
        facts = [f"{job.id} {job.state.value}{where(job)}"]
        if job.state is JobState.QUEUED:
            now = time.monotonic()
            if self._position is not None and now - self._asked_at >= POSITION_EVERY:
                self._asked_at = now
                try:
                    self._queue_position = self._position(job.id)
                except Exception:  # the status line must never end a wait; the position is a nicety
                    self._queue_position = None
            if self._queue_position is not None:
                facts.append(f"position {self._queue_position} in the queue")
            if job.decision is not None:
                facts.append(job.decision.summary)
        return tuple(facts)

    def __rich__(self) -> RenderableType:
        from rich.text import Text

        line = Text(f"gpulayer: {self._text} [{elapsed_text(time.monotonic() - self.started)}]",
                    no_wrap=True, overflow="ellipsis")
        if self._spinner is None:
            return line
        self._spinner.update(text=line)  # one spinner for the whole wait, so that it turns
        return self._spinner

    def _start_live(self) -> None:
        from rich.console import Console
        from rich.live import Live
        from rich.spinner import Spinner

        self._spinner = Spinner("dots")
        # redrawn by update() (each look at the job), not by a thread of rich's own, so that
        # nothing is drawn while the job's output is being written
        self._live = Live(self, console=Console(file=self.stream), auto_refresh=False, transient=True,
                          redirect_stdout=False, redirect_stderr=False)
        self._live.start()

    def update(self, job: JobRecord) -> None:
        """A fresh look at the job: a line when its state changes (not on a terminal: when
        any fact changes), and on a terminal a redraw of the live line. The line of the end
        waits for :meth:`close`, after the job's last output."""
        facts = self._facts_of(job)
        changed = job.state.value != self._state or (not self._wants_live and facts != self._facts)
        self._state, self._facts, self._text = job.state.value, facts, "; ".join(facts)
        line = f"gpulayer: {self._text} [{elapsed_text(time.monotonic() - self.started)}]"
        if job.state.terminal:
            self._last = line if changed else self._last
            return
        if self._wants_live and self._live is None:
            self._start_live()
        if changed:
            self._note(line)
        if self._live is not None:
            self._live.refresh()

    def _note(self, line: str) -> None:
        """A permanent line (above the live one, on a terminal)."""
        if self._live is not None:
            self._live.console.print(line, markup=False, highlight=False, soft_wrap=True)
        else:
            self.stream.write(line + "\n")
            self.stream.flush()

    @contextmanager
    def paused(self) -> Iterator[None]:
        """Lift the live line while the job's output is written, so that output reaches the
        terminal exactly as the job wrote it."""
        live = self._live
        if live is None or not live.is_started:
            yield
            return
        live.stop()
        try:
            yield
        finally:
            if self._live is not None:
                live.start(refresh=True)

    def close(self) -> None:
        """Take the live line away and write the line of the job's end, if it ended."""
        live, self._live = self._live, None
        self._wants_live = False
        if live is not None:
            live.stop()
        last, self._last = self._last, None
        if last is not None:
            self._note(last)


def status_for(client: Any, stream: IO[str] | None = None) -> JobStatus:
    """The status display ``gpulayer submit`` uses: live when ``stream`` (stderr) is a terminal."""
    stream = stream if stream is not None else sys.stderr

    def position(job_id: str) -> int | None:
        return client.api.queue_position(job_id)  # type: ignore[no-any-return]

    return JobStatus(stream, live=is_terminal(stream), position=position)
