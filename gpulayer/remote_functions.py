"""``@gl.remote`` and the functions it makes (:class:`RemoteFunction`).

Apart from :mod:`gpulayer.sdk` so that importing a job's module is cheap where it runs: a
worker's function runner (and its fork server, which forks one child per task from an
interpreter that imported this module) imports the module, whose ``@gl.remote`` then only
wraps the function. Its options were checked when the job was submitted, and the SDK (the
job specs, pydantic, the client) is imported when the task itself calls ``.remote()``. So
this module imports only the standard library and :mod:`gpulayer.errors`; a fork server that
preloads it stays small, and a fork of a small process costs a third of a fork of one that
imported the SDK (``bench/fork_server.py``).

Everywhere else ``@gl.remote`` checks its options at once: a bad one fails at decoration,
not at ``.remote()``.
"""

from __future__ import annotations

import functools
import inspect
import os
import sys
import sysconfig
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Generic, ParamSpec, TypeVar, cast, overload

from gpulayer.errors import InvalidArgument
from gpulayer.worker.function_runner import IMPORTING_ENV as IMPORTING_JOB_MODULE

if TYPE_CHECKING:
    from typing_extensions import Unpack

    from gpulayer.joboptions import JobOptions
    from gpulayer.sdk import JobHandle
    from gpulayer.specs import FunctionJob, Spelling

__all__ = ["RemoteFunction", "function_reference", "remote", "warm"]

T = TypeVar("T")
P = ParamSpec("P")
ADR = "docs/adr/0002-json-only-arguments.md"


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


def _in_job_module_import() -> bool:
    """Whether a worker's function runner is importing the module being decorated."""
    return bool(os.environ.get(IMPORTING_JOB_MODULE))


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
    if module == "__main__" and file and _under_main_guard(file, fn.__code__.co_firstlineno):
        raise InvalidArgument(
            f"@gl.remote: {qualname} is defined under `if __name__ == \"__main__\":` in {file}; a worker "
            f"imports that file by name, which does not run that block, so it could not find {qualname}. "
            f"Define it above the guard, at the top level of the module (see {ADR})"
        )
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


def _under_main_guard(file: str, line: int) -> bool:
    """Whether line ``line`` of the script ``file`` is inside a top-level
    ``if __name__ == "__main__":`` block (False where the file cannot be read as Python)."""
    return any(first <= line <= last for first, last in _main_guards(file))


@functools.cache
def _main_guards(file: str) -> tuple[tuple[int, int], ...]:
    """The line ranges of ``file``'s top-level ``if __name__ == "__main__":`` blocks."""
    import ast

    try:
        tree = ast.parse(Path(file).read_bytes(), file)
    except (OSError, SyntaxError, ValueError):
        return ()
    guards = []
    for node in tree.body:
        if isinstance(node, ast.If) and isinstance(test := node.test, ast.Compare) and len(test.ops) == 1 \
                and isinstance(test.ops[0], ast.Eq):
            sides = {ast.dump(test.left), ast.dump(test.comparators[0])}
            if sides == {ast.dump(ast.Name("__name__", ast.Load())), ast.dump(ast.Constant("__main__"))}:
                guards.append((node.lineno, node.end_lineno or node.lineno))
    return tuple(guards)


class RemoteFunction(Generic[P, T]):
    """A function that runs here when called and on a worker with ``.remote()``.

    Typed as the function it wraps (as Ray's remote functions are): ``.remote()`` takes its
    parameters and returns a ``JobHandle[T]`` whose ``result()`` is the function's ``T``."""

    def __init__(self, fn: Callable[P, T], options: JobOptions, *, call: str = "@gl.remote") -> None:
        self._fn = fn
        self.function, default_bundle = function_reference(fn)
        #: how errors name the call its options were given to (``train.options`` for one
        #: that :meth:`options` made: its options were checked at the decoration already)
        self._call = call
        self._options: dict[str, Any] = dict(options)
        bundle = self._options.pop("bundle", default_bundle)
        self._bundle = str(bundle) if bundle is not None else None
        # check the options now: a bad one fails at decoration, not at .remote(). Not the
        # installed plugins yet: a worker imports this module too, with plugins of its own;
        # and not at all where a worker's function runner imports the module to call one of
        # its functions (they were checked when the job was submitted, and a .remote() made
        # by the task checks its own): that check was a third of a forked task's work
        if not _in_job_module_import():
            self._spec([], {}, check_installed=False)
        functools.update_wrapper(self, fn)

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> T:
        return self._fn(*args, **kwargs)

    def options(self, **overrides: Unpack[JobOptions]) -> RemoteFunction[P, T]:
        """The function with these options changed, for the calls made through what this
        returns (as Ray's ``.options()``): ``train.options(gpus=2, after=prep).remote(cfg)``."""
        call = f"{self.function.partition(':')[2]}.options"
        check_remote_options(dict(overrides), f"{call}()")
        return RemoteFunction(self._fn, cast("JobOptions", {**self._options, "bundle": self._bundle, **overrides}),
                              call=call)

    def _spec(self, args: list[Any], kwargs: dict[str, Any], *, check_installed: bool = True,
              call: str | None = None) -> FunctionJob:
        """The FunctionJob for ``fn(*args, **kwargs)``; ``call`` (``train.remote()``, or ""
        where the caller names the call), where given: the arguments must fit the function's
        signature, or the refusal says so."""
        from gpulayer import joboptions
        from gpulayer.specs import check_json

        if call is not None:
            self._bind(args, kwargs, call)
        named = f"{call}: " if call else ""  # (.map() names the call itself)
        check_json(list(args), f"{named}args")
        check_json(dict(kwargs), f"{named}kwargs")
        options = cast("JobOptions", {**self._options, "bundle": self._bundle,
                                      "name": self._options.get("name") or self.function})
        return joboptions.function_job(self.function, args, kwargs, options, remote_spelling(self._call),
                                       check_installed=check_installed, arguments_checked=True)

    @functools.cached_property
    def _signature(self) -> inspect.Signature | None:
        """The function's signature, read once (28 us a read: a ``.map()`` of 1,000 calls
        read it 1,000 times); None where it has none to check against."""
        try:
            return inspect.signature(self._fn)
        except (TypeError, ValueError):  # (the worker's call says)
            return None

    def _bind(self, args: list[Any], kwargs: dict[str, Any], call: str) -> None:
        """Refuse arguments the function's signature does not take (a missing one, one too
        many, an unknown keyword), as calling it here would: submitted, the job would fail
        on the worker with that TypeError, after its queue wait and its start."""
        signature = self._signature
        if signature is None:
            return
        try:
            signature.bind(*args, **kwargs)
        except TypeError as exc:
            bare = signature.replace(parameters=[p.replace(annotation=p.empty) for p in signature.parameters.values()],
                                     return_annotation=signature.empty)  # (a string annotation reads 'int')
            raise InvalidArgument(f"{call + ': ' if call else ''}{exc}; it takes {self._fn.__name__}{bare}") from None

    def remote(self, *args: P.args, **kwargs: P.kwargs) -> JobHandle[T]:
        """Submit ``fn(*args, **kwargs)`` as a FunctionJob; returns its handle at once."""
        from gpulayer.sdk import _submit

        name = self.function.partition(':')[2]
        return _submit(self._spec(list(args), dict(kwargs), call=f"{name}.remote()"), None, f"{name}.remote()")

    def map(self, *iterables: Iterable[Any]) -> list[JobHandle[T]]:
        """Submit ``fn(x)`` for each ``x`` of one iterable (``fn(x, y)`` for each pair of two
        iterables of the same length, and so on) as FunctionJobs at once
        (:func:`gpulayer.submit_many`); returns their handles, in order."""
        from gpulayer.sdk import _submit_many

        if not iterables:
            raise InvalidArgument(f"{self.function}.map(): give at least one iterable of arguments, "
                                  "e.g. .map(range(10))")
        for i, it in enumerate(iterables):
            if isinstance(it, (str, bytes, dict)) or not isinstance(it, Iterable):
                raise InvalidArgument(f"{self.function}.map(): argument {i + 1} is {type(it).__name__}; "
                                      "accepted: a list, tuple, range or other iterable of arguments")
        try:
            calls = list(zip(*iterables, strict=True))
        except ValueError as exc:  # (zip names the argument that ran out first)
            raise InvalidArgument(f"{self.function}.map(): the iterables differ in length ({exc}); "
                                  "give one argument of each per call") from None
        specs = []
        for i, args in enumerate(calls):
            try:
                specs.append(self._spec(list(args), {}, call=""))
            except InvalidArgument as exc:  # (which call: "args[0]" alone is every call's first)
                each = "its iterable" if len(iterables) == 1 else "each iterable"
                raise InvalidArgument(f"{self.function}.map(): call {i} (item {i} of {each}): {exc}") from None
        return _submit_many(specs, None, f"{self.function.partition(':')[2]}.map()")

    def spec(self, *args: P.args, **kwargs: P.kwargs) -> FunctionJob:
        """The FunctionJob ``.remote()`` would submit (for inspection and dry runs)."""
        return self._spec(list(args), dict(kwargs), call=f"{self.function.partition(':')[2]}.spec()")


@functools.cache
def remote_spelling(call: str = "@gl.remote") -> Spelling:
    """How ``@gl.remote``'s options are named in errors and explanations (as keywords of
    ``call``: ``train.options`` for those given to ``train.options()``)."""
    from gpulayer import joboptions

    return joboptions.keyword_spelling(call)


@functools.cache
def remote_options() -> frozenset[str]:
    """Every option of ``@gl.remote``: those of :class:`~gpulayer.joboptions.JobOptions`."""
    from gpulayer.joboptions import JobOptions

    return frozenset(JobOptions.__optional_keys__)


def check_remote_options(options: dict[str, Any], call: str) -> None:
    """Refuse options ``@gl.remote`` does not take (``call``: who was given them)."""
    from gpulayer import joboptions

    joboptions.check_option_names(options, remote_options(), call, renamed={"gpus_per_node": "gpus"})


@overload
def remote(fn: Callable[P, T], /) -> RemoteFunction[P, T]: ...


@overload
def remote(fn: None = None, /, **options: Unpack[JobOptions]) -> Callable[[Callable[P, T]], RemoteFunction[P, T]]: ...


def remote(fn: Callable[P, T] | None = None, /, **options: Unpack[JobOptions]) -> Any:
    """Decorator: ``@gl.remote`` or ``@gl.remote(accelerator="cuda", gpus=1, ...)``.

    Options (:class:`~gpulayer.joboptions.JobOptions`, the same as ``gpulayer submit``'s
    flags): ``accelerator``, ``allow_unknown_accelerator``, ``gpus``, ``min_gpu_memory_gb``,
    ``compute_capability``, ``frameworks`` ({name: specifier} or a list of 'name>=x'
    strings), ``python_version``, ``os``, ``cpus``, ``memory_gb``, ``labels``, ``profile``,
    ``target``, ``fallback_targets``, ``on_unschedulable`` ("fail" or "wait"), ``prefer``
    (the cloud target's offers to try first), ``timeout``, ``retries``, ``priority``, ``env``, ``name``, ``bundle`` (directory; default: the
    directory the function's module is imported from), ``after`` (jobs, or their handles, to
    run after: see :meth:`RemoteFunction.options`).
    """
    if not _in_job_module_import():
        check_remote_options(dict(options), "@gl.remote")
    if fn is not None:
        return RemoteFunction(fn, options)

    def wrap(f: Callable[P, T]) -> RemoteFunction[P, T]:
        return RemoteFunction(f, options)

    return wrap
