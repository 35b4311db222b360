"""Whether a process runs, read cheaply: what a submit asks of every local worker it finds.

Standard library only on Linux (the CLI's light paths import it too); psutil elsewhere.
"""

from __future__ import annotations

import os

#: where a process's state can be read from its ``stat`` file
_PROC = os.path.isdir("/proc/self")


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` runs: it exists and is not a zombie. On Linux one read of its
    ``stat`` file; through psutil (its start time, then its status: two reads and two
    objects) a submit's look at the local workers was a fifth of a submitting script's CPU."""
    if _PROC:
        try:
            with open(f"/proc/{pid}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            return False
        # "pid (comm) S ...": the state follows the last ")" (a comm may hold one itself)
        end = stat.rfind(b")")
        return stat[end + 2:end + 3] not in (b"Z", b"X", b"")
    import psutil

    try:
        return bool(psutil.Process(pid).status() != psutil.STATUS_ZOMBIE)
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return False
