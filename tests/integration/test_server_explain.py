"""``explain`` through a real ``gpulayer server start`` on loopback: a client token explains
only its own jobs and sees other owners' work unnamed; a large bundle uploads with a progress
bar on a terminal and without one in a pipe."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpulayer.client import http_client
from gpulayer.errors import NotFound
from gpulayer.specs import CommandJob, Placement
from tests.server_support import Api, ServerProc, base_env, start_remote_worker, stop_proc, wait_workers
from tests.support import Terminal, cli, wait_for

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    home = tmp_path_factory.mktemp("explain-server")
    srv = ServerProc(home / "server", env={"GPULAYER_HEARTBEAT_TIMEOUT": "5"}).start()
    admin = Api(srv.url, srv.admin_token)
    worker = start_remote_worker(srv.url, admin.token_for("join")["token"], home / "worker", cpu_slots=1)
    try:
        [w] = wait_workers(admin, 1)
        yield {"server": srv, "admin": admin, "worker_id": w["id"], "home": home,
               "a": admin.token_for("client")["token"], "b": admin.token_for("client")["token"]}
    finally:
        stop_proc(worker)
        srv.stop()


def as_client(served: dict[str, Any], token: str, tmp: Path) -> dict[str, str]:
    return base_env(tmp, GPULAYER_URL=served["server"].url, GPULAYER_TOKEN=token)


def test_a_client_explains_its_own_jobs_and_sees_others_work_unnamed(served: dict[str, Any], tmp_path: Path) -> None:
    url = served["server"].url
    a, b = http_client(url, token=served["a"]), http_client(url, token=served["b"])
    release = tmp_path / "release"
    hold = ["sh", "-c", f"i=0; while [ ! -e {release} ] && [ $i -lt 12000 ]; do sleep 0.05; i=$((i+1)); done"]
    try:
        running = a.submit(CommandJob(command=hold, placement=Placement(target="remote")))
        wait_for(lambda: a.api.get_job(running.id).state.value == "running", 60, "the job to run")
        queued = a.submit(CommandJob(command=["true"], placement=Placement(target="remote")))
        # the owner: its place in the queue, and its own running job named on the busy worker
        env_a = as_client(served, served["a"], tmp_path / "a")
        proc = cli("jobs", "explain", queued.id, env=env_a)
        assert proc.returncode == 0, proc.stderr
        lines = proc.stdout.splitlines()
        assert lines[0] == f"job {queued.id}: queued, position 1 in the queue"
        busy = next(line for line in lines if line.startswith(served["worker_id"]))
        assert busy.startswith(f"{served['worker_id']}: compatible but busy: no free CPU slot (running {running.id} for ")
        # another client: that job does not exist for it, and the busy worker's job has no name
        env_b = as_client(served, served["b"], tmp_path / "b")
        other = cli("jobs", "explain", queued.id, env=env_b)
        assert other.returncode == 2 and f"job {queued.id!r}: no such job" in other.stderr
        with pytest.raises(NotFound):
            b.api.explain_job(queued.id)
        with pytest.raises(NotFound):
            b.api.queue_position(queued.id)
        assert a.api.queue_position(queued.id) == 1
        theirs = cli("explain", "--target", "remote", "--json", "--", "true", env=env_b)
        data = json.loads(theirs.stdout)
        [view] = data["workers"]
        assert view["status"] == "busy"
        assert [(t["job_id"], t["task_id"]) for t in view["running"]] == [(None, None)]
        assert running.id not in theirs.stdout and queued.id not in theirs.stdout
        assert data["queue_position"] == 2  # behind the queued job of the same priority
        # an admin sees it all
        admin = http_client(url, token=served["server"].admin_token)
        seen = admin.api.explain_job(queued.id)
        assert [t.job_id for t in seen.workers[0].running] == [running.id]
    finally:
        release.touch()
        for c in (a, b):
            c.close()


def test_a_large_bundle_uploads_with_a_progress_bar_on_a_terminal_only(served: dict[str, Any], tmp_path: Path) -> None:
    env = as_client(served, served["a"], tmp_path / "client")
    bundles = []
    for name in ("shown", "piped"):
        d = tmp_path / name
        d.mkdir()
        (d / "weights.bin").write_bytes(os.urandom(6 * 1024 * 1024))  # incompressible: over 4 MiB zipped
        bundles.append(d)
    args = ("submit", "--detach", "--target", "remote", "--on-unschedulable", "wait", "--label", "never=here")
    term = Terminal(*args, "--bundle", str(bundles[0]), "--", "true", env=env)
    assert term.finish() == 0
    # (the rate's unit follows the speed: a fast loopback upload shows GB/s)
    assert "upload " in term.output and re.search(r"[kMG]B/s", term.output) and "6.3/6.3 MB" in term.output, \
        term.output
    piped = cli(*args, "--bundle", str(bundles[1]), "--", "true", env=env)
    assert piped.returncode == 0, piped.stderr
    assert not re.search(r"[kMG]B/s", piped.stderr) and "upload" not in piped.stderr
    # both were uploaded whole: each job names a stored bundle
    client = http_client(served["server"].url, token=served["a"])
    try:
        for out in (term.output, piped.stdout):
            job_id = re.findall(r"job-[0-9a-f]{12}", out)[-1]
            digest = client.api.get_job(job_id).spec.bundle_digest
            assert digest is not None and client.api.has_bundle(digest)
            client.api.cancel(job_id)
    finally:
        client.close()
