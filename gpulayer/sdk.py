"""The Python SDK: ``@gl.remote``, ``gl.submit``, job handles, ``gl.wait``, ``gl.as_completed``,
``gl.cancel``.

``@gl.remote`` turns a module-level function into one that can also run as a
:class:`~gpulayer.specs.FunctionJob`: ``f(...)`` still runs here, ``f.remote(...)``
submits it and returns a :class:`JobHandle`. Arguments and the result are JSON
(docs/adr/0002-json-only-arguments.md); the function travels as source, by name.
"""

from __future__ import annotations

import math
import os
import sys
import time
import warnings
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, Generic, TypeVar, cast, overload

from gpulayer import leaving
from gpulayer.api import MAX_BATCH, MAX_LONG_POLL
from gpulayer.client import Client, connect, prefixes_nodes
from gpulayer.errors import (
    InvalidArgument,
    InvalidInput,
    JobFailed,
    RemoteError,
    Unschedulable,
)
from gpulayer.joboptions import JobOptions
from gpulayer.lending import lent_while_waiting
from gpulayer.logtail import checked_tail
from gpulayer.logtext import NodeLines
from gpulayer.records import Explanation, JobRecord, JobState
from gpulayer.remote_functions import (
    RemoteFunction,
    check_remote_options,
    function_reference,
    remote,
    remote_spelling,
    warm,
)
from gpulayer.scheduling import NO_ELIGIBLE_WORKER
from gpulayer.specs import (
    CommandJob,
    DistributedJob,
    FunctionJob,
    Spelling,
)
from gpulayer.unsent import UnsentFileWarning, note, unsent_in_specs

if TYPE_CHECKING:
    from typing_extensions import Unpack

T = TypeVar("T")

__all__ = ["JobHandle", "RemoteFunction", "as_completed", "cancel", "connect", "explain", "function_reference",
           "get_job", "remote", "submit", "submit_many", "wait", "warm"]



class JobHandle(Generic[T]):
    """A submitted job: ``id``, ``status()``, ``result()``, ``logs()``, ``cancel()``.

    ``JobHandle[T]``: ``result()`` is a ``T``, the return type of the ``@gl.remote`` function
    whose ``.remote()`` made it (``Any`` for a handle of a spec or of ``gl.get_job``).

    Two handles of one job are equal and hash alike (``gl.get_job(ID)`` twice, the handle
    ``.remote()`` returned, one read back from a pickle), as Ray's ObjectRefs are: a handle is
    its job's id on its control plane (:attr:`~gpulayer.client.Client.control_plane`), so a
    set or a dict of handles holds each job once."""

    def __init__(self, job_id: str, client: Client | None = None) -> None:
        self.id = job_id
        self._client = client or connect()

    def __repr__(self) -> str:
        return f"JobHandle({self.id!r})"

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, JobHandle):
            return NotImplemented
        return self.id == other.id and (self._client is other._client
                                        or self._client.control_plane == other._client.control_plane)

    def __hash__(self) -> int:
        return hash((self._client.control_plane, self.id))

    def __reduce__(self) -> tuple[Any, tuple[str]]:
        # a handle pickles as its job's id (to a ProcessPoolExecutor, a multiprocessing
        # queue): read back, it is gl.get_job's handle on that process's default control
        # plane (its GPULAYER_URL, GPULAYER_TOKEN, or the home's), as a Ray ObjectRef or a
        # Dask future travels; no client, connection or token goes into the pickle
        return (get_job, (self.id,))

    def record(self) -> JobRecord:
        return self._client.api.get_job(self.id)

    def status(self) -> str:
        return self._client.job(self.id, brief=True).state.value  # (not its result and arguments)

    def done(self) -> bool:
        return self._client.job(self.id, brief=True).state.terminal

    def wait(self, timeout: float | None = None) -> JobRecord:
        return self._ended(wait_limit(timeout, "handle.wait"), arguments=True)

    def _ended(self, timeout: float | None, *, arguments: bool) -> JobRecord:
        job = self._client.wait(self.id, timeout, arguments=arguments)
        if not job.state.terminal:
            raise TimeoutError(f"job {self.id} is still {job.state.value} after {timeout} s")
        return job

    def result(self, timeout: float | None = None) -> T:
        """Wait for the job; return a function's JSON result (or a command's exit code).

        A function that raised comes back as :class:`RemoteError` with the remote type,
        message and traceback; a job no worker could run as :class:`Unschedulable`; any other
        unsuccessful end as :class:`JobFailed` (of which both are kinds).
        """
        return cast("T", result_of(self._ended(wait_limit(timeout, "handle.result"), arguments=False)))

    def logs(self, node: int | None = None, *, tail: int | None = None) -> str:
        """The output so far; lines of a job of several nodes are prefixed ``[node R]``, as
        ``gpulayer jobs logs`` shows them. ``tail=N``: its last N lines only (0 to 100,000),
        read from the end, as ``gpulayer jobs logs --tail N``."""
        if tail is not None:
            checked_tail(tail, f"handle.logs(tail={tail!r})")
        job = self._client.job(self.id, brief=True)  # (its spec's nodes: not its result and arguments)
        lines = NodeLines(prefixes_nodes(job.spec, node, spelled=f"handle.logs(node={node!r})"))
        text = "".join(lines.text(c.data, c.node_rank, c.stream)
                       for c in self._client.log_chunks(self.id, node=node, tail=tail))
        return text + "".join(rest for _, rest in lines.rest())

    def follow(self, node: int | None = None, *, tail: int | None = None) -> Iterator[str]:
        """The output as it arrives, until the job ends (prefixed as :meth:`logs`); ``tail=N``:
        the last N lines written so far first, as ``tail -n N -f``."""
        if tail is not None:
            checked_tail(tail, f"handle.follow(tail={tail!r})")
        lines = NodeLines(prefixes_nodes(self._client.job(self.id, brief=True).spec, node,
                                         spelled=f"handle.follow(node={node!r})"))
        for chunk in self._client.follow(self.id, node=node, tail=tail):
            text = lines.text(chunk.data, chunk.node_rank, chunk.stream)
            if text:
                yield text
        for _, rest in lines.rest():
            yield rest

    def cancel(self) -> str:
        return self._client.api.cancel(self.id).state.value

    def rerun(self, *, downstream: bool = False) -> JobHandle[T]:
        """Run this ended job again as a new job, with its spec and arguments: its handle
        (``downstream``: and the ended jobs that run after it, naming the new one)."""
        answer = self._client.rerun([self.id], downstream=downstream)
        if self.id not in answer.rerun:
            state = answer.not_ended.get(self.id)
            raise InvalidInput(f"{self.id} is {state.value if state else 'gone'}: a job is run again once it has ended"
                               + (" (h.cancel() first)" if state else ""))
        return JobHandle[T](answer.rerun[self.id], self._client)


    def artifacts(self, to: str | os.PathLike[str] | None = None) -> Path:
        """Download the files the job's tasks left in ``$GPULAYER_ARTIFACTS_DIR`` (its last
        attempt's) into the folder ``to`` (default: a folder named after the job, here), which
        must not exist or be empty; a job of several nodes gets ``node-0``, ``node-1``, ...
        Returns the folder."""
        return self._client.artifacts(self.id, to).to


def result_of(job: JobRecord) -> Any:
    """A finished job's result, or the error that says why there is none."""
    if job.state is JobState.SUCCEEDED:
        return job.result if job.spec.kind == "function" else job.exit_code
    err = job.error
    if job.state is JobState.UNSCHEDULABLE:
        raise Unschedulable(err.message if err else NO_ELIGIBLE_WORKER, job_id=job.id)
    if job.state is JobState.FAILED and err is not None and err.raised:
        raise RemoteError(err.type, err.message, err.traceback or "", job_id=job.id)
    raise JobFailed(job.outcome(), job_id=job.id, state=job.state.value, exit_code=job.exit_code)


#: GPUlayer's own folder: a warning points at the first frame outside it (the user's line)
_OURS = os.path.dirname(os.path.abspath(__file__)) + os.sep


def _note_unsent(specs: Iterable[CommandJob | FunctionJob | DistributedJob], who: str, client: Client) -> None:
    """Warn (:class:`~gpulayer.unsent.UnsentFileWarning`), at the user's line, where a spec
    names a file of the current folder and sends no bundle: the job runs in a folder of its
    own. Each file is named once (:func:`~gpulayer.unsent.unsent_in_specs`)."""
    for unsent in unsent_in_specs(specs, client.default_target):
        frame, level = sys._getframe(0), 1
        while frame.f_back is not None and frame.f_code.co_filename.startswith(_OURS):
            frame, level = frame.f_back, level + 1
        warnings.warn(f"{who}: {note(unsent, cli=False)}", UnsentFileWarning, stacklevel=level)


def get_job(job_id: str) -> JobHandle[Any]:
    """The handle of a job submitted before, here or elsewhere (another process, ``gpulayer
    submit``), by its id (``h.id``, ``gpulayer jobs list``), on the default control plane. A
    job it does not have is :class:`~gpulayer.errors.NotFound` at the handle's first use."""
    if not isinstance(job_id, str) or not job_id.strip():
        accepted = "accepted: a job's id as a str, such as 'job-5b8055b4ec6a' (h.id, gpulayer jobs list)"
        if isinstance(job_id, JobHandle):
            accepted += f"; this is a handle already: its id is {job_id.id!r}"
        raise InvalidArgument(f"gl.get_job({job_id!r}): not a job id; {accepted}")
    return JobHandle(job_id.strip())


def submit(spec: CommandJob | FunctionJob | DistributedJob, *, client: Client | None = None) -> JobHandle[Any]:
    """Submit a job spec; returns its handle.

    With ``on_unschedulable="fail"`` (the default) a job no registered worker could ever
    run raises :class:`Unschedulable` with the scheduler's per-worker reasons.
    """
    return _submit(spec, client, "gl.submit")


def _submit(spec: CommandJob | FunctionJob | DistributedJob, client: Client | None, who: str) -> JobHandle[Any]:
    """:func:`submit`, its warnings saying ``who`` submitted (``train.remote()``)."""
    if not isinstance(spec, (CommandJob, FunctionJob, DistributedJob)):
        raise InvalidArgument(f"{who}: the spec is {type(spec).__name__}; accepted: CommandJob, FunctionJob, "
                              "DistributedJob")
    client = client_for(client, who)
    _note_unsent([spec], who, client)
    job = client.submit(spec, arguments=False)  # (the handle needs the id and the state)
    if job.state is JobState.UNSCHEDULABLE:
        # the stored error: the scheduler's lines, then the nearest miss and what to run
        raise Unschedulable(job.error.message if job.error else NO_ELIGIBLE_WORKER, job_id=job.id)
    return JobHandle(job.id, client)


def submit_many(specs: Iterable[CommandJob | FunctionJob | DistributedJob], *,
                client: Client | None = None) -> list[JobHandle[Any]]:
    """Submit many job specs at once; returns their handles, in order.

    Far cheaper than a loop of :func:`submit`: the specs are stored in one transaction
    and placed in one pass per :data:`~gpulayer.api.MAX_BATCH` jobs (one request each
    against a server). Each such batch is stored whole or not at all: a spec the
    control plane refuses raises :class:`~gpulayer.errors.InvalidInput` naming it
    (``specs[3]: ...``) and none of its batch is stored. As with :func:`submit`, a job no
    registered worker could ever run raises :class:`Unschedulable` (the first such job's
    report); the other jobs were submitted and run (``gpulayer jobs list`` shows them).
    """
    return _submit_many(specs, client, "gl.submit_many")


def _submit_many(specs: Iterable[CommandJob | FunctionJob | DistributedJob], client: Client | None,
                 who: str) -> list[JobHandle[Any]]:
    """:func:`submit_many`, its warnings saying ``who`` submitted (``train.map()``)."""
    if isinstance(specs, (CommandJob, FunctionJob, DistributedJob)):
        raise InvalidArgument("gl.submit_many: specs is one job spec; pass a list of them (or use gl.submit)")
    items = list(specs)
    for i, spec in enumerate(items):
        if not isinstance(spec, (CommandJob, FunctionJob, DistributedJob)):
            raise InvalidArgument(f"gl.submit_many: specs[{i}] is {type(spec).__name__}; accepted: CommandJob, "
                                  "FunctionJob, DistributedJob")
    if not items:
        return []
    client = client_for(client, who)
    _note_unsent(items, who, client)
    jobs = client.submit_many(items, arguments=False)
    for job in jobs:
        if job.state is JobState.UNSCHEDULABLE:
            raise Unschedulable(job.error.message if job.error else NO_ELIGIBLE_WORKER, job_id=job.id)
    return [JobHandle(job.id, client) for job in jobs]


def explain(what: Any, *, client: Client | None = None, **options: Unpack[JobOptions]) -> Explanation:
    """Could this run, where, and if not, which worker comes closest? Submits nothing.

    ``what`` is a ``@gl.remote`` function (as ``.remote()`` would submit it, ``options``
    overriding its own), a plain module-level function (as ``@gl.remote(**options)`` would),
    a job spec, or a submitted job (its handle or id). ``print()`` the record for the text
    ``gpulayer explain`` prints; its fields are documented in docs/explain.md.
    """
    client = client_for(client, "gl.explain")
    if isinstance(what, (str, JobHandle)):
        if options:
            raise InvalidArgument("gl.explain: options apply to a function or a spec, not to a submitted job")
        e = client.explain_job(what if isinstance(what, str) else what.id)
        e._spelling = REMOTE_SPELLING
        return e
    if isinstance(what, (CommandJob, FunctionJob, DistributedJob)):
        if options:
            raise InvalidArgument("gl.explain: options apply to a function; change the spec's fields instead")
        e = client.explain(what)
        e._spelling = RECORD_SPELLING
        return e
    if isinstance(what, RemoteFunction):
        fn = RemoteFunction(what._fn, cast(JobOptions, {**what._options, **options})) if options else what
    elif callable(what):
        check_remote_options(dict(options), "gl.explain")
        fn = RemoteFunction(what, options)
    else:
        raise InvalidArgument(f"gl.explain: {what!r} is not a function, a job spec or a job; accepted: a "
                              "@gl.remote function, a module-level function, a CommandJob, FunctionJob or "
                              "DistributedJob, a JobHandle or a job id")
    e = client.explain(fn._spec([], {}))  # (its requirements: no call, so no arguments to check)
    e._spelling = REMOTE_SPELLING
    return e


@overload
def wait(handles: Iterable[JobHandle[Any]], timeout: float | None = None) -> list[JobRecord]: ...


@overload
def wait(handles: Iterable[JobHandle[T]], timeout: float | None = None, *,
         num_returns: int) -> tuple[list[JobHandle[T]], list[JobHandle[T]]]: ...


def wait(handles: Iterable[JobHandle[Any]], timeout: float | None = None, *,
         num_returns: int | None = None) -> list[JobRecord] | tuple[list[JobHandle[Any]], list[JobHandle[Any]]]:
    """Wait for every handle; returns their records in the same order (a job still running
    after ``timeout`` seconds: :class:`TimeoutError`).

    With ``num_returns``, as Ray's ``ray.wait``: wait until that many of the jobs have ended,
    or ``timeout`` ran out, and return ``(ended, not_ended)``, two lists of handles in the
    order given, the first of at most ``num_returns`` (fewer where time ran out: no error);
    a job given twice counts once. Many jobs are waited for together (``wait_jobs``, up to
    :data:`~gpulayer.api.MAX_BATCH` a call), not one after another: one read looks at all of
    them, and a server answers one long poll for all of them."""
    hs = _listed(handles, "gl.wait")
    timeout = wait_limit(timeout, "gl.wait")
    if num_returns is not None:
        return _wait_some(hs, num_returns, timeout)
    deadline = None if timeout is None else time.monotonic() + timeout
    records: dict[str, JobRecord] = {}
    for client, ids in _groups(hs):
        leaving.on_main_thread()  # (jobs submitted from another thread: SIGTERM now ends them)
        with lent_while_waiting(client, timeout):  # (in a task: its slot is lent meanwhile)
            _wait_for(client, ids, records, deadline, timeout)
    return [records[h.id] for h in hs]


def _wait_some(handles: list[JobHandle[T]], num_returns: Any,
               timeout: float | None) -> tuple[list[JobHandle[T]], list[JobHandle[T]]]:
    """:func:`wait` with ``num_returns``: ``(ended, not_ended)``, as ``ray.wait``."""
    given = list(dict.fromkeys(_checked(handles, "gl.wait")))
    if not given:
        return [], []
    if isinstance(num_returns, bool) or not isinstance(num_returns, int) or not 1 <= num_returns <= len(given):
        raise InvalidArgument(f"gl.wait(num_returns={num_returns!r}): accepted: a whole number from 1 to "
                              f"{len(given)}, the number of jobs given")
    deadline = None if timeout is None else time.monotonic() + timeout
    ended: set[str] = set()
    pending = given
    while True:
        remaining = MAX_LONG_POLL if deadline is None else max(0.0, min(MAX_LONG_POLL, deadline - time.monotonic()))
        ended |= _ended(pending, remaining)
        pending = [h for h in pending if h.id not in ended]
        if len(given) - len(pending) >= num_returns or (deadline is not None and time.monotonic() >= deadline):
            break
    ready = [h for h in given if h.id in ended][:num_returns]
    chosen = {h.id for h in ready}
    return ready, [h for h in given if h.id not in chosen]


def _wait_for(client: Client, pending: list[str], records: dict[str, JobRecord], deadline: float | None,
              timeout: float | None) -> None:
    """:func:`wait` for the jobs ``pending`` of one client, their records put in ``records``."""
    while pending:
        remaining = MAX_LONG_POLL if deadline is None else max(0.0, min(MAX_LONG_POLL, deadline - time.monotonic()))
        for job in client.api.wait_jobs(pending, count=len(pending), timeout=remaining):
            records[job.id] = job
        pending = [j for j in pending if j not in records]
        if pending and deadline is not None and time.monotonic() >= deadline:
            job = client.api.get_job(pending[0])
            if job.state.terminal:  # (it ended since the look: look once more)
                continue
            raise TimeoutError(f"job {job.id} is still {job.state.value} after {timeout} s"
                               + (f" ({len(pending) - 1} more not ended)" if len(pending) > 1 else ""))


def cancel(handles: Iterable[JobHandle[Any]]) -> list[JobRecord]:
    """Cancel every handle's job (``handle.cancel()`` for each, together); returns their
    records in the same order, without tasks, results or arguments (``state`` is
    ``cancelled`` for a job that had not started, and stays ``running`` until the processes
    of one that had are gone: :func:`wait` for them). Many jobs are cancelled together
    (``cancel_many``, up to :data:`~gpulayer.api.MAX_BATCH` a call): one request, one
    transaction and one placement pass each. A job that has ended already is left as it is."""
    hs = _listed(handles, "gl.cancel")
    records: dict[str, JobRecord] = {}
    for client, ids in _groups(hs, "gl.cancel"):
        for job_id, outcome in client.cancel_jobs(ids).items():
            if not isinstance(outcome, JobRecord):
                raise outcome
            records[job_id] = outcome
    return [records[h.id] for h in hs]


def as_completed(handles: Iterable[JobHandle[T]], timeout: float | None = None) -> Iterator[JobHandle[T]]:
    """Yield handles as their jobs end, first finished first (those that end between two
    looks in the order given). One look at up to :data:`~gpulayer.api.MAX_BATCH` jobs waits
    for the first of them to end (``wait_jobs``). A job given twice (two equal handles) is
    yielded once, its first handle, as ``concurrent.futures.as_completed`` yields a future."""
    pending = _listed(handles, "gl.as_completed")
    timeout = wait_limit(timeout, "gl.as_completed")
    deadline = None if timeout is None else time.monotonic() + timeout
    pending = list(dict.fromkeys(_checked(pending, "gl.as_completed")))
    while pending:
        remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
        ended = _ended(pending, MAX_LONG_POLL if remaining is None else min(MAX_LONG_POLL, remaining))
        done = [h for h in pending if h.id in ended]
        pending = [h for h in pending if h.id not in ended]
        yield from done
        if pending and not ended and deadline is not None and time.monotonic() >= deadline:
            raise TimeoutError(f"{len(pending)} job(s) still running after {timeout} s")


def wait_limit(timeout: Any, who: str) -> float | None:
    """A wait's ``timeout`` as seconds (None, or an infinite one: no limit); anything but a
    number of seconds, 0 or more, is refused naming ``who`` was called."""
    if timeout is None or timeout == math.inf:
        return None
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout >= 0:
        raise InvalidArgument(f"{who}(timeout={timeout!r}): accepted: a number of seconds, 0 or more, or None to "
                              "wait until the job ends")
    return timeout  # (as given: a message says "after 5 s", not "after 5.0 s")


def client_for(client: Any, who: str) -> Client:
    """``client``, or the default one (:func:`connect`) for None; anything else is refused
    naming ``who`` was called."""
    if client is None:
        return connect()
    if not isinstance(client, Client):
        raise InvalidArgument(f"{who}(client={client!r}): not a client; accepted: what gl.connect() returns, or None "
                              "for the default")
    return client


def _listed(handles: Iterable[JobHandle[T]], what: str) -> list[JobHandle[T]]:
    """The handles as a list; one handle (or one id) alone is refused, naming ``what``."""
    if isinstance(handles, (JobHandle, str)):
        raise InvalidArgument(f"{what}: {handles!r} is one {'handle' if isinstance(handles, JobHandle) else 'string'}; "
                              "accepted: a list of the handles that .remote(), gl.submit and gl.submit_many return")
    return list(handles)


def _groups(handles: list[JobHandle[Any]], what: str = "gl.wait") -> list[tuple[Client, list[str]]]:
    """The handles' job ids by the client they were submitted through, each id once, in
    runs of at most :data:`~gpulayer.api.MAX_BATCH`; anything but a handle is refused,
    naming ``what`` was called."""
    by_client: dict[int, tuple[Client, dict[str, None]]] = {}
    for h in _checked(handles, what):
        by_client.setdefault(id(h._client), (h._client, {}))[1][h.id] = None
    return [(client, list(ids)[i:i + MAX_BATCH]) for client, ids in by_client.values()
            for i in range(0, len(ids), MAX_BATCH)]


def _checked(handles: list[JobHandle[T]], what: str) -> list[JobHandle[T]]:
    """``handles``, where each is a handle; anything else is refused, naming ``what``."""
    for h in handles:
        if not isinstance(h, JobHandle):
            raise InvalidArgument(f"{what}: {h!r} is not a job handle; accepted: the handles that .remote(), "
                                  "gl.submit and gl.submit_many return (gl.get_job(ID) makes one from a job id)")
    return handles


def _ended(handles: list[JobHandle[Any]], wait: float) -> set[str]:
    """The ids of those of these jobs that have ended, waiting up to ``wait`` seconds for
    one to: the other runs of ids are looked at without waiting, and the wait on the first
    run is kept short (1 s) while there are others, so that each is looked at that often."""
    groups = _groups(handles, "gl.as_completed")
    ended: set[str] = set()
    for client, ids in groups[1:]:
        ended.update(client.ended(ids, timeout=0))
    client, ids = groups[0]
    first = 0.0 if ended else (min(wait, 1.0) if len(groups) > 1 else wait)
    ended.update(client.ended(ids, timeout=first))
    return ended


REMOTE_SPELLING = remote_spelling()
#: how a spec built by hand names its fields (by their paths: requirements.gpus)
RECORD_SPELLING = Spelling(call="CommandJob")
