"""The Python SDK: ``@gl.remote``, ``gl.submit``, job handles, ``gl.wait``, ``gl.as_completed``.

``@gl.remote`` turns a module-level function into one that can also run as a
:class:`~gpulayer.specs.FunctionJob`: ``f(...)`` still runs here, ``f.remote(...)``
submits it and returns a :class:`JobHandle`. Arguments and the result are JSON
(docs/adr/0002-json-only-arguments.md); the function travels as source, by name.
"""

from __future__ import annotations

import functools
import inspect
import os
import sys
import sysconfig
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, Generic, TypeVar, cast

from gpulayer import joboptions
from gpulayer.client import Client, chunk_text, connect, prefixes_nodes
from gpulayer.errors import (
    InvalidArgument,
    JobFailed,
    RemoteError,
    Unschedulable,
)
from gpulayer.joboptions import JobOptions
from gpulayer.records import Explanation, JobRecord, JobState
from gpulayer.scheduling import NO_ELIGIBLE_WORKER
from gpulayer.specs import (
    CommandJob,
    DistributedJob,
    FunctionJob,
    Spelling,
    check_json,
)
from gpulayer.worker.function_runner import IMPORTING_ENV as IMPORTING_JOB_MODULE

if TYPE_CHECKING:
    from typing_extensions import Unpack

__all__ = ["JobHandle", "RemoteFunction", "as_completed", "connect", "explain", "get_job", "remote", "submit",
           "wait"]

T = TypeVar("T")
ADR = "docs/adr/0002-json-only-arguments.md"


class JobHandle:
    """A submitted job: ``id``, ``status()``, ``result()``, ``logs()``, ``cancel()``."""

    def __init__(self, job_id: str, client: Client | None = None) -> None:
        self.id = job_id
        self._client = client or connect()

    def __repr__(self) -> str:
        return f"JobHandle({self.id!r})"

    def record(self) -> JobRecord:
        return self._client.api.get_job(self.id)

    def status(self) -> str:
        return self.record().state.value

    def done(self) -> bool:
        return self.record().state.terminal

    def wait(self, timeout: float | None = None) -> JobRecord:
        job = self._client.wait(self.id, timeout)
        if not job.state.terminal:
            raise TimeoutError(f"job {self.id} is still {job.state.value} after {timeout} s")
        return job

    def result(self, timeout: float | None = None) -> Any:
        """Wait for the job; return a function's JSON result (or a command's exit code).

        A function that raised comes back as :class:`RemoteError` with the remote type,
        message and traceback; any other unsuccessful end as :class:`JobFailed`.
        """
        job = self.wait(timeout)
        return result_of(job)

    def logs(self, node: int | None = None) -> str:
        """The output so far; lines of a job of several nodes are prefixed ``[node R]``, as
        ``gpulayer jobs logs`` shows them."""
        job = self.record()
        prefix = prefixes_nodes(job.spec, node)
        return "".join(chunk_text(c, prefix=prefix) for c in self._client.api.logs(self.id, node=node))

    def follow(self, node: int | None = None) -> Iterator[str]:
        """The output as it arrives, until the job ends (prefixed as :meth:`logs`)."""
        prefix = prefixes_nodes(self.record().spec, node)
        for chunk in self._client.follow(self.id, node=node):
            yield chunk_text(chunk, prefix=prefix)

    def cancel(self) -> str:
        return self._client.api.cancel(self.id).state.value


def result_of(job: JobRecord) -> Any:
    """A finished job's result, or the error that says why there is none."""
    if job.state is JobState.SUCCEEDED:
        return job.result if job.spec.kind == "function" else job.exit_code
    err = job.error
    if job.state is JobState.UNSCHEDULABLE:
        raise Unschedulable(err.message if err else NO_ELIGIBLE_WORKER, job_id=job.id)
    if job.state is JobState.FAILED and err is not None and err.raised:
        raise RemoteError(err.type, err.message, err.traceback or "", job_id=job.id)
    message = err.message if err and err.message else job.state.value
    raise JobFailed(f"job {job.id} {job.state.value}: {message}", job_id=job.id, state=job.state.value,
                    exit_code=job.exit_code)


def get_job(job_id: str) -> JobHandle:
    return JobHandle(job_id)


def submit(spec: CommandJob | FunctionJob | DistributedJob, *, client: Client | None = None) -> JobHandle:
    """Submit a job spec; returns its handle.

    With ``on_unschedulable="fail"`` (the default) a job no registered worker could ever
    run raises :class:`Unschedulable` with the scheduler's per-worker reasons.
    """
    client = client or connect()
    job = client.submit(spec)
    if job.state is JobState.UNSCHEDULABLE:
        # the stored error: the scheduler's lines, then the nearest miss and what to run
        raise Unschedulable(job.error.message if job.error else NO_ELIGIBLE_WORKER, job_id=job.id)
    return JobHandle(job.id, client)


def explain(what: Any, *, client: Client | None = None, **options: Unpack[JobOptions]) -> Explanation:
    """Could this run, where, and if not, which worker comes closest? Submits nothing.

    ``what`` is a ``@gl.remote`` function (as ``.remote()`` would submit it, ``options``
    overriding its own), a plain module-level function (as ``@gl.remote(**options)`` would),
    a job spec, or a submitted job (its handle or id). ``print()`` the record for the text
    ``gpulayer explain`` prints; its fields are documented in docs/explain.md.
    """
    client = client or connect()
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
        fn = RemoteFunction(what._fn, cast(JobOptions, {**what.options, **options})) if options else what
    elif callable(what):
        joboptions.check_option_names(options, _REMOTE_OPTIONS, "gl.explain")
        fn = RemoteFunction(what, options)
    else:
        raise InvalidArgument(f"gl.explain: {what!r} is not a function, a job spec or a job; accepted: a "
                              "@gl.remote function, a module-level function, a CommandJob, FunctionJob or "
                              "DistributedJob, a JobHandle or a job id")
    e = client.explain(fn.spec())
    e._spelling = REMOTE_SPELLING
    return e


def wait(handles: Iterable[JobHandle], timeout: float | None = None) -> list[JobRecord]:
    """Wait for every handle; returns their records in the same order."""
    deadline = None if timeout is None else time.monotonic() + timeout
    out = []
    for h in handles:
        remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
        out.append(h.wait(remaining))
    return out


def as_completed(handles: Iterable[JobHandle], timeout: float | None = None) -> Iterator[JobHandle]:
    """Yield handles as their jobs end, first finished first."""
    pending = list(handles)
    deadline = None if timeout is None else time.monotonic() + timeout
    delay = 0.02
    while pending:
        for h in list(pending):
            if h.done():
                pending.remove(h)
                yield h
        if not pending:
            return
        if deadline is not None and time.monotonic() > deadline:
            raise TimeoutError(f"{len(pending)} job(s) still running after {timeout} s")
        time.sleep(delay)
        delay = min(delay * 1.5, 0.5)


# --------------------------------------------------------------------------- @gl.remote


@functools.cache
def _install_roots() -> tuple[str, ...]:
    paths = sysconfig.get_paths()
    return tuple(sorted({paths[k] for k in ("purelib", "platlib", "stdlib")}))


def _installed(path: Path) -> bool:
    text = str(path)
    return any(text.startswith(r) for r in _install_roots()) or "site-packages" in path.parts


def warm() -> None:
    """Compute now what the first ``@gl.remote`` of a process computes. A fork server calls
    this before it forks: in a forked child, sysconfig's first look at its variables touched
    enough of the parent's memory to cost 1-2 ms a task."""
    _install_roots()


def function_reference(fn: Callable[..., Any]) -> tuple[str, str | None]:
    """``(module:qualname, bundle directory or None)`` for a module-level function.

    Lambdas, closures and nested functions are refused: they cannot be imported by name
    on another machine (docs/adr/0002-json-only-arguments.md).
    """
    if not inspect.isfunction(fn):
        raise InvalidArgument(
            f"@gl.remote: {fn!r} is not a plain function; decorate a function defined at the "
            f"top level of a module (see {ADR})"
        )
    qualname = fn.__qualname__
    if fn.__name__ == "<lambda>":
        raise InvalidArgument(f"@gl.remote: lambdas cannot run remotely; define a named function at module level (see {ADR})")
    if "<locals>" in qualname or fn.__closure__:
        raise InvalidArgument(
            f"@gl.remote: {qualname} is a nested function or closure; it cannot be imported by "
            f"name on a worker. Define it at the top level of a module (see {ADR})"
        )
    module = fn.__module__
    mod = sys.modules.get(module)
    file = getattr(mod, "__file__", None)
    spec = getattr(mod, "__spec__", None)
    if module == "__main__" and spec is not None and spec.name not in ("__main__", None):
        # run as `python -m pkg.mod` (or `-m pkg`, spec name `pkg.__main__`): the worker
        # imports it by that name, from the directory above the top-level package
        module = spec.name
    if module == "__main__":
        if not file:
            raise InvalidArgument(
                f"@gl.remote: {qualname} is defined in an interactive session; put it in a .py "
                f"file so a worker can import it (see {ADR})"
            )
        script = Path(file).resolve()
        return f"{script.stem}:{qualname}", str(script.parent)
    if not file:
        return f"{module}:{qualname}", None
    path = Path(file).resolve()
    if _installed(path):
        return f"{module}:{qualname}", None
    depth = len(module.split("."))
    root = path.parent
    if path.name == "__init__.py":
        root = root.parent
    for _ in range(depth - 1):
        root = root.parent
    return f"{module}:{qualname}", str(root)


class RemoteFunction(Generic[T]):
    """A function that runs here when called and on a worker with ``.remote()``."""

    def __init__(self, fn: Callable[..., T], options: JobOptions) -> None:
        self._fn = fn
        self.function, default_bundle = function_reference(fn)
        self.options: dict[str, Any] = dict(options)
        bundle = self.options.pop("bundle", default_bundle)
        self._bundle = str(bundle) if bundle is not None else None
        # check the options now: a bad one fails at decoration, not at .remote(). Not the
        # installed plugins yet: a worker imports this module too, with plugins of its own;
        # and not at all where a worker's function runner imports the module to call one of
        # its functions (they were checked when the job was submitted, and a .remote() made
        # by the task checks its own): that check was a third of a forked task's work
        if not os.environ.get(IMPORTING_JOB_MODULE):
            self._spec([], {}, check_installed=False)
        functools.update_wrapper(self, fn)

    def __call__(self, *args: Any, **kwargs: Any) -> T:
        return self._fn(*args, **kwargs)

    def _spec(self, args: list[Any], kwargs: dict[str, Any], *, check_installed: bool = True) -> FunctionJob:
        check_json(list(args), "args")
        check_json(dict(kwargs), "kwargs")
        options = cast(JobOptions, {**self.options, "bundle": self._bundle,
                                    "name": self.options.get("name") or self.function})
        return joboptions.function_job(self.function, args, kwargs, options, REMOTE_SPELLING,
                                       check_installed=check_installed)

    def remote(self, *args: Any, **kwargs: Any) -> JobHandle:
        """Submit ``fn(*args, **kwargs)`` as a FunctionJob; returns its handle at once."""
        return submit(self._spec(list(args), dict(kwargs)))

    def spec(self, *args: Any, **kwargs: Any) -> FunctionJob:
        """The FunctionJob ``.remote()`` would submit (for inspection and dry runs)."""
        return self._spec(list(args), dict(kwargs))


#: every option of ``@gl.remote``: those of :class:`~gpulayer.joboptions.JobOptions`
_REMOTE_OPTIONS = frozenset(JobOptions.__optional_keys__)
REMOTE_SPELLING = joboptions.keyword_spelling("@gl.remote")
#: how a spec built by hand names its fields (by their paths: requirements.gpus)
RECORD_SPELLING = Spelling(call="CommandJob")


def remote(fn: Callable[..., T] | None = None, **options: Unpack[JobOptions]) -> Any:
    """Decorator: ``@gl.remote`` or ``@gl.remote(accelerator="cuda", gpus=1, ...)``.

    Options (:class:`~gpulayer.joboptions.JobOptions`, the same as ``gpulayer submit``'s
    flags): ``accelerator``, ``allow_unknown_accelerator``, ``gpus``, ``min_gpu_memory_gb``,
    ``compute_capability``, ``frameworks`` ({name: specifier} or a list of 'name>=x'
    strings), ``python_version``, ``os``, ``cpus``, ``memory_gb``, ``labels``, ``profile``,
    ``target``, ``fallback_targets``, ``on_unschedulable`` ("fail" or "wait"), ``prefer``
    (the cloud target's offers to try first), ``timeout``, ``retries``, ``priority``, ``env``, ``name``, ``bundle`` (directory; default: the
    directory the function's module is imported from).
    """
    joboptions.check_option_names(options, _REMOTE_OPTIONS, "@gl.remote", renamed={"gpus_per_node": "gpus"})
    if fn is not None:
        return RemoteFunction(fn, options)

    def wrap(f: Callable[..., T]) -> RemoteFunction[T]:
        return RemoteFunction(f, options)

    return wrap
