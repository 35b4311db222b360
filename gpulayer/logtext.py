"""A job's output as the store keeps it and as it is shown, on the standard library alone:
the store (:mod:`gpulayer.store.mapping`), the client and the CLI's light path
(:mod:`gpulayer.cli.light`, which prints ``gpulayer jobs logs`` without SQLAlchemy or
pydantic) share it, so both paths print the same bytes.

Stored: lone surrogates (which no database can encode) become U+FFFD; a chunk with a NUL
(PostgreSQL's text cannot hold one), or one that starts with :data:`QUOTED`, is stored as
that mark followed by the chunk as a JSON string, on every database alike.
"""

from __future__ import annotations

import json
import re

__all__ = ["QUOTED", "NodeLines", "escaped_text", "log_text", "node_refused", "prefixes_nodes", "shown_text",
           "stored_log_text", "utf8_text"]

#: marks a stored chunk whose text is JSON-quoted (a private-use character that output
#: essentially never starts with)
QUOTED = "\ue000"
_LONE_SURROGATE = re.compile("[\ud800-\udfff]")


def utf8_text(data: str) -> str:
    """``data`` as UTF-8 can hold it: each lone surrogate (``'\\udcff'``, what a byte that is not
    UTF-8 becomes in a path or an error message decoded with ``surrogateescape``) replaced by
    U+FFFD, as that byte in a task's output is. (Looked for only in text that does not
    encode: the regular expression scanned each 64 kB chunk character by character, 28% of a
    chatty task's worker CPU; the encode is C.)"""
    if not data.isascii():
        try:
            data.encode()
        except UnicodeEncodeError:
            return _LONE_SURROGATE.sub("\ufffd", data)
    return data


def escaped_text(data: str) -> str:
    """``data`` as UTF-8 can hold it, each lone surrogate as its escape (``'\\udcff'``, as
    Python's ``repr`` and a job's stderr show it): for a message or a path that is shown,
    which says which byte it was, where output keeps U+FFFD (:func:`utf8_text`)."""
    return data.encode("utf-8", "backslashreplace").decode("utf-8") if not data.isascii() else data


def stored_log_text(data: str) -> str:
    """Log text as stored: lone surrogates (not encodable) replaced by U+FFFD (:func:`utf8_text`),
    NUL kept."""
    data = utf8_text(data)
    if "\x00" in data or data.startswith(QUOTED):
        return QUOTED + json.dumps(data)
    return data


def log_text(stored: str) -> str:
    """The text a stored chunk holds (see :func:`stored_log_text`)."""
    if stored.startswith(QUOTED):
        try:
            text: str = json.loads(stored[len(QUOTED):])
            return text
        except ValueError:
            return stored
    return stored


def node_refused(kind: str, nodes: int, node: object) -> str | None:
    """Why a job of ``kind`` with ``nodes`` nodes has no node ``node`` to show the output of
    (None: it has, or no node was asked for)."""
    count = nodes if kind == "distributed" else 1
    if node is None or (type(node) is int and 0 <= node < count):
        return None
    return f"the job has {'one node, 0' if count == 1 else f'nodes 0 to {count - 1}'}"


def prefixes_nodes(kind: str, nodes: int, node: int | None = None) -> bool:
    """Whether a job's output is shown with ``[node R]`` line prefixes: a job of several
    nodes (``kind`` and ``nodes`` of its spec), all of them shown."""
    return kind == "distributed" and nodes > 1 and node is None


def shown_text(data: str, node_rank: int, *, prefix: bool) -> str:
    """A chunk's text as shown, each line prefixed ``[node R] `` when ``prefix``."""
    if not prefix:
        return data
    return "".join(f"[node {node_rank}] {line}" for line in data.splitlines(keepends=True))


#: the most of one node's unfinished line :class:`NodeLines` holds back (characters): past
#: it, what it has is shown as a line of its own, and the line goes on after another prefix
HOLD_LINE = 1024 * 1024


class NodeLines:
    """A job's chunks as shown one after another, each line prefixed ``[node R] `` when
    ``prefix``, whole lines only: a chunk ends wherever its worker's read and shipping
    interval cut the output, often inside a line, so the unfinished line a chunk ends with is
    held until the chunk of that node and stream that ends it. Shown chunk by chunk, another
    node's output landed inside that line, and a second prefix in the middle of it.
    :meth:`rest` gives what is held once the output has ended. Without ``prefix`` the text
    passes as it is."""

    def __init__(self, prefix: bool) -> None:
        self.prefix = prefix
        self._held: dict[tuple[int, str], str] = {}

    def text(self, data: str, node_rank: int, stream: str) -> str:
        """What to show of this chunk now."""
        if not self.prefix:
            return data
        key = (node_rank, stream)
        lines = (self._held.pop(key, "") + data).splitlines(keepends=True)
        if lines and lines[-1].splitlines()[0] == lines[-1]:  # (no line break at its end: the line goes on)
            if len(lines[-1]) < HOLD_LINE:
                self._held[key] = lines.pop()
            else:
                lines[-1] += "\n"
        return "".join(f"[node {node_rank}] {line}" for line in lines)

    def rest(self) -> list[tuple[str, str]]:
        """The unfinished lines held, as ``(stream, text)``, each ended with a line break
        (another node's may follow); none are held after."""
        out = [(stream, f"[node {node_rank}] {line}\n") for (node_rank, stream), line in self._held.items()]
        self._held.clear()
        return out
