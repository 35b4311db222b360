"""Artifacts end to end: the files a task leaves in ``$GPULAYER_ARTIFACTS_DIR`` come back
with ``handle.artifacts()`` and ``gpulayer jobs artifacts``, embedded and through a real
server on SQLite and PostgreSQL (the ``plane`` fixture), with real workers."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

import gpulayer as gl
from gpulayer.errors import InvalidInput, NotFound
from tests.integration.conftest import Plane
from tests.support import cli

#: a command that leaves a text file, a binary one in a subfolder, an empty file, and a link
_LEAVES = """
import os, pathlib
d = pathlib.Path(os.environ["GPULAYER_ARTIFACTS_DIR"])
(d / "metrics.json").write_text('{"loss": 0.25}')
(d / "ckpt").mkdir()
(d / "ckpt" / "model.bin").write_bytes(bytes(range(256)) * 4000)
(d / "empty").write_bytes(b"")
os.symlink("/etc/hostname", d / "link")
print("trained")
"""


def test_what_a_command_leaves_comes_back_whole(plane: Plane, tmp_path: Path) -> None:
    plane.ensure_worker()
    h = gl.submit(gl.CommandJob(command=[sys.executable, "-c", _LEAVES]))
    assert h.result(timeout=60) == 0
    got = h.artifacts(tmp_path / "out")
    assert got == tmp_path / "out"
    assert sorted(str(p.relative_to(got)) for p in got.rglob("*") if p.is_file()) == [
        "ckpt/model.bin", "empty", "metrics.json"]
    assert (got / "ckpt" / "model.bin").read_bytes() == bytes(range(256)) * 4000
    assert json.loads((got / "metrics.json").read_text()) == {"loss": 0.25}
    assert not (got / "link").exists()  # (a link is left out, and the output says so)
    assert "gpulayer: artifacts: left out link (only regular files are kept, not links or devices)" in h.logs()

    shown = cli("jobs", "artifacts", h.id, "--to", str(tmp_path / "cli"), "--json", check=True)
    record = json.loads(shown.stdout)
    assert record["files"] == ["ckpt/model.bin", "empty", "metrics.json"] and record["attempt"] == 1
    assert record["bytes"] == 1_024_000 + 14 and record["to"] == str(tmp_path / "cli")
    assert (tmp_path / "cli" / "ckpt" / "model.bin").read_bytes() == (got / "ckpt" / "model.bin").read_bytes()
    plain = cli("jobs", "artifacts", h.id, check=True, cwd=tmp_path)  # (default: ./JOB)
    assert plain.stdout == f"3 file(s), 1000.0 KB, of {h.id} (attempt 1) in {h.id}/\n"
    assert (tmp_path / h.id / "metrics.json").is_file()
    assert f"artifacts 3 file(s), 1000.0 KB, attempt 1: gpulayer jobs artifacts {h.id}" in cli(
        "jobs", "show", h.id, check=True).stdout


def test_a_forked_function_and_a_failed_retried_command_leave_their_own(plane: Plane, tmp_path: Path) -> None:
    plane.ensure_worker()
    code = tmp_path / "code"
    code.mkdir()
    (code / "arts.py").write_text(
        "import os\n"
        "def make(n):\n"
        "    d = os.environ['GPULAYER_ARTIFACTS_DIR']\n"
        "    open(os.path.join(d, 'n.txt'), 'w').write(str(n))\n"
        "    return sorted(os.listdir(d))\n")
    f = gl.submit(gl.FunctionJob(function="arts:make", args=[7], bundle=str(code)))
    assert f.result(timeout=60) == ["n.txt"]  # (each task's folder is its own: empty when it starts)
    g = gl.submit(gl.FunctionJob(function="arts:make", args=[8], bundle=str(code)))
    assert g.result(timeout=60) == ["n.txt"]
    assert (f.artifacts(tmp_path / "f") / "n.txt").read_text() == "7"
    assert (g.artifacts(tmp_path / "g") / "n.txt").read_text() == "8"

    # a failed attempt leaves its files too; the job's are its last attempt's
    script = ("import os, sys; d = os.environ['GPULAYER_ARTIFACTS_DIR']; a = os.environ['GPULAYER_ATTEMPT']; "
              "open(os.path.join(d, 'attempt-' + a), 'w').write(a); sys.exit(3)")
    r = gl.submit(gl.CommandJob(command=[sys.executable, "-c", script], retries=1))
    assert r.wait(timeout=60).state.value == "failed"
    assert sorted(p.name for p in r.artifacts(tmp_path / "r").iterdir()) == ["attempt-2"]
    stored = gl.connect().api.list_artifacts(r.id)
    assert [(t.attempt, t.files) for t in stored] == [(1, 1), (2, 1)]


def test_what_cannot_be_downloaded_says_why(plane: Plane, tmp_path: Path) -> None:
    plane.ensure_worker()
    none = gl.submit(gl.CommandJob(command=[sys.executable, "-c", "pass"]))
    assert none.result(timeout=60) == 0
    with pytest.raises(NotFound, match=f"{none.id} has no artifacts: none of its tasks left a file in "
                                       r"\$GPULAYER_ARTIFACTS_DIR"):
        none.artifacts(tmp_path / "x")
    assert not (tmp_path / "x").exists()  # (nothing made for nothing)
    refused = cli("jobs", "artifacts", none.id)
    assert refused.returncode == 2 and "has no artifacts" in refused.stderr

    leaves = gl.submit(gl.CommandJob(command=[sys.executable, "-c", _LEAVES]))
    assert leaves.result(timeout=60) == 0
    full = tmp_path / "full"
    full.mkdir()
    (full / "mine.txt").write_text("keep me")
    refused = cli("jobs", "artifacts", leaves.id, "--to", str(full))
    assert refused.returncode == 2
    assert refused.stderr == (f"error: --to {full}: is not empty; artifacts go into a new or empty folder\n")
    assert (full / "mine.txt").read_text() == "keep me" and sorted(p.name for p in full.iterdir()) == ["mine.txt"]
    with pytest.raises(InvalidInput, match=r"^to .*: is not a folder"):
        leaves.artifacts(full / "mine.txt")

    unknown = cli("jobs", "artifacts", "job-0123456789ab")
    assert unknown.returncode == 2 and "error: job 'job-0123456789ab': no such job" in unknown.stderr

    running = gl.submit(gl.CommandJob(command=["sleep", "60"]))
    early = cli("jobs", "artifacts", running.id)
    assert early.returncode == 2
    assert f"error: {running.id} is " in early.stderr and "its tasks' artifacts are stored as they end" in early.stderr
    running.cancel()

    # deleted with their job
    cli("jobs", "delete", leaves.id, check=True)
    with pytest.raises(NotFound):
        gl.connect().api.list_artifacts(leaves.id)


def test_a_foreground_submit_downloads_what_the_job_left(plane: Plane, tmp_path: Path) -> None:
    plane.ensure_worker()
    out = tmp_path / "out"
    leave = 'echo 0.1 > "$GPULAYER_ARTIFACTS_DIR/loss.txt"; exit 3'
    done = cli("submit", "--artifacts", str(out), "--", "sh", "-c", leave)
    assert done.returncode == 3, done.stderr  # (the job's outcome, its files downloaded all the same)
    assert (out / "loss.txt").read_text() == "0.1\n"
    assert re.search(rf"gpulayer: 1 file\(s\), 4 B, of job-[0-9a-f]{{12}} in {re.escape(str(out))}/\n", done.stderr)

    none = cli("submit", "--artifacts", str(tmp_path / "none"), "--", "true")
    assert none.returncode == 0 and "gpulayer: no artifacts: job-" in none.stderr and "has no artifacts" in none.stderr
    assert not (tmp_path / "none").exists()

    before = len(gl.connect().api.list_jobs(limit=100))
    refused = cli("submit", "--artifacts", str(out), "--", "true")  # (not empty: refused before it runs)
    assert refused.returncode == 2
    assert refused.stderr == f"error: --artifacts {out}: is not empty; artifacts go into a new or empty folder\n"
    detached = cli("submit", "--artifacts", str(tmp_path / "d"), "--detach", "--", "true")
    assert detached.returncode == 2 and detached.stderr.startswith(
        "error: --artifacts: the job's files are downloaded once it ends, and --detach does not wait for it")
    assert len(gl.connect().api.list_jobs(limit=100)) == before  # (nothing submitted by either)


def test_a_server_refuses_artifacts_over_its_limit_and_the_task_says_so(tmp_path: Path) -> None:
    """The server's GPULAYER_MAX_ARTIFACTS_MB, lower than its worker's: the upload is refused
    as it streams (413), the task's output says why, and the job's outcome is its own."""
    from tests.server_support import Api, ServerProc, joined_worker, start_remote_worker, stop_proc, wait_job, wait_workers

    server = ServerProc(tmp_path / "server", env={"GPULAYER_MAX_ARTIFACTS_MB": "0.01"}).start()
    worker = None
    try:
        admin = Api(server.url, server.admin_token)
        worker = start_remote_worker(server.url, admin.token_for("join")["token"], tmp_path / "worker")
        wait_workers(admin, 1)
        script = "import os; open(os.path.join(os.environ['GPULAYER_ARTIFACTS_DIR'], 'r.bin'), 'wb').write(os.urandom(50000))"
        r = admin("POST", "/v1/jobs", json={"spec": {"kind": "command", "command": [sys.executable, "-c", script],
                                                     "placement": {"target": "remote"}}})
        assert r.status_code == 201, r.text
        job_id = r.json()["id"]
        assert wait_job(admin, job_id)["state"] == "succeeded"
        assert admin("GET", f"/v1/jobs/{job_id}/artifacts").json() == []
        logs = "".join(c["data"] for c in admin("GET", f"/v1/jobs/{job_id}/logs").json())
        assert logs == ("gpulayer: artifacts not kept (1 file(s), 48.8 KB): artifacts are over the control plane's "
                        "limit: 49.0 KB zipped; the limit is 10.2 KB (10485 bytes, GPULAYER_MAX_ARTIFACTS_MB)\n")
        assert admin("PUT", f"/v1/tasks/tsk-000000000000/artifacts/{'0' * 64}", content=b"x").status_code == 403
        # another worker's upload is refused before its body is read: not as too large (413)
        _, other = joined_worker(server.url, admin)
        task_id = admin("GET", f"/v1/jobs/{job_id}").json()["tasks"][0]["id"]
        refused = other("PUT", f"/v1/tasks/{task_id}/artifacts/{'0' * 64}", content=b"x" * 20_000)
        assert refused.status_code == 403 and "is not assigned to worker" in refused.text, refused.text
    finally:
        stop_proc(worker)
        server.stop()
