"""The warm CLI's server: one interpreter with the CLI, the embedded control plane and the
plugins' modules imported once, that answers command lines on a home's socket by forking a
child that becomes the command (its descriptors, directory, environment and umask) and runs
it as the ``gpulayer`` command would. The command's side, and how a server is started and
found, is :mod:`gpulayer.cli.warm`; this module is what the server's process runs
(:func:`main`, from :func:`gpulayer.cli.warm.server_argv`).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import signal
import socket
import sys
from typing import Any

from gpulayer.cli import warm
from gpulayer.cli.warm import _FAILED, _HANDSHAKE, _MAX_MESSAGE, COMMANDS, _interpreter, _lock_path

__all__ = ["main", "serve"]


def _loaded_files(also: set[str]) -> dict[str, int]:
    """What a command is answered only while it is unchanged, with modification times: the
    source files of GPUlayer's modules this process imported and of the modules named in
    ``also`` (the plugins'), and the folders of ``sys.path`` (an install or removal of a
    package changes its folder)."""
    out = {}
    for entry in sys.path:
        if entry and os.path.isdir(entry):
            out[entry] = os.stat(entry).st_mtime_ns
    for name, module in list(sys.modules.items()):
        if not (name == "gpulayer" or name.startswith("gpulayer.") or name in also):
            continue
        file = getattr(module, "__file__", None)
        if file:
            with contextlib.suppress(OSError):
                out[file] = os.stat(file).st_mtime_ns
    return out


def _unchanged(files: dict[str, int]) -> bool:
    for file, mtime in files.items():
        try:
            if os.stat(file).st_mtime_ns != mtime:
                return False
        except OSError:
            return False
    return True


def _declined(request: dict[str, Any], mine: dict[str, Any], files: dict[str, int]) -> str | None:
    """Why this server does not answer ``request``, or None."""
    for key, value in mine.items():
        if request.get(key) != value:
            return f"another interpreter ({key})"
    if not _unchanged(files):
        return "GPUlayer's code or the installed packages changed since this server started"
    return None


def _child(request: dict[str, Any], fds: list[int], conn: socket.socket) -> None:
    """Become the command: its descriptors, directory, environment and umask; run it; tell
    the command how it ended (over ``conn``, so it hears even if the server is gone); exit.
    Called with INT, TERM and HUP blocked (see :func:`serve`)."""
    warm._served = True  # (the command line it runs is not forwarded again)
    code = 1
    try:
        signal.set_wakeup_fd(-1)
        for sig in (signal.SIGCHLD, signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        for sig in request.get("ignored") or ():  # (what the command ignored: nohup's SIGHUP)
            signal.signal(sig, signal.SIG_IGN)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT, signal.SIGTERM, signal.SIGHUP})
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
        for fd in fds:
            if fd > 2:
                os.close(fd)
        os.chdir(request["cwd"])
        os.umask(int(request["umask"]))
        os.environ.clear()
        os.environ.update(request["env"])
        import time

        time.tzset()  # (the command's TZ)
        # the standard streams again, on the command's descriptors, as Python makes them:
        # the same encoding (the locale matched), a terminal line buffered, PYTHONUNBUFFERED
        # written through
        unbuffered = bool(os.environ.get("PYTHONUNBUFFERED"))
        encoding, errors = sys.stdout.encoding, sys.stdout.errors
        sys.stdin = open(0, encoding=sys.stdin.encoding, errors=sys.stdin.errors, closefd=False)
        sys.stdout = open(1, "w", encoding=encoding, errors=errors, closefd=False,
                          buffering=1 if os.isatty(1) else -1)
        sys.stderr = open(2, "w", encoding=encoding, errors="backslashreplace", closefd=False,
                          buffering=1)
        if unbuffered:
            sys.stdout.reconfigure(write_through=True)
        sys.argv[:] = ["gpulayer", *request["argv"]]
        # the command's own first entry (the script's folder; the working directory for
        # ``python -m gpulayer.cli``), which the server's interpreter does not have
        if request.get("path0"):
            sys.path.insert(0, request["path0"])
        from gpulayer.cli import main

        main()
        code = 0
    except SystemExit as exc:
        if exc.code is None or isinstance(exc.code, int):
            code = exc.code or 0
        else:  # sys.exit("message"): printed, as the interpreter would
            with contextlib.suppress(Exception):
                print(exc.code, file=sys.stderr)
            code = 1
    except BaseException:
        import traceback

        with contextlib.suppress(Exception):
            traceback.print_exc()
    try:
        import atexit
        import threading

        with contextlib.suppress(Exception):
            threading._shutdown()  # type: ignore[attr-defined]  # (as the interpreter does first)
        atexit._run_exitfuncs()
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        with contextlib.suppress(OSError):
            conn.send(json.dumps({"exit": code}).encode())
        os._exit(code)


def _same(path: str, ident: tuple[int, int]) -> bool:
    """Whether the socket at ``path`` is still the one this server bound (not removed with
    its home, nor replaced)."""
    try:
        st = os.stat(path)
    except OSError:
        return False
    return (st.st_dev, st.st_ino) == ident


def serve(path: str, idle: float | None = None) -> None:
    """Import the CLI and the embedded control plane once, then answer command lines on the
    socket at ``path``: until this process is ended (a worker's server dies with its
    worker), or, with ``idle``, until no command line came and none ran for that many
    seconds, or its socket was removed or replaced.

    One server serves a socket at a time, the one holding its lock: a worker's server (no
    ``idle``) waits for the lock, one a command started leaves at once if it is held."""
    import gc
    import importlib
    import selectors
    import threading
    import time

    lock = os.open(_lock_path(path), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | (0 if idle is None else fcntl.LOCK_NB))
    except BlockingIOError:
        return  # another server serves this home, or is starting to
    os.ftruncate(lock, 0)
    os.pwrite(lock, f"{os.getpid()}\n".encode(), 0)  # (who serves: server_pid)

    try:
        # what the full path of the commands answered here imports (see gpulayer/cli/__init__.py);
        # nothing of it opens a database or starts a thread, so a fork is safe
        for name in ("gpulayer.cli.root", "gpulayer.cli.jobs", "gpulayer.cli.explain", "gpulayer.cli.bundle",
                     "gpulayer.cli.progress", "gpulayer.client", "gpulayer.control", "gpulayer.sdk",
                     "gpulayer.joboptions", "gpulayer.bundles", "gpulayer.resources", "gpulayer.plugin",
                     # a command line for a server (--url): its HTTP client (httpx imports
                     # httpcore as it makes its first client)
                     "gpulayer.http_client", "httpcore",
                     # the in-process worker a submit starts where no worker runs
                     "gpulayer.worker.agent", "gpulayer.capability_cache",
                     "sqlalchemy.dialects.sqlite", "rich.console", "rich.live"):
            importlib.import_module(name)
        from sqlalchemy.orm import configure_mappers

        from gpulayer.cli import root

        configure_mappers()  # (the ORM does it on its first query: ~10 ms of every child's)
        root.warm_up(COMMANDS)  # (converted from Typer's app once, with the commands answered here)
        # what reading a distribution's metadata imports (the plugins' entry points)
        importlib.import_module("email.parser")
        before = set(sys.modules)
        from importlib import metadata

        # the plugins' modules too (a command loads them through their entry points, which it
        # still reads itself: what is installed, and what GPULAYER_DISABLE_PLUGINS blocks)
        for ep in metadata.entry_points(group="gpulayer"):
            with contextlib.suppress(Exception):
                importlib.import_module(ep.module)
        if threading.active_count() > 1:
            raise SystemExit(f"the CLI server would fork with {threading.active_count()} threads")
        files = _loaded_files(set(sys.modules) - before)
        mine = _interpreter(dict(os.environ), sys.path)
        # (what is loaded now is left out of the collector's reach in every child)
        gc.collect()
        gc.freeze()
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)  # left by one that died (this one holds the lock)
        # bound and listening under a name of its own, then renamed into place: a command never
        # finds the socket before it accepts
        ready = f"{path}.{os.getpid()}"
        umask = os.umask(0o177)  # the socket is its owner's alone from the start (as is the home)
        try:
            listener.bind(ready)
        finally:
            os.umask(umask)
        listener.listen(16)
        os.rename(ready, path)
    except BaseException as exc:
        if not (isinstance(exc, SystemExit) and exc.code in (0, None)):  # (not a SIGTERM)
            # commands start no other server for a while (gpulayer.cli.warm._start_server)
            with contextlib.suppress(OSError):
                with open(path + _FAILED, "w") as failed:
                    failed.write(f"{type(exc).__name__}: {exc}\n")
        raise
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path + _FAILED)
    st = os.stat(path)
    ident = (st.st_dev, st.st_ino)
    sel = selectors.DefaultSelector()
    sel.register(listener, selectors.EVENT_READ, None)
    children: dict[int, tuple[socket.socket, int]] = {}  # pid -> (its command's socket, its pidfd)
    # (a look at least every 5 s whether its socket is still there: a home removed)
    tick = None if idle is None else min(max(idle, 0.1), 5.0)
    last = time.monotonic()
    try:
        while True:
            events = sel.select(tick)
            if idle is not None:
                # idle: no command line answered (one it declines does not count) and none running
                now = time.monotonic()
                if children:
                    last = now
                elif now - last >= idle or not _same(path, ident):
                    return
            for key, _ in events:
                if key.data is None:
                    conn, _addr = listener.accept()
                    fds: list[int] = []
                    try:
                        conn.settimeout(_HANDSHAKE)  # (one that stalls does not hold up the rest)
                        msg, fds, _flags, _addr = socket.recv_fds(conn, _MAX_MESSAGE, 3)
                        conn.settimeout(None)
                        request = json.loads(msg)
                        why = _declined(request, mine, files) if len(fds) == 3 else "no descriptors"
                        if warm.peer_uid(conn) != os.getuid():  # (the home is its owner's only: defence in depth)
                            why = "another user"
                    except (OSError, ValueError) as exc:
                        why = f"{type(exc).__name__}: {exc}"
                    if why is not None:
                        with contextlib.suppress(OSError):
                            conn.send(json.dumps({"declined": why}).encode())
                        conn.close()
                        for fd in fds:
                            os.close(fd)
                        if why.startswith("GPUlayer's code"):
                            return  # a worker started with the new code starts a new server
                        continue
                    # the child takes over its signals' handling only once it has reset them:
                    # until then one passed on must wait, not run this server's handlers
                    stopping = {signal.SIGINT, signal.SIGTERM, signal.SIGHUP}
                    signal.pthread_sigmask(signal.SIG_BLOCK, stopping)
                    try:
                        pid = os.fork()
                    except OSError as exc:
                        pid = -1
                        with contextlib.suppress(OSError):
                            conn.send(json.dumps({"declined": f"fork: {exc}"}).encode())
                    if pid == 0:
                        try:
                            os.close(lock)  # (it is the server's to hold, not the command's)
                            listener.close()
                            sel.close()
                            for other, _pidfd in children.values():
                                other.close()
                            _child(request, fds, conn)
                        finally:
                            os._exit(1)
                    signal.pthread_sigmask(signal.SIG_UNBLOCK, stopping)
                    for fd in fds:
                        os.close(fd)
                    if pid < 0:
                        conn.close()
                        continue
                    pidfd = os.pidfd_open(pid)
                    children[pid] = (conn, pidfd)
                    last = time.monotonic()
                    sel.register(pidfd, selectors.EVENT_READ, ("exit", pid))
                    sel.register(conn, selectors.EVENT_READ, ("gone", pid))
                    with contextlib.suppress(OSError):
                        conn.send(json.dumps({"pid": pid}).encode())
                elif key.data[0] == "exit":
                    last = time.monotonic()
                    pid = key.data[1]
                    conn, pidfd = children.pop(pid)
                    sel.unregister(pidfd)
                    os.close(pidfd)
                    with contextlib.suppress(KeyError):  # (still watched: its command waits)
                        sel.unregister(conn)
                    _, status = os.waitpid(pid, 0)
                    with contextlib.suppress(OSError):
                        conn.send(json.dumps({"exit": os.waitstatus_to_exitcode(status)}).encode())
                    conn.close()
                else:  # the command went away (killed) before its child ended: end the child
                    pid = key.data[1]
                    with contextlib.suppress(OSError):
                        if not key.fileobj.recv(1):  # type: ignore[union-attr]
                            sel.unregister(key.fileobj)
                            os.kill(pid, signal.SIGTERM)
    finally:
        # no new commands; those running go on and tell their commands how they ended
        # themselves (a death by a signal reads as "ended without saying how")
        if _same(path, ident):
            with contextlib.suppress(OSError):
                os.unlink(path)


def _stop(_signum: int, _frame: Any) -> None:
    raise SystemExit(0)  # (its socket is removed on the way out)


def main() -> None:
    """``PATH [--idle SECONDS]`` (:func:`gpulayer.cli.warm.server_argv`)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C at the worker's terminal is the worker's
    signal.signal(signal.SIGTERM, _stop)  # the worker stops
    args = sys.argv[1:]
    idle = float(args[2]) if args[1:2] == ["--idle"] else None
    serve(args[0], idle)


if __name__ == "__main__":
    main()
