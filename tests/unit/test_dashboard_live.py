"""The dashboard's live streams wake for what their page shows (gpulayer.server.dashboard.live,
Server.next_change): a job's page for that job's output, every page for a change or a task's
start, and no page for another job's output. The streams here look at the database again only
every 600 s on their own, so anything a test reads came from a wake."""

from __future__ import annotations

import contextlib
import html
import json
import queue
import re
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from starlette.testclient import TestClient

from gpulayer.control import ControlPlane
from gpulayer.records import TaskState
from gpulayer.server.app import create_app
from gpulayer.server.dashboard import DashboardOptions, views
from gpulayer.specs import CommandJob
from gpulayer.store import Store
from tests.factories import make_capabilities


def _events(lines: Iterator[str]) -> Callable[[], tuple[str, Any]]:
    """The next (event name, its data) of a server-sent event stream, read by a thread of
    its own; one that does not come within a minute fails the test."""
    got: queue.Queue[tuple[str, Any]] = queue.Queue()

    def read() -> None:
        name, data = "message", ""
        with contextlib.suppress(Exception):  # (the stream closed at the test's end)
            for line in lines:
                if line.startswith("event: "):
                    name = line[7:]
                elif line.startswith("data: "):
                    data += line[6:]
                elif not line and data:
                    got.put((name, json.loads(data)))
                    name, data = "message", ""

    threading.Thread(target=read, daemon=True).start()

    def next_event() -> tuple[str, Any]:
        try:
            return got.get(timeout=60)
        except queue.Empty:
            raise AssertionError("no event came: the stream was not woken") from None

    return next_event


def test_a_job_page_wakes_for_its_own_output_and_a_list_page_for_a_start_not_for_output(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    control = ControlPlane(Store(f"sqlite:///{tmp_path / 'server.db'}"), heartbeat_timeout=30, results_as_text=True)
    looks: list[str] = []
    list_look = views.jobs

    def counted(*args: Any, **kwargs: Any) -> Any:
        looks.append("jobs")
        return list_look(*args, **kwargs)

    monkeypatch.setattr(views, "jobs", counted)
    specs = views.spec_json
    monkeypatch.setattr(views, "spec_json", lambda record: looks.append("spec") or specs(record))
    with TestClient(create_app(control, background=False, dashboard=DashboardOptions(recheck=600))) as tc:
        assert tc.post("/login", data={"token": control.create_token(scope="admin").token},
                       follow_redirects=False).status_code == 303
        w = control.register_worker(make_capabilities(), cpu_slots=3)
        mine, theirs, later = (control.submit(CommandJob(command=[c])) for c in ("a", "b", "c"))
        tasks = {t.job_id: t.task_id for t in control.poll_tasks(w.id)}
        for job in (mine, theirs):
            control.start_task(tasks[job.id], worker_id=w.id)
        with tc.stream("GET", f"/live/jobs/{mine.id}") as page, tc.stream("GET", "/live/jobs") as listing:
            events = _events(page.iter_lines())
            assert events()[0] == "regions"  # (its first look)
            list_events = _events(listing.iter_lines())
            assert list_events()[0] == "regions" and looks == ["jobs"]
            # another job's output, then this one's: the page's next event is its own line
            control.append_logs(tasks[theirs.id], worker_id=w.id, chunks=[("stdout", "not mine\n")])
            control.append_logs(tasks[mine.id], worker_id=w.id, chunks=[("stdout", "mine\n")])
            name, data = events()
            while name == "regions":  # (a look on a slow machine may find its times moved on: "running for 2 s")
                name, data = events()
            assert (name, data) == ("log", [["stdout", "mine\n"]])
            # the list page did not look again for either job's output; the job page's looks
            # wrote no spec (no live region shows it)
            assert looks == ["jobs"]
            # a task's start: the list shows the job running (a look, and the new region)
            control.start_task(tasks[later.id], worker_id=w.id)
            name, data = list_events()
            assert name == "regions" and looks == ["jobs", "jobs"]


def test_an_ended_jobs_page_gets_the_rest_of_a_log_longer_than_one_page(tmp_path: Path) -> None:
    """A job's page shows the first page of its log (4 Mi characters) and says that the live
    stream adds the rest: so a job that has ended has a stream too while its log goes on past
    the page, which sends the rest and ends."""
    control = ControlPlane(Store(f"sqlite:///{tmp_path / 'server.db'}"), heartbeat_timeout=30, results_as_text=True)
    with TestClient(create_app(control, background=False, dashboard=DashboardOptions(recheck=600))) as tc:
        assert tc.post("/login", data={"token": control.create_token(scope="admin").token},
                       follow_redirects=False).status_code == 303
        w = control.register_worker(make_capabilities(), cpu_slots=1)
        job = control.submit(CommandJob(command=["yes"]))
        (task,) = control.poll_tasks(w.id)
        control.start_task(task.task_id, worker_id=w.id)
        chunk = 512 * 1024  # what a worker ships at most in one chunk
        lines = [f"{n:07d}" + "x" * (chunk - 8) + "\n" for n in range(9)]  # 4.5 Mi characters
        for line in lines:
            control.append_logs(task.task_id, worker_id=w.id, chunks=[("stdout", line)])
        control.finish_task(task.task_id, worker_id=w.id, state=TaskState.SUCCEEDED, exit_code=0)

        page = tc.get(f"/jobs/{job.id}").text
        assert "the live stream adds the rest" in page
        shown = [line[:7] for line in lines if line[:7] in page]
        assert shown == [f"{n:07d}" for n in range(8)]  # the first page: 4 Mi characters
        live = re.search(r'data-live="([^"]+)"', page)
        assert live, "the page of an ended job with more log than it shows has no live stream"
        got: list[str] = []
        with tc.stream("GET", html.unescape(live.group(1))) as stream:
            events = _events(stream.iter_lines())
            while (event := events())[0] != "end":
                if event[0] == "log":
                    got.extend(text for _, text in event[1])
        assert "".join(got) == lines[8]


@pytest.mark.parametrize("after", ["²", "1²", "-1", "x", "4611686018427387905", "9" * 5000])
def test_a_live_streams_after_that_is_not_a_log_chunk_id_is_a_clear_error(tmp_path: Path, after: str) -> None:
    """``?after=`` is refused naming itself and what it takes (``²`` is a digit to
    ``str.isdigit`` but not to ``int``: it was an internal error); a ``Last-Event-ID`` header
    that is no chunk id is ignored (the browser sends back what it got)."""
    control = ControlPlane(Store(f"sqlite:///{tmp_path / 'server.db'}"), heartbeat_timeout=30, results_as_text=True)
    with TestClient(create_app(control, background=False, dashboard=DashboardOptions(recheck=600))) as tc:
        assert tc.post("/login", data={"token": control.create_token(scope="admin").token},
                       follow_redirects=False).status_code == 303
        job = control.submit(CommandJob(command=["true"]))
        control.cancel(job.id)
        r = tc.get(f"/live/jobs/{job.id}", params={"after": after})
        assert r.status_code == 422, r.text
        assert r.text.startswith("query.after=") and "expected a whole number from 0 to 4611686018427387904" in r.text
        r = tc.get(f"/live/jobs/{job.id}", headers=[(b"last-event-id", after.encode("utf-8"))])
        assert r.status_code == 200 and "event: end" in r.text, r.text


def test_the_jobs_page_says_when_it_shows_only_the_newest_and_keeps_its_limit(tmp_path: Path) -> None:
    """``limit`` (default 100) cuts the list: the page says so, links to a longer one, and its
    state filter keeps the limit it was given."""
    control = ControlPlane(Store(f"sqlite:///{tmp_path / 'server.db'}"), heartbeat_timeout=30, results_as_text=True)
    with TestClient(create_app(control, background=False, dashboard=DashboardOptions(recheck=600))) as tc:
        assert tc.post("/login", data={"token": control.create_token(scope="admin").token},
                       follow_redirects=False).status_code == 303
        ids = [control.submit(CommandJob(command=["true"])).id for _ in range(3)]

        def rows(page: str) -> list[str]:
            return re.findall(r'<th scope="row"><a href="/jobs/([^"]+)"', page)

        page = tc.get("/jobs", params={"limit": "2"}).text
        assert rows(page) == ids[:0:-1]  # the two newest
        assert "Only the 2 newest are shown" in page
        assert '<a href="/jobs?state=&amp;limit=1000">the 1,000 newest</a>' in page
        # the next page: the jobs submitted before the last one shown, and a way back
        older = re.search(r'<a href="(/jobs\?[^"]+)" rel="next">older jobs</a>', page)
        assert older is not None and f"before={ids[1]}" in older[1]
        back = tc.get(older[1].replace("&amp;", "&")).text
        assert rows(back) == ids[:1] and f"Jobs submitted before {ids[1]}" in back
        assert 'rel="next"' not in back and '<a href="/jobs?state=&amp;limit=2">newest jobs</a>' in back
        missing = tc.get("/jobs", params={"before": "job-000000000000"})
        assert missing.status_code == 404 and "no such job" in missing.text
        assert '<input type="hidden" name="limit" value="2">' in page  # the filter keeps it
        state = control.get_job(ids[0]).state.value  # (all three are in the same one)
        filtered = tc.get("/jobs", params={"state": state, "limit": "2"}).text
        assert f'<a href="/jobs?state={state}&amp;limit=1000">' in filtered
        for whole in (tc.get("/jobs").text, tc.get("/jobs", params={"limit": "3"}).text):
            assert rows(whole) == ids[::-1] and "newest are shown" not in whole
        assert 'name="limit"' not in tc.get("/jobs").text  # the default needs none
        with tc.stream("GET", "/live/jobs?limit=2") as stream:
            name, regions = _events(stream.iter_lines())()
            assert name == "regions" and "Only the 2 newest are shown" in regions["live_jobs_more"]


def test_a_job_page_whose_job_is_deleted_says_so_and_ends_its_stream_quietly(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A job deleted while its page is open (by another process here: its changes wake no
    stream, so the deletion is all there is to find at the next look): the look found no job,
    which logged a traceback ("live stream ended: looking failed") and left the browser to
    reconnect, to a page that is gone. The stream now says ``deleted`` (the page shows its
    message) and ends, and the server logs no warning."""
    path = tmp_path / "server.db"
    control = ControlPlane(Store(f"sqlite:///{path}"), heartbeat_timeout=30, results_as_text=True)
    with TestClient(create_app(control, background=False, dashboard=DashboardOptions(recheck=600))) as tc:
        assert tc.post("/login", data={"token": control.create_token(scope="admin").token},
                       follow_redirects=False).status_code == 303
        w = control.register_worker(make_capabilities(), cpu_slots=1)
        job = control.submit(CommandJob(command=["a"]))
        (task,) = control.poll_tasks(w.id)
        control.start_task(task.task_id, worker_id=w.id)
        caplog.set_level("DEBUG", logger="gpulayer")
        # its page, and a page of the jobs submitted before it (the job is that list's cursor)
        with tc.stream("GET", f"/live/jobs/{job.id}") as page, \
                tc.stream("GET", f"/live/jobs?before={job.id}") as older:
            events, older_events = _events(page.iter_lines()), _events(older.iter_lines())
            assert events()[0] == "regions" and older_events()[0] == "regions"  # (their first looks)
            other = ControlPlane(Store(f"sqlite:///{path}"), heartbeat_timeout=30)
            other.finish_task(task.task_id, worker_id=w.id, state=TaskState.SUCCEEDED, exit_code=0)
            assert other.delete_jobs([job.id]).deleted == [job.id]
            other.store.dispose()
            control.submit(CommandJob(command=["b"]))  # a change in this process: every page looks again
            assert events() == ("deleted", {"message": f"Job {job.id} was deleted; nothing more will change."})
            assert older_events() == ("deleted", {
                "message": f"Job {job.id} was deleted: this page lists the jobs submitted before it. "
                           "Open the list of jobs again to see the newest."})
    assert [(r.levelname, r.getMessage()) for r in caplog.records if r.levelno >= 30 or r.exc_info] == []
