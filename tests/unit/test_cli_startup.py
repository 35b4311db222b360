"""``import gpulayer`` and ``gpulayer --help`` stay light (issue 11, "CLI start-up"): they load
no database, HTTP or ML stack. Each check runs in a fresh interpreter and reads its
``sys.modules``; bench/cli_startup.py measures the time."""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from gpulayer.cli import commands
from tests.support import seed_probe_cache

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


@pytest.mark.parametrize("args", [["jobs", "--help"], ["jobs", "list", "--help"], ["submit", "--help"],
                                  ["worker", "start", "--help"], ["resources", "detect", "--help"],
                                  ["server", "start", "--help"]])
def test_a_commands_help_loads_no_database_or_http_stack(args: list[str], tmp_path: Path) -> None:
    loaded = loaded_after(HELP.replace("ARGS", repr(args)), tmp_path)
    assert not loaded & {*HEAVY, "pluggy"}, sorted(loaded & {*HEAVY, "pluggy"})


def cli_modules_after(code: str, tmp_path: Path) -> set[str]:
    probe = textwrap.dedent(code) + textwrap.dedent("""
        import json, sys
        print(json.dumps(sorted(m for m in sys.modules if m.startswith("gpulayer.cli."))))
    """)
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120,
                          cwd=tmp_path, env={**_env(), "GPULAYER_HOME": str(tmp_path)})
    assert proc.returncode == 0, proc.stderr
    return set(json.loads(proc.stdout.splitlines()[-1]))


def test_the_roots_help_imports_no_command_module(tmp_path: Path) -> None:
    loaded = cli_modules_after(HELP.replace("ARGS", "['--help']"), tmp_path)
    # (gpulayer.cli.warm: whether a local worker's CLI server runs the command; standard library only)
    assert loaded <= {"gpulayer.cli.commands", "gpulayer.cli.conventions", "gpulayer.cli.root",
                      "gpulayer.cli.light", "gpulayer.cli.warm"}, sorted(loaded)


@pytest.mark.parametrize(("args", "module"), [(["jobs", "--help"], "jobs"), (["submit", "--help"], "jobs"),
                                              (["worker", "--help"], "worker"), (["token", "--help"], "token"),
                                              (["profiles", "--help"], "resources")])
def test_a_command_imports_only_its_own_module(args: list[str], module: str, tmp_path: Path) -> None:
    loaded = cli_modules_after(HELP.replace("ARGS", repr(args)), tmp_path)
    others = {f"gpulayer.cli.{m}" for m, _ in commands.COMMANDS.values()} - {f"gpulayer.cli.{module}"}
    assert f"gpulayer.cli.{module}" in loaded
    assert not loaded & others, sorted(loaded & others)


def test_every_listed_command_is_registered_by_its_module() -> None:
    """The table of gpulayer.cli.commands and the modules agree: each module registers
    exactly the names the table gives it, and each takes its help from the table."""
    import typer

    from gpulayer.cli import app

    root = typer.main.get_command(app)
    for name, (_, one_line) in commands.COMMANDS.items():
        cmd = root.commands[name]  # type: ignore[attr-defined]
        assert (cmd.help or "").startswith(one_line), (name, cmd.help)
    for module in {m for m, _ in commands.COMMANDS.values()}:
        holder = typer.Typer()
        importlib.import_module(f"gpulayer.cli.{module}").register(holder)
        names = {c.name for c in holder.registered_commands} | {g.name for g in holder.registered_groups}
        assert names == {n for n, (m, _) in commands.COMMANDS.items() if m == module}, module


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


def test_a_server_start_loads_no_http_client_or_page_templates(tmp_path: Path) -> None:
    """``gpulayer server start`` up to serving: the HTTP client (httpx) and the dashboard's
    templates (Jinja) wait for a page or a request that needs them (some 130 ms a start)."""
    loaded = loaded_after("""
        import sys, uvicorn
        class Serving(BaseException):
            pass
        def run(self, *args, **kwargs):
            raise Serving
        uvicorn.Server.run = run
        sys.argv = ["gpulayer", "server", "start", "--port", "0"]
        from gpulayer.cli import main
        try:
            main()
        except Serving:
            pass
    """, tmp_path)
    assert {"uvicorn", "starlette", "sqlalchemy"} <= loaded  # (it got as far as serving)
    assert not loaded & {"httpx", "jinja2", "torch"}, sorted(loaded & {"httpx", "jinja2", "torch"})


def test_an_embedded_jobs_list_starts_no_worker_loads_no_plugin_and_detects_nothing(tmp_path: Path) -> None:
    probe = HELP.replace("ARGS", "['jobs', 'list']").replace('"Usage: gpulayer"', '"no jobs"') + """
    import json, os, threading
    plugins = sys.modules.get("gpulayer.plugins")
    cache = os.path.join(os.environ["GPULAYER_HOME"], "cache")
    print(json.dumps({"threads": [t.name for t in threading.enumerate()],
                      "plugins loaded": plugins is not None and plugins._manager is not None,
                      "cache": sorted(f for _, _, fs in os.walk(cache) for f in fs)}))
    """
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(probe)], capture_output=True, text=True,
                          timeout=120, cwd=tmp_path, env={**_env(), "GPULAYER_HOME": str(tmp_path)})
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout.splitlines()[-1]) == {"threads": ["MainThread"], "plugins loaded": False,
                                                        "cache": []}


def test_a_command_closes_the_embedded_database_at_exit(tmp_path: Path, probed_frameworks: Path) -> None:
    """The CLI's last exit handler closes its clients before it freezes the garbage
    collector (gpulayer.cli._at_last): SQLite checkpoints and removes its WAL, as it did
    when the interpreter freed the engine."""
    seed_probe_cache(tmp_path, probed_frameworks)  # (the submit's worker need not probe again)
    env = {**_env(), "GPULAYER_HOME": str(tmp_path)}
    for args in (["jobs", "list"], ["submit", "--", sys.executable, "-c", "pass"]):
        proc = subprocess.run([sys.executable, "-m", "gpulayer.cli", *args], capture_output=True, text=True,
                              timeout=120, cwd=tmp_path, env=env)
        assert proc.returncode == 0, proc.stderr
        assert (tmp_path / "gpulayer.db").exists()
        left = sorted(p.name for p in tmp_path.glob("gpulayer.db-*"))
        assert left == [], (args, left)


def test_jobs_list_on_the_embedded_database_loads_no_typer_pydantic_or_database_stack(tmp_path: Path) -> None:
    """Once the database exists, ``jobs list`` is answered by gpulayer.cli.light on the
    standard library's sqlite3 (tests/unit/test_cli_light.py: the same output)."""
    probe = HELP.replace("ARGS", "['jobs', 'list']").replace('"Usage: gpulayer"', '"no jobs"')
    loaded_after(probe, tmp_path)  # the first run creates the database (the full path)
    for args in (["jobs", "list"], ["jobs", "list", "--json", "--state", "queued", "--limit", "5"]):
        probe = HELP.replace("ARGS", repr(args)).replace('assert "Usage: gpulayer" in out.getvalue()', "")
        loaded = loaded_after(probe, tmp_path)
        assert not loaded & {*HEAVY, *ALSO_LIGHT, "typer"}, (args, sorted(loaded & {*HEAVY, *ALSO_LIGHT, "typer"}))


def test_resources_detect_with_its_cache_warm_loads_no_typer_pydantic_pluggy_or_database_stack(
        tmp_path: Path, probed_frameworks: Path) -> None:
    """Once a full ``resources detect`` has kept its text in the capability cache entry, the
    next is answered by gpulayer.cli.light (tests/unit/test_cli_detect_light.py: the same
    output, and when it must not answer)."""
    seed_probe_cache(tmp_path, probed_frameworks)  # (the first need not probe again)
    unwanted = {*HEAVY, *ALSO_LIGHT, "typer"}
    for args in (["resources", "detect"], ["resources", "detect", "--explain"]):
        probe = "\n    import os\n    os.environ['GPULAYER_DETECTORS'] = 'none'  # no trouble from this machine's own" + (
            HELP.replace("ARGS", repr(args)).replace('assert "Usage: gpulayer" in out.getvalue()',
                                                     'assert "backends" in out.getvalue()'))
        assert loaded_after(probe, tmp_path) & {"typer", "pydantic", "pluggy"}  # the first detects and keeps it
        for _ in range(3):  # (free disk, shown to 0.1 GB, may move a step in between: then it is detected again)
            loaded = loaded_after(probe, tmp_path)
            if not loaded & unwanted:
                break
        assert not loaded & unwanted, (args, sorted(loaded & unwanted))


JOB_MODULE = """
    import gpulayer as gl

    @gl.remote(gpus=1, timeout=5)
    def step(x):
        return x + 1
"""


def test_a_job_module_imported_by_the_function_runner_loads_no_sdk(tmp_path: Path) -> None:
    """Where a worker's function runner imports a job's module, its ``@gl.remote`` only wraps
    the function (the options were checked at submit): the SDK, pydantic and the plugins stay
    unloaded, so a fork server that preloads only the decorator forks a small process."""
    (tmp_path / "jobmod.py").write_text(textwrap.dedent(JOB_MODULE))
    loaded = loaded_after("""
        import os, sys
        sys.path.insert(0, os.getcwd())
        os.environ["GPULAYER_IMPORTING_JOB_MODULE"] = "jobmod:step"
        import jobmod
        assert jobmod.step(1) == 2 and jobmod.step.function == "jobmod:step"
    """, tmp_path)
    assert not loaded & {*HEAVY, *ALSO_LIGHT}, sorted(loaded & {*HEAVY, *ALSO_LIGHT})
    full = subprocess.run([sys.executable, "-c", "import sys, gpulayer; gpulayer.remote; print('gpulayer.sdk' in sys.modules)"],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path, env=_env())
    assert full.stdout.strip() == "False", full.stderr


def test_gl_remote_still_checks_its_options_at_decoration(tmp_path: Path) -> None:
    """Outside the runner's import, a bad option fails where it is written."""
    import gpulayer as gl
    from gpulayer.errors import InvalidArgument

    with pytest.raises(InvalidArgument, match=r"@gl.remote: unknown option\(s\) gpus_per_node \(did you mean gpus\?\)"):
        gl.remote(gpus_per_node=1)
    (tmp_path / "badmod.py").write_text(textwrap.dedent(JOB_MODULE).replace("gpus=1", "gpus=-1"))
    run = [sys.executable, "-c", "import badmod"]
    refused = subprocess.run(run, capture_output=True, text=True, timeout=120, cwd=tmp_path, env=_env())
    assert refused.returncode == 1 and "@gl.remote(gpus=-1): must be at least 0" in refused.stderr, refused.stderr
    # the same module where the runner imports it: not checked again (it was, at submit)
    runner = subprocess.run(run, capture_output=True, text=True, timeout=120, cwd=tmp_path,
                            env={**_env(), "GPULAYER_IMPORTING_JOB_MODULE": "badmod:step"})
    assert runner.returncode == 0, runner.stderr
