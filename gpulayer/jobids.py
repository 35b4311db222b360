"""A job's id as a spec field takes it (``after``, ``after_ended``): the id, or a job's handle."""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import AfterValidator, BeforeValidator

from gpulayer.errors import InvalidInput

__all__ = ["MAX_AFTER", "JobId"]


def _job_id(value: object) -> object:
    """A job's handle (anything with a ``job_id`` or an ``id`` of text) stands for its id."""
    for name in ("job_id", "id"):
        found = getattr(value, name, None)
        if isinstance(found, str) and not isinstance(value, str):
            return found
    return value


_JOB_ID_RE = re.compile(r"^job-[0-9a-f]{1,64}$")


def _check_job_id(value: str) -> str:
    if not _JOB_ID_RE.match(value):
        raise InvalidInput("not a job id; accepted: a job's id, job- and hexadecimal digits (gpulayer jobs list)")
    return value


#: a job's id (``job-`` and hexadecimal digits), or a handle of one (see _job_id)
JobId = Annotated[str, BeforeValidator(_job_id), AfterValidator(_check_job_id)]
#: the most jobs one job may run after
MAX_AFTER = 100
