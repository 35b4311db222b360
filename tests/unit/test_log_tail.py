"""A job's last lines (``logs(tail=N)``, ``handle.logs(tail=N)``): read from the newest chunk
back on every database, lines counted in the output as written (streams together), a line
split across chunks whole, an unterminated last line one of them; the same from a control
plane from before ``tail``, whose whole output is read and its end kept."""

from __future__ import annotations

import re
import threading
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

import gpulayer as gl
from gpulayer import client as client_mod
from gpulayer.api import MAX_LOG_CHUNKS
from gpulayer.client import Client
from gpulayer.control import ControlPlane
from gpulayer.errors import InvalidInput, NotFound
from gpulayer.logtail import MAX_TAIL, kept_end, tail_start
from gpulayer.records import TaskState
from gpulayer.specs import CommandJob
from gpulayer.store import queries
from tests.factories import make_capabilities

Chunks = list[tuple[Any, str]]


def last_lines(text: str, n: int) -> str:
    """What ``tail -n N`` prints of ``text``: its last N lines, an unterminated last one counted."""
    lines = re.findall(r"[^\n]*\n|[^\n]+\Z", text)
    return "".join(lines[max(0, len(lines) - n):]) if n else ""


def tail_text(chunks: list[str], n: int) -> str:
    """The text from where :func:`tail_start` says the last ``n`` lines of ``chunks`` start."""
    start = tail_start(reversed(list(enumerate(chunks))), n)
    if start is None:
        return ""
    first, cut = start
    return chunks[first][cut:] + "".join(chunks[first + 1:])


@given(st.lists(st.text(alphabet="ab\néx", max_size=8), max_size=12), st.integers(min_value=0, max_value=15))
def test_the_last_lines_start_where_tail_says_however_the_output_was_cut_into_chunks(chunks: list[str], n: int) -> None:
    assert tail_text(chunks, n) == last_lines("".join(chunks), n)
    # and a reader that can only read from the start keeps the chunks that hold them
    kept = kept_end(list(enumerate(chunks)), n, lambda c: c[1])
    start = tail_start(reversed(kept), n)
    assert start is None or start[0] >= (kept[0][0] if kept else 0)
    assert tail_text(chunks, n) == ("" if start is None else chunks[start[0]][start[1]:] + "".join(
        text for i, text in kept if i > start[0]))


def test_a_reader_of_the_whole_output_holds_no_more_than_the_chunks_of_its_last_lines() -> None:
    chunks = [(i, f"line {i}\n") for i in range(1000)]
    assert kept_end(chunks, 3, lambda c: c[1]) == chunks[-4:]  # (a line more: the end of the one before)
    assert kept_end(chunks, 0, lambda c: c[1]) == chunks[-1:]
    assert kept_end([(0, "x" * 10)] * 5, 1, lambda c: c[1]) == [(0, "x" * 10)] * 5  # one line, all of it


def finished_job(cp: ControlPlane, chunks: Chunks, *, end: bool = True) -> tuple[str, str, str]:
    """A command job whose task wrote ``chunks`` (and ended, with ``end``): its id, task id, worker id."""
    w = cp.register_worker(make_capabilities(), cpu_slots=1)
    job = cp.submit(CommandJob(command=["x"]))
    [a] = cp.poll_tasks(w.id)
    cp.start_task(a.task_id, worker_id=w.id)
    cp.append_logs(a.task_id, worker_id=w.id, chunks=chunks)
    if end:
        cp.finish_task(a.task_id, worker_id=w.id, state=TaskState.SUCCEEDED, exit_code=0)
    return job.id, a.task_id, w.id


#: streams interleaved, lines split across chunks and across the two streams, characters of
#: several bytes, text stored quoted (a NUL), more chunks than a page read back, no line feed at the end
MIXED: Chunks = [("stdout", "fïrst\nsec"), ("stderr", "warn: ✓\n"), ("stdout", "ond\n"), ("stdout", "a\x00b\n")] + [
    ("stdout" if i % 3 else "stderr", f"line {i} ü" + ("\n" if i % 2 else "")) for i in range(2 * queries.BACK_PAGE + 7)
] + [("stderr", "done 日本\n"), ("stdout", "the end, no line feed")]
WHOLE = "".join(text for _, text in MIXED)


@pytest.mark.parametrize("n", [0, 1, 2, 3, 10, 300, 400, MAX_TAIL])
def test_the_last_lines_of_a_job_s_output_on_every_database(cp: ControlPlane, n: int) -> None:
    job_id, _, _ = finished_job(cp, MIXED)
    page = cp.logs(job_id, tail=n)
    assert "".join(c.data for c in page) == last_lines(WHOLE, n)
    # each chunk on its own stream, as written: only the first one cut
    whole = cp.logs(job_id)
    assert [(c.id, c.stream) for c in page] == [(c.id, c.stream) for c in whole[len(whole) - len(page):]]
    assert [c.data for c in page[1:]] == [c.data for c in whole[len(whole) - len(page) + 1:]]
    if n == 0:  # (the newest chunk, emptied: where a follower goes on)
        assert [(c.id, c.data) for c in page] == [(whole[-1].id, "")]


def test_the_last_lines_are_found_from_the_end_without_reading_the_rest(cp: ControlPlane) -> None:
    """Only the newest page of ids is read back for a few lines of a long output."""
    job_id, _, _ = finished_job(cp, [("stdout", f"{i}\n") for i in range(3 * queries.BACK_PAGE)])
    pulled = 0
    with cp.store.read() as s:
        def counted() -> Any:
            nonlocal pulled
            for chunk in queries.logs_backwards(s, job_id, after=0, node=None):
                pulled += 1
                yield chunk
        start = tail_start(counted(), 10)
    assert start is not None and pulled == 11  # (one page of BACK_PAGE: one query)
    assert [c.data for c in cp.logs(job_id, tail=10)] == [f"{i}\n" for i in range(3 * queries.BACK_PAGE - 10,
                                                                                   3 * queries.BACK_PAGE)]


def test_the_last_lines_of_a_node_of_a_job_or_of_a_job_without_output(cp: ControlPlane) -> None:
    workers = [cp.register_worker(make_capabilities(), cpu_slots=1).id for _ in range(2)]
    job = cp.submit(gl.DistributedJob(entry="train.py", nodes=2))
    for w in workers:
        for a in cp.poll_tasks(w):
            cp.start_task(a.task_id, worker_id=w)
            cp.append_logs(a.task_id, worker_id=w, chunks=[("stdout", f"rank {a.node_rank} {i}\n") for i in range(5)])
    assert [c.data for c in cp.logs(job.id, tail=2, node=1)] == ["rank 1 3\n", "rank 1 4\n"]
    assert [(c.node_rank, c.data) for c in cp.logs(job.id, tail=1, node=0)] == [(0, "rank 0 4\n")]
    silent, _, _ = finished_job(cp, [])
    assert cp.logs(silent, tail=5) == [] and cp.logs(silent, tail=0) == []
    with pytest.raises(NotFound):
        cp.logs("job-000000000000", tail=1)


def test_more_last_lines_than_a_page_holds_are_read_on_after_it(gpulayer_home: Path) -> None:
    """The first page of a long tail ends as any page does; the client reads the rest."""
    cp = client_mod.connect().control
    assert cp is not None
    chunks: Chunks = [("stdout", f"{i}\n") for i in range(MAX_LOG_CHUNKS + 100)]
    job_id, _, _ = finished_job(cp, chunks)
    assert len(cp.logs(job_id, tail=MAX_LOG_CHUNKS + 50)) == MAX_LOG_CHUNKS
    want = "".join(f"{i}\n" for i in range(50, MAX_LOG_CHUNKS + 100))
    assert gl.get_job(job_id).logs(tail=MAX_LOG_CHUNKS + 50) == want


def refusing_tail(client: Client, asked: list[Any]) -> None:
    """``client``'s control plane as one from before ``tail`` answers: it refuses the field (as a
    server words an unknown query field) and reads pages as before."""
    real = client.api.logs

    def older(job_id: str, **kw: Any) -> Any:
        asked.append(kw.get("tail"))
        if "tail" in kw:
            raise InvalidInput(f"query.tail='{kw['tail']}': no such field; accepted: after, node, limit, wait")
        return real(job_id, **kw)

    client.api.logs = older  # type: ignore[method-assign]


@pytest.mark.parametrize("n", [0, 1, 3, 400])
def test_a_control_plane_from_before_tail_has_its_output_read_and_its_end_kept(gpulayer_home: Path, n: int) -> None:
    client = client_mod.connect()
    assert client.control is not None
    job_id, _, _ = finished_job(client.control, MIXED)
    asked: list[Any] = []
    refusing_tail(client, asked)
    handle = gl.get_job(job_id)
    assert handle.logs(tail=n) == last_lines(WHOLE, n)
    assert handle.logs(tail=n) == last_lines(WHOLE, n)
    assert asked[0] == n and asked[1:] == [None] * (len(asked) - 1)  # refused once, not asked again
    assert "".join(handle.follow(tail=n)) == last_lines(WHOLE, n)


def test_follow_with_a_tail_gives_the_last_lines_then_what_follows(gpulayer_home: Path) -> None:
    client = client_mod.connect()
    cp = client.control
    assert cp is not None
    job_id, task_id, worker_id = finished_job(cp, [("stdout", "a\nb\n"), ("stderr", "c\n"), ("stdout", "d")], end=False)
    got = client.follow(job_id, tail=2)
    first = [(next(got).data, next(got).data)]
    assert first == [("c\n", "d")]
    more = threading.Timer(0.2, lambda: (cp.append_logs(task_id, worker_id=worker_id, chunks=[("stdout", "e\nf\n")]),
                                         cp.finish_task(task_id, worker_id=worker_id, state=TaskState.SUCCEEDED,
                                                        exit_code=0)))
    more.start()
    assert [c.data for c in got] == ["e\nf\n"]
    more.join()
    # tail=0: nothing of what was written before, as `tail -n 0 -f`
    assert list(client.follow(job_id, tail=0)) == []


@pytest.mark.parametrize(("tail", "says"), [
    (-1, "out of range"), (MAX_TAIL + 1, "out of range"), (True, "not a whole number"), ("3", "not a whole number"),
    (2.0, "not a whole number"),
])
def test_a_tail_that_is_not_a_number_of_lines_is_refused_naming_it(gpulayer_home: Path, tail: Any, says: str) -> None:
    job_id, _, _ = finished_job(client_mod.connect().control, [("stdout", "x\n")])  # type: ignore[arg-type]
    handle = gl.get_job(job_id)
    with pytest.raises(gl.InvalidInput) as err:
        handle.logs(tail=tail)
    assert str(err.value) == f"handle.logs(tail={tail!r}): {says}; accepted: a whole number from 0 to 100,000"
    with pytest.raises(gl.InvalidInput, match=re.escape(f"handle.follow(tail={tail!r}): {says}")):
        list(handle.follow(tail=tail))
