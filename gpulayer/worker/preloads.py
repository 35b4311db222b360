"""What a fork server does with the worker's preloads (``--preload``): import them one at a
time, tell whether the server is still safe to fork from, and stamp the files they came from
so the worker sees them change on disk. Run in the server (:mod:`.fork_server`), in the job's
Python: like it, this module imports only the standard library, and is loaded by its path.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import os
import select
import signal
import sys
from collections.abc import Callable
from typing import Any

#: device nodes whose driver a forked child cannot share with its parent (an accelerator
#: runtime initialised before the fork: CUDA's, ROCm's, ...); a preload that leaves one open
#: makes the server unsafe to fork
DEVICE_NODES = ("/dev/nvidia", "/dev/kfd", "/dev/dri/", "/dev/accel", "/dev/neuron", "/dev/davinci")
#: the most files of preloaded modules outside the interpreter's installed packages (an
#: editable install, a folder on PYTHONPATH) stamped one by one (see stamps)
MAX_STAMPED = 1000
#: the inode of a stamp for a path that does not exist yet (see :func:`absent`): the worker
#: reads the path's appearance as a change (``ForkServer.stale``)
ABSENT = -1


def threads() -> int:
    """This process's threads: every one, native ones too, where Linux lists them."""
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return sys.modules["threading"].active_count() if "threading" in sys.modules else 1


#: how long a fork made to count threads (see unsafe) may take to exit
PROBE_TIMEOUT = 5.0


def probe_fork() -> str | None:
    """Fork a child that exits at once, and reap it; why that went wrong, or None. (A
    library's after-fork handler, which runs in the child before it can exit, may wait for a
    lock a thread held: such a child is killed after :data:`PROBE_TIMEOUT`.)"""
    import warnings

    try:
        with warnings.catch_warnings():  # (Python 3.12+ warns of a fork with threads: it is why we fork)
            warnings.simplefilter("ignore", DeprecationWarning)
            pid = os.fork()
        if pid == 0:
            os._exit(0)
    except OSError:
        return None
    try:
        pidfd = os.pidfd_open(pid)
    except OSError:  # (no pidfds: wait as long as it takes)
        with contextlib.suppress(OSError):
            os.waitpid(pid, 0)
        return None
    try:
        exited = select.poll()  # (not select.select: a descriptor past 1023 is refused there)
        exited.register(pidfd, select.POLLIN)
        if not exited.poll(PROBE_TIMEOUT * 1000):
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
            with contextlib.suppress(OSError):
                os.waitpid(pid, 0)
            return f"an after-fork handler that hangs (a child forked from the server did not exit within " \
                   f"{PROBE_TIMEOUT:g} s)"
        with contextlib.suppress(OSError):
            os.waitpid(pid, 0)
    finally:
        os.close(pidfd)
    return None


def unsafe() -> str | None:
    """Why this process may not be forked from now, or None: a thread other than its own
    running, or a device node of an accelerator open. A thread pool that its library ends
    before each fork (OpenBLAS's, which NumPy loads, stops its threads in a
    ``pthread_atfork`` handler and starts them again when next used) is no reason: a fork
    that exits at once is made to find out, and the threads counted again after it."""
    if threads() > 1:
        hung = probe_fork()
        if hung is not None:
            return hung
        count = threads()
        if count > 1:
            return f"{count} threads running"
    try:
        fds = os.listdir("/proc/self/fd")
    except OSError:
        return None
    for fd in fds:
        with contextlib.suppress(OSError):
            target = os.readlink(f"/proc/self/fd/{fd}")
            if target.startswith(DEVICE_NODES):
                return f"{target} open"
    return None


def preload(names: list[str], announce: Callable[[str], None] | None = None,
            ) -> tuple[list[str], dict[str, str], str | None, str | None]:
    """Import the worker's preloads in turn: those imported, those that failed (name: why),
    and the first that left this process unsafe to fork with why (it ends the list).
    ``announce(name)`` is called before each import (the worker hears which one hangs)."""
    done: list[str] = []
    refused: dict[str, str] = {}
    for name in names:
        if announce is not None:
            announce(name)
        try:
            importlib.import_module(name)
        except BaseException as exc:  # (SystemExit too: a module's import is not this server's to end)
            refused[name] = f"{type(exc).__name__}: {exc}"
        why = unsafe()  # (an import that failed half way may have started something too)
        if why is not None:
            return done, refused, name, why
        if name not in refused:
            done.append(name)
    return done, refused, None, None


def stamp(path: str) -> list[Any]:
    st = os.stat(path)
    return [path, st.st_ino, st.st_size, st.st_mtime_ns]


def installed() -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The folders packages are installed in (site-packages: pip adds and removes a
    distribution's ``.dist-info`` folder there, which moves the folder's times) and those of
    the standard library, each ending with a separator."""
    import site
    import sysconfig

    paths = sysconfig.get_paths()
    sites = [paths.get("purelib"), paths.get("platlib")]
    with contextlib.suppress(Exception):  # (site's functions are missing where it was not run)
        sites += site.getsitepackages()
    with contextlib.suppress(Exception):
        sites.append(site.getusersitepackages())
    std = [paths.get("stdlib"), paths.get("platstdlib")]
    return (tuple(os.path.join(os.path.realpath(p), "") for p in sites if p),
            tuple(os.path.join(os.path.realpath(p), "") for p in std if p))


#: what ``site`` runs from a site-packages folder as an interpreter starts, besides ``.pth`` files
SITE_HOOKS = ("sitecustomize", "usercustomize")


def site_files(folder: str, names: list[str] | None = None) -> list[list[Any]]:
    """``[name, size, mtime]`` of the files in ``folder`` that ``site`` reads as an
    interpreter starts (its ``.pth`` files, a ``sitecustomize``), sorted; ``names``: those
    known (only these are looked at: no listing)."""
    if names is None:
        try:
            names = [n for n in os.listdir(folder) if n.endswith(".pth") or n.partition(".")[0] in SITE_HOOKS]
        except OSError:
            return []
    out = []
    for name in names:
        with contextlib.suppress(OSError):
            st = os.stat(os.path.join(folder, name))
            out.append([name, st.st_size, st.st_mtime_ns])
    return sorted(out)


def site_stamps() -> list[list[Any]]:
    """The folders ``site`` reads as an interpreter starts (site-packages; the user's, where
    that is on), each ``[folder, inode, size, mtime, site_files]``: a ``.pth`` file added or
    changed after the server started (``pip install -e`` adds one) reaches a fresh
    interpreter, and so must reach a forked task (see ``ForkServer.stale``). One missing is
    stamped as absent."""
    import site
    import sysconfig

    paths = sysconfig.get_paths()
    folders = [paths.get("purelib"), paths.get("platlib")]
    with contextlib.suppress(Exception):  # (site's functions are missing where it was not run)
        folders += site.getsitepackages()
    if site.ENABLE_USER_SITE:
        with contextlib.suppress(Exception):
            folders.append(site.getusersitepackages())
    out: list[list[Any]] = []
    for folder in dict.fromkeys(os.path.realpath(p) for p in folders if p):
        try:
            out.append([*stamp(folder), site_files(folder)])
        except OSError:
            out.append([folder, ABSENT, 0, 0, []])
    return out


def _missing_part(name: str) -> str | None:
    """The first part of a dotted module name that is not imported (its parent is)."""
    parts = name.split(".")
    return next((".".join(parts[:i]) for i in range(1, len(parts) + 1)
                 if ".".join(parts[:i]) not in sys.modules), None)


def found_in(name: str) -> str | None:
    """The file a module that failed to import would be imported from, found without
    importing anything: the first part of its dotted name that is not imported (its parent
    is), through every finder (an editable install's too)."""
    first = _missing_part(name)
    if first is None:
        return None
    try:
        spec = importlib.util.find_spec(first)
    except BaseException:  # (a finder is a plugin's code)
        return None
    origin = getattr(spec, "origin", None)
    return origin if origin and os.path.isfile(origin) else None


def absent(name: str) -> list[str]:
    """Where a module that is found nowhere would appear once installed or saved: in each
    folder it would be looked for in (``sys.path``, or its parent package's ``__path__``),
    its module file, its package folder and its extension module files. Only those: a
    folder's own times move whenever anything is written there (a task's output, a bytecode
    cache), and a server restarted for each of those would import its preloads each time."""
    import importlib.machinery

    first = _missing_part(name)
    if first is None:
        return []
    parent, _, last = first.rpartition(".")
    where = getattr(sys.modules.get(parent), "__path__", None) if parent else sys.path
    names = [last, last + ".py", *(last + suffix for suffix in importlib.machinery.EXTENSION_SUFFIXES)]
    return [os.path.join(os.path.abspath(entry or "."), n) for entry in where or [] for n in names]


def stamps(tops: list[str], loaded: list[str], refused: list[str]) -> tuple[list[list[Any]], int, int]:
    """What tells the worker that a preload changed on disk, how many of those (the first)
    are kept whatever their count, and how many files were left unstamped. Kept: the file of
    each preloaded top-level module (pip replaces it when it upgrades or removes the
    package); each site-packages folder the preloads imported from (a package installed,
    upgraded or removed there: a dependency of a preload too); the file a preload that failed
    to import was found in (a save that broke it, then the one that fixes it), or, for one
    found nowhere, the paths it would appear at (:func:`absent`: a ``pip install`` after the
    worker started), stamped as absent. A preload that failed, or that imported as a bare
    namespace (a package folder without its ``__init__.py`` yet), may be an install caught
    half way: the site-packages folders are stamped too (pip and uv write a package's
    ``.dist-info`` last, which moves the folder's times once the install is complete), and
    a namespace's ``__init__.py`` as absent. Then each file
    of the modules they imported from outside the installed packages and the standard library
    (an editable install, a folder on ``PYTHONPATH``: code a user edits), up to
    :data:`MAX_STAMPED`. No other folder is stamped: a task that writes a module's bytecode
    cache (``__pycache__``) in it would move its times."""
    sites, std = installed()
    paths: dict[str, None] = {}  # (what is stamped whatever the count comes first: see serve)
    own: dict[str, None] = {}
    missing: dict[str, None] = {}
    unfinished = bool(refused)
    for name in tops:
        module = sys.modules.get(name)
        file = getattr(module, "__file__", None)
        if file:
            paths[os.path.abspath(file)] = None
        elif hasattr(module, "__path__") and not any(
                n.startswith(name + ".") and getattr(sys.modules.get(n), "__file__", None) for n in loaded):
            # a bare namespace (a package folder whose __init__.py may be on its way), not
            # one that holds what was preloaded (google.protobuf, nvidia.*)
            unfinished = True
            missing.update(dict.fromkeys(p for p in (os.path.join(entry, "__init__.py")
                                                     for entry in getattr(module, "__path__", []))
                                         if not os.path.lexists(p)))
    for name in refused:
        found = found_in(name)
        if found:
            paths[os.path.abspath(found)] = None
        else:
            missing.update(dict.fromkeys(p for p in absent(name) if not os.path.lexists(p)))
    if unfinished:
        for folder in sites:
            paths[folder.rstrip(os.sep)] = None
    left = 0
    for name in loaded:
        file = getattr(sys.modules.get(name), "__file__", None)
        if not file:
            continue
        real = os.path.realpath(file)
        site_dir = next((d for d in sites if real.startswith(d)), None)
        if site_dir is not None:
            paths[site_dir.rstrip(os.sep)] = None
        elif real.startswith(std):
            continue
        elif len(own) >= MAX_STAMPED:
            left += 1
        else:
            own[os.path.abspath(file)] = None
    out: list[list[Any]] = [[path, ABSENT, 0, 0] for path in missing]
    for path in [*paths, *own]:
        with contextlib.suppress(OSError):
            out.append(stamp(path))
    return out, len(out) - len(own), left
