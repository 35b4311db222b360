"""The last lines of a job's output (``gpulayer jobs logs --tail N``, ``handle.logs(tail=N)``),
on the standard library alone: the control plane, the client and the CLI's light path share it.

Lines are counted in the output as written, its chunks one after another in the order they
were stored (stdout and stderr, and the nodes of a job of several, together), as ``tail -n``
counts the output of ``gpulayer jobs logs JOB 2>&1``: a line ends with a line feed, and text
after the last one is a line too. The chunks are read from the newest back, so a job with
100 MB of output has only the chunks that hold its last lines read to find where they start.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable
from typing import TypeVar

__all__ = ["MAX_TAIL", "checked_tail", "kept_end", "tail_start"]

#: the most lines ``--tail`` takes (a larger tail is the whole output, read as such)
MAX_TAIL = 100_000
#: what ``--tail`` and ``tail=`` accept, as an error says it
TAIL_ACCEPTED = f"a whole number from 0 to {MAX_TAIL:,}"

C = TypeVar("C")


def checked_tail(value: object, spelled: str) -> int:
    """``value`` as a number of lines to show, or :class:`~gpulayer.errors.InvalidArgument`
    naming it as ``spelled`` (``handle.logs(tail=-1)``) and what is accepted."""
    from gpulayer.errors import InvalidArgument

    if type(value) is not int:
        raise InvalidArgument(f"{spelled}: not a whole number; accepted: {TAIL_ACCEPTED}")
    if not 0 <= value <= MAX_TAIL:
        raise InvalidArgument(f"{spelled}: out of range; accepted: {TAIL_ACCEPTED}")
    return value


def tail_start(newest_first: Iterable[tuple[int, str]], lines: int) -> tuple[int, int] | None:
    """Where the last ``lines`` lines of the chunks start: the id of a chunk and the offset in
    its text (characters), from ``(id, text)`` pairs newest first, read only as far back as
    needed. None: there are no chunks. Fewer lines than asked: the first chunk, from 0.
    ``lines=0``: the end of the newest chunk (from which a follower goes on)."""
    seen = 0  # line feeds counted so far, from the end
    wanted: int | None = None  # line feeds to pass: one more when the output ends with one
    oldest: int | None = None  # (and the chunk read before it, newer)
    for chunk_id, text in newest_first:
        if oldest is None and lines == 0:
            return chunk_id, len(text)
        newer, oldest = oldest, chunk_id
        if wanted is None:
            if not text:
                continue
            wanted = lines + (1 if text.endswith("\n") else 0)
        count = text.count("\n")
        if seen + count >= wanted:
            at = len(text)
            for _ in range(wanted - seen):
                at = text.rindex("\n", 0, at)
            # (they start after this chunk's last line feed: in the newer chunk, whole)
            return (newer, 0) if at + 1 == len(text) and newer is not None else (chunk_id, at + 1)
        seen += count
    return None if oldest is None else (oldest, 0)


def kept_end(chunks: Iterable[C], lines: int, text: Callable[[C], str]) -> list[C]:
    """Of ``chunks`` (oldest first, read to their end), the newest that hold the last ``lines``
    lines and the chunk they start in (:func:`tail_start` says where), oldest first: what a
    reader keeps of a control plane that cannot read from the end (one from before ``tail``),
    holding no more than those chunks at once."""
    kept: deque[C] = deque(maxlen=1 if lines == 0 else None)
    feeds = 0  # line feeds in the kept chunks after the first
    for chunk in chunks:
        kept.append(chunk)
        if len(kept) > 1:
            feeds += text(chunk).count("\n")
        # the first is not needed once those after it hold a line feed more than the lines
        # (the one that ends the line before them, should the output end with a line feed)
        while len(kept) > 1 and feeds > lines:
            kept.popleft()
            feeds -= text(kept[0]).count("\n")
    return list(kept)
