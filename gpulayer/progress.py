"""Progress bars for what takes a while outside the job itself: uploading a source bundle.

Drawn by rich on stderr, and only when stderr is a terminal (:func:`is_terminal`): in a
pipe or a log file a bar is noise. rich is imported when a bar is shown, not before.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

__all__ = ["CHUNK", "is_terminal", "upload"]

#: bytes sent per step of the bar
CHUNK = 256 * 1024


def is_terminal(stream: Any) -> bool:
    """``stream`` is a terminal (False for a pipe, a file, a closed or missing stream)."""
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):
        return False


def upload(data: bytes, description: str) -> Iterator[bytes]:
    """``data`` in chunks, advancing a bar (bytes, rate, time left) on stderr as each one is
    taken by the sender. The bar ends when the last chunk is taken or the sender gives up."""
    from rich.console import Console
    from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn, TransferSpeedColumn

    columns = (TextColumn("{task.description}"), BarColumn(), DownloadColumn(), TransferSpeedColumn(),
               TimeRemainingColumn())
    with Progress(*columns, console=Console(stderr=True), transient=False) as bar:
        task = bar.add_task(description, total=len(data))
        view = memoryview(data)
        for start in range(0, len(data), CHUNK):
            piece = bytes(view[start:start + CHUNK])
            yield piece
            bar.advance(task, len(piece))
