"""Whether a control plane was watching: what tells it that a silence it sees is not the
workers'.

A worker is written off when its stored heartbeat is older than the heartbeat timeout. That
verdict is fair only from a process that could have heard the heartbeats meanwhile. Two
kinds of time are not such:

* **before this process started.** A ``gpulayer jobs list`` opened right after a laptop
  resumed found every worker of the home silent for as long as the lid was closed, and wrote
  them off with their running tasks (retried: run twice; or failed). A control plane starts
  watching when it is made: silence counts for nothing for one heartbeat timeout after that
  (as after a server's start: ``begin_grace``). A worker whose process is gone is written off
  at once, as before.
* **a pause of its own.** A process that was stopped (SIGSTOP, a suspended laptop, a
  paused VM, a host too loaded to run it) or whose wall clock stepped (NTP) sees, on its
  next look, heartbeats as old as the pause, or the step. :class:`Pauses` notices: between
  two looks the monotonic clock moved much more than the looks' cadence allows (stopped;
  the monotonic clock runs on while a process is stopped), or the wall clock moved apart
  from the monotonic one (a suspend: the monotonic clock of Linux and macOS does not count
  the time asleep; or a step of the wall clock). After one, silence counts for nothing for
  one heartbeat timeout, so the workers, which were paused with it, heartbeat first.

This is how Kubernetes' node controller judges leases (by what it observed, with a grace
after its own start) and what a JVM pause monitor does; Ray and HTCondor likewise measure
a silence on the clock of the process that judges it. The looks that come often enough to
tell are a server's expiry pass (every second) and an embedded worker's heartbeats (twice
a second): the processes that write off silent workers in practice. A process that looks
seldom (a script that lists workers now and then) counts every look as after a pause, and
leaves the verdict to them.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

#: the least gap between two looks, or drift between the two clocks, seconds, that counts
#: as a pause (see :meth:`Pauses.look`): well above the cadence of the looks that tell
#: (a server's expiry pass every second, an embedded worker's heartbeat every 0.5 s) and
#: above what NTP's slewing moves the wall clock by between two of them
PAUSE_FLOOR = 2.0


def pause_limit(heartbeat_timeout: float) -> float:
    """The gap (or clock step) between two looks that counts as a pause: half the heartbeat
    timeout, and no less than :data:`PAUSE_FLOOR`."""
    return max(PAUSE_FLOOR, heartbeat_timeout / 2)


@dataclass
class Pauses:
    """Notices the pauses of the process that looks (see the module doc). ``wall`` and
    ``monotonic`` are the two clocks compared (given in tests)."""

    wall: Callable[[], float] = time.time
    monotonic: Callable[[], float] = time.monotonic
    #: (wall, monotonic) at the last look; None before the first
    _last: tuple[float, float] | None = None

    def look(self, limit: float) -> float | None:
        """Note a look. Returns how long this process was paused, or how far the wall
        clock stepped, since the last look, when that is more than ``limit`` seconds; None
        otherwise, and at the first look."""
        wall, mono = self.wall(), self.monotonic()
        last, self._last = self._last, (wall, mono)
        if last is None:
            return None
        gap = mono - last[1]  # stopped (or too busy to look): the monotonic clock ran on
        step = abs((wall - last[0]) - gap)  # asleep (the monotonic clock stood still), or a step
        paused = max(gap, step)
        return paused if paused > limit else None
