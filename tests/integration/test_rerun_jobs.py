"""Running ended jobs again end to end (``handle.rerun()``, ``gpulayer jobs rerun``), embedded
and through a real server on SQLite and PostgreSQL (the ``plane`` fixture), with real workers."""

from __future__ import annotations

import sys
from pathlib import Path

import gpulayer as gl
from tests.integration.conftest import Plane
from tests.support import cli


def test_a_failed_job_and_the_pipeline_after_it_run_again(plane: Plane, tmp_path: Path) -> None:
    plane.ensure_worker()
    flag = tmp_path / "ready"  # the first attempt fails: the file is not there yet
    step = gl.submit(gl.CommandJob(command=[sys.executable, "-c", f"import os, sys; sys.exit(0 if os.path.exists({str(flag)!r}) else 3)"]))
    after = gl.submit(gl.CommandJob(command=[sys.executable, "-c", "print('after')"], after=[step]))
    assert after.wait(timeout=60).state.value == "failed"  # (without running: step failed)
    flag.touch()

    again = step.rerun()
    assert again != step and again.result(timeout=60) == 0
    assert step.status() == "failed"  # (left as it was)

    shown = cli("jobs", "rerun", step.id, "--downstream", check=True).stdout.splitlines()
    new_step, new_after = (line.split(" -> ")[1] for line in shown)
    assert [line.split(" -> ")[0] for line in shown] == [step.id, after.id]
    assert cli("jobs", "wait", new_after, "--timeout", "60").returncode == 0
    assert cli("jobs", "logs", new_after, check=True).stdout == "after\n"
    assert f"after     {new_step}" in cli("jobs", "show", new_after, check=True).stdout

    busy = gl.submit(gl.CommandJob(command=["sleep", "60"]))
    refused = cli("jobs", "rerun", busy.id, "job-0123456789ab")
    assert refused.returncode == 2
    assert f"error: job {busy.id} is " in refused.stderr and "a job is run again once it has ended" in refused.stderr
    assert "error: job 'job-0123456789ab': no such job" in refused.stderr
    busy.cancel()
