"""The dashboard's pure parts: log and command text, where a login may go on to, session
lifetimes, the fleet summary, and that every page's live regions render on their own."""

from __future__ import annotations

import html
import json
import re
from pathlib import Path

import pytest

from gpulayer.api import LogChunk, LogStream
from gpulayer.hookrecords import Device
from gpulayer.records import JobRecord, JobState, WorkerRecord
from gpulayer.server.dashboard import views
from gpulayer.server.dashboard.sessions import Identity, Sessions, safe_next
from gpulayer.specs import CommandJob
from tests.factories import make_capabilities


def test_logs_lose_terminal_escapes_and_control_characters_but_keep_their_text() -> None:
    raw = "\x1b[1;31mred\x1b[0m plain\x1b]0;a title\x07\r\n10%\r20%\rdone\x00\x08\tok\n"
    assert views.clean_log(raw) == "red plain\n10%\n20%\ndone\tok\n"
    assert views.clean_log("<script>alert(1)</script>") == "<script>alert(1)</script>"  # escaping is Jinja's


def test_commands_show_their_control_characters_written_out() -> None:
    job = JobRecord(id="job-1", spec=CommandJob(command=["printf", "\x1b[31mred\n"]), state=JobState.QUEUED,
                    created_at=0, updated_at=0)
    assert views.what(job) == "printf '\\x1b[31mred\\n'"


@pytest.mark.parametrize(("target", "where"), [
    ("/jobs?state=queued", "/jobs?state=queued"), ("/", "/"), (None, "/"), ("", "/"), ("jobs", "/"),
    ("//evil.example", "/"), ("/\\evil.example", "/"), ("https://evil.example/", "/"), ("/jobs\r\nSet-Cookie: x", "/"),
])
def test_a_login_goes_on_to_a_path_of_this_site_only(target: str | None, where: str) -> None:
    assert safe_next(target) == where


@pytest.mark.parametrize(("target", "where"), [
    ("/gl/jobs?state=queued", "/gl/jobs?state=queued"), ("/gl", "/gl"), ("/gl/", "/gl/"), (None, "/gl/"),
    ("/jobs", "/gl/"), ("/glx/jobs", "/gl/"), ("//evil.example", "/gl/"),
])
def test_under_a_root_path_a_login_goes_on_to_a_path_under_it(target: str | None, where: str) -> None:
    assert safe_next(target, "/gl") == where


def test_a_session_ends_at_its_lifetime_or_its_tokens_expiry() -> None:
    now = [1000.0]
    sessions = Sessions(clock=lambda: now[0], lifetime=100)
    forever = sessions.create(Identity("admin", "tok-a"))
    short = sessions.create(Identity("client", "tok-b", expires_at=1010.0))
    assert forever.id != short.id and forever.csrf != short.csrf and len(forever.id) >= 43
    assert sessions.get(forever.id) is forever and sessions.get(short.id) is short
    now[0] = 1010.0
    assert sessions.get(short.id) is None and sessions.get(forever.id) is forever
    now[0] = 1100.0
    assert sessions.get(forever.id) is None and len(sessions) == 0
    assert sessions.get(None) is None and sessions.get("") is None


def test_csrf_tokens_are_compared_whole() -> None:
    session = Sessions().create(Identity("admin", None))
    assert session.csrf_ok(session.csrf)
    for wrong in (None, "", session.csrf[:-1], session.csrf + "x", "é"):
        assert not session.csrf_ok(wrong)


def test_the_owner_filter_is_the_apis() -> None:
    assert Identity("admin", "tok-a").owner is None
    assert Identity("client", "tok-b").owner == "tok-b"
    assert Identity("client", "tok-b").may_see("tok-b") and not Identity("client", "tok-b").may_see("tok-c")


def _worker(wid: str, devices: list[Device], *, online: bool = True, draining: bool = False) -> WorkerRecord:
    return WorkerRecord(id=wid, name=wid, capabilities=make_capabilities(devices=devices), cpu_slots=4,
                        online=online, draining=draining)


def test_the_fleet_counts_devices_busy_free_and_unavailable_by_kind() -> None:
    cuda = [Device(kind="cuda", index=i, name="GPU") for i in range(3)]
    broken = Device(kind="cuda", index=3, name="GPU", usable=False, unusable_reason="driver too old")
    ws = [
        views.WorkerView(_worker("a", [*cuda, broken]), "online",
                         [views.DeviceView("cuda", d.index, "GPU", "", d.usable, "", d.index == 0) for d in [*cuda, broken]],
                         busy_cpu_slots=1),
        views.WorkerView(_worker("b", cuda[:1], draining=True), "draining",
                         [views.DeviceView("cuda", 0, "GPU", "", True, "", False)], busy_cpu_slots=0),
        views.WorkerView(_worker("c", cuda, online=False), "offline",
                         [views.DeviceView("cuda", 0, "GPU", "", True, "", False)], busy_cpu_slots=0),
    ]
    fleet = views.fleet(ws)
    (kind,) = fleet.kinds
    assert (kind.kind, kind.total, kind.busy, kind.free, kind.unavailable) == ("cuda", 5, 1, 2, 2)
    assert (fleet.online, fleet.draining, fleet.offline, fleet.cpu_slots, fleet.busy_cpu_slots) == (1, 1, 1, 4, 1)


@pytest.mark.parametrize("template", ["overview.html", "jobs.html", "job.html", "workers.html"])
def test_every_live_region_is_an_element_with_its_own_id(template: str) -> None:
    source = views.environment().loader.get_source(views.environment(), template)[0]  # type: ignore[union-attr]
    blocks = [n for n in views.environment().get_template(template).blocks if n.startswith("live_")]
    assert blocks
    for name in blocks:
        assert f'id="{name}"' in source, f"{template}: block {name} is not inside an element with id {name}"


def test_logs_of_several_nodes_get_node_prefixes_and_streams_stay_apart() -> None:
    def chunk(i: int, node: int, stream: LogStream, data: str) -> LogChunk:
        return LogChunk(id=i, task_id=f"tsk-{node}", node_rank=node, stream=stream, data=data, ts=0)

    chunks = [chunk(1, 0, "stdout", "a\nb\n"), chunk(2, 1, "stdout", "c\n"), chunk(3, 1, "stderr", "oops\n")]
    parts = views.log_parts(chunks, prefix=True)
    assert [(p.stream, p.text) for p in parts] == [
        ("stdout", "[node 0] a\n[node 0] b\n[node 1] c\n"), ("stderr", "[node 1] oops\n")]
    assert views.log_parts(chunks[:1], prefix=False)[0].text == "a\nb\n"


def test_a_result_shows_as_json_whether_given_as_its_text_or_as_a_value() -> None:
    from gpulayer.wire import ResultJSON

    template = views.environment().from_string("<pre>{{ result | result_json | truncate(30, True) }}</pre>")
    for result, shown in ((ResultJSON('{"a" : "<b>"}'), '{"a" : "<b>"}'), ({"a": "<b>"}, '{"a": "<b>"}')):
        page = template.render(result=result)
        assert "<b>" not in page and html.unescape(page) == f"<pre>{shown}</pre>"
    assert template.render(result=ResultJSON(json.dumps(list(range(100))))).endswith("...</pre>")


def test_a_job_page_leaves_large_arguments_out_of_the_spec_and_says_where_they_are() -> None:
    from gpulayer.specs import FunctionJob

    rows = [{"i": i, "name": f"item-{i}"} for i in range(5000)]
    record = JobRecord(id="job-000000000001", spec=FunctionJob(function="m:f", args=[rows], kwargs={"k": 1},
                                                               env={"KEY": "secret"}),
                       state=JobState.RUNNING, created_at=0.0, updated_at=0.0)
    shown = json.loads(views.spec_json(record))
    size = len(json.dumps([rows]))
    assert size > views.ARGS_SHOWN
    assert shown == {"function": "m:f", "kwargs": {"k": 1}, "env": {"KEY": "(set)"},
                     "args": f"({size:,} characters of JSON, not shown: gpulayer jobs show job-000000000001 --json)"}
    small = record.model_copy(update={"spec": FunctionJob(function="m:f", args=[1])})
    assert json.loads(views.spec_json(small)) == {"function": "m:f", "args": [1]}


def test_the_workers_page_gives_memory_sizes_with_their_unit(tmp_path: Path) -> None:
    from gpulayer.control import ControlPlane
    from gpulayer.store import Store
    from tests.factories import make_device

    control = ControlPlane(Store(f"sqlite:///{tmp_path / 'db.sqlite'}"))
    control.register_worker(make_capabilities(devices=[make_device(memory_gb=80)], memory_gb=23.5), cpu_slots=1)
    context = {"who": Identity("admin", None), "csrf": "", "notice": None, "current": "workers", "root": "",
               "static": "/static",
               "live": None, "machines_nav": False, **views.workers(control, Identity("admin", None))}
    text = re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", views.render("workers.html", context)))
    assert "23.5 GB memory" in text
    assert "cuda:0 " in text and " 80.0 GB free" in text


def test_the_workers_page_reads_running_jobs_without_their_arguments(tmp_path: Path) -> None:
    """The page lists the tasks each worker runs, and its live stream looks again at every
    change: a function's arguments (up to a megabyte a job) are not read for it."""
    from gpulayer.control import ControlPlane
    from gpulayer.specs import FunctionJob
    from gpulayer.store import Store

    control = ControlPlane(Store(f"sqlite:///{tmp_path / 'db.sqlite'}"))
    worker = control.register_worker(make_capabilities(), cpu_slots=1)
    job = control.submit(FunctionJob(function="m:f", args=["x" * 100_000], kwargs={"k": "y" * 100_000}))
    (task,) = control.poll_tasks(worker.id)
    control.start_task(task.task_id, worker_id=worker.id)
    (view,) = views.workers(control, Identity("admin", None))["workers"]
    ((shown_task, shown_job),) = view.tasks
    assert shown_job.id == job.id and shown_task.id == task.task_id
    assert shown_job.spec.function == "m:f"  # what the page shows of it
    assert shown_job.spec.args == [] and shown_job.spec.kwargs == {}


def test_one_tokens_logins_do_not_push_out_other_sessions() -> None:
    """Each login adds a session and the oldest go past MAX_SESSIONS: a client token logging in
    10,000 times logged every admin out. One token keeps its MAX_SESSIONS_PER_TOKEN newest."""
    from gpulayer.server.dashboard.sessions import MAX_SESSIONS, MAX_SESSIONS_PER_TOKEN

    sessions = Sessions()
    admin = sessions.create(Identity("admin", "tok-admin"))
    client = [sessions.create(Identity("client", "tok-client")) for _ in range(MAX_SESSIONS + 1)]
    assert sessions.get(admin.id) is admin
    assert len(sessions) == 1 + MAX_SESSIONS_PER_TOKEN
    assert all(sessions.get(s.id) is s for s in client[-MAX_SESSIONS_PER_TOKEN:])
    assert sessions.get(client[-MAX_SESSIONS_PER_TOKEN - 1].id) is None
