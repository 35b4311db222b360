"""The process-wide client: one per setting, and a change of settings never pulls the
control plane out from under job handles that still use the old one."""

from __future__ import annotations

from pathlib import Path

import pytest

import gpulayer as gl
from gpulayer import client as client_mod
from gpulayer.records import JobError, JobRecord, JobState
from gpulayer.specs import CommandJob, Placement


def test_connect_gives_one_client_per_setting(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPULAYER_HOME", str(tmp_path / "a"))
    first = client_mod.connect()
    assert client_mod.connect() is first and first.embedded and first.location == "embedded"
    monkeypatch.setenv("GPULAYER_HOME", str(tmp_path / "b"))
    assert client_mod.connect() is not first


def test_a_handle_outlives_a_switch_to_other_settings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPULAYER_HOME", str(tmp_path / "a"))
    wait = Placement(on_unschedulable="wait", target="remote")  # no worker: it stays queued
    h = gl.submit(CommandJob(command=["true"], placement=wait))
    monkeypatch.setenv("GPULAYER_HOME", str(tmp_path / "b"))
    other = gl.submit(CommandJob(command=["true"], placement=wait))
    assert h.status() == "queued" and other.status() == "queued"  # the first client still works
    assert h.cancel() == JobState.CANCELLED.value
    assert [j.id for j in client_mod.connect().api.list_jobs()] == [other.id]


def test_a_bundle_is_asked_for_and_uploaded_once_per_client(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A loop of submits with one source directory asks the control plane about the bundle
    once (stored bundles and their readers are never removed); a changed directory is a new
    bundle, asked about and uploaded again."""
    monkeypatch.setenv("GPULAYER_HOME", str(tmp_path / "home"))
    code = tmp_path / "code"
    code.mkdir()
    (code / "job.py").write_text("print('one')\n")
    client = client_mod.connect()
    asked: list[str] = []
    uploaded: list[str] = []
    has, put = client.api.has_bundle, client.api.put_bundle
    monkeypatch.setattr(client.api, "has_bundle", lambda d, **kw: asked.append(d) or has(d, **kw))
    monkeypatch.setattr(client.api, "put_bundle", lambda d, data, **kw: uploaded.append(d) or put(d, data, **kw))
    wait = Placement(on_unschedulable="wait", target="remote")  # no worker: they stay queued
    jobs = [gl.submit(CommandJob(command=["python", "job.py"], bundle=str(code), placement=wait)) for _ in range(3)]
    assert len(asked) == 1 and len(uploaded) == 1
    stored = {client.api.get_job(h.id).spec.bundle_digest for h in jobs}
    assert stored == {uploaded[0]}
    (code / "job.py").write_text("print('two')\n")
    gl.submit(CommandJob(command=["python", "job.py"], bundle=str(code), placement=wait))
    assert len(asked) == 2 and len(uploaded) == 2 and uploaded[1] != uploaded[0]


def test_a_cancel_reason_a_control_plane_from_before_refuses_is_dropped_and_not_sent_again() -> None:
    """A server from before reasons refuses the field ('no such field'): the jobs are
    cancelled without it, and later cancels do not send it."""
    from types import SimpleNamespace

    from gpulayer.errors import InvalidInput

    calls: list[dict[str, object]] = []

    def cancel_many(job_ids: list[str], **kw: object) -> list[object]:
        calls.append(kw)
        if "reason" in kw:
            raise InvalidInput("body.reason: no such field")
        return [SimpleNamespace(id=j) for j in job_ids]

    client = client_mod.Client.__new__(client_mod.Client)
    client._cancel_reasons = True
    client.api = SimpleNamespace(cancel_many=cancel_many)  # type: ignore[assignment]
    assert [r.id for r in client._cancel_many(["job-1"], "why")] == ["job-1"]  # type: ignore[attr-defined]
    client._cancel_many(["job-2"], "why")
    assert calls == [{"reason": "why"}, {}, {}]


def test_a_handle_made_from_a_job_id_in_another_process(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """gl.get_job(ID) took anything: None, a number, a handle, "" made a handle, and its first
    use said "job None: no such job"; a str id of a job submitted elsewhere works."""
    import subprocess
    import sys

    monkeypatch.setenv("GPULAYER_HOME", str(tmp_path / "home"))
    wait = "gl.Placement(on_unschedulable='wait', target='remote')"  # no worker: it stays queued
    out = subprocess.run([sys.executable, "-c", "import gpulayer as gl; print(gl.submit(gl.CommandJob("
                          f"command=['true'], placement={wait})).id)"], capture_output=True, text=True, check=True)
    h = gl.get_job(out.stdout.strip() + "\n")
    assert h.status() == "queued" and h.cancel() == "cancelled"
    with pytest.raises(gl.JobFailed) as info:
        h.result()
    assert info.value.state == "cancelled" and str(info.value) == f"job {h.id} cancelled: cancelled before it started"
    for bad in (None, 123, "", "  "):
        with pytest.raises(gl.InvalidInput) as refused:
            gl.get_job(bad)  # type: ignore[arg-type]
        assert str(refused.value) == (f"gl.get_job({bad!r}): not a job id; accepted: a job's id as a str, such "
                                      "as 'job-5b8055b4ec6a' (h.id, gpulayer jobs list)")
    with pytest.raises(gl.InvalidInput, match=f"this is a handle already: its id is '{h.id}'"):
        gl.get_job(h)  # type: ignore[arg-type]


def test_a_handle_travels_to_another_process_as_its_job_id(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """pickle.dumps(handle) (a ProcessPoolExecutor's argument) failed: cannot pickle
    '_thread.RLock' (its client); it pickles as the job's id, read back on that process's
    default control plane, with no token in it."""
    import multiprocessing
    import pickle
    from concurrent.futures import ProcessPoolExecutor

    monkeypatch.setenv("GPULAYER_HOME", str(tmp_path / "home"))
    h = gl.submit(gl.CommandJob(command=["true"], placement=gl.Placement(on_unschedulable="wait", target="remote")))
    data = pickle.dumps(h)
    assert h.id.encode() in data and b"glt_" not in data and len(data) < 200
    assert pickle.loads(data).id == h.id
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        assert pool.submit(_status_of, h).result(timeout=120) == "queued"
    h.cancel()


def _status_of(handle: gl.JobHandle) -> str:
    return handle.status()


@pytest.mark.parametrize(("error", "text"), [
    (JobError.cancelled(), "job job-1 cancelled"),
    (JobError.cancelled("cancelled: the process that submitted it received SIGTERM"),
     "job job-1 cancelled: the process that submitted it received SIGTERM"),
    (JobError.lost("worker wkr-1 (pid 7) is gone"), "job job-1 failed: lost: worker wkr-1 (pid 7) is gone"),
])
def test_job_failed_says_what_gpulayer_submit_says(error: JobError, text: str) -> None:
    """handle.result() said "job job-1 cancelled: cancelled", and left "lost" out of a lost
    job's end, which the CLI says as the job's outcome."""
    from gpulayer.cli.conventions import outcome_text
    from gpulayer.sdk import result_of

    state = JobState.CANCELLED if error.type == "cancelled" else JobState.FAILED
    job = JobRecord(id="job-1", spec=CommandJob(command=["true"]), state=state, error=error, attempt=1,
                    created_at=0.0, updated_at=0.0)
    with pytest.raises(gl.JobFailed) as info:
        result_of(job)
    assert str(info.value) == text == outcome_text(job) and info.value.state == state.value


def test_handles_of_one_job_are_equal_and_hash_alike(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """gl.get_job(ID) twice gave two handles that were unequal and hashed apart, so a set of
    handles kept one job twice; a handle is its job's id on its control plane, as a Ray
    ObjectRef is."""
    import pickle

    monkeypatch.setenv("GPULAYER_HOME", str(tmp_path / "a"))
    wait = Placement(on_unschedulable="wait", target="remote")  # no worker: it stays queued
    h = gl.submit(CommandJob(command=["true"], placement=wait))
    other = gl.submit(CommandJob(command=["true"], placement=wait))
    again, back = gl.get_job(h.id), pickle.loads(pickle.dumps(h))
    assert h == again == back and hash(h) == hash(again) == hash(back)
    assert h != other and h != h.id and len({h, again, back, other}) == 2
    assert {h: 1, again: 2}[back] == 2
    # one job id on another control plane is another job
    monkeypatch.setenv("GPULAYER_HOME", str(tmp_path / "b"))
    assert gl.get_job(h.id) != h
    # two clients of one server (two tokens) reach the same jobs
    one = client_mod.http_client("http://127.0.0.1:9/", token="one")
    two = client_mod.http_client("http://127.0.0.1:9", token="two")
    try:
        assert gl.JobHandle("job-1", one) == gl.JobHandle("job-1", two) != gl.JobHandle("job-2", two)
        assert hash(gl.JobHandle("job-1", one)) == hash(gl.JobHandle("job-1", two))
    finally:
        one.close()
        two.close()
    h.cancel()
    other.cancel()
