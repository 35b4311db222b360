"""The warm CLI: command lines a running local worker's CLI server answers by forking.

``gpulayer submit`` (and ``jobs show``, ``worker list``, ...: :data:`COMMANDS`) on the
embedded control plane spends most of its time importing: the control plane with
SQLAlchemy and the records with pydantic, twenty times what Python's own start-up costs. A ``gpulayer worker start`` on an
embedded home therefore also starts a CLI server: one interpreter with all of that imported
once, single-threaded, listening on ``$GPULAYER_HOME/cli.sock``. A command line then sends
the server its words, working directory, environment and umask, and its stdin, stdout and
stderr as file descriptors; the server forks a child that takes all of those on and runs the
command line exactly as the ``gpulayer`` command would (same output to the same terminal,
same exit code), while the command itself only waits: it passes on SIGINT, SIGTERM and
SIGHUP to the child, and the server ends the child with SIGTERM when the command goes away.

A command line is answered only when the server's interpreter is the command's own (the
same ``sys.executable`` and ``sys.path``, the same variables an interpreter reads as it
starts) and the code the server imported is unchanged on disk; otherwise, with no server
or with ``GPULAYER_WARM_CLI=0``, the command runs as usual. A command line for a server
(``--url`` or ``GPULAYER_URL``) is answered by its home's CLI server too: the child talks to
that server over HTTP as the command would. (The child shares the server's hash seed, like
a forked FunctionJob.)

Where no worker runs, the first such command line on a home starts a CLI server
of its own in the background (and runs as usual itself): the command lines that follow are
answered warm, and the server exits once no command line came for
``GPULAYER_CLI_SERVER_IDLE`` seconds (``0``: commands start none). It is the same server
(a child still runs the command line with the command's own environment, so a job it
submits and the in-process worker it starts are the command's); one server serves a home
at a time, the one holding ``cli.sock.lock``: a worker's server waits for a command's to
exit, a second command's gives way at once.

This module is the command's side (:func:`forward`, and starting a server); it imports
only the standard library: it runs on every command line before anything else is loaded.
The server's side is :mod:`gpulayer.cli.warm_server`. Linux only (descriptor passing and
pidfds); elsewhere :func:`forward` never forwards.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import signal
import socket
import sys
import time
from collections.abc import Sequence
from typing import Any

from gpulayer.cli.light import GLOBAL_OPTIONS
from gpulayer.interpreter import start_variables
from gpulayer.worker import TREE_ID_ENV

__all__ = ["COMMANDS", "MAX_SOCKET_PATH", "answered", "forward", "peer_uid", "server_argv", "server_pid", "socket_path"]

#: the command lines a CLI server answers: a top-level command -> None for all of its
#: commands, or the only ones answered. Those left out serve until stopped and should not
#: be a server's children (``worker start``, ``server start``, ``dashboard``), or are what
#: a provider runs on a host it probes (``resources detect``: its cost is the detection,
#: its cache warm it is the light path's, and a probe must leave no server behind).
COMMANDS: dict[str, frozenset[str] | None] = {
    "submit": None, "explain": None, "jobs": None, "bundle": None,
    "worker": frozenset({"list", "status", "prune", "pause", "resume"}),
    "plugins": None, "profiles": None, "providers": None, "machines": None, "token": None,
}
_MAX_MESSAGE = 1 << 22
_NAME = "cli.sock"
#: how long either side waits for the other's first message
_HANDSHAKE = 10.0


#: the longest socket path (``sun_path`` holds 108 bytes, with its terminating zero and room
#: for the temporary name it is bound under first)
MAX_SOCKET_PATH = 100


def socket_path(home: str) -> str:
    return os.path.join(home, _NAME)


def _lock_path(path: str) -> str:
    """The lock the server of the socket at ``path`` holds while it serves."""
    return f"{path}.lock"


def _interpreter_options(argv: Sequence[str]) -> list[str]:
    """The interpreter's own options in the command line ``argv`` (``sys.orig_argv``): what
    comes before the script, ``-c`` or ``-m`` (``-X`` and ``-W`` take a value, attached or
    next)."""
    out: list[str] = []
    i = 1
    while i < len(argv):
        arg = argv[i]
        if arg == "--" or not arg.startswith("-") or arg == "-":
            break
        if arg.startswith("--"):  # (--check-hash-based-pycs VALUE and the like)
            out.append(arg)
            if arg == "--check-hash-based-pycs" and i + 1 < len(argv):
                out.append(argv[i + 1])
                i += 1
            i += 1
            continue
        for j, letter in enumerate(arg[1:], 1):
            if letter in "cm":
                if j > 1:
                    out.append(arg[:j])
                return out
            if letter in "XW":
                out.append(arg)
                if j == len(arg) - 1 and i + 1 < len(argv):  # (the value is the next word)
                    out.append(argv[i + 1])
                    i += 1
                break
        else:
            out.append(arg)
        i += 1
    return out


def server_argv(path: str, idle: float | None = None) -> list[str]:
    """The command line of a CLI server for the socket at ``path``: this interpreter, with
    the options it was started with (a server answers only commands whose interpreter is its
    own), without the working directory on its ``sys.path``; ``idle``: it exits after that
    many seconds without a command line (None: it serves until it is ended)."""
    code = ("import sys\nif not getattr(sys.flags, 'safe_path', False): del sys.path[0]\n"
            "from gpulayer.cli.warm_server import main\nmain()")
    options = _interpreter_options(getattr(sys, "orig_argv", [sys.executable]))
    return [sys.executable, *options, "-c", code, path, *([] if idle is None else ["--idle", repr(idle)])]


def server_pid(home: str) -> int | None:
    """The process id of the CLI server that serves ``home`` (or is starting to), or None.
    (Read from its lock file without taking the lock: a look must not make a server that is
    starting find it held and leave.)"""
    path = socket_path(home)
    try:
        with open(_lock_path(path), "rb") as f:
            text = f.read(32).decode(errors="replace").strip()
        pid = int(text)
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            words = f.read().split(b"\0")
    except (OSError, ValueError):
        return None
    return pid if os.fsencode(path) in words else None


#: next to the socket: the start of the last server a command started that failed before it
#: served (its error), which keeps commands from starting another for a while
_FAILED = ".failed"
_RETRY_AFTER_FAILURE = 60.0
#: the server's own output (an error at its start), next to the socket
_LOG = "cli-server.log"


def _start_server(home: str, idle: float) -> None:
    """Start the home's CLI server in the background for the command lines that follow,
    unless one is starting or serving (it holds the lock), ``idle`` is 0, the path is too
    long for a socket, this command runs inside a task (whose processes end with it), or
    the last one failed at its start less than a minute ago (its error is in
    ``cli-server.log``). The server is not this command's child: it is started through an
    intermediate process that leaves at once (a session of its own, reparented)."""
    path = socket_path(home)
    if idle <= 0 or os.environ.get(TREE_ID_ENV) or len(os.fsencode(path)) > MAX_SOCKET_PATH:
        return
    try:
        if os.stat(path + _FAILED).st_mtime > time.time() - _RETRY_AFTER_FAILURE:
            return
    except OSError:
        pass
    try:
        os.makedirs(home, mode=0o700, exist_ok=True)
        fd = os.open(_lock_path(path), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
    except OSError:
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return  # held: a server is starting, or serving (for another interpreter)
    finally:
        os.close(fd)  # (and with it the lock: the server takes it)
    argv = server_argv(path, idle)
    try:
        log = os.open(os.path.join(home, _LOG), os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    except OSError:
        return
    try:
        pid = os.fork()  # (the command has no thread yet: forward runs first)
    except OSError:
        os.close(log)
        return
    if pid == 0:  # the intermediate: a session of its own, the server, and away
        try:
            os.setsid()
            if os.fork() == 0:
                devnull = os.open(os.devnull, os.O_RDWR)
                os.dup2(devnull, 0)
                os.dup2(devnull, 1)
                os.dup2(log, 2)
                os.chdir(home)
                os.execv(sys.executable, argv)
        finally:
            os._exit(0)
    os.close(log)
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, 0)


def peer_uid(sock: socket.socket) -> int:
    """The user id of the process at the other end of the Unix socket ``sock``."""
    import struct

    _pid, uid, _gid = struct.unpack("3i", sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED,
                                                          struct.calcsize("3i")))
    return int(uid)


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
#: the signals a command passes on to the child that runs it
_PASSED_ON = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def _home_of(argv: Sequence[str], home: str | None) -> tuple[str, int] | None:
    """The home a command line uses (``home``: GPULAYER_HOME's) and where its command starts,
    or None when it uses options this look does not know (the command runs as usual). A
    command line for a server (``--url``) has a home too: its CLI server runs it."""
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
        if name == "--home":
            home = value
        i += 1
    if not home.strip():
        home = os.path.join(os.path.expanduser("~"), ".gpulayer")
    return os.path.abspath(os.path.expanduser(home)), i


def answered(words: Sequence[str]) -> bool:
    """Whether a CLI server answers the command line ``words`` (from its top-level command
    on): one of :data:`COMMANDS`, not asking for help (``--help`` or ``-h`` before any
    ``--``: what follows is the job's)."""
    options = words[:words.index("--")] if "--" in words else words
    if not words or words[0] not in COMMANDS or "--help" in options or "-h" in options:
        return False
    only = COMMANDS[words[0]]
    return only is None or (len(words) > 1 and words[1] in only)


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
    if not answered(argv[i:]):
        return None
    from gpulayer import config

    env = config.settings()  # (a bad value of any setting: the error the full path gives)
    if not env.warm_cli:
        return None
    path = socket_path(home)
    # a signal this command was started ignoring (under nohup, or `gpulayer ... &` in a
    # script) stays ignored, as in the command's own process: not passed on, and ignored by
    # the child, and so by the jobs its in-process worker starts
    ignored = [int(sig) for sig in _PASSED_ON if signal.getsignal(sig) == signal.SIG_IGN]
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        sock.settimeout(_HANDSHAKE)  # a server that does not answer: run as usual
        sock.connect(path)
    except OSError:  # none there (or a stale socket): run as usual, and start one for the next
        sock.close()
        _start_server(home, env.cli_server_idle)
        return None
    try:
        if peer_uid(sock) != os.getuid():  # (the environment and the terminal go only to this user's server)
            sock.close()
            return None
        environ = dict(os.environ)
        umask = os.umask(0o022)
        os.umask(umask)
        request = {"argv": list(argv), "cwd": os.getcwd(), "env": environ, "umask": umask,
                   "ignored": ignored, "path0": sys.path[0] if sys.path else "",
                   **_interpreter(environ, sys.path[1:])}
        socket.send_fds(sock, [json.dumps(request).encode()], [0, 1, 2])
        reply = json.loads(sock.recv(_MAX_MESSAGE) or b"{}")
        sock.settimeout(None)
    except (OSError, ValueError):
        sock.close()
        return None  # it went away: run as usual
    pid = reply.get("pid")
    if not isinstance(pid, int):
        sock.close()
        return None  # it declined (another interpreter, changed code): run as usual

    def pass_on(signum: int, _frame: Any) -> None:
        with contextlib.suppress(OSError):
            os.kill(pid, signum)

    for sig in _PASSED_ON:
        if int(sig) not in ignored:
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
