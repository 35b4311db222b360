"""``gpulayer explain``, ``gpulayer jobs explain``, ``gl.explain`` and ``submit --dry-run``'s
verdict, through the CLI as a subprocess and the SDK, against real control planes."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import typer.main

import gpulayer as gl
from gpulayer.fakes import fake_devices_env
from tests.integration.conftest import Plane
from tests.support import cli, start_worker, wait_for


def double(x: int) -> int:
    return 2 * x


def test_explain_says_why_before_anything_is_submitted(plane: Plane) -> None:
    plane.ensure_worker()
    proc = cli("explain", "--accelerator", "cuda", "--gpus", "2", "--framework", "torch>=99", "--", "true")
    assert proc.returncode == 125, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0] == "would fail: scheduling: no eligible worker"
    assert any(line.endswith(": needs 2 usable cuda device(s), worker has 0") for line in lines), proc.stdout
    assert any(" does not satisfy >=99" in line for line in lines), proc.stdout
    closest = next(line for line in lines if line.startswith("closest: "))
    assert "has 0 of 2 cuda devices" in closest and "needs >=99 (one upgrade away)" in closest
    assert json.loads(cli("jobs", "list", "--json", check=True).stdout) == []
    # the same as data
    data = json.loads(cli("explain", "--json", "--accelerator", "cuda", "--", "true").stdout)
    assert data["decision"]["outcome"] == "unschedulable" and data["job_id"] is None
    assert {w["status"] for w in data["workers"]} == {"rejected"}
    assert data["closest"][0]["misses"][0] == {
        "code": "devices", "field": "requirements.gpus", "wanted": "1", "have": "0", "distance": 2.0,
        "text": "has 0 of 1 cuda device"}
    ok = cli("explain", "--", "true")
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout.startswith("would be placed now: assigned to ")
    assert ": eligible, free now" in ok.stdout


def test_explain_relaxes_in_the_flags_words(home: Path) -> None:
    worker = start_worker("--cpu-slots", "0", env=fake_devices_env("cuda:2:24:8.6"))
    try:
        [w] = wait_for(lambda: gl.connect().api.list_workers(), 60, "the worker to register")
        proc = cli("explain", "--accelerator", "cuda", "--gpus", "4", "--min-gpu-memory", "20", "--", "true")
        assert proc.returncode == 125, proc.stderr
        assert proc.stdout.splitlines()[-2:] == [f"closest: {w.id} has 2 of 4 cuda devices",
                                                 "relax --gpus to 2 and 1 worker fits"]
        proc = cli("explain", "--accelerator", "cuda", "--gpus", "2", "--min-gpu-memory", "40", "--", "true")
        assert proc.stdout.splitlines()[-2:] == [f"closest: {w.id} has 0 of 2 cuda devices with >= 40.0 GB",
                                                 "relax --min-gpu-memory to 24 and 1 worker fits"]
        # two requirements missed: no one change is enough, and it says so
        proc = cli("explain", "--accelerator", "cuda", "--gpus", "4", "--label", "zone=eu", "--", "true")
        assert proc.stdout.splitlines()[-1] == "no single change to the job makes a worker fit"
    finally:
        worker.terminate()
        worker.wait(30)


def test_explain_takes_exactly_submits_options_and_words_bad_input_the_same() -> None:
    from gpulayer.cli import app

    group = typer.main.get_command(app)
    commands = group.commands  # type: ignore[attr-defined]

    def options(name: str) -> set[str]:
        return {o for p in commands[name].params for o in p.opts + p.secondary_opts}

    assert options("explain") == options("submit") - {"--detach", "-d", "--dry-run", "--artifacts"}
    submitted = cli("submit", "--timeout", "inf", "--", "true")
    explained = cli("explain", "--timeout", "inf", "--", "true")
    assert submitted.returncode == explained.returncode == 2
    assert explained.stderr == submitted.stderr == (
        "error: --timeout inf: not a finite number; accepted: a number of seconds > 0 (leave it out for no limit)\n")


def test_jobs_explain_a_stored_job(plane: Plane) -> None:
    plane.ensure_worker()
    failed = cli("submit", "--accelerator", "cuda", "--", "true")
    assert failed.returncode == 125
    job_id = failed.stderr.strip().splitlines()[-1].removeprefix("run: gpulayer jobs explain ")
    proc = cli("jobs", "explain", job_id)
    assert proc.returncode == 125, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[:3] == [f"job {job_id}: unschedulable", "last placement pass: scheduling: no eligible worker",
                         "if placed now on its own: would fail: scheduling: no eligible worker"]
    assert any(line.startswith("closest: ") for line in lines)
    data = json.loads(cli("jobs", "explain", job_id, "--json", check=False).stdout)
    assert (data["job_id"], data["state"], data["queue_position"]) == (job_id, "unschedulable", None)
    missing = cli("jobs", "explain", "job-000000000000")
    assert missing.returncode == 2 and "no such job" in missing.stderr


def test_dry_run_adds_the_placement_verdict(home: Path) -> None:
    proc = cli("submit", "--dry-run", "--accelerator", "cuda", "--", "python", "train.py")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout[:proc.stdout.rindex("}") + 1]) == {
        "requirements": {"accelerator": "cuda"}, "command": ["python", "train.py"]}
    tail = proc.stdout.splitlines()[-3:]
    assert tail == ["placement: would fail: scheduling: no eligible worker",
                    "closest: in-process has 0 of 1 cuda device",
                    "run: gpulayer explain --accelerator cuda -- python train.py"]
    data = json.loads(cli("submit", "--dry-run", "--json", "--", "true").stdout)
    assert data["placement"]["outcome"] == "assigned"
    assert data["placement"]["summary"] == "assigned to in-process (CPU slot)"
    assert json.loads(cli("jobs", "list", "--json", check=True).stdout) == []


@pytest.mark.parametrize(("submit", "explain"), [
    (["submit", "--dry-run", "--gpus", "1", "-a", "cuda", "--", "python", "train.py"],
     "gpulayer explain --gpus 1 -a cuda -- python train.py"),
    # explain takes no --detach ("No such option: --detach", exit 2)
    (["--home", "h", "submit", "--detach", "--dry-run", "--json", "--", "true"], "gpulayer --home h explain --json -- true"),
    (["submit", "-d", "--dry-run", "--", "true"], "gpulayer explain -- true"),
    # nor --artifacts DIR (where a job's files go once it ended: explain runs nothing)
    (["submit", "--artifacts", "out", "--dry-run", "--cpus", "2", "--", "true", "--artifacts", "x"],
     "gpulayer explain --cpus 2 -- true --artifacts x"),
    (["submit", "--artifacts=out", "--dry-run", "--", "true"], "gpulayer explain -- true"),
    # the job's own words stay as given: a --dry-run of train.py's, a word 'submit'
    (["submit", "--dry-run", "--", "python", "train.py", "--dry-run", "submit", "-d"],
     "gpulayer explain -- python train.py --dry-run submit -d"),
])
def test_dry_run_names_an_explain_command_line_that_runs(submit: list[str], explain: str) -> None:
    from gpulayer.cli.explain import command_line

    assert command_line(submit) == explain


def test_gl_explain_a_function_a_spec_and_a_job(plane: Plane) -> None:
    plane.ensure_worker()
    e = gl.explain(double, accelerator="cuda", gpus=2)
    assert e.decision.outcome == "unschedulable" and e.spec.kind == "function"
    assert str(e).splitlines()[0] == "would fail: scheduling: no eligible worker"
    assert gl.explain(gl.remote(double)).decision.outcome == "assigned"
    spec = gl.CommandJob(command=[sys.executable, "-c", "pass"], requirements=gl.Requirements(accelerator="cuda"))
    assert gl.explain(spec).closest[0].misses[0].text == "has 0 of 1 cuda device"
    with pytest.raises(gl.Unschedulable) as err:
        gl.submit(spec)
    stored = gl.explain(err.value.job_id)
    assert (stored.job_id, stored.state) == (err.value.job_id, "unschedulable")
    with pytest.raises(gl.InvalidInput, match=r"gl\.explain: options apply to a function"):
        gl.explain(spec, gpus=1)
    with pytest.raises(gl.InvalidInput, match="unknown option"):
        gl.explain(double, gpu=1)  # type: ignore[call-arg]
