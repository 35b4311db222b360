"""The warm CLI: command lines a running local worker's CLI server answers by forking.

``gpulayer submit`` (and ``explain``, ``jobs``, ``bundle``) on the embedded control plane
spends most of its time importing: the control plane with SQLAlchemy and the records with
pydantic, twenty times what Python's own start-up costs. A ``gpulayer worker start`` on an
embedded home therefore also starts a CLI server: one interpreter with all of that imported
once, single-threaded, listening on ``$GPULAYER_HOME/cli.sock``. A command line then sends
the server its words, working directory, environment and umask, and its stdin, stdout and
stderr as file descriptors; the server forks a child that takes all of those on and runs the
command line exactly as the ``gpulayer`` command would (same output to the same terminal,
same exit code), while the command itself only waits: it passes on SIGINT, SIGTERM and
SIGHUP to the child, and the server ends the child with SIGTERM when the command goes away.

A command line is answered only when the server's interpreter is the command's own (the
same ``sys.executable`` and ``sys.path``, the same variables an interpreter reads as it
starts) and the code the server imported is unchanged on disk; otherwise, with no server,
with ``GPULAYER_WARM_CLI=0``, or with ``--url`` or ``GPULAYER_URL`` (a server), the command
runs as usual. (The child shares the server's hash seed, like a forked FunctionJob.)

This module's client side (:func:`forward`) imports only the standard library: it runs on
every command line before anything else is loaded. Linux only (descriptor passing and
pidfds); elsewhere :func:`forward` never forwards.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import sys
from collections.abc import Sequence
from typing import Any

from gpulayer.cli.light import GLOBAL_OPTIONS
from gpulayer.interpreter import start_variables

__all__ = ["COMMANDS", "forward", "serve", "socket_path"]

#: the command groups a CLI server answers (the rest do not need it, or should not run as
#: its children: workers, servers, the dashboard)
COMMANDS = frozenset({"submit", "explain", "jobs", "bundle"})
_MAX_MESSAGE = 1 << 22
_NAME = "cli.sock"
#: how long either side waits for the other's first message
_HANDSHAKE = 10.0


def socket_path(home: str) -> str:
    return os.path.join(home, _NAME)


def _interpreter(env: dict[str, str], path: Sequence[str]) -> dict[str, Any]:
    """What must be the same in the server and in a command it answers (``path``: its
    ``sys.path`` but the script's own folder)."""
    return {"executable": os.path.realpath(sys.executable), "path": [p for p in path if p],
            "start": start_variables(env, locale=True), "pythonpath": env.get("PYTHONPATH", ""),
            # the interpreter's options (-X utf8, -W, -O, ...): a `gpulayer` script has none
            "flags": list(sys.flags), "warnoptions": list(sys.warnoptions),
            "xoptions": sorted(f"{k}={v}" for k, v in sys._xoptions.items())}


#: set in a child of the server: the command it runs is not forwarded again
_served = False


def _home_of(argv: Sequence[str], home: str | None) -> tuple[str, int] | None:
    """The home a command line uses (``home``: GPULAYER_HOME's) and where its command starts,
    or None when it names a server or uses options this look does not know (the command runs
    as usual)."""
    i = 0
    home = home or ""
    while i < len(argv) and argv[i].startswith("-"):
        name, eq, value = argv[i].partition("=")
        if name not in GLOBAL_OPTIONS:
            return None
        if not eq:
            if i + 1 >= len(argv):
                return None
            value = argv[i + 1]
            i += 1
        if name == "--url":
            return None
        if name == "--home":
            home = value
        i += 1
    if not home.strip():
        home = os.path.join(os.path.expanduser("~"), ".gpulayer")
    return os.path.abspath(os.path.expanduser(home)), i


# --------------------------------------------------------------------------- the command's side


def forward(argv: Sequence[str]) -> int | None:
    """Have the home's CLI server run ``argv`` (the words after ``gpulayer``); its exit
    code, or None when it did not (nothing was printed: the command runs as usual)."""
    if _served or not sys.platform.startswith("linux"):
        return None
    where = _home_of(argv, os.environ.get("GPULAYER_HOME"))
    if where is None:
        return None
    home, i = where
    if i >= len(argv) or argv[i] not in COMMANDS or "--help" in argv[i:]:
        return None
    path = socket_path(home)
    if not os.path.exists(path):
        return None
    from gpulayer import config

    env = config.settings()  # (a bad value of any setting: the error the full path gives)
    if not env.warm_cli or env.url:
        return None
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        sock.settimeout(_HANDSHAKE)  # a server that does not answer: run as usual
        sock.connect(path)
        environ = dict(os.environ)
        umask = os.umask(0o022)
        os.umask(umask)
        request = {"argv": list(argv), "cwd": os.getcwd(), "env": environ, "umask": umask,
                   "path0": sys.path[0] if sys.path else "", **_interpreter(environ, sys.path[1:])}
        socket.send_fds(sock, [json.dumps(request).encode()], [0, 1, 2])
        reply = json.loads(sock.recv(_MAX_MESSAGE) or b"{}")
        sock.settimeout(None)
    except (OSError, ValueError):
        sock.close()
        return None  # no server there (a stale socket), or it went away: run as usual
    pid = reply.get("pid")
    if not isinstance(pid, int):
        sock.close()
        return None  # it declined (another interpreter, changed code): run as usual

    def pass_on(signum: int, _frame: Any) -> None:
        with contextlib.suppress(OSError):
            os.kill(pid, signum)

    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, pass_on)
    try:
        while True:
            try:
                data = sock.recv(_MAX_MESSAGE)
                break
            except InterruptedError:  # (a signal passed on: keep waiting for the end)
                continue
        code = json.loads(data or b"{}").get("exit")
    except (OSError, ValueError):
        code = None
    finally:
        sock.close()
    if not isinstance(code, int):
        sys.stderr.write("gpulayer: the command's process ended without saying how (killed?)\n")
        return 1
    if code < 0:  # the command was killed by a signal: so is this process, as it would have been
        sys.stdout.flush()
        signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
        return 128 - code  # (a signal that does not end a process)
    return code


# --------------------------------------------------------------------------- the server's side


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
    global _served
    _served = True
    code = 1
    try:
        signal.set_wakeup_fd(-1)
        for sig in (signal.SIGCHLD, signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
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


def serve(path: str) -> None:
    """Import the CLI and the embedded control plane once, then answer command lines on the
    socket at ``path`` (until this process is ended; it dies with the worker that started it)."""
    import gc
    import importlib
    import selectors
    import struct
    import threading

    # what the full path of the commands answered here imports (see gpulayer/cli/__init__.py);
    # nothing of it opens a database or starts a thread, so a fork is safe
    for name in ("gpulayer.cli.root", "gpulayer.cli.jobs", "gpulayer.cli.explain", "gpulayer.cli.bundle",
                 "gpulayer.cli.progress", "gpulayer.client", "gpulayer.control", "gpulayer.sdk",
                 "gpulayer.joboptions", "gpulayer.bundles", "gpulayer.resources", "gpulayer.plugin",
                 "sqlalchemy.dialects.sqlite", "rich.console", "rich.live"):
        importlib.import_module(name)
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
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            probe.connect(path)
            return  # another worker's server answers on this home

        except ConnectionRefusedError:
            os.unlink(path)  # left by one that died
        finally:
            probe.close()
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
    sel = selectors.DefaultSelector()
    sel.register(listener, selectors.EVENT_READ, None)
    children: dict[int, tuple[socket.socket, int]] = {}  # pid -> (its command's socket, its pidfd)
    try:
        while True:
            for key, _ in sel.select():
                if key.data is None:
                    conn, _addr = listener.accept()
                    fds: list[int] = []
                    try:
                        conn.settimeout(_HANDSHAKE)  # (one that stalls does not hold up the rest)
                        msg, fds, _flags, _addr = socket.recv_fds(conn, _MAX_MESSAGE, 3)
                        conn.settimeout(None)
                        request = json.loads(msg)
                        why = _declined(request, mine, files) if len(fds) == 3 else "no descriptors"
                        _pid, uid, _gid = struct.unpack("3i", conn.getsockopt(
                            socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")))
                        if uid != os.getuid():  # (the home is its owner's only: defence in depth)
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
                    sel.register(pidfd, selectors.EVENT_READ, ("exit", pid))
                    sel.register(conn, selectors.EVENT_READ, ("gone", pid))
                    with contextlib.suppress(OSError):
                        conn.send(json.dumps({"pid": pid}).encode())
                elif key.data[0] == "exit":
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
        with contextlib.suppress(OSError):
            os.unlink(path)


def _stop(_signum: int, _frame: Any) -> None:
    raise SystemExit(0)  # (its socket is removed on the way out)


def main() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C at the worker's terminal is the worker's
    signal.signal(signal.SIGTERM, _stop)  # the worker stops
    serve(sys.argv[1])


if __name__ == "__main__":
    main()
