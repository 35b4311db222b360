"""The fields of a reply's records that a server sends only to a client that reads them.

A client older than the lenient read of records (docs/server.md, "Upgrading") refuses an
answer with a field it does not know. A field added since that is in most answers (a task's
``usage``) is therefore sent only to a client that names it in its :data:`READS_HEADER`;
GPUlayer's own clients name every such field they read (:data:`READS`).
"""

from __future__ import annotations

from typing import Any

from gpulayer.records import JobRecord

__all__ = ["READS", "READS_HEADER", "reads_usage", "without_usage"]

#: the request header in which a client names the fields of a reply's records that it reads
#: and an older client would refuse (``usage``: a task's; docs/server.md, "Upgrading"). A server
#: sends them only to a client that names them; any other client reads the records it knew
READS_HEADER = "gpulayer-reads"
#: what this GPUlayer's clients say in it
READS = "usage"


def reads_usage(header: str) -> bool:
    """Whether a request's :data:`READS_HEADER` (``usage``, or a list with commas) names ``usage``."""
    return READS in (part.strip() for part in header.split(","))


def without_usage(answer: Any) -> Any:
    """``answer`` (a reply: a job's record, a list of them, or another) without its tasks'
    ``usage``, for a client that does not read it (see :data:`READS_HEADER`); the records
    given are left as they are."""
    if isinstance(answer, JobRecord):
        if not any(t.usage is not None for t in answer.tasks):
            return answer
        return answer.model_copy(update={"tasks": [t.model_copy(update={"usage": None}) for t in answer.tasks]})
    if isinstance(answer, list) and answer and isinstance(answer[0], JobRecord):
        return [without_usage(job) for job in answer]
    return answer
