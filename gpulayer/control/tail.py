"""A job's last lines, read from the end (``logs(tail=N)``: :mod:`gpulayer.logtail`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from gpulayer.api import LOG_PAGE_TEXT, LogChunk
from gpulayer.logtail import tail_start
from gpulayer.store import mapping, plain, queries

if TYPE_CHECKING:
    from gpulayer.control.jobs import JobOps


def tail_page(plane: JobOps, job_id: str, *, lines: int, after: int, node: int | None, limit: int) -> list[LogChunk]:
    """The first page of the job's last ``lines`` lines among its chunks after ``after``: the
    chunks from the one they start in, its text cut there (to nothing for ``lines=0``), at most
    ``limit`` of them and :data:`LOG_PAGE_TEXT` characters as any page. One read: where they
    start is found from the newest chunk back, a page of ids at a time, so that the chunks
    before them are never read."""
    with plane.store.read() as s:
        if plain.job_state(s, job_id) is None:
            raise plain.not_found("job", job_id)
        start = tail_start(queries.logs_backwards(s, job_id, after=after, node=node), lines)
        if start is None:
            return []
        first, cut = start
        page = [mapping.log_chunk(r) for r in queries.logs(s, job_id, after=first - 1, node=node, limit=limit,
                                                           text=LOG_PAGE_TEXT)]
    if page and cut:
        page[0] = page[0].model_copy(update={"data": page[0].data[cut:]})
    return page
