"""``import gpulayer`` and ``gpulayer --help`` stay light (issue 11, "CLI start-up"): they load
no database, HTTP or ML stack. Each check runs in a fresh interpreter and reads its
``sys.modules``; bench/cli_startup.py measures the time."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

#: never loaded by ``import gpulayer`` or ``gpulayer --help``
HEAVY = ("sqlalchemy", "sqlmodel", "httpx", "uvicorn", "starlette", "torch")
#: not loaded by ``import gpulayer`` and ``gpulayer --help`` either: pydantic's model builds
#: and pluggy's entry-point scan cost most of a start-up (the commands load them when they
#: run; Typer itself loads pydantic for a command's own options, so a command's help may)
ALSO_LIGHT = ("pydantic", "pluggy", "rich")


def loaded_after(code: str, tmp_path: Path) -> set[str]:
    probe = textwrap.dedent(code) + textwrap.dedent("""
        import json, sys
        print(json.dumps(sorted({m.split(".")[0] for m in sys.modules})))
    """)
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120,
                          cwd=tmp_path, env={**_env(), "GPULAYER_HOME": str(tmp_path)})
    assert proc.returncode == 0, proc.stderr
    return set(json.loads(proc.stdout.splitlines()[-1]))


def _env() -> dict[str, str]:
    import os

    return {k: v for k, v in os.environ.items() if k not in ("GPULAYER_URL", "GPULAYER_TOKEN")}


HELP = """
    import contextlib, io, sys
    sys.argv = ["gpulayer", *ARGS]
    from gpulayer.cli import main
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        try:
            main()
        except SystemExit as exc:
            assert exc.code == 0, (exc.code, out.getvalue())
    assert "Usage: gpulayer" in out.getvalue()
"""


def test_import_gpulayer_is_light(tmp_path: Path) -> None:
    loaded = loaded_after("import gpulayer", tmp_path)
    assert not loaded & {*HEAVY, *ALSO_LIGHT}, sorted(loaded & {*HEAVY, *ALSO_LIGHT})


@pytest.mark.parametrize("args", [["--help"], ["-h"]])
def test_help_is_light(args: list[str], tmp_path: Path) -> None:
    loaded = loaded_after(HELP.replace("ARGS", repr(args)), tmp_path)
    assert not loaded & {*HEAVY, *ALSO_LIGHT}, sorted(loaded & {*HEAVY, *ALSO_LIGHT})


@pytest.mark.parametrize("args", [["jobs", "--help"], ["submit", "--help"], ["worker", "start", "--help"],
                                  ["resources", "detect", "--help"], ["server", "start", "--help"]])
def test_a_commands_help_loads_no_database_or_http_stack(args: list[str], tmp_path: Path) -> None:
    loaded = loaded_after(HELP.replace("ARGS", repr(args)), tmp_path)
    assert not loaded & {*HEAVY, "pluggy"}, sorted(loaded & {*HEAVY, "pluggy"})


def test_the_lazy_names_of_gpulayer_still_resolve(tmp_path: Path) -> None:
    loaded = loaded_after("""
        import gpulayer as gl
        assert gl.CommandJob(command=["true"]).command == ["true"]
        assert callable(gl.hookimpl) and callable(gl.remote)
        assert set(gl.__all__) <= set(dir(gl))
        from gpulayer import FunctionJob, Requirements, submit
    """, tmp_path)
    assert "pydantic" in loaded


def test_jobs_list_loads_no_http_or_server_stack(tmp_path: Path) -> None:
    loaded = loaded_after(HELP.replace("ARGS", "['jobs', 'list']").replace('"Usage: gpulayer"', '"no jobs"'),
                          tmp_path)
    assert not loaded & {"httpx", "uvicorn", "starlette", "torch"}, sorted(loaded)
