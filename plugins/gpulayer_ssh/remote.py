"""The half of the ``ssh`` provider that runs on a pool host.

The adapter never installs anything on a host: it sends this file's source as the program
of ``PYTHON -c SOURCE`` over SSH (the Python the host's section names, the same one that
runs the worker) and one JSON request on the channel's stdin; the answer is one JSON line
on stdout. Secrets (the bootstrap token) travel only in that stdin, never in an argv.

Operations (``op`` in the request):

``status``     every marker under the state directory, each with ``alive``; with
               ``probe: true`` also the host's capabilities (``gpulayer.cli resources detect``)
``launch``     start the worker detached, in a session and process group of its own, its
               output in ``logs/<machine_id>.log``, and write its marker; an existing live
               marker of the same machine id is the answer again (launch is idempotent); a
               live marker of another machine means the host is taken; a worker that exits
               within ``EARLY_EXIT_SECONDS`` (it cannot start) is the answer ``exited``, with
               the last lines of its log, and leaves no marker
``terminate``  SIGTERM to the worker's process group (and every descendant that left it,
               and every process carrying the machine's ``GPULAYER_MACHINE_ID``: what a
               worker killed with SIGKILL left), up to ``grace`` seconds, then SIGKILL;
               remove the machine's folder; a missing marker is success

State directory layout (``state_dir``, default ``~/.gpulayer/ssh-provider``)::

    machines/<machine_id>/marker.json   {machine_id, label, pid, create_time, started_at}
    machines/<machine_id>/home/         the worker's GPULAYER_HOME (bundles, caches; it starts
                                        with the probe cache of probe-home)
    probe-home/                         GPULAYER_HOME of the host's probe (``status``)
    logs/<machine_id>.log               the worker's output (kept after terminate)
    lock                                flock'ed while a launch or terminate runs

Standard library only, plus psutil when the host's Python has it (GPUlayer depends on it):
psutil tells a live worker from a recycled pid (by its start time) and finds descendants.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

try:
    import psutil
except ImportError:  # pragma: no cover - GPUlayer's own Python always has it
    psutil = None  # type: ignore[assignment]


def _create_time(pid: int) -> float | None:
    if psutil is None:
        return None
    try:
        return float(psutil.Process(pid).create_time())
    except psutil.Error:
        return None


def _alive(marker: dict[str, Any]) -> bool:
    pid = int(marker.get("pid") or 0)
    if pid <= 0:
        return False
    if psutil is not None:
        try:
            proc = psutil.Process(pid)
            if proc.status() == psutil.STATUS_ZOMBIE:
                return False
            started = marker.get("create_time")
            # a pid the kernel gave to another process since is not our worker
            return started is None or abs(proc.create_time() - float(started)) < 1.0
        except psutil.Error:
            return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _machines(state: str) -> str:
    return os.path.join(state, "machines")


def _read_marker(folder: str) -> dict[str, Any] | None:
    try:
        with open(os.path.join(folder, "marker.json")) as f:
            data = json.load(f)
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _markers(state: str) -> list[dict[str, Any]]:
    root = _machines(state)
    try:
        names = sorted(os.listdir(root))
    except OSError:
        return []
    found = []
    for name in names:
        marker = _read_marker(os.path.join(root, name))
        if marker is not None:
            found.append({**marker, "alive": _alive(marker)})
    return found


@contextlib.contextmanager
def _locked(state: str) -> Iterator[None]:
    os.makedirs(state, mode=0o700, exist_ok=True)
    with open(os.path.join(state, "lock"), "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _probe(req: dict[str, Any], env: dict[str, str]) -> dict[str, Any]:
    home = os.path.join(req["state_dir"], "probe-home")
    os.makedirs(home, mode=0o700, exist_ok=True)
    try:
        out = subprocess.run([sys.executable, "-m", "gpulayer.cli", "resources", "detect", "--json"],
                             # (a probe leaves nothing running on the host: no CLI server)
                             env={"GPULAYER_HOME": home, **env, "GPULAYER_WARM_CLI": "0"}, stdin=subprocess.DEVNULL,
                             capture_output=True,
                             text=True, timeout=float(req.get("probe_timeout", 120)))
    except subprocess.TimeoutExpired:
        return {"error": f"'{sys.executable} -m gpulayer.cli resources detect --json' did not finish in "
                         f"{req.get('probe_timeout', 120)} s"}
    if out.returncode != 0:
        tail = (out.stderr or out.stdout).strip().splitlines()[-3:]
        return {"error": f"'{sys.executable} -m gpulayer.cli resources detect --json' exited {out.returncode}: "
                         + " | ".join(tail)}
    try:
        return {"capabilities": json.loads(out.stdout)}
    except ValueError:
        return {"error": "'gpulayer.cli resources detect --json' printed no JSON"}


def _seed_probes(state: str, home: str) -> None:
    """Start the worker's home with the framework probes' answers the host's own probe left
    (``probe-home``, see :func:`_probe`): the worker's detection then does not run them again
    (they import torch and the like: seconds of CPU). Each entry is checked as any cached one
    is (the same Python, its ``sys.path`` folders unchanged, the same ``PYTHONPATH`` and probes),
    so one that no longer fits is probed afresh; nothing to copy, or a copy that fails, only
    costs that."""
    probes = os.path.join(state, "probe-home", "cache", "probes")
    if os.path.isdir(probes):
        with contextlib.suppress(OSError):
            # (not an entry being written meanwhile: the probe renames it into place when whole)
            shutil.copytree(probes, os.path.join(home, "cache", "probes"), dirs_exist_ok=True,
                            ignore=shutil.ignore_patterns("*.tmp"))


def status(req: dict[str, Any]) -> dict[str, Any]:
    answer: dict[str, Any] = {"markers": _markers(req["state_dir"])}
    if req.get("probe"):
        answer["probe"] = _probe(req, {**os.environ, **req.get("env", {})})
    return answer


def launch(req: dict[str, Any]) -> dict[str, Any]:
    state, machine_id = req["state_dir"], req["machine_id"]
    with _locked(state):
        for marker in _markers(state):
            if not marker["alive"]:
                continue
            if marker.get("machine_id") == machine_id:
                return {"pid": marker["pid"], "existing": True}
            return {"busy": marker.get("machine_id")}
        folder = os.path.join(_machines(state), machine_id)
        home = os.path.join(folder, "home")
        os.makedirs(home, mode=0o700, exist_ok=True)
        _seed_probes(state, home)
        logs = os.path.join(state, "logs")
        os.makedirs(logs, mode=0o700, exist_ok=True)
        env = {**os.environ, "GPULAYER_HOME": home, **req.get("env", {}), **req["worker_env"]}
        fd = os.open(os.path.join(logs, f"{machine_id}.log"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            # its own session: no SIGHUP when the SSH channel closes, and one process group
            # for terminate to signal; no descriptor of the channel is inherited, so the
            # channel closes as soon as this script exits
            argv = [os.path.expanduser(req["argv"][0]), *req["argv"][1:]]
            proc = subprocess.Popen(argv, env=env, cwd=folder, stdin=subprocess.DEVNULL, stdout=fd,
                                    stderr=subprocess.STDOUT, start_new_session=True, close_fds=True,
                                    umask=_LOGIN_UMASK)
        finally:
            os.close(fd)
        # a worker that cannot start (a Python without GPUlayer, a broken install) exits at
        # once: say so now, with its words, rather than leave the server waiting for its join
        with contextlib.suppress(subprocess.TimeoutExpired):
            code = proc.wait(timeout=float(req.get("early_exit", EARLY_EXIT_SECONDS)))
            shutil.rmtree(folder, ignore_errors=True)
            return {"exited": code, "log": _tail(os.path.join(logs, f"{machine_id}.log"))}
        marker = {"machine_id": machine_id, "label": req["label"], "pid": proc.pid,
                  "create_time": _create_time(proc.pid), "started_at": time.time()}
        tmp = os.path.join(folder, "marker.json.tmp")
        with open(tmp, "w") as f:
            json.dump(marker, f)
        os.replace(tmp, os.path.join(folder, "marker.json"))
        return {"pid": proc.pid, "existing": False}


def _tail(path: str, lines: int = 3) -> str:
    """The last ``lines`` lines of a log, on one line."""
    try:
        with open(path, "rb") as f:
            f.seek(max(0, os.path.getsize(path) - 4096))
            text = f.read().decode("utf-8", "replace")
    except OSError:
        return ""
    return " | ".join(line.strip() for line in text.strip().splitlines()[-lines:])


def _tree(pid: int) -> list[Any]:
    if psutil is None:
        return []
    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.Error:
        return []


def _machine_processes(machine_id: str) -> list[Any]:
    """Every process of ours that carries ``GPULAYER_MACHINE_ID=machine_id`` in its environment
    (the worker sets it, its tasks inherit it): what the machine left running, also after its
    worker died and its tasks' children were re-parented to init. Linux (``/proc``) with psutil;
    elsewhere none."""
    if psutil is None or not os.path.isdir("/proc/self"):
        return []
    needle = f"GPULAYER_MACHINE_ID={machine_id}".encode()
    me, found = os.getpid(), []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == me:
            continue
        try:
            with open(f"/proc/{name}/environ", "rb") as f:
                if needle not in f.read().split(b"\0"):
                    continue
            found.append(psutil.Process(int(name)))
        except (OSError, psutil.Error):  # gone meanwhile, or another user's
            continue
    return found


def _signal_all(pgid: int, procs: list[Any], sig: int) -> None:
    if pgid > 0:  # (0: no live worker; killpg(0) would signal this script's own group)
        with contextlib.suppress(OSError):
            os.killpg(pgid, sig)
    for proc in procs:  # descendants that left the group (a task's own session)
        with contextlib.suppress(Exception):
            proc.send_signal(sig)


def _gone(pgid: int, procs: list[Any]) -> bool:
    if psutil is not None:
        # only the worker's descendants can be in its group; a zombie is as good as gone
        # (a host whose init does not reap would otherwise keep the group "alive")
        def ended(proc: Any) -> bool:
            try:
                return not proc.is_running() or proc.status() == psutil.STATUS_ZOMBIE
            except psutil.Error:
                return True

        return all(ended(p) for p in procs)
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


def terminate(req: dict[str, Any]) -> dict[str, Any]:
    state, machine_id = req["state_dir"], req["machine_id"]
    folder = os.path.join(_machines(state), machine_id)
    with _locked(state):
        marker = _read_marker(folder)
        if marker is None:
            shutil.rmtree(folder, ignore_errors=True)
            return {"found": False, "was_running": False}
        running = _alive(marker)
        # the worker's tree, and whatever else carries the machine's id: a task's processes
        # that outlived a worker killed with SIGKILL, or left its tree
        pid = int(marker["pid"]) if running else 0
        procs = _tree(pid) if running else []
        known = {p.pid for p in procs}
        left = [p for p in _machine_processes(machine_id) if p.pid not in known]
        if running or left:
            procs += left
            _signal_all(pid, procs, signal.SIGTERM)
            deadline = time.monotonic() + float(req.get("grace", 20))
            while not _gone(pid, procs) and time.monotonic() < deadline:
                time.sleep(0.1)
            if not _gone(pid, procs):
                _signal_all(pid, (_tree(pid) if running else []) + procs, signal.SIGKILL)
        shutil.rmtree(folder, ignore_errors=True)
        return {"found": True, "was_running": running, "left_behind": 0 if running else len(left)}


#: how long a launch watches the worker it started for an exit at once (a Python without
#: GPUlayer exits within a tenth of a second), seconds
EARLY_EXIT_SECONDS = 0.5

#: the umask the worker gets: the login's own (this script's files are private, 0600/0700)
_LOGIN_UMASK = 0o022


def main() -> None:
    global _LOGIN_UMASK
    _LOGIN_UMASK = os.umask(0o077)
    req = json.loads(sys.stdin.read())
    req["state_dir"] = os.path.expanduser(req["state_dir"])
    ops = {"status": status, "launch": launch, "terminate": terminate}
    answer = ops[req["op"]](req)
    sys.stdout.write(json.dumps(answer) + "\n")


if __name__ == "__main__":
    main()
