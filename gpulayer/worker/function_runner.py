"""Call a FunctionJob's function inside the job's process and write its result as JSON.

Usage (the worker runs it in the job's Python, with the bundle directory as cwd)::

    python /path/to/function_runner.py SPEC_JSON_PATH RESULT_JSON_PATH
    python -m gpulayer.worker.function_runner SPEC_JSON_PATH RESULT_JSON_PATH

SPEC_JSON_PATH holds ``{"function": "pkg.mod:fn", "args": [...], "kwargs": {...}}``; the
part after ``:`` may be a dotted path (``mod:Class.method``). The module is imported by name
with the current directory first on ``sys.path`` (also under ``python -I``), so a script's
``if __name__ == "__main__":`` block does not run. RESULT_JSON_PATH receives, atomically::

    {"ok": true, "result": <the return value>}                                    exit 0
    {"ok": false, "error": {"type": ..., "message": ..., "traceback": ...}}       exit 1

``type`` is the exception's qualified name (``ValueError``, ``mypkg.errors.MyError``). A
result that is not JSON (a set, bytes, NaN, an object, a non-string key) is refused with the
path of the first offending value, and so is a str with a lone surrogate (``ValueError``).
The function's own prints go to stdout/stderr as usual.

This file must import only the standard library: the job's Python need not have GPUlayer's
dependencies (or GPUlayer) installed.
"""

from __future__ import annotations

import json
import math
import os
import re
import sys
import traceback
from typing import Any

EXIT_OK = 0
EXIT_ERROR = 1
EXIT_USAGE = 2

#: set while the job's module is being imported: a gl.submit() or .remote() made by that
#: module's top-level code refuses to run (gpulayer.client.Client.submit), because on a
#: worker that code would submit the job again, without end; and its @gl.remote functions
#: do not check their options again (gpulayer.remote_functions.RemoteFunction: checked at submit)
IMPORTING_ENV = "GPULAYER_IMPORTING_JOB_MODULE"

_ACCEPTED = "accepted: None, bool, int, finite float, str, list, dict with str keys"
#: how the result file of a function that returned begins: the result's JSON follows, then
#: "}" ends the file (a reader may take the result's text as it is, between the two)
RESULT_PREFIX = '{"ok": true, "result": '
#: the deepest a result may nest (lists and dicts in one another): every reader parses it
#: with Python's json, which stops at the interpreter's recursion limit (1,000 by default,
#: less the reader's own frames), and a result that a function raised the limit to write
#: would be stored and then unreadable
MAX_NESTING = 800
#: the most digits an int in a result may have: Python's default limit on converting an int
#: to text and back (``sys.int_info.default_max_str_digits``), under which json writes and
#: reads it (gpulayer.specs.MAX_INT_DIGITS, for arguments)
MAX_INT_DIGITS = 4300


class _RunnerError(Exception):
    """An error that the runner reports itself (bad spec, import failure, non-JSON result)."""

    def __init__(self, type_name: str, message: str, tb: str = "") -> None:
        super().__init__(message)
        self.type_name = type_name
        self.message = message
        self.tb = tb


def _type_name(exc: BaseException) -> str:
    cls = type(exc)
    module = getattr(cls, "__module__", None)
    if module in (None, "builtins", "__main__"):
        return cls.__qualname__
    return f"{module}.{cls.__qualname__}"


def _format_tb(exc: BaseException, skip: int = 0) -> str:
    tb = exc.__traceback__
    for _ in range(skip):  # drop the runner's own frames
        if tb is not None and tb.tb_next is not None:
            tb = tb.tb_next
    return "".join(traceback.format_exception(type(exc), exc, tb))


def _setup_path(cwd: str) -> list[str]:
    """cwd first on sys.path; this file's own directory off it when run as a script."""
    here = os.path.dirname(os.path.abspath(__file__))
    if __name__ == "__main__" and sys.path and sys.path[0]:
        if os.path.abspath(sys.path[0]) == here and here != cwd:
            del sys.path[0]  # run as a script: keep process.py & co. from shadowing user modules
    sys.path[:] = [p for p in sys.path if p not in ("", cwd)]
    sys.path.insert(0, cwd)
    return sys.path


def _load_spec(source: str | dict[str, Any]) -> tuple[str, list[Any], dict[str, Any]]:
    """The function, args and kwargs of a spec file, or of the spec itself (a dict: a fork
    server's child gets it in its request)."""
    if isinstance(source, dict):
        spec: Any = source
        path = "(given inline)"
    else:
        path = source
        try:
            with open(path, encoding="utf-8") as f:
                spec = json.load(f)
        except (OSError, ValueError) as exc:
            raise _RunnerError(_type_name(exc), f"cannot read the function spec {path}: {exc}") from exc
    if not isinstance(spec, dict):
        raise _RunnerError("TypeError", f"function spec {path} is not a JSON object")
    ref = spec.get("function")
    args = spec.get("args", [])
    kwargs = spec.get("kwargs", {})
    if not isinstance(ref, str) or ref.count(":") != 1 or not all(ref.split(":")):
        raise _RunnerError(
            "ValueError",
            f"function spec: 'function' is {ref!r}, expected 'module:function' "
            "(e.g. 'train:main' or 'pkg.mod:Class.method')",
        )
    if not isinstance(args, list):
        raise _RunnerError(
            "TypeError", f"function spec: 'args' must be a list, not {type(args).__name__}"
        )
    if not isinstance(kwargs, dict):
        raise _RunnerError(
            "TypeError", f"function spec: 'kwargs' must be an object, not {type(kwargs).__name__}"
        )
    return ref, args, kwargs


def _resolve(ref: str) -> Any:
    import importlib

    module_name, qualname = ref.split(":")
    os.environ[IMPORTING_ENV] = ref
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        missing = exc.name or ""
        if missing == module_name or module_name.startswith(missing + "."):
            raise _RunnerError(
                "ModuleNotFoundError",
                f"cannot import {ref}: no module named {missing!r} "
                f"(cwd {os.getcwd()}; sys.path {sys.path})",
            ) from exc
        raise _RunnerError(
            _type_name(exc),
            f"cannot import {ref}: importing {module_name!r} failed: {exc}",
            _format_tb(exc, skip=1),
        ) from exc
    except BaseException as exc:  # the module raised while being imported
        raise _RunnerError(
            _type_name(exc),
            f"cannot import {ref}: importing {module_name!r} raised {_type_name(exc)}: {exc}",
            _format_tb(exc, skip=1),
        ) from exc
    finally:
        os.environ.pop(IMPORTING_ENV, None)

    obj: Any = module
    parts = qualname.split(".")
    for i, part in enumerate(parts):
        try:
            obj = getattr(obj, part)
        except AttributeError as exc:
            owner = f"module {module_name!r}" if i == 0 else f"{module_name}:{'.'.join(parts[:i])}"
            where = getattr(module, "__file__", None) or "(no file)"
            raise _RunnerError(
                "AttributeError",
                f"cannot find {ref}: {owner} has no attribute {part!r} "
                f"(module {module_name!r} loaded from {where}; sys.path {sys.path})",
            ) from exc
    if not callable(obj):
        raise _RunnerError("TypeError", f"{ref} is {_a(type(obj).__name__)}, which is not callable")
    return obj


def _describe(value: Any) -> str:
    if isinstance(value, float):
        return f"a float {value!r} (NaN and infinities are not allowed)"
    if isinstance(value, (bytes, bytearray)):
        return f"{type(value).__name__} (decode it to str, or encode it, e.g. base64)"
    if isinstance(value, (set, frozenset)):
        return f"a {type(value).__name__} (return a list)"
    cls = type(value)
    name = cls.__qualname__ if cls.__module__ in ("builtins", "__main__") else (
        f"{cls.__module__}.{cls.__qualname__}"
    )
    return f"{_a(name)} object"


def _a(name: str) -> str:
    return f"{'an' if name[:1].lower() in 'aeiou' else 'a'} {name}"


def find_non_json(value: Any, path: str = "result") -> str | None:
    """Describe the first value under ``value`` that is not JSON, with its path, or None.

    Iterative (deep nesting cannot overflow the stack) and linear; cycles are reported.
    """
    on_path: set[int] = set()  # ids of the containers that enclose the current value
    leave = object()  # marker: done with a container
    stack: list[tuple[Any, Any]] = [(value, path)]
    while stack:
        item, where = stack.pop()
        if where is leave:
            on_path.discard(item)
            continue
        if item is None or isinstance(item, (bool, str)):
            continue
        if isinstance(item, int):
            if item.bit_length() > 14_000 and abs(item) >= 10**MAX_INT_DIGITS:
                return f"an int of more than {MAX_INT_DIGITS} digits at {where} (return it as a str)"
            continue
        if isinstance(item, float):
            if not math.isfinite(item):
                return f"{_describe(item)} at {where}"
            continue
        if isinstance(item, (list, tuple, dict)):
            if id(item) in on_path:
                return f"a circular reference at {where}"
            children: list[tuple[Any, Any]] = []
            if isinstance(item, dict):
                for key, sub in item.items():
                    if not isinstance(key, str):
                        return (
                            f"{_a(type(key).__name__)} key {key!r} at {where} "
                            "(JSON objects have string keys)"
                        )
                    children.append((sub, f"{where}[{json.dumps(key)}]"))
            else:
                children = [(sub, f"{where}[{i}]") for i, sub in enumerate(item)]
            on_path.add(id(item))
            stack.append((id(item), leave))
            stack.extend(reversed(children))  # depth first, in order
            continue
        return f"{_describe(item)} at {where}"
    return None


def _error_payload(type_name: str, message: str, tb: str) -> dict[str, Any]:
    return {"ok": False, "error": {"type": type_name, "message": message, "traceback": tb}}


def _write(path: str, text: str) -> None:
    """Write the result file whole or not at all (a task killed while writing leaves no half
    file: the rename is atomic). Not synced to disk: the worker on this machine reads it as
    soon as the task exits, from the page cache, and a machine that crashes first takes the
    worker with it (the task is lost and retried). A sync cost 0.3-8 ms per task here."""
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(tmp, path)


def run(spec: str | dict[str, Any], result_path: str) -> dict[str, Any]:
    """Call the function the spec names (a spec file's path, or the spec itself), write the
    result file and return what it holds."""
    cwd = os.getcwd()
    try:
        ref, args, kwargs = _load_spec(spec)
        sys.argv[:] = [ref]
        _setup_path(cwd)
        fn = _resolve(ref)
        if type(fn).__module__ == "gpulayer.remote_functions":
            # @gl.remote's wrapper: called through, its __call__ was the remote traceback's
            # first frame, a file of GPUlayer's above the user's own
            fn = getattr(fn, "_fn", fn)
        try:
            result = fn(*args, **kwargs)
            if _is_coroutine(result):
                import asyncio

                result = asyncio.run(result)
        except BaseException as exc:
            payload = _error_payload(_type_name(exc), _message(exc), _format_tb(exc, skip=1))
        else:
            text = _result_text(ref, result)
            _write(result_path, text)
            return {"ok": True, "result": result}
    except _RunnerError as exc:
        payload = _error_payload(exc.type_name, exc.message, exc.tb)
    _write(result_path, json.dumps(payload))
    return payload


def _result_text(ref: str, result: Any) -> str:
    """The result file's text for ``result``, or :class:`_RunnerError` naming the first value
    in it that is not JSON, with its path.

    ``json.dumps`` (C) refuses most of what is not JSON (NaN, a set, an object, a cycle); what
    it takes and changes (a key that is not a str: it writes the key 1 as "1") is looked for
    by one walk over the containers, which also refuses nesting deeper than
    :data:`MAX_NESTING` (what a reader could not parse). Only a result refused is walked again, slowly, by
    :func:`find_non_json` for the path of what it holds that is not JSON (that walk, for every
    result, cost 2.8x the ``json.dumps`` of a 7 MB list of small dicts)."""
    shape: str | None = None
    try:
        body = json.dumps(result, allow_nan=False)
        shape = _shape_problem(result)
        refused: BaseException | None = None if shape is None else ValueError(shape)
    except (TypeError, ValueError, RecursionError) as exc:
        refused = exc
    if shape == _TOO_DEEP:
        raise _RunnerError("ValueError", f"result of {ref} nests lists and dicts more than {MAX_NESTING} levels "
                                         f"deep; accepted: at most {MAX_NESTING}")
    if refused is None and "\\ud" in body and _LONE_ESCAPE.search(body):
        found = _lone_surrogate(result)
        if found is not None:
            where, text, index = found
            shown = repr(text) if len(text) <= 100 else f"a str of {len(text)} characters"
            raise _RunnerError("ValueError", f"result of {ref} at {where}: {shown} is not valid UTF-8 (a lone "
                                             f"surrogate {text[index]!r} at index {index}); accepted: valid Unicode "
                                             "text")
    if refused is not None:
        problem = find_non_json(result)
        if problem is not None:
            raise _RunnerError("TypeError", f"result of {ref} is not JSON: {problem}; {_ACCEPTED}")
        # (what only json.dumps refuses: nesting deeper than its recursion allows)
        raise _RunnerError("TypeError", f"result is not JSON: {refused}; {_ACCEPTED}")
    return RESULT_PREFIX + body + "}"


#: a lone surrogate as json.dumps escapes it (a pair, a character past U+FFFF, is
#: ``\\ud83d\\ude00``); a match may be an escaped backslash's text, which
#: :func:`_lone_surrogate` tells apart
_LONE_ESCAPE = re.compile(r"\\ud[89ab][0-9a-f]{2}(?!\\ud[c-f])|(?<!\\ud[89ab][0-9a-f]{2})\\ud[c-f][0-9a-f]{2}")
_SURROGATE = re.compile("[\ud800-\udfff]")


def _lone_surrogate(value: Any) -> tuple[str, str, int] | None:
    """The first str (a value or a key) in ``value``, a result json.dumps took, that holds a
    lone surrogate: ``(its path, the str, the surrogate's index)``, or None. No reader takes
    one (pydantic refuses the JSON, a database's text the character): a result that held one
    was stored, and then every read of its job through a server failed."""
    stack: list[tuple[Any, str]] = [(value, "result")]
    while stack:
        item, where = stack.pop()
        if isinstance(item, str):
            m = _SURROGATE.search(item)
            if m is not None:
                return where, item, m.start()
        elif isinstance(item, dict):
            subs = []
            for key, sub in item.items():
                m = _SURROGATE.search(key)
                if m is not None:
                    return f"{where} (a key)", key, m.start()
                subs.append((sub, f"{where}[{json.dumps(key)}]"))
            stack.extend(reversed(subs))
        elif isinstance(item, (list, tuple)):
            stack.extend(reversed([(sub, f"{where}[{i}]") for i, sub in enumerate(item)]))
    return None


#: what _shape_problem finds
_NOT_STR_KEY = "a key that is not a str"
_TOO_DEEP = "nested too deep"


def _shape_problem(value: Any) -> str | None:
    """What ``json.dumps`` took in ``value`` (it has no cycle) and a reader would not: a dict
    key that is not a str (:data:`_NOT_STR_KEY`), nesting deeper than :data:`MAX_NESTING`
    (:data:`_TOO_DEEP`); None when neither."""
    containers = (dict, list, tuple)
    stack = [(value, 1)] if isinstance(value, containers) else []
    while stack:
        item, depth = stack.pop()
        if depth > MAX_NESTING:
            return _TOO_DEEP
        subs: Any = item
        if isinstance(item, dict):
            for key in item:
                if not isinstance(key, str):
                    return _NOT_STR_KEY
            subs = item.values()
        deeper = depth + 1
        for sub in subs:
            if isinstance(sub, containers):
                stack.append((sub, deeper))
    return None


def _is_coroutine(value: Any) -> bool:
    import inspect

    return inspect.iscoroutine(value)


def _message(exc: BaseException) -> str:
    if isinstance(exc, SystemExit):
        return f"the function called sys.exit({exc.code!r})"
    return str(exc)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 2:
        print(
            "usage: python function_runner.py SPEC_JSON_PATH RESULT_JSON_PATH",
            file=sys.stderr,
        )
        return EXIT_USAGE
    spec_path, result_path = (os.path.abspath(p) for p in argv)
    return report(spec_path, result_path)


def report(spec: str | dict[str, Any], result_path: str) -> int:
    """:func:`run`, the error also on stderr (the job's log shows it), the streams flushed;
    the process's exit code. What ``main`` does once it read its arguments, and what a fork
    server's child runs (with the spec from its request: no file to write and read)."""
    try:
        payload = run(spec, result_path)
        if not payload["ok"]:  # the job's log shows the error too
            error = payload["error"]
            print(
                error["traceback"].rstrip("\n") if error["traceback"]
                else f"{error['type']}: {error['message']}",
                file=sys.stderr,
            )
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:
                pass
    return EXIT_OK if payload["ok"] else EXIT_ERROR


if __name__ == "__main__":
    sys.exit(main())
