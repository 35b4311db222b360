"""What a serving process keeps between requests (gpulayer.server.state): how long a worker
poll that hears of nothing waits, and how a waiting poll is woken."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

from gpulayer.control import ControlPlane
from gpulayer.server.state import FIRST_POLL_SPREAD, POLL_SPREAD, Batches, Server, wait_woken
from gpulayer.store import Store


def make_server(tmp_path: Path) -> Server:
    return Server(ControlPlane(Store(f"sqlite:///{tmp_path / 'server.db'}")))


def test_a_fleet_that_polls_at_once_is_spread_over_its_first_wait(tmp_path: Path) -> None:
    server = make_server(tmp_path)
    first = [server.poll_wait(f"wkr-{i}", 20.0) for i in range(2000)]
    later = [server.poll_wait(f"wkr-{i}", 20.0) for i in range(2000)]
    # the first poll of each worker ends within the last half of its wait, spread across it
    assert all(20.0 * (1 - FIRST_POLL_SPREAD) <= w <= 20.0 for w in first)
    assert max(first) - min(first) > 0.8 * 20.0 * FIRST_POLL_SPREAD
    # later ones near their full wait, still apart
    assert all(20.0 * (1 - POLL_SPREAD) <= w <= 20.0 for w in later)
    assert len(set(later)) > 1000
    assert server.poll_wait("wkr-0", 0.0) == 0.0


def test_a_waiting_poll_is_woken_by_its_worker_only(tmp_path: Path) -> None:
    server = make_server(tmp_path)

    async def main() -> tuple[bool, bool, bool, bool]:
        a, b = server.arm("wkr-a"), server.arm("wkr-b")
        waits = asyncio.gather(wait_woken(a, 30.0), wait_woken(b, 0.05))
        await asyncio.sleep(0)
        server._wake_workers(frozenset({"wkr-a", "wkr-unknown"}))
        woke_a, woke_b = await waits
        # a wake after the poll was answered changes nothing; a fresh arm is not woken by it
        server._wake_workers(frozenset({"wkr-a"}))
        c = server.arm("wkr-a")
        server._wake_all()
        return woke_a, woke_b, a.result(), await wait_woken(c, 30.0)

    server._loop = None  # no observer callbacks from threads here
    assert asyncio.run(main()) == (True, False, True, True)


def test_a_jobs_output_wakes_its_followers_and_its_page_but_not_the_waits_for_jobs(tmp_path: Path) -> None:
    """A running job that prints (a chunk every 0.1 s) must not wake every waiting long
    poll to read its job again, nor every dashboard page; its own page and the long polls
    for its logs still hear of it (not those for another job's). A task's start wakes the
    pages (a list shows the job running); a change wakes everything."""
    server = make_server(tmp_path)

    async def main() -> dict[str, object]:
        seen: dict[str, object] = {}
        page, a_page, b_page = server.next_change(), server.next_change("job-a"), server.next_change("job-b")
        waiting = asyncio.create_task(server.changed(server.change_event(), 30.0))
        mine, theirs = server.follow("job-a"), server.follow("job-b")
        await asyncio.sleep(0)
        server._wake_progress("job-a", True)  # output
        await asyncio.sleep(0.05)
        seen["output"] = (a_page.is_set(), b_page.is_set(), page.is_set(), waiting.done(), mine.done(), theirs.done())
        a_page = server.next_change("job-a")
        server._wake_progress("job-b", False)  # job-b's task started
        seen["start"] = (a_page.is_set(), b_page.is_set(), page.is_set(), waiting.done())
        server.unfollow("job-a", mine)
        page, a_page = server.next_change(), server.next_change("job-a")
        server._wake()  # a change (a job ended): all hear of it
        await asyncio.wait_for(waiting, 30.0)
        server.unfollow("job-b", theirs)
        seen["change"] = (a_page.is_set(), page.is_set(), theirs.done(), server.next_change() is not page)
        seen["left"] = (dict(server._followers), dict(server._job_pages))
        return seen

    server._loop = None
    assert asyncio.run(main()) == {
        "output": (True, False, False, False, True, False),
        "start": (True, True, True, False),
        "change": (True, True, True, True),
        "left": ({}, {}),
    }


def test_a_change_between_a_waits_read_and_its_wait_is_not_missed(tmp_path: Path) -> None:
    """A wait for a job takes the change event before it reads: a change made while it
    read ends its wait at once (it was noticed at the next look, up to a second later)."""
    server = make_server(tmp_path)

    async def main() -> bool:
        event = server.change_event()  # ... the wait reads the job here, and meanwhile:
        server._wake()
        waiting = asyncio.create_task(server.changed(event, 30.0))
        done, _ = await asyncio.wait({waiting}, timeout=10.0)  # (it ends at once; the bug, in 30 s)
        return waiting in done

    server._loop = None
    assert asyncio.run(main()) is True


def test_a_gathering_batch_is_served_at_once_when_a_call_in_it_is_hurried() -> None:
    """A worker poll's first look waits (FIRST_LOOK_GATHER) for others to share its read,
    unless its worker is given work meanwhile: then the batch is served at once, the others
    in it too."""
    served: list[dict[str, int]] = []

    def fn(batch: dict[str, int]) -> dict[str, str]:
        served.append(dict(batch))
        return {k: k.upper() for k in batch}

    batches: Batches[int, str] = Batches(fn, gather=600.0)  # (a gathering no test would wait out)

    async def main() -> tuple[bool, list[str]]:
        woken: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        calls = [asyncio.ensure_future(batches.submit("a", 1, hurry=woken)),
                 asyncio.ensure_future(batches.submit("b", 2))]
        await asyncio.sleep(0.05)
        gathering = not any(c.done() for c in calls)
        woken.set_result(True)
        return gathering, list(await asyncio.wait_for(asyncio.gather(*calls), 60.0))

    assert asyncio.run(main()) == (True, ["A", "B"])
    assert served == [{"a": 1, "b": 2}]


def test_a_worker_heard_while_the_database_was_full_is_not_written_off_once_it_can_be_written(
        tmp_path: Path) -> None:
    """A full disk under a server's database failed its workers' heartbeats (HTTP 500): the
    worker kept calling, but once the disk had room the next expiry found its last written
    heartbeat older than the timeout and marked it offline and its running task lost (a job
    without retries failed), before its next heartbeat came. A database that could not be
    written is a silence of the server's, not of the worker's (a real full tmpfs; root only)."""
    import subprocess

    import pytest

    from gpulayer.records import TaskState
    from gpulayer.specs import CommandJob
    from tests.factories import Clock, make_capabilities
    from tests.support import mount_small_tmpfs

    mount = tmp_path / "small"
    mount.mkdir()
    mount_small_tmpfs(mount, "2m")
    try:
        clock = Clock()
        control = ControlPlane(Store(f"sqlite:///{mount / 'server.db'}"), heartbeat_timeout=10.0, clock=clock)
        server = Server(control)
        server._loop = None  # no observer callbacks from threads here
        w = control.register_worker(make_capabilities(), cpu_slots=1)
        job = control.submit(CommandJob(command=["true"]))
        [a] = control.poll_tasks(w.id)
        control.start_task(a.task_id, worker_id=w.id)
        filler = mount / "filler"
        with open(filler, "wb") as f:  # the disk, full
            with contextlib.suppress(OSError):
                while True:
                    f.write(b"\0" * 65536)
                    f.flush()

        async def beat() -> None:
            await server.heartbeat(w.id, [a.task_id])

        for _ in range(5):  # it calls through the failure, a heartbeat every 5 s
            clock.now += 5
            with pytest.raises(Exception, match="database or disk is full"):
                asyncio.run(beat())
        filler.unlink()  # room again; the expiry comes before the worker's next heartbeat
        assert control.expire_workers() == []
        record = control.get_job(job.id)
        assert record.tasks[0].state is TaskState.RUNNING
        clock.now += 5
        asyncio.run(beat())
        clock.now += 8  # heard, written: silence counts again from its last heartbeat
        assert control.expire_workers() == []
        clock.now += 20
        assert control.expire_workers() == [w.id]
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def test_workers_that_come_and_go_leave_nothing_in_the_server_s_memory(tmp_path: Path) -> None:
    """A fleet whose workers join, poll and leave (1,000 over a few weeks of machines
    coming and going) left a poll future, a "known" entry and a "spread" entry per worker
    for ever: the server's memory grew with every worker that had ever polled it."""
    from starlette.testclient import TestClient

    from gpulayer.http_client import connect_http
    from gpulayer.server.app import create_app
    from tests.factories import make_capabilities

    control = ControlPlane(Store(f"sqlite:///{tmp_path / 'server.db'}"), heartbeat_timeout=30)
    app = create_app(control, background=False)
    join = control.create_token(scope="join").token
    with TestClient(app) as tc:
        server: Server = app.state.server
        for i in range(60):
            reply = connect_http("http://testserver", token=None, retry_for=0.5,
                                 transport=tc._transport).join_worker(make_capabilities(), join_token=join)
            worker = connect_http("http://testserver", token=reply.token, retry_for=0.5, transport=tc._transport)
            worker.heartbeat(reply.worker_id, running=[])
            worker.poll_work(reply.worker_id, wait=0.05 if i % 2 else 0.0)  # (a wait that runs out, and none)
            if i % 3:  # most leave; the others just stop polling
                worker.deregister_worker(reply.worker_id)
        assert server._worker_events == {} and server._polling == {}
        # (those that never said they left are forgotten when they expire)
        assert len(server._known) <= 20 and len(server._spread) <= 20
