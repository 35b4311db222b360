"""Finding the processes of a task's tree, wherever they went.

Every process of a task's tree carries a marker in its environment (``GPULAYER_TREE_ID``:
``<worker pid>.<worker start time>.<id>``, set by :func:`gpulayer.worker.process.run_process`):
:func:`owner` is that prefix for this process, :func:`owner_alive` whether a marker's worker
still runs. :func:`marked` finds the processes that carry a marker: below a subreaper of the
tree (:func:`descendants`), among the processes started since the task began
(:class:`PidMark`), or else among every process on the machine.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterable
from dataclasses import dataclass

import psutil

from gpulayer.worker import TREE_ID_ENV

__all__ = ["PidMark", "descendants", "every_marker", "marked", "owner", "owner_alive"]


_owners: dict[int, str] = {}


def _start_ticks(pid: int) -> int | None:
    """When ``pid`` started, in clock ticks since boot (``/proc/PID/stat``'s 22nd field): a
    time no change of the wall clock moves. None where it cannot be read."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    fields = stat[stat.rfind(b")") + 2:].split()  # (a command's name may hold a ")" itself)
    try:
        return int(fields[19])
    except (IndexError, ValueError):
        return None


def _start_centis(pid: int) -> int | None:
    """When ``pid`` started, in hundredths of a second since the epoch (psutil's)."""
    try:
        return int(psutil.Process(pid).create_time() * 100)
    except psutil.Error:
        return None


#: Linux: a marker's start is ``t`` and the ticks since boot; elsewhere (and in markers of
#: earlier versions) the hundredths of a second since the epoch, which on Linux psutil
#: derives from the boot time that ``/proc/stat`` gives in whole seconds from the wall
#: clock: a clock set or slewed across a second moves it, and a live worker's tasks looked
#: like orphans to the next worker that started
_TICKS = sys.platform.startswith("linux") and os.path.isdir("/proc/self")
#: how far apart two readings of one process's start in hundredths may be
_CENTIS_SLACK = 200


def owner() -> str:
    """This process as a marker prefix: pid and start time (a reused pid is not us)."""
    pid = os.getpid()  # (a forked child is another process: it looks itself up)
    if pid not in _owners:
        ticks = _start_ticks(pid) if _TICKS else None
        if ticks is not None:
            _owners[pid] = f"{pid}.t{ticks}"
        else:
            _owners[pid] = f"{pid}.{_start_centis(pid) or 0}"
    return _owners[pid]


def owner_alive(marker: str) -> bool:
    pid_text, _, rest = marker.partition(".")
    started_text = rest.partition(".")[0]
    ticks = started_text.startswith("t")
    try:
        pid, started = int(pid_text), int(started_text[1:] if ticks else started_text)
    except ValueError:
        return True  # not one of ours (or an older format): leave it alone
    if ticks:
        return _start_ticks(pid) == started
    now = _start_centis(pid)
    return now is not None and abs(now - started) <= _CENTIS_SLACK


def marked(marker: str, within: int | None = None, since: PidMark | None = None) -> list[psutil.Process]:
    """Processes (other than this one) whose environment has ``TREE_ID_ENV=marker``; with
    ``within``, only those below that process (a subreaper of the whole tree: see
    :attr:`Started.within`) when its descendants can be listed; else, with ``since`` (taken
    before the tree's first process started), only the processes started since, when that
    can be told (:meth:`PidMark.started_since`)."""
    me = os.getpid()
    if _PROC_ENVIRON:
        pids = descendants(within) if within is not None else None
        if pids is None and since is not None:
            pids = since.started_since()
        return [p for p in (process_of(pid) for pid in _marked_pids(marker, pids)) if p is not None and p.pid != me]
    found = []
    for proc in psutil.process_iter():
        if proc.pid == me:
            continue
        try:
            if proc.environ().get(TREE_ID_ENV) == marker:
                found.append(proc)
        except (psutil.Error, OSError):
            continue
    return found


#: Linux: read /proc/PID/environ directly, which is several times cheaper than psutil's
#: parsed dict (this scan runs once per task, after its main process exited)
_PROC_ENVIRON = sys.platform.startswith("linux") and os.path.isdir("/proc/self")


def _read_int(path: str) -> int | None:
    try:
        with open(path, "rb") as f:
            return int(f.read())
    except (OSError, ValueError):
        return None


#: the pid this pid namespace allocated last, and the highest it allocates before it wraps
_LAST_PID = "/proc/sys/kernel/ns_last_pid"
_PID_MAX = _read_int("/proc/sys/kernel/pid_max") if _PROC_ENVIRON else None
#: forks a second no machine reaches: a window of pids is trusted for a tree that lived less
#: than ``pid_max`` of them (a whole round of pids could not have been allocated meanwhile)
_FORK_RATE_BOUND = 100_000
#: past this many pids in the window, listing /proc costs less than trying each
_WINDOW_MAX = 4096


@dataclass(frozen=True)
class PidMark:
    """Where the pid allocator stood before a task's first process started, and when.

    A process the task started later (one that left its group, and its parent, behind) has
    a pid allocated after that: the scan for leftovers can look at those pids instead of at
    every process on the machine, which reads the environment of each (0.6-0.9 ms a task on
    a quiet machine, more on a busy one)."""

    last: int
    at: float

    @classmethod
    def now(cls) -> PidMark | None:
        """None where it cannot be read, or /proc is not this pid namespace's."""
        if not _PROC_ENVIRON or _PID_MAX is None or os.readlink("/proc/self") != str(os.getpid()):
            return None
        last = _read_int(_LAST_PID)
        return None if last is None else cls(last, time.monotonic())

    def started_since(self) -> list[str] | None:
        """The pids allocated since this mark, or None (look at every process): after a
        wrap-around of the pid counter, a long life (it might have wrapped round more than
        once), or a window wider than the process table."""
        if _PID_MAX is None or time.monotonic() - self.at >= _PID_MAX / _FORK_RATE_BOUND:
            return None
        last = _read_int(_LAST_PID)
        if last is None or last < self.last or last - self.last > _WINDOW_MAX:
            return None
        return [str(pid) for pid in range(self.last + 1, last + 1)]


def descendants(root: int) -> list[str] | None:
    """The pids below ``root``, from ``/proc/PID/task/TID/children``; None when that cannot be
    read (no such process, a kernel without the file, a tree that keeps changing): then every
    process is looked at. A process that ends during the walk sends its children up to the
    subreaper, whose list was read already, so the walk is then made again: where it is gone,
    and where its own list read empty as it ended (a zombie's, its parent not having waited
    for it yet: its children may have gone up just before; once a zombie, it moves nothing
    more, and does not make the next walk be made again)."""
    ended: set[str] = set()
    for _ in range(3):
        out: list[str] = []
        todo = [str(root)]
        moved = False
        while todo:
            pid = todo.pop()
            try:
                threads = os.listdir(f"/proc/{pid}/task")
            except OSError:
                if pid == str(root):
                    return None
                moved = True
                continue
            for tid in threads:
                try:
                    with open(f"/proc/{pid}/task/{tid}/children", "rb") as f:
                        kids = f.read().decode().split()
                except OSError:
                    if os.path.exists(f"/proc/{pid}/task/{tid}/stat"):
                        return None  # a live thread without the file: this kernel lacks it
                    moved = True
                    continue
                out.extend(kids)
                todo.extend(kids)
                if not kids and tid not in ended:
                    state = _exit_state(f"/proc/{pid}/task/{tid}/stat")
                    if state == "ended":
                        ended.add(tid)
                    moved = moved or state is not None
        if not moved:
            return out
    return None


def _marked_pids(marker: str, pids: Iterable[str] | None = None) -> list[int]:
    """The pids, of ``pids`` (default: every process), whose environment carries ``marker``."""
    needle = f"\0{TREE_ID_ENV}={marker}\0".encode()
    found = []
    for name in pids if pids is not None else os.listdir("/proc"):
        if not name.isdigit():
            continue
        data = _environ(name)
        if data and needle in b"\0" + data + b"\0":
            found.append(int(name))
    return found


def _read_environ(name: str) -> bytes | None:
    """``/proc/PID/environ`` as it reads now; None: gone, or not ours to read."""
    try:  # os.read in pages: a third cheaper than open() and its buffered reader
        fd = os.open(f"/proc/{name}/environ", os.O_RDONLY)
    except OSError:
        return None
    chunks = []
    try:
        while part := os.read(fd, 8192):
            chunks.append(part)
    except OSError:
        return None
    finally:
        os.close(fd)
    return b"".join(chunks)


#: /proc/PID/stat's flags: a kernel thread (it has no environment), a process that exits
_PF_KTHREAD = 0x00200000
_PF_EXITING = 0x00000004
#: how long a scan waits for one process's exec to put its program's environment in place
_EXEC_WAIT = 1.0


def _stat(path: str) -> list[bytes]:
    """The fields of a ``/proc/PID/stat`` from the state on (the 3rd: a command's name may
    hold a ")" or a space itself); none where it cannot be read."""
    try:
        with open(path, "rb") as f:
            stat = f.read()
    except OSError:
        return []
    return stat[stat.rfind(b")") + 2:].split()


def _exit_state(path: str) -> str | None:
    """Whether the process or thread of ``path`` (its ``stat``) is "exiting", has "ended" (a
    zombie, or gone), or neither (None)."""
    fields = _stat(path)
    try:
        if fields[0] in (b"Z", b"X"):
            return "ended"
        return "exiting" if int(fields[6]) & _PF_EXITING else None
    except (IndexError, ValueError):
        return "ended"


def _env_end(name: str) -> int | None:
    """Where the environment of ``name``'s program ends in its memory (``/proc/PID/stat``'s
    51st field): 0 while an exec has not put it in place yet; None for a kernel thread, a
    process that exits, or where it cannot be read (a kernel older than 3.5)."""
    fields = _stat(f"/proc/{name}/stat")
    try:
        if fields[0] in (b"Z", b"X") or int(fields[6]) & (_PF_KTHREAD | _PF_EXITING):
            return None
        return int(fields[48])
    except (IndexError, ValueError):
        return None


def _environ(name: str) -> bytes | None:
    """The environment of process ``name`` (None: gone, or not ours to read).

    An exec replaces a process's memory before it copies the new program's environment
    there, and between the two ``/proc/PID/environ`` reads empty: ``subprocess.Popen`` has
    returned by then (the child's close-on-exec pipe closes as the exec passes its point of
    no return), so a task that starts a process and exits at once can end while that
    process is still in its exec, and a scan then would not see its marker (a process that
    left the task's group outlived the task, twice in CI under load). Such a process
    (``/proc/PID/stat`` says where its environment ends: 0 until it is there) is read again
    once its environment is in place, waiting :data:`_EXEC_WAIT` at most."""
    data = _read_environ(name)
    if data != b"":
        return data
    deadline = time.monotonic() + _EXEC_WAIT
    pause = 0.0002
    while (end := _env_end(name)) == 0 and time.monotonic() < deadline:
        time.sleep(pause)
        pause = min(pause * 2, 0.01)
    # (read again even where no exec was seen: it may have ended between the two reads; a
    # program given an empty environment reads empty again)
    return data if end is None else _read_environ(name)


def _pid_namespace(pid: int | str) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/ns/pid")
    except OSError:
        return None


def every_marker() -> dict[str, list[int]]:
    """Every marker on the machine and the pids that carry it (Linux: ``/proc/PID/environ``
    read directly, about 2 ms for 150 processes, so a worker can afford it every few
    seconds; elsewhere through psutil), of this process's PID namespace only: a marker
    names its worker by the pid that worker has in its own namespace, so the tasks of a
    worker in a container, seen from the host, would look like orphans (their owner's pid
    is another process here, or none) and be ended while they run."""
    found: dict[str, list[int]] = {}
    me = os.getpid()
    here = _pid_namespace("self")
    if not _PROC_ENVIRON:
        for proc in psutil.process_iter():
            try:
                marker = proc.environ().get(TREE_ID_ENV) if proc.pid != me else None
            except (psutil.Error, OSError):
                continue
            if marker:
                found.setdefault(marker, []).append(proc.pid)
        return found
    needle = f"\0{TREE_ID_ENV}=".encode()
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == me:
            continue
        environ = _environ(name)
        if not environ:
            continue
        data = b"\0" + environ
        at = data.find(needle)
        if at >= 0:
            start = at + len(needle)
            end = data.find(b"\0", start)
            marker = data[start:end if end >= 0 else len(data)].decode(errors="replace")
            if marker and _pid_namespace(name) == here:
                found.setdefault(marker, []).append(int(name))
    return found


def process_of(pid: int) -> psutil.Process | None:
    """The process ``pid``, or None where it is gone (or cannot be read)."""
    try:
        return psutil.Process(pid)
    except psutil.Error:
        return None
