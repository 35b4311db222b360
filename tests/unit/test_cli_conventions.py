"""The conventions every ``gpulayer`` command follows (gpulayer/cli/conventions.py,
docs/cli.md "Conventions"), checked by walking the whole command tree, so that a command
added later is held to them too."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from gpulayer.cli import app, conventions
from gpulayer.records import JobError, JobRecord, JobState
from tests.factories import make_job

#: commands that print no result of their own, so take no ``--json``, and why
NO_JSON = {
    "jobs logs": "prints the job's own output as written; jobs wait --json gives its outcome",
}


def _tree() -> Any:
    return conventions.prepare(typer.main.get_command(app))


def commands() -> Iterator[tuple[str, Any]]:
    def walk(prefix: str, cmd: Any) -> Iterator[tuple[str, Any]]:
        yield prefix, cmd
        for name, sub in sorted(getattr(cmd, "commands", {}).items()):
            yield from walk(f"{prefix} {name}".strip(), sub)

    yield from walk("", _tree())


ALL = [path for path, _ in commands()]
LEAVES = [path for path, cmd in commands() if not getattr(cmd, "commands", None)]


def run(*args: str) -> Any:
    return CliRunner().invoke(app, list(args))


def test_the_walk_finds_the_commands() -> None:
    assert {"submit", "jobs wait", "jobs cancel", "worker start", "resources detect"} <= set(LEAVES)


@pytest.mark.parametrize("path", ALL)
def test_help_has_no_type_placeholders_and_h_is_help(path: str) -> None:
    words = path.split()
    long = run(*words, "--help")
    short = run(*words, "-h")
    assert long.exit_code == 0, long.output
    assert short.output == long.output
    assert long.output.startswith(f"Usage: gpulayer {path}".rstrip() + " ")
    # Typer's rich panels wrote `--help <bool>`, `--gpus <int>`, `{job_id}`: none of that
    assert not re.search(r"<(bool|str|int|float|list|path|\w+ range)[^>]*>", long.output), long.output
    assert not re.search(r"\{\w+\}", long.output.splitlines()[0]), long.output
    assert "╭" not in long.output


@pytest.mark.parametrize("path", LEAVES)
def test_every_option_that_takes_a_value_shows_a_metavar(path: str) -> None:
    cmd = dict(commands())[path]
    for p in cmd.params:
        if p.param_type_name == "option" and not (p.is_flag or p.count):
            assert (p.metavar and p.metavar == p.metavar.upper()) or "|" in p.metavar, (path, p.opts, p.metavar)


def test_a_flag_shows_one_metavar_in_every_command() -> None:
    """``providers offers`` showed ``--gpus GPUS``, ``--min-gpu-memory MIN_GPU_MEMORY`` where
    ``submit`` shows ``--gpus N``, ``--min-gpu-memory GB``. (``--token`` is a join token in
    ``worker start``.)"""
    shown: dict[str, set[str]] = {}
    for _path, cmd in commands():
        for p in cmd.params:
            if p.param_type_name == "option" and not (p.is_flag or p.count):
                shown.setdefault(max(p.opts, key=len), set()).add(p.metavar)
    assert {flag: m for flag, m in shown.items() if len(m) > 1} == {"--token": {"JOIN", "TOKEN"}}


@pytest.mark.parametrize("path", LEAVES)
def test_every_command_that_prints_a_result_takes_json(path: str) -> None:
    cmd = dict(commands())[path]
    opts = {o for p in cmd.params for o in p.opts}
    if path in NO_JSON:
        assert "--json" not in opts, f"{path} takes --json now: drop it from NO_JSON"
        return
    assert "--json" in opts, f"gpulayer {path} has no --json (or add it to NO_JSON with the reason)"
    option = next(p for p in cmd.params if "--json" in p.opts)
    assert option.is_flag and option.default is False


def test_version() -> None:
    from gpulayer import __version__

    for args in (["--version"], ["--version", "jobs", "list"]):
        result = run(*args)
        assert result.exit_code == 0
        assert result.output == f"gpulayer {__version__}\n"


@pytest.mark.parametrize(("words", "says"), [
    (["jobs", "wait", "--timeout", "inf", "job-x"],
     "error: --timeout inf: not a number of seconds; accepted: a number >= 0 (leave it out to wait as long as it takes)"),
    (["jobs", "wait", "--timeout=1e400", "job-x"], "error: --timeout 1e400: not a number of seconds"),  # (as written)
    # a number, below the range: said so (it read "not a number of seconds")
    (["jobs", "wait", "--timeout", "-1", "job-x"],
     "error: --timeout -1: must be at least 0; accepted: a number >= 0 (leave it out to wait as long as it takes)"),
    (["jobs", "result", "--timeout=-0.5", "job-x"], "error: --timeout -0.5: must be at least 0"),
    # the API's bounds, said by the CLI with the flag, embedded too (an embedded list took 5000)
    (["jobs", "list", "--limit", "5000"], "Invalid value for '--limit': '5000': out of range; accepted: a whole number "
                                          "from 1 to 1000"),
    # a number option's value said as typed, with what is accepted (pydantic's words were shown)
    (["submit", "--timeout", "abc", "--", "true"], "Invalid value for '--timeout': 'abc': not a number; accepted: "
                                                   "a number"),
    (["explain", "--priority", "1.5", "--", "true"], "Invalid value for '--priority': '1.5': not a whole number"),
    (["worker", "start", "--cpu-slots", "100001"], "Invalid value for '--cpu-slots'"),
    # (taken, then a traceback as it stopped with a task running: its task lost)
    (["worker", "start", "--grace", "inf"], "Invalid value for '--grace': 'inf': not a finite number; accepted: "
                                            "a number of seconds from 0"),
    (["--url", "http://127.0.0.1:1", "token", "create", "--join", "--ttl", "1e400h"],
     "error: --ttl 1e400h: expected more than 0 seconds and at most 10 years (3650d)"),
    (["--url", "http://127.0.0.1:1", "token", "create", "--join", "--ttl", "nan"], "error: --ttl nan: expected more"),
    # the API's bounds, said by the CLI with the flag (it said "create_token: uses: Input should be ...")
    (["--url", "http://127.0.0.1:1", "token", "create", "--join", "--uses", "1000000001"],
     "Invalid value for '--uses': '1000000001': out of range; accepted: a whole number from 1 to 1000000000"),
    (["--url", "http://127.0.0.1:1", "token", "create", "--join", "-d", "x" * 501],
     "error: --description: 501 characters; accepted: text of at most 500 characters"),
    # a secret where its id goes: sent in the URL's path (which proxies log), and answered "no
    # such token", so a leaked secret looked harmless while it still worked
    (["--url", "http://127.0.0.1:1", "token", "revoke", "glt_9XU3flj3CAzRaRqwcltY9HPiQ"],
     "error: TOKEN: that is a token's secret (glt_...), not its id; give its id (tok-...)"),
    # taken before, failing later: every job at its start, a label no worker could have
    (["resources", "detect", "--python", "/nonexistent"], "error: --python /nonexistent: no such program"),
    (["worker", "start", "--python", "/nonexistent"], "error: --python /nonexistent: no such program"),
    # a program that is no Python: the worker started, and every `python ...` job failed (exit code 1)
    (["worker", "start", "--python", "/bin/false"], "error: --python /bin/false: not a Python (exit code 1, no "
                                                   "version printed); accepted: the path of a Python"),
    # resources detect took it, and printed what no worker would report (python unknown, the
    # probe's script in a diagnostic), exit 0
    (["resources", "detect", "--python", "/bin/false"], "error: --python /bin/false: not a Python (exit code 1, "
                                                        "no version printed); accepted: the path of a Python"),
    (["submit", "--", ""], "error: the command after --: the program to run is empty"),
    (["submit", "--label", "=v", "--", "true"], "error: --label =v: label key '': empty"),
    # a bundle that is no directory, named as the flag (it was "bundle directory ...", and
    # explain, which builds no bundle, took it and exited 0)
    (["submit", "--bundle", "/nonexistent/gl-bundle", "--", "true"],
     "error: --bundle /nonexistent/gl-bundle: no such directory; accepted: the path of a directory"),
    (["explain", "--bundle", "/nonexistent/gl-bundle", "--", "true"], "error: --bundle /nonexistent/gl-bundle: no such"),
    (["explain", "--bundle", "/etc/hostname", "--", "true"], "error: --bundle /etc/hostname: not a directory"),
    (["worker", "start", "--label", "=v"], "Invalid value for --label: '=v': expected KEY=VALUE, with a KEY"),
    # empty values (a "$VAR" unset): inspected the folder it ran in; a program named as nothing
    (["bundle", "inspect", ""], "error: DIRECTORY '': empty; accepted: the path of a directory"),
    (["worker", "start", "--python", ""], "error: --python '': no such program"),
    (["worker", "start", "--resources", ""], "error: --resources '': empty; accepted: the path of a resources file"),
    (["worker", "start", "--resources", "/etc/passwd"], "error: --resources '/etc/passwd': not valid TOML"),
    # an empty OS read as "any" (a `--os "$OS"` with OS unset)
    (["submit", "--os", "", "--", "true"], "error: --os '': empty; accepted: an operating system such as linux"),
    (["submit", "--name", "", "--", "true"], "error: --name '': empty; accepted: a name of text (leave it out"),
    (["explain", "--", "job-5b8055b4ec6a"], "error: the command after --: 'job-5b8055b4ec6a' is a job's id, not a "
                                            "program; to explain a submitted job: gpulayer jobs explain job-5b8055b4ec6a"),
    # conflicting flags: the timeout of a wait it was told not to make was ignored
    (["jobs", "result", "--no-wait", "--timeout", "5", "job-x"],
     "Invalid value for '--timeout': bounds a wait, and --no-wait makes none"),
    # a join token without a server: an embedded worker started, the token unused
    (["worker", "start", "--token", "gljt_x"], "Invalid value for '--token': a join token is for a server: give its "
                                               "address too"),
])
def test_bad_input_names_the_flag_and_exits_2(tmp_path: Any, words: list[str], says: str) -> None:
    from tests.support import cli

    for warm in ("0", "1"):  # (the light path and the full path alike)
        proc = cli(*words, env={"GPULAYER_HOME": str(tmp_path), "GPULAYER_WARM_CLI": warm}, timeout=60)
        assert proc.returncode == 2, proc.stderr
        assert says in " ".join(proc.stderr.split()), proc.stderr


# --------------------------------------------------------------------------- outcomes


def _job(state: JobState, error: JobError | None = None, exit_code: int | None = None) -> JobRecord:
    return JobRecord(id="job-1", spec=make_job(), state=state, error=error, exit_code=exit_code,
                     attempt=1, created_at=0.0, updated_at=0.0)


@pytest.mark.parametrize(("state", "error", "exit_code", "text", "code"), [
    (JobState.CANCELLED, JobError.cancelled(), -15, "job job-1 cancelled", 130),
    (JobState.CANCELLED, JobError(type="cancelled", message="cancelled: cancelled"), None, "job job-1 cancelled", 130),
    (JobState.CANCELLED, JobError.cancelled("cancelled: the process that submitted it received SIGTERM"), None,
     "job job-1 cancelled: the process that submitted it received SIGTERM", 130),
    (JobState.FAILED, JobError(type="failed", message="exit code 3"), 3, "job job-1 failed: exit code 3", 3),
    (JobState.FAILED, JobError.lost("worker wkr-1 went silent"), None, "job job-1 failed: lost: worker wkr-1 went silent",
     126),
    (JobState.TIMED_OUT, JobError(type="timed_out", message="timed out after 1 s"), None,
     "job job-1 timed_out: timed out after 1 s", 124),
    (JobState.SUCCEEDED, None, 0, "job job-1 succeeded", 0),
    (JobState.RUNNING, None, None, "job job-1 running", 75),
])
def test_outcome_says_the_state_once(state: JobState, error: JobError | None, exit_code: int | None,
                                     text: str, code: int) -> None:
    job = _job(state, error, exit_code)
    assert conventions.outcome_text(job) == text
    assert conventions.exit_code_for(job) == code
    record = conventions.outcome_record(job)
    assert record["code"] == code and record["state"] == state.value


def test_the_exit_code_table_is_documented() -> None:
    from pathlib import Path

    doc = (Path(__file__).resolve().parents[2] / "docs" / "cli.md").read_text()
    for code, meaning in conventions.EXIT_CODES:
        assert re.search(rf"^\| {re.escape(code)} \|", doc, flags=re.M), f"docs/cli.md has no row for exit code {code}"
        assert meaning


def test_token_create_s_bounds_are_the_api_s() -> None:
    from gpulayer.cli import token
    from gpulayer.wire import TokenBody

    limits = {f: {type(m).__name__: m for m in TokenBody.model_fields[f].metadata} for f in ("uses", "description")}
    assert limits["uses"]["Le"].le == token.MAX_USES
    assert limits["description"]["MaxLen"].max_length == token.MAX_DESCRIPTION


#: the page of its own that documents a command's options, where docs/cli.md's row sends the reader
OPTIONS_DOCUMENTED_IN = {"server start": "docs/server.md", "token create": "docs/server.md",
                         "token list": "docs/server.md", "token revoke": "docs/server.md",
                         "dashboard": "docs/dashboard.md", "bundle inspect": "docs/bundles.md"}


def _paragraphs_about(page: str, path: str) -> str:
    """The paragraphs (blocks between blank lines: a synopsis included; each row of a table
    on its own) of ``page`` that name ``gpulayer PATH``."""
    from pathlib import Path

    text = (Path(__file__).resolve().parents[2] / page).read_text()
    units = [u for p in re.split(r"\n\s*\n", text) for u in (p.splitlines() if p.lstrip().startswith("|") else [p])]
    return "\n".join(u for u in units if re.search(rf"gpulayer {path}(?![\w-])", u))


@pytest.mark.parametrize("path", LEAVES)
def test_every_option_is_documented_where_the_command_is(path: str) -> None:
    """``jobs list --limit``, ``worker start --idle-exit``, ``--python`` and ``--name``,
    ``token create --description`` were in no doc; a script's author reads the docs, not
    only ``--help``. ``explain`` takes ``submit``'s options, which its synopsis says."""
    cmd = dict(commands())[path]
    def options(c: Any) -> dict[str, list[str]]:  # (--wait / --no-wait: either spelling)
        return {max(p.opts, key=len): [*p.opts, *p.secondary_opts] for p in c.params
                if p.param_type_name == "option" and "--help" not in p.opts}

    own = options(cmd)
    if path == "explain":
        own = {o: s for o, s in own.items() if o not in options(dict(commands())["submit"])}
    where = _paragraphs_about("docs/cli.md", path)
    if path in OPTIONS_DOCUMENTED_IN:
        from pathlib import Path

        where += (Path(__file__).resolve().parents[2] / OPTIONS_DOCUMENTED_IN[path]).read_text()
    missing = sorted(o for o, spellings in own.items()
                     if not any(re.search(rf"{re.escape(s)}(?![\w-])", where) for s in spellings if s.startswith("--")))
    assert not missing, f"gpulayer {path}: {missing} in no paragraph of the docs that names the command"
