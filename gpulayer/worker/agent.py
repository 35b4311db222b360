"""The worker agent: registers, heartbeats, takes assigned tasks and runs them.

It talks to the control plane through :class:`~gpulayer.api.WorkerAPI`, which the embedded
:class:`~gpulayer.control.ControlPlane` implements directly and
:func:`~gpulayer.http_client.connect_http` implements over the network, so one agent serves
both the embedded default and a server. A worker joining a server spends its join token
first (``WorkerAPI.join_worker``, see ``gpulayer worker start``) and is handed to the agent
already registered.

Each task runs in a thread of its own (one a task before used, :mod:`gpulayer.worker.threads`)
as its own process tree (:mod:`gpulayer.worker.process`).
One long poll (``WorkerAPI.poll_work``) both takes new tasks and hears at once which running
ones to end (a cancelled job); a heartbeat thread keeps the worker alive and learns the same
as a safety net (a group whose other node failed, a poll that was not answered). Stopping (SIGINT/SIGTERM, or :meth:`Agent.stop`) stops
taking work, lets running tasks finish for a grace period, then ends and reports them.
A task that the same kind of signal killed while the worker was being stopped by one (a
Ctrl-C reaches the terminal's whole process group; ``scancel`` of a Slurm allocation and
a machine's shutdown signal every process on it) is not reported: its machine went away,
the task did not fail, and the worker's leaving marks it lost.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

from gpulayer import bundles, config
from gpulayer.api import LogStream, TaskAssignment, WorkerAPI
from gpulayer.errors import AuthError, Conflict, ConnectionFailed, DatabaseFailed, GpulayerError, InvalidInput, NotFound, PluginError
from gpulayer.hookrecords import Capabilities
from gpulayer.launchers import launch_command
from gpulayer.records import JobError, TaskState, WorkerRecord
from gpulayer.worker.artifacts import keep as keep_artifacts
from gpulayer.worker.cache_keeper import CacheKeeper
from gpulayer.worker.fork_servers import ForkServers, site_hook
from gpulayer.worker.forking import RUNNER_PATH, ForkServer
from gpulayer.worker.logbuffer import LogBuffer, task_sender
from gpulayer.worker.outcome import Deletions, NotStarted, StartMark, TaskOutcome, error_text, finish, function_outcome
from gpulayer.worker.process import Cancel, OrphanSweep, Started, Starter, StartFailed
from gpulayer.worker.stop_signals import StopSignals
from gpulayer.worker.task_env import WORKER_SECRETS, task_environ
from gpulayer.worker.task_files import INLINE_SPEC_MAX, TaskFiles
from gpulayer.worker.task_files import sweep as sweep_files
from gpulayer.worker.threads import WORKER_THREADS, waited_briefly

log = logging.getLogger("gpulayer.worker")

#: the longest a worker waits between tries to reach a control plane that went away
RECONNECT_MAX = 2.0
#: how many of the tasks it took last a worker remembers (Agent._take)
TAKEN_KEPT = 1024


def default_cpu_slots(capabilities: Capabilities) -> int:
    """CPU-only tasks a worker runs at once unless told: one per CPU, at most four."""
    return max(1, min(4, capabilities.host.cpu_count))


#: exit codes of a death by a stopping signal: negative, the main process was killed by it;
#: 128 + the signal, a shell whose child was (``sh -c 'cmd'``: when the signal reaches the
#: child first, the shell exits with that code before its own signal is delivered)
_STOPPING = (signal.SIGHUP, signal.SIGINT, signal.SIGKILL, signal.SIGTERM)
_STOP_SIGNALS = frozenset([*(-int(s) for s in _STOPPING), *(128 + int(s) for s in _STOPPING)])


class Agent:
    def __init__(
        self,
        api: WorkerAPI,
        *,
        capabilities: Capabilities | None = None,
        registered: WorkerRecord | None = None,
        name: str | None = None,
        cpu_slots: int | None = None,
        python: str | None = None,
        heartbeat_interval: float | None = None,
        poll_wait: float | None = None,
        grace: float = 10.0,
        kill_grace: float = 5.0,
        idle_exit: float | None = None,
        preload: tuple[str, ...] | None = None,
    ) -> None:
        self.api = api
        if capabilities is None:
            from gpulayer.resources import detect_capabilities

            capabilities = detect_capabilities(python=python)
        self.capabilities = capabilities
        self.name = name
        self.cpu_slots = cpu_slots if cpu_slots is not None else default_cpu_slots(capabilities)
        self.python = python or capabilities.host.python_path or sys.executable
        # embedded: frequent (cheap, and cancels are seen through heartbeats); over HTTP the
        # API says how often, so a large fleet does not flood the server
        default_interval = getattr(api, "heartbeat_interval", 0.5)
        self.heartbeat_interval = heartbeat_interval or config.settings().heartbeat_interval or default_interval
        # how long one poll for work may wait: embedded polls are cheap and local; over HTTP
        # a long poll answers as soon as a task is assigned, so it can wait long
        self.poll_wait = poll_wait if poll_wait is not None else getattr(api, "poll_wait", 1.0)
        self.grace = grace
        self._stop_grace = grace
        self.kill_grace = kill_grace
        self.idle_exit = idle_exit
        #: set when a join already registered this worker (a server's join token)
        self.registered = registered
        self.worker_id: str | None = registered.id if registered is not None else None
        self._stopping = threading.Event()
        self._signalled = threading.Event()
        #: why the control plane refused this worker's credentials (its token revoked): it stops
        self.refused: str | None = None
        self._stopped = threading.Event()
        self._running: dict[str, Cancel] = {}
        #: running tasks already told to end, or whose process ended (they are reporting)
        self._ending: set[str] = set()
        #: each task's end (its thread is set to go on with other work: see worker.threads)
        self._done: dict[str, threading.Event] = {}
        #: the last tasks taken, oldest first (see _take)
        self._taken: dict[str, None] = {}
        self._lock = threading.Lock()
        self._shutdown_ended: set[str] = set()
        self._deleted = Deletions()  # (tasks whose job was deleted while this worker held them)
        self._last_busy = time.monotonic()
        self._bundle_cache = config.home() / "bundles"
        self._cache_keeper = CacheKeeper(self._bundle_cache)
        self._started = False
        self._heartbeats: threading.Thread | None = None
        self._orphans = OrphanSweep()  # (and what one killed beside us left: every few seconds)
        #: warm interpreters that fork FunctionJob tasks (:mod:`gpulayer.worker.forking`),
        #: started on first use with the environment every task inherits
        self.forks = ForkServers(self.python, {k: v for k, v in os.environ.items() if k not in WORKER_SECRETS},
                                 config.settings().preload if preload is None else preload, follow=WORKER_SECRETS)
        self.task_files = TaskFiles()  # (its tasks' spec, result, scratch and artifacts folders)

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> WorkerRecord:
        self._orphans.now()  # what a worker killed before us left running must not run beside us
        sweep_files()  # (nor its tasks' files stay for ever)
        record = self.registered if self.registered is not None else self._register()
        self._started = True
        self._heartbeats = threading.Thread(target=self._heartbeat_loop, name="gpulayer-heartbeat", daemon=True)
        self._heartbeats.start()
        threading.Thread(target=self._poll_loop, name="gpulayer-poll", daemon=True).start()
        self.forks.prestart()  # (its preloads imported before the first FunctionJob asks for them)
        return record

    def _register(self) -> WorkerRecord:
        record = self.api.register_worker(
            self.capabilities, worker_id=self.worker_id, name=self.name, cpu_slots=self.cpu_slots,
            pid=os.getpid(),
        )
        self.worker_id = record.id
        return record

    def run_forever(self, asked: StopSignals | None = None) -> None:
        """Serve (start first if need be) until SIGINT/SIGTERM or ``idle_exit`` idle seconds, then drain
        and stop; at once if ``asked`` heard one already (its handler takes no lock: :mod:`.stop_signals`)."""
        if not self._started:
            self.start()
        signals = asked if asked is not None else StopSignals()
        signals.install(signal.SIGTERM, signal.SIGINT)
        signals.follow(self._on_signal)
        while not self._stopping.wait(0.5):
            if self.idle_exit is not None:
                with self._lock:
                    busy = bool(self._running)
                if busy:
                    self._last_busy = time.monotonic()
                elif time.monotonic() - self._last_busy > self.idle_exit:
                    break
        self.stop()

    def _on_signal(self, signum: int) -> None:
        log.warning("%s: draining (grace %g s)", signal.Signals(signum).name, self.grace)
        self._signalled.set()
        self._stopping.set()

    def stop(self, grace: float | None = None) -> None:
        """Stop taking work; give running tasks ``grace`` seconds, then end them; report all."""
        grace = self.grace if grace is None else grace
        self._stop_grace = grace  # (what a task ended by the stop says it was given)
        self._stopping.set()
        if self.worker_id is not None and self.refused is None:
            waited_briefly("mark the worker draining", self._drain_call)
        deadline = time.monotonic() + grace
        for done in list(self._done.values()):
            # (a grace of years is "until they end": one wait can be no longer than TIMEOUT_MAX)
            done.wait(min(max(0.0, deadline - time.monotonic()), threading.TIMEOUT_MAX))
        with self._lock:
            for task_id, event in self._running.items():
                self._shutdown_ended.add(task_id)
                event.set()
        deadline = time.monotonic() + self.kill_grace + 5  # (for them all, not each: N slots, N times)
        for done in list(self._done.values()):
            done.wait(max(0.0, deadline - time.monotonic()))
        self._stopped.set()
        if self._heartbeats is not None:  # (a heartbeat that lands after the deregistration
            self._heartbeats.join(self.kill_grace + 5)  # below would bring this worker back)
        self._cache_keeper.close(self.kill_grace + 5)
        self.forks.close()
        self.task_files.close(self.running_tasks)  # (a task still at its end keeps its folders)
        if self.worker_id is not None:
            waited_briefly("deregister the worker", self._leave_call)

    def _drain_call(self) -> None:
        try:
            self.api.drain_worker(str(self.worker_id))
        except GpulayerError as exc:
            log.warning("could not mark worker draining: %s", exc)

    def _leave_call(self) -> None:
        try:
            self.api.deregister_worker(str(self.worker_id))
        except AuthError as exc:  # (its token revoked: the server let it go, an idle machine ended)
            log.info("not deregistered: %s; the server no longer counts this worker", exc)
        except GpulayerError as exc:
            log.warning("could not deregister worker: %s", exc)

    @property
    def running_tasks(self) -> list[str]:
        with self._lock:
            return list(self._running)

    # ------------------------------------------------------------------ loops

    def _heartbeat_loop(self) -> None:
        backoff = self.heartbeat_interval
        while not self._stopped.wait(backoff):
            if self.worker_id is None:  # pragma: no cover - start() registers first
                continue
            self._orphans.when_due()
            try:
                reply = self.api.heartbeat(self.worker_id, running=self.running_tasks)
                backoff = self.heartbeat_interval
            except AuthError as exc:  # (its token revoked: no later beat would be heard)
                log.error("the control plane refused this worker's token (%s): stopping", exc)
                self.refused = str(exc)
                self._stopping.set()
                return
            except Exception as exc:  # whatever went wrong, this thread must keep beating
                # capped well below any heartbeat timeout: a server that comes back hears
                # from this worker within moments
                backoff = min(max(backoff, 0.5) * 2, RECONNECT_MAX)
                log.warning("heartbeat failed (%s: %s); retrying in %.1f s", type(exc).__name__, exc, backoff)
                continue
            if not reply.known and not self._stopping.is_set():
                log.warning("control plane does not know this worker; registering again")
                try:
                    self._register()
                except Exception as exc:
                    log.warning("re-register failed: %s", exc)
                continue
            self._end(reply.cancel)

    def _end(self, task_ids: list[str]) -> None:
        """End these running tasks (a cancel, a superseded attempt): their trees die now."""
        with self._lock:
            events = [self._running.get(t) for t in task_ids]
            self._ending.update(t for t in task_ids if t in self._running)
        for event in events:
            if event is not None:
                event.set()

    def _poll_loop(self) -> None:
        backoff = 0.5
        while not self._stopping.is_set():
            if self.worker_id is None:  # pragma: no cover - start() registers first
                return
            try:
                # the tasks running here go with the poll, so a cancel of one of them answers
                # it at once (not at the next heartbeat)
                with self._lock:  # (those told to end are left out: the answer would repeat at once)
                    running = [t for t in self._running if t not in self._ending]
                work = self.api.poll_work(self.worker_id, running=running, wait=self.poll_wait)
                backoff = 0.5
            except ConnectionFailed as exc:
                log.warning("poll failed (%s); retrying in %.1f s", exc, backoff)
                self._stopping.wait(backoff)
                backoff = min(backoff * 2, RECONNECT_MAX)
                continue
            except Exception as exc:  # keep serving; the control plane may be back in a moment
                log.warning("poll failed (%s: %s)", type(exc).__name__, exc)
                self._stopping.wait(1.0)
                continue
            self._end(work.cancel)
            self._take(work.tasks)

    def _take(self, tasks: list[TaskAssignment]) -> None:
        """Run each of these tasks in a thread of its own, but those this worker took already:
        a poll and a report's answer may both hand over one (a task that ran and ended
        since is remembered a while too; were it not, its start would be refused)."""
        for a in tasks:
            with self._lock:
                if a.task_id in self._running or a.task_id in self._taken or self._stopping.is_set():
                    continue
                self._running[a.task_id] = Cancel()
                self._done[a.task_id] = done = threading.Event()
                self._taken[a.task_id] = None
                if len(self._taken) > TAKEN_KEPT:
                    del self._taken[next(iter(self._taken))]
                self._last_busy = time.monotonic()
            WORKER_THREADS.run(self._run_task, a, done)

    # ------------------------------------------------------------------ one task

    def _run_task(self, a: TaskAssignment, done: threading.Event) -> None:
        worker_id = self._own_id()
        cancel = self._running[a.task_id]
        started = StartMark(lambda how: self._start_task(a.task_id, worker_id, how))
        fork: ForkServer | None = None
        try:
            if a.attempt > 1:  # its last attempt's processes may be left here, by a worker killed since
                self._orphans.now()
            if a.spec.kind == "function":
                # what the task's interpreter would start with: the worker's, with the job's
                fork, started.how = self.forks.choose(a.spec.python, {**self.forks.follow_environ(), **a.spec.env})
            try:
                if fork is None:  # a spawned process runs at once: started before it
                    started()
                # (a forked child is told to go once started() has run: see _run)
                outcome = self._execute(a, cancel, fork, started)
                if fork is not None:  # its process ended: a replaced server need not wait for the report
                    leased: ForkServer = fork
                    fork = None
                    leased.release()
                started()  # (a forked task that ended before its child was started: its bundle failed)
            except NotStarted as exc:
                log.info("not starting %s: %s", a.task_id, f"job {a.job_id} was deleted" if exc.deleted else exc)
                return
            with self._lock:  # ended: a poll need not ask about it any more
                self._ending.add(a.task_id)
            if self._died_with_worker(a.task_id, outcome):
                log.warning("task %s was killed by a signal while this worker was being stopped by one: "
                            "left to be marked lost", a.task_id)
                return
            self._report(a.task_id, outcome, a.job_id)
        except Exception as exc:  # a bug or an environment problem: the task must still end
            log.exception("task %s crashed in the worker", a.task_id)
            try:
                started()  # (started before it is reported, as a task that ran is)
            except NotStarted:
                return
            except Exception:
                pass  # (the report says why; its retries face the same control plane)
            self._report(a.task_id, TaskOutcome(TaskState.FAILED, error=JobError.worker(
                f"worker error: {type(exc).__name__}: {exc}")), a.job_id)
        finally:
            if fork is not None:  # (leased to this task by choose())
                fork.release()
            with self._lock:
                self._running.pop(a.task_id, None)
                self._ending.discard(a.task_id)
                self._done.pop(a.task_id, None)
                self._last_busy = time.monotonic()
            self._deleted.forget(a.task_id)
            done.set()

    def _died_with_worker(self, task_id: str, outcome: TaskOutcome) -> bool:
        """Whether ``outcome`` is a death by the signal that stops this worker (see the module
        doc), not by the worker's own kill after the grace period."""
        if (outcome.state is not TaskState.FAILED or outcome.exit_code not in _STOP_SIGNALS
                or task_id in self._shutdown_ended):
            return False
        # the signal reaches the task's process and this worker's main thread at once, and
        # the task's end may be seen first
        return self._signalled.wait(1.0)

    def _own_id(self) -> str:
        if self.worker_id is None:
            raise GpulayerError("the worker is not registered yet (call start() first)")
        return self.worker_id

    #: how long a worker keeps trying to start a task, and to deliver its final report,
    #: through an outage of the control plane
    start_for = 120.0
    report_for = 600.0

    def _start_task(self, task_id: str, worker_id: str, how: str) -> None:
        """Starting matters (a task that cannot start is lost, then retried), so keep trying
        through an outage, or while the control plane cannot store it (a full disk: the task
        has not run, and must not fail for it); a repeated start is success."""
        deadline = time.monotonic() + self.start_for
        while True:
            try:
                self.api.start_task(task_id, worker_id=worker_id, how=how)
                return
            except (ConnectionFailed, DatabaseFailed) as exc:
                if time.monotonic() > deadline:
                    raise
                log.warning("marking %s started failed (%s); retrying in 1 s", task_id, exc)
                time.sleep(1.0)

    def _report(self, task_id: str, outcome: TaskOutcome, job_id: str) -> None:
        """Deliver the outcome, retrying through outages. While this runs the task stays in
        the heartbeat's running list; one that gives up is found lost by the control plane.
        A task the control plane no longer has (its job was deleted) is said once, calmly."""
        worker_id = self._own_id()
        delay = 0.5
        deadline = time.monotonic() + self.report_for
        while True:
            try:
                more = finish(self.api, task_id, worker_id, outcome)
            except NotFound:
                self._deleted.say(task_id, job_id, "its processes were ended as for a cancel"
                                  if outcome.state is TaskState.CANCELLED
                                  else f"it had ended ({outcome.state.value}): nothing to report")
                return
            except (Conflict, AuthError) as exc:
                log.info("report for %s refused: %s", task_id, exc)
                return
            except InvalidInput as exc:
                if outcome.result is None and outcome.state is TaskState.FAILED:
                    log.error("report for %s refused: %s", task_id, exc)
                    return
                # e.g. a result too large to store: the task fails, saying why
                outcome = TaskOutcome(TaskState.FAILED, exit_code=outcome.exit_code, usage=outcome.usage,
                                      error=JobError.worker(f"the task's report was refused: {exc}"))
                continue
            except Exception as exc:  # the control plane is away or failing: keep the outcome
                if time.monotonic() > deadline:
                    log.error("giving up reporting %s after %.0f s: %s", task_id, self.report_for, exc)
                    return
                log.warning("reporting %s failed (%s: %s); retrying in %.1f s", task_id,
                            type(exc).__name__, exc, delay)
                time.sleep(delay)
                delay = min(delay * 2, RECONNECT_MAX)
            else:
                self._take(more or [])  # (what the slot was given: no wait for the poll)
                return

    def _workdir(self, a: TaskAssignment) -> Path:
        """The working directory of a task whose bundle is not in the cache yet (see :meth:`_run`): the
        bundle fetched and extracted (held by the task, see :meth:`_execute`), or a scratch folder."""
        digest = a.spec.bundle_digest
        if digest:
            data = self.api.get_bundle(digest)
            extracted = Path(bundles.extract_bundle(data, digest, self._bundle_cache))
            self._cache_keeper.ask()  # a new bundle in the cache: keep it within its limits
            return extracted
        return self.task_files.scratch(a.task_id)

    def task_env(self, a: TaskAssignment, workdir: Path) -> dict[str, str]:
        return task_environ(a, workdir, self.capabilities, self.task_files.artifacts(a.task_id))

    def _execute(self, a: TaskAssignment, cancel: threading.Event, fork: ForkServer | None,
                 started: StartMark) -> TaskOutcome:
        worker_id = self._own_id()
        sender = task_sender(self.api, a.task_id, worker_id)

        def ship(chunks: list[tuple[LogStream, str]], offset: int) -> None:
            if not self._deleted.said(a.task_id):  # (after that, its output has nowhere to go)
                try:
                    sender(chunks, offset)
                except NotFound:  # its job was deleted (a task goes with its job alone): as for a cancel
                    self._deleted.say(a.task_id, a.job_id, "its processes are ended as for a cancel")
                    self._end([a.task_id])

        logbuf = LogBuffer(ship, retry_for=self.report_for)
        digest = a.spec.bundle_digest
        held = bundles.bundle_in_use(self._bundle_cache, digest) if digest else contextlib.nullcontext()
        swapped: list[ForkServer] = []  # (a server _run chose instead of ``fork``: leased to it)
        try:
            with held:
                outcome = self._run(a, cancel, logbuf, fork, started, swapped)
            if not self._deleted.said(a.task_id):  # (stored before the report: there when the job has ended)
                keep_artifacts(self.api, a, worker_id, self.task_files.artifacts_made(a.task_id), logbuf, self.report_for)
            return outcome
        finally:
            for server in swapped:
                server.release()
            logbuf.close()
            self.task_files.remove(a.task_id, function=a.spec.kind == "function")

    def _own_copies(self, a: TaskAssignment, fork: ForkServer, search: list[str], started: StartMark,
                    swapped: list[ForkServer]) -> ForkServer | None:
        """``fork``, or where the task's own path (``search``: its bundle, its ``PYTHONPATH``)
        has a copy of a module the preloads imported, which a fresh interpreter would import
        instead (and with it, the preloads that import it), the server without the preloads
        (leased, in ``swapped``) or None (spawn it: marked started here, as a spawn must be)."""
        own = fork.shadowed(search)
        if not own or a.spec.kind != "function":
            return fork
        other, started.how = self.forks.choose(a.spec.python, {**self.forks.follow_environ(), **a.spec.env}, own)
        if other is None:
            started()
        else:
            swapped.append(other)
        return other

    def _run(self, a: TaskAssignment, cancel: threading.Event, logbuf: LogBuffer, fork: ForkServer | None,
             started: StartMark, swapped: list[ForkServer]) -> TaskOutcome:
        """Prepare the task's directory, environment and command; run it; read its outcome.
        ``started`` marks the task started (once): a forked child is sent its task first and
        told to go after it (it gets ready meanwhile); a bundle to fetch is fetched after it
        (but where the server's preloads may not be the task's: see :meth:`_own_copies`)."""
        from gpulayer.worker.process import run_process

        digest = a.spec.bundle_digest
        workdir = self._bundle_cache / digest if digest else None
        if workdir is None or not workdir.is_dir():
            # a bundle to fetch first: what may take long comes after the start, but a task
            # to fork is marked started once the bundle's files are there: whether it is
            # forked, and from which server, depends on them (site_hook, _own_copies)
            if digest and fork is None:
                started()
            try:
                workdir = self._workdir(a)
            except (GpulayerError, OSError) as exc:
                logbuf.add("stderr", f"gpulayer: could not prepare the source bundle: {exc}\n")
                return TaskOutcome(TaskState.FAILED, error=JobError.bundle(error_text(exc)))
        try:
            env = self.task_env(a, workdir)
        except PluginError as exc:  # (the granted devices' environment: the plugin is named)
            logbuf.add("stderr", f"gpulayer: {exc}\n")
            return TaskOutcome(TaskState.FAILED, error=JobError.plugin(error_text(exc)))
        if fork is not None and (hook := site_hook([str(workdir), *a.spec.env.get("PYTHONPATH", "").split(os.pathsep)])):
            fork = None  # (its server ran site's hooks as it started, from the worker's own path)
            started.how = f"spawned: {hook} would not run in a forked process"
            started()
        if fork is not None and fork.tops:
            fork = self._own_copies(a, fork, [str(workdir), *env.get("PYTHONPATH", "").split(os.pathsep)],
                                    started, swapped)
        spec = a.spec
        result_path: Path | None = None
        start: Starter | None = None
        if spec.kind == "command":
            argv = list(spec.command)
            if argv and argv[0] == "python":  # "python" is the worker's job Python, not PATH's
                argv[0] = self.python
        elif spec.kind == "function":
            spec_path, result_path = self.task_files.paths(a.task_id)
            call = {"function": spec.function, "args": spec.args, "kwargs": spec.kwargs}
            text = json.dumps(call)
            argv = [spec.python or self.python, RUNNER_PATH, str(spec_path), str(result_path)]
            # a forked child gets the spec in its request (a small one: a large one would not
            # fit in one message, see ForkServer.start); a spawned runner reads it from a file
            inline = fork is not None and len(text) <= INLINE_SPEC_MAX
            if not inline:
                spec_path.write_text(text)
            if fork is not None:
                server, cwd, files = fork, str(workdir), (str(spec_path), str(result_path))
                given: str | dict[str, Any] = call if inline else files[0]

                def start(full_env: dict[str, str]) -> tuple[Started, int, int]:
                    try:
                        child, out, err = server.start(cwd=cwd, env=full_env, spec=given, result=files[1],
                                                       gated=True)
                    except StartFailed as exc:
                        if inline:
                            Path(files[0]).write_text(text)
                        started.how = f"spawned: {exc}"  # (its event says how it did start)
                        started()  # the spawn that follows runs the task at once
                        raise
                    try:
                        started()
                    except BaseException:
                        child.let_go()  # it exits having run nothing
                        os.close(out)
                        os.close(err)
                        raise
                    if cancel.is_set():  # cancelled meanwhile: it ends as cancelled, having run nothing
                        child.let_go()
                    else:
                        child.go()
                    return child, out, err
        elif spec.kind == "distributed":
            try:
                if a.rendezvous is None:  # (the control plane gives one to every node)
                    raise PluginError(f"no rendezvous for launcher {spec.launcher!r}")
                cmd = launch_command(spec, a.rendezvous, a.node_rank, self.python)
            except PluginError as exc:
                logbuf.add("stderr", f"gpulayer: {exc}\n")
                return TaskOutcome(TaskState.FAILED, error=JobError.launcher(error_text(exc)))
            argv = list(cmd.argv)
            env.update(cmd.env)
        else:  # pragma: no cover - the spec union is closed
            raise AssertionError(spec.kind)
        outcome = run_process(argv, env=env, cwd=str(workdir), on_output=logbuf.write,
                              timeout=spec.timeout, cancel=cancel, grace=self.kill_grace, start=start)
        state = TaskState(outcome.state)
        if state is TaskState.CANCELLED and a.task_id in self._shutdown_ended:
            # ended because this worker is stopping, not because anyone cancelled the job:
            # a failure the job may retry elsewhere
            state = TaskState.FAILED
            outcome.error = f"the worker stopped before the task finished (grace {self._stop_grace:g} s)"
        report = TaskOutcome(state, exit_code=outcome.exit_code, usage=outcome.usage)
        if outcome.error and state is not TaskState.SUCCEEDED:
            report.error = JobError.ended(state, error_text(outcome.error))
        if result_path is not None and state in (TaskState.SUCCEEDED, TaskState.FAILED):
            return function_outcome(report, result_path, getattr(spec, "python", None))  # (a FunctionJob)
        return report
