"""Helpers for tests that drive GPUlayer as a user would: the CLI and workers as subprocesses."""

from __future__ import annotations

import atexit
import contextlib
import importlib
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest


def wait_for(predicate: Callable[[], Any], timeout: float = 30.0, what: str = "condition") -> Any:
    """Poll ``predicate`` until it returns something truthy; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def children_running(parent: Any, needle: str, *, recursive: bool = False) -> list[Any]:
    """The children of ``parent`` (a ``psutil.Process``) whose command line holds ``needle``.
    A child that ended meanwhile, or a zombie (whose command line psutil refuses to read:
    any child another thread has not waited for yet), is not one of them."""
    import psutil

    found = []
    for child in parent.children(recursive=recursive):
        try:
            if needle in " ".join(child.cmdline()):
                found.append(child)
        except psutil.Error:
            continue
    return found


def cli(*args: str, env: dict[str, str] | None = None, timeout: float = 120,
        cwd: str | Path | None = None, check: bool = False) -> subprocess.CompletedProcess[str]:
    """Run ``gpulayer ARGS`` as a subprocess of this test's Python."""
    full_env = dict(os.environ)
    full_env.update(env or {})
    proc = subprocess.run([sys.executable, "-m", "gpulayer.cli", *args], env=full_env, cwd=cwd,
                          capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"gpulayer {' '.join(args)} exited {proc.returncode}\n{proc.stdout}\n{proc.stderr}")
    return proc


def start_worker(*args: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    full_env = dict(os.environ)
    full_env.update(env or {})
    return subprocess.Popen([sys.executable, "-m", "gpulayer.cli", "worker", "start", *args], env=full_env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


class Terminal:
    """``gpulayer ARGS`` with stdin, stdout and stderr on a pseudo-terminal, as a person at a
    terminal runs it: :meth:`read_until` what it has drawn so far, :meth:`finish` to the end."""

    def __init__(self, *args: str, env: dict[str, str] | None = None, columns: int = 120) -> None:
        import pty

        full_env = dict(os.environ)
        full_env.update(env or {})
        full_env.setdefault("TERM", "xterm")
        full_env["COLUMNS"] = str(columns)
        self._master, slave = pty.openpty()
        self.proc = subprocess.Popen([sys.executable, "-m", "gpulayer.cli", *args], env=full_env,
                                     stdin=slave, stdout=slave, stderr=slave, close_fds=True)
        os.close(slave)
        self.output = ""
        self._eof = False

    def _read(self, wait: float) -> None:
        import select

        if self._eof:
            return
        # (poll, not select.select: a test process holds more than 1,023 descriptors at times,
        # and select refused the terminal's: "filedescriptor out of range in select()", CI)
        poller = select.poll()
        poller.register(self._master, select.POLLIN)
        if not poller.poll(wait * 1000):
            return
        try:
            data = os.read(self._master, 65536)
        except OSError:  # EIO: the other side is closed
            data = b""
        if not data:
            self._eof = True
            return
        self.output += data.decode(errors="replace")

    def read_until(self, text: str, timeout: float = 60.0) -> str:
        deadline = time.monotonic() + timeout
        while text not in self.output:
            if self._eof or time.monotonic() > deadline:
                raise AssertionError(f"the terminal never showed {text!r}; it showed:\n{self.output!r}")
            self._read(0.2)
        return self.output

    def finish(self, timeout: float = 120.0) -> int:
        """Read to the end; the exit code."""
        deadline = time.monotonic() + timeout
        while not self._eof:
            if time.monotonic() > deadline:
                self.proc.kill()
                raise AssertionError(f"gpulayer did not finish; the terminal showed:\n{self.output!r}")
            self._read(0.2)
        os.close(self._master)
        return self.proc.wait(timeout)


@contextlib.contextmanager
def job_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, prefix: str, source: str) -> Iterator[Any]:
    """A module of ``source`` (dedented) in a directory of its own (its bundle) on
    ``sys.path``, imported under a name unique to the test (``PREFIX_TMPDIR``); forgotten
    after."""
    proj = tmp_path / "proj"
    proj.mkdir()
    name = f"{prefix}_{tmp_path.name.replace('-', '_')}"
    (proj / f"{name}.py").write_text(textwrap.dedent(source))
    monkeypatch.syspath_prepend(str(proj))
    try:
        yield importlib.import_module(name)
    finally:
        sys.modules.pop(name, None)


def stop_strays(home: Path, timeout: float = 30.0, *, below: bool = False) -> list[int]:
    """Stop what outlived the commands a test ran on ``home``: every process of this user
    whose ``GPULAYER_HOME`` is ``home`` (``below``: is in the folder ``home``) and that is
    neither this process nor one of its descendants (a background worker that a detached
    submit started, the CLI server the first command started, their tasks). SIGTERM, then
    SIGKILL after ``timeout`` seconds; their pids."""
    import psutil

    me = psutil.Process()
    ours = {me.pid, *(p.pid for p in me.children(recursive=True))}
    wanted = str(home)
    found = []
    for proc in psutil.process_iter(["pid", "uids"]):
        if proc.pid in ours or proc.info["uids"] is None or proc.info["uids"].real != os.getuid():
            continue
        with contextlib.suppress(psutil.Error):
            theirs = proc.environ().get("GPULAYER_HOME")
            if theirs == wanted or (below and theirs is not None and theirs.startswith(wanted + os.sep)):
                found.append(proc)
    for proc in found:
        with contextlib.suppress(psutil.Error):
            proc.terminate()
    _gone, alive = psutil.wait_procs(found, timeout=timeout)
    for proc in alive:
        with contextlib.suppress(psutil.Error):
            proc.kill()
    psutil.wait_procs(alive, timeout=10)
    return [p.pid for p in found]


def seed_probe_cache(home: Path, probes: Path) -> None:
    """Put the entries of ``probes`` (:func:`first_detection`, or :func:`detect_probes`) into
    ``home``'s cache."""
    shutil.copytree(probes, home / "cache" / "probes", dirs_exist_ok=True)


def detect_probes(home: Path, **env: str) -> Path:
    """The framework probes' cache (``cache/probes/`` of ``home``) as a first detection by this
    interpreter leaves it: a real ``gpulayer resources detect`` on ``home``, with ``env``
    (e.g. the ``PYTHONPATH`` a test's workers get: an entry is kept per ``PYTHONPATH``)."""
    from gpulayer.testing import no_real_devices_env

    run_env = {k: v for k, v in os.environ.items() if not k.startswith("GPULAYER_")}
    run_env.update(GPULAYER_HOME=str(home), GPULAYER_CLI_SERVER_IDLE="0", **no_real_devices_env(), **env)
    # (--timeout: each probe's own limit, 10 s by default, was passed on a machine loaded by
    # other work, and a probe that gives no answer leaves no cache entry: the fixture failed)
    run = subprocess.run([sys.executable, "-m", "gpulayer.cli", "resources", "detect", "--json", "--timeout", "120"],
                         env=run_env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    probes = home / "cache" / "probes"
    assert list(probes.glob("*.json")), "the detection left no probe cache entry"
    return probes


def first_detection(**env: str) -> Path:
    """:func:`detect_probes` with this test process's environment and ``env``, once per
    process for each ``env`` (in a folder removed when it exits; one that failed fails again
    at once, rather than run again, up to 300 s, for every test that asks). Every such detection on a fresh home imports torch in its
    probe subprocess (about 2 s of CPU); copied into a test's fresh home (the ``home``
    fixture, :func:`tests.server_support.start_remote_worker`), it is what a home that has
    detected before holds. Each entry is checked as always (the interpreter and every
    ``sys.path`` folder unchanged, the same probes, the same ``PYTHONPATH``), so a test that
    changes any of them probes again. The probes themselves are tested on homes that start
    empty (tests/plugins/test_frameworks.py, tests/unit/test_plugins.py, test_resources.py
    and test_cli_resources.py's end-to-end detection)."""
    key = tuple(sorted(env.items()))
    got = _detections.get(key)
    if isinstance(got, BaseException):
        raise AssertionError(f"the first detection failed: {got}")
    if got is None:
        folder = tempfile.mkdtemp(prefix="gpulayer-tests-probed-")
        atexit.register(shutil.rmtree, folder, True)
        try:
            got = detect_probes(Path(folder) / "home", **env)
        except Exception as exc:
            _detections[key] = exc
            raise
        _detections[key] = got
    return got


#: :func:`first_detection`'s answers in this process, by ``env``: the probes, or why not
_detections: dict[tuple[tuple[str, str], ...], Path | BaseException] = {}


def need_root(why: str) -> None:
    """Skip a test that needs root (to mount, to make a PID namespace) where it cannot have it,
    except under ``.ci/run`` (``GPULAYER_REQUIRE_ROOT=1``), where it fails."""
    if os.environ.get("GPULAYER_REQUIRE_ROOT") == "1":
        pytest.fail(f"{why} (GPULAYER_REQUIRE_ROOT=1)", pytrace=False)
    pytest.skip(why)


def mount_small_tmpfs(mount: Path, size: str, *, inodes: int | None = None) -> None:
    """Mount a tmpfs of ``size`` (``4m``), and of at most ``inodes`` files and folders, on the
    empty folder ``mount``: a real file system that fills up (it needs root: :func:`need_root`)."""
    if os.geteuid() == 0:
        options = f"size={size}" + (f",nr_inodes={inodes}" if inodes is not None else "")
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(mount)],
                              capture_output=True, text=True)
        if done.returncode == 0:
            return
        need_root(f"mount -t tmpfs failed: {done.stderr.strip()}")
    need_root("mounting a small tmpfs needs root")
