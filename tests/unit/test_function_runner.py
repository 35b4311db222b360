"""The FunctionJob runner, run as a real subprocess the way the worker runs it."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

import gpulayer.worker.function_runner as fr

RUNNER = Path(fr.__file__).resolve()
PY = sys.executable


def clean_env() -> dict[str, str]:
    e = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    return e


def call(
    bundle: Path,
    function: str,
    args: list[Any] | None = None,
    kwargs: dict[str, Any] | None = None,
    *,
    how: str = "isolated-script",
    spec: Any = None,
) -> tuple[int, dict[str, Any], subprocess.CompletedProcess[str]]:
    spec_path = bundle.parent / f"{bundle.name}-spec.json"
    result_path = bundle.parent / f"{bundle.name}-result.json"
    if result_path.exists():
        result_path.unlink()
    payload = spec if spec is not None else {
        "function": function, "args": args or [], "kwargs": kwargs or {},
    }
    spec_path.write_text(json.dumps(payload))
    if how == "isolated-script":
        # -I: no PYTHONPATH, no user site, no cwd or script dir magic beyond the script's dir
        argv = [PY, "-I", str(RUNNER), str(spec_path), str(result_path)]
        env = clean_env()
    else:  # python -m with gpulayer importable
        argv = [PY, "-m", "gpulayer.worker.function_runner", str(spec_path), str(result_path)]
        env = dict(os.environ)
    proc = subprocess.run(argv, cwd=bundle, env=env, capture_output=True, text=True, timeout=60)
    result = json.loads(result_path.read_text()) if result_path.exists() else {}
    return proc.returncode, result, proc


@pytest.fixture
def bundle(tmp_path: Path) -> Path:
    b = tmp_path / "bundle"
    b.mkdir()
    (b / "tasks.py").write_text(
        textwrap.dedent(
            """
            import math, sys

            def add(a, b=0, *, scale=1):
                print("adding", a, b)
                print("to stderr", file=sys.stderr)
                return {"sum": (a + b) * scale, "items": [a, b], "none": None, "ok": True}

            def fail(msg):
                raise ValueError(msg)

            def bad_set():
                return {"x": [1, {2, 3}]}

            def bad_bytes():
                return [b"raw"]

            def bad_nan():
                return {"loss": float("nan")}

            def bad_key():
                return {1: "one"}

            def bad_object():
                class Model:
                    pass
                return {"model": Model()}

            def cycle():
                x = []
                x.append(x)
                return x

            def exits():
                sys.exit(4)

            async def coro(x):
                return x * 2

            def argv():
                return sys.argv

            not_callable = 42

            class Tools:
                @staticmethod
                def double(x):
                    return 2 * x

                class Inner:
                    @classmethod
                    def name(cls):
                        return cls.__qualname__

            if __name__ == "__main__":
                print("MAIN BLOCK RAN")
                raise SystemExit(99)
            """
        )
    )
    pkg = b / "mypkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "errors.py").write_text("class MyError(Exception):\n    pass\n")
    (pkg / "jobs.py").write_text(
        textwrap.dedent(
            """
            from mypkg.errors import MyError

            def inner():
                raise MyError("deep failure")

            def outer():
                inner()
            """
        )
    )
    (b / "broken_import.py").write_text(
        "import no_such_dependency_gpulayer\n\ndef f():\n    pass\n"
    )
    (b / "raises_on_import.py").write_text("raise RuntimeError('config missing')\n")
    return b


@pytest.mark.parametrize("how", ["isolated-script", "module"])
def test_success_args_kwargs(bundle: Path, how: str) -> None:
    code, result, proc = call(bundle, "tasks:add", [2, 3], {"scale": 10}, how=how)
    assert code == 0, proc.stderr
    assert result == {
        "ok": True,
        "result": {"sum": 50, "items": [2, 3], "none": None, "ok": True},
    }
    assert proc.stdout == "adding 2 3\n"
    assert "to stderr" in proc.stderr
    assert "MAIN BLOCK RAN" not in proc.stdout


def test_exception_type_message_traceback(bundle: Path) -> None:
    code, result, proc = call(bundle, "tasks:fail", ["bad input"])
    assert code == 1
    assert result["ok"] is False
    err = result["error"]
    assert err["type"] == "ValueError"
    assert err["message"] == "bad input"
    assert "Traceback (most recent call last)" in err["traceback"]
    assert 'raise ValueError(msg)' in err["traceback"]
    assert "tasks.py" in err["traceback"]
    assert "function_runner" not in err["traceback"]  # the runner's frames are dropped
    assert "ValueError: bad input" in proc.stderr  # and the log shows it


def test_the_traceback_of_a_remote_function_starts_at_the_users_code(bundle: Path) -> None:
    """A @gl.remote function's traceback began with GPUlayer's own frame (remote_functions.py,
    in __call__: the decorator's wrapper) above the user's."""
    (bundle / "decorated.py").write_text(textwrap.dedent("""\
        import gpulayer as gl

        @gl.remote
        def fail(msg):
            raise ValueError(msg)
    """))
    code, result, _ = call(bundle, "decorated:fail", ["bad input"], how="module")
    assert code == 1 and result["error"]["type"] == "ValueError", result
    frames = [line for line in result["error"]["traceback"].splitlines() if line.startswith('  File "')]
    assert len(frames) == 1 and "decorated.py" in frames[0] and "in fail" in frames[0], frames


def test_qualified_exception_type(bundle: Path) -> None:
    code, result, _ = call(bundle, "mypkg.jobs:outer")
    assert code == 1
    err = result["error"]
    assert err["type"] == "mypkg.errors.MyError"
    assert err["message"] == "deep failure"
    assert "in inner" in err["traceback"] and "in outer" in err["traceback"]


@pytest.mark.parametrize(
    ("function", "fragment"),
    [
        ("tasks:bad_set", 'a set (return a list) at result["x"][1]'),
        ("tasks:bad_bytes", "bytes (decode it to str, or encode it, e.g. base64) at result[0]"),
        ("tasks:bad_nan", 'a float nan (NaN and infinities are not allowed) at result["loss"]'),
        ("tasks:bad_key", "an int key 1 at result (JSON objects have string keys)"),
        ("tasks:bad_object", 'a tasks.bad_object.<locals>.Model object at result["model"]'),
        ("tasks:cycle", "a circular reference at result[0]"),
    ],
)
def test_non_json_result_refused(bundle: Path, function: str, fragment: str) -> None:
    code, result, _ = call(bundle, function)
    assert code == 1
    err = result["error"]
    assert err["type"] == "TypeError"
    assert err["message"].startswith(f"result of {function} is not JSON: ")
    assert fragment in err["message"]
    assert err["traceback"] == ""


def test_module_not_found(bundle: Path) -> None:
    code, result, _ = call(bundle, "nosuchmodule:fn")
    assert code == 1
    err = result["error"]
    assert err["type"] == "ModuleNotFoundError"
    assert "cannot import nosuchmodule:fn: no module named 'nosuchmodule'" in err["message"]
    assert "sys.path" in err["message"]
    # the bundle dir (cwd) is first on sys.path, even under python -I
    shown = ast.literal_eval(err["message"].split("sys.path ", 1)[1].rstrip(")"))
    assert os.path.samefile(shown[0], bundle)
    # the runner's own directory is not on the path (its modules cannot shadow the user's)
    assert str(RUNNER.parent) not in shown


def test_dependency_missing_inside_module(bundle: Path) -> None:
    code, result, _ = call(bundle, "broken_import:f")
    assert code == 1
    err = result["error"]
    assert err["type"] == "ModuleNotFoundError"
    assert "importing 'broken_import' failed" in err["message"]
    assert "no_such_dependency_gpulayer" in err["message"]
    assert "broken_import.py" in err["traceback"]


def test_module_raises_on_import(bundle: Path) -> None:
    code, result, _ = call(bundle, "raises_on_import:f")
    assert code == 1
    err = result["error"]
    assert err["type"] == "RuntimeError"
    assert "config missing" in err["message"]
    assert "raises_on_import" in err["message"]


def test_attribute_missing(bundle: Path) -> None:
    code, result, _ = call(bundle, "tasks:nope")
    assert code == 1
    err = result["error"]
    assert err["type"] == "AttributeError"
    assert "cannot find tasks:nope: module 'tasks' has no attribute 'nope'" in err["message"]
    assert "tasks.py" in err["message"] and "sys.path" in err["message"]

    code, result, _ = call(bundle, "tasks:Tools.missing")
    assert "tasks:Tools has no attribute 'missing'" in result["error"]["message"]


def test_not_callable(bundle: Path) -> None:
    code, result, _ = call(bundle, "tasks:not_callable")
    assert code == 1
    assert result["error"]["type"] == "TypeError"
    assert "tasks:not_callable is an int, which is not callable" in result["error"]["message"]


def test_nested_attribute_staticmethod_and_classmethod(bundle: Path) -> None:
    code, result, _ = call(bundle, "tasks:Tools.double", [21])
    assert (code, result) == (0, {"ok": True, "result": 42})
    code, result, _ = call(bundle, "tasks:Tools.Inner.name")
    assert (code, result) == (0, {"ok": True, "result": "Tools.Inner"})


def test_async_function_is_awaited(bundle: Path) -> None:
    code, result, _ = call(bundle, "tasks:coro", [4])
    assert (code, result) == (0, {"ok": True, "result": 8})


def test_sys_exit_is_an_error(bundle: Path) -> None:
    code, result, _ = call(bundle, "tasks:exits")
    assert code == 1
    assert result["error"]["type"] == "SystemExit"
    assert result["error"]["message"] == "the function called sys.exit(4)"


def test_sys_argv_is_not_the_runners(bundle: Path) -> None:
    _, result, _ = call(bundle, "tasks:argv")
    assert result == {"ok": True, "result": ["tasks:argv"]}


@pytest.mark.parametrize(
    ("spec", "fragment"),
    [
        ({"function": "no_colon"}, "expected 'module:function'"),
        ({"function": "tasks:add", "args": {"a": 1}}, "'args' must be a list"),
        ({"function": "tasks:add", "kwargs": [1]}, "'kwargs' must be an object"),
        ([1, 2], "is not a JSON object"),
    ],
)
def test_bad_spec(bundle: Path, spec: Any, fragment: str) -> None:
    code, result, _ = call(bundle, "", spec=spec)
    assert code == 1
    assert fragment in result["error"]["message"]


@pytest.mark.parametrize(
    ("spec", "fragment"),
    [
        ({"function": "no_colon"}, "expected 'module:function'"),
        ({"function": "tasks:add", "args": {"a": 1}}, "'args' must be a list"),
    ],
)
def test_a_spec_given_inline_is_checked_the_same(bundle: Path, spec: Any, fragment: str) -> None:
    """A fork server's child gets the spec itself, not a file (fr.report(dict, result))."""
    code = textwrap.dedent(f"""
        import json, os, sys
        sys.path.insert(0, {str(bundle)!r})
        os.chdir({str(bundle)!r})
        from gpulayer.worker import function_runner as fr
        rc = fr.report(json.loads(sys.argv[1]), sys.argv[2])
        print(rc)
    """)
    result = bundle.parent / "inline-result.json"
    good = subprocess.run([PY, "-c", code, json.dumps({"function": "tasks:add", "args": [2, 3]}), str(result)],
                          capture_output=True, text=True, timeout=60)
    assert good.stdout.strip().splitlines()[-1] == "0", good.stderr
    assert json.loads(result.read_text()) == {"ok": True, "result": {"sum": 5, "items": [2, 3], "none": None, "ok": True}}
    bad = subprocess.run([PY, "-c", code, json.dumps(spec), str(result)], capture_output=True, text=True, timeout=60)
    assert bad.stdout.strip().splitlines()[-1] == "1"
    assert fragment in json.loads(result.read_text())["error"]["message"]


def test_usage_error(tmp_path: Path) -> None:
    proc = subprocess.run([PY, str(RUNNER)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert "usage:" in proc.stderr


def test_result_written_atomically_no_tmp_left(bundle: Path) -> None:
    call(bundle, "tasks:add", [1])
    leftovers = [p.name for p in bundle.parent.iterdir() if ".tmp-" in p.name]
    assert leftovers == []


def test_runner_imports_only_the_stdlib() -> None:
    tree = ast.parse(RUNNER.read_text())
    imported: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            imported.add(node.module.split(".")[0])
    stdlib = set(sys.stdlib_module_names) | {"__future__"}
    assert imported <= stdlib, imported - stdlib


def test_find_non_json_in_process() -> None:
    assert fr.find_non_json({"a": [1, 2.5, None, True, "s", (1, 2)]}) is None
    assert fr.find_non_json(float("inf")) is not None
    deep: Any = []
    cur = deep
    for _ in range(100_000):  # no RecursionError
        nxt: list[Any] = []
        cur.append(nxt)
        cur = nxt
    assert fr.find_non_json(deep) is None
    shared = [1]
    # the same list twice is not a cycle
    assert fr.find_non_json({"a": shared, "b": shared, "c": [shared, shared]}) is None
    assert fr.find_non_json([1, {"k": [{2}]}]) == 'a set (return a list) at result[1]["k"][0]'


def test_a_result_int_too_long_to_write_is_refused_naming_where() -> None:
    """json.dumps refuses an int of more digits than Python converts to text: the error said
    only json's message, without the function or where the int was."""
    big = 10**fr.MAX_INT_DIGITS
    assert fr.find_non_json([big - 1, -(big - 1)]) is None
    with pytest.raises(fr._RunnerError) as exc:
        fr._result_text("m:f", {"a": [1, -big]})
    assert exc.value.message.startswith(
        f'result of m:f is not JSON: an int of more than {fr.MAX_INT_DIGITS} digits at result["a"][1] '
        "(return it as a str); accepted: ")


def test_a_result_is_checked_by_json_dumps_and_a_walk_over_its_keys_in_process() -> None:
    """What json.dumps takes and changes (a key that is not a str) is refused as the slow
    walk words it, wherever it is; what both take is written as JSON after RESULT_PREFIX."""

    class Name(str):
        pass

    ok = {"a": [(1, 2), {Name("k"): None}], "b": 2.5, "c": True}
    text = fr._result_text("m:f", ok)
    assert text.startswith(fr.RESULT_PREFIX) and text.endswith("}")
    assert json.loads(text) == {"ok": True, "result": {"a": [[1, 2], {"k": None}], "b": 2.5, "c": True}}
    assert fr._result_text("m:f", 7) == fr.RESULT_PREFIX + "7}"
    for bad, fragment in (([{"a": [{None: 1}]}], 'a NoneType key None at result[0]["a"][0]'),
                          ({"x": {True: 1}}, 'a bool key True at result["x"]'),
                          ({"x": ({2.5: 1},)}, 'a float key 2.5 at result["x"][0]')):
        with pytest.raises(fr._RunnerError) as exc:
            fr._result_text("m:f", bad)
        assert exc.value.message.startswith("result of m:f is not JSON: ") and fragment in exc.value.message
    deep: Any = []
    cur = deep
    for _ in range(100_000):  # json.dumps cannot, the walk can: said as json.dumps says it
        nxt: list[Any] = []
        cur.append(nxt)
        cur = nxt
    with pytest.raises(fr._RunnerError, match=r"^result is not JSON: maximum recursion depth"):
        fr._result_text("m:f", deep)


def nested(levels: int) -> Any:
    value: Any = 1
    for i in range(levels):
        value = [value] if i % 2 else {"k": value}
    return value


def test_a_result_nested_deeper_than_a_reader_could_parse_is_refused() -> None:
    """json.dumps writes what nests as deep as the function's recursion limit allows; every
    reader (the caller, a server) parses with the default limit: past MAX_NESTING the result
    is refused, not stored unreadable."""
    assert json.loads(fr._result_text("m:f", nested(fr.MAX_NESTING)))["result"] == nested(fr.MAX_NESTING)
    with pytest.raises(fr._RunnerError) as exc:
        fr._result_text("m:f", nested(fr.MAX_NESTING + 1))
    assert exc.value.type_name == "ValueError"
    assert exc.value.message == (f"result of m:f nests lists and dicts more than {fr.MAX_NESTING} levels deep; "
                                 f"accepted: at most {fr.MAX_NESTING}")


def test_a_result_with_a_lone_surrogate_is_refused_naming_where_and_pairs_pass() -> None:
    """A result holding a lone surrogate was written (json.dumps escapes it) and stored, and
    then no reader took it: a server's client failed on every read of the job. Refused now,
    as an argument with one is at submit; a character past U+FFFF, or a backslash's text
    that looks like an escape, is not one."""
    for result, said in (
            ({"s": "a\udcffb"}, "at result[\"s\"]: 'a\\udcffb' is not valid UTF-8 (a lone surrogate '\\udcff' at index 1)"),
            ([1, {"ok": "😀", "k\ud83d": 1}],
             "at result[1] (a key): 'k\\ud83d' is not valid UTF-8 (a lone surrogate '\\ud83d' at index 1)"),
            (["\\\udcff"], "at result[0]: '\\\\\\udcff' is not valid UTF-8 (a lone surrogate '\\udcff' at index 1)")):
        with pytest.raises(fr._RunnerError) as caught:
            fr._result_text("m:f", result)
        assert caught.value.type_name == "ValueError"
        assert caught.value.message == f"result of m:f {said}; accepted: valid Unicode text"
    for fine in (["😀𝄞", "\\ud800", "\\\\ud83d"], "\ud83d\ude00"):
        assert json.loads(fr._result_text("m:f", fine)[len(fr.RESULT_PREFIX):-1]) == json.loads(json.dumps(fine))
