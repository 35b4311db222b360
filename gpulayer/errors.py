"""GPUlayer's exceptions.

Every error GPUlayer raises on purpose derives from :class:`GpulayerError`::

    GpulayerError
    ├── InvalidInput            bad user input: names the input and what is accepted
    │   ├── InvalidRequirement  a framework spec, profile, accelerator, ... that cannot be used
    │   ├── InvalidArgument     a FunctionJob argument that is not JSON
    │   └── BundleError         a source bundle that is too large, unsafe, or not what it claims
    ├── PluginError             a plugin conflict, an unknown hook, a plugin asked for but broken
    ├── NotFound                no job, worker, task, bundle or token with that id
    ├── Conflict                a state transition that is not allowed (a late report, ...)
    ├── Unschedulable           no registered worker could ever run the job (carries reasons)
    ├── JobFailed               the job ended without success (carries its state and exit code)
    │   └── RemoteError         a FunctionJob raised: remote type, message and traceback
    ├── AuthError               missing or wrong token (401) or wrong scope (403)
    └── ConnectionFailed        the control plane could not be reached
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "AuthError",
    "BundleError",
    "Conflict",
    "ConnectionFailed",
    "GpulayerError",
    "InvalidArgument",
    "InvalidInput",
    "InvalidRequirement",
    "JobFailed",
    "NotFound",
    "PluginError",
    "RemoteError",
    "Unschedulable",
]


class GpulayerError(Exception):
    """Base class of every error GPUlayer raises on purpose."""

    #: HTTP status the server answers with for this error.
    status_code = 500
    #: stable machine-readable code, carried over the HTTP API.
    code = "error"

    def to_dict(self) -> dict[str, Any]:
        return {"code": self.code, "message": str(self)}


class InvalidInput(GpulayerError, ValueError):
    status_code = 422
    code = "invalid_input"


class InvalidRequirement(InvalidInput):
    code = "invalid_requirement"


class InvalidArgument(InvalidInput):
    code = "invalid_argument"


class BundleError(InvalidInput):
    code = "invalid_bundle"


class PluginError(GpulayerError):
    code = "plugin_error"


class NotFound(GpulayerError, LookupError):
    status_code = 404
    code = "not_found"


class Conflict(GpulayerError):
    status_code = 409
    code = "conflict"


class Unschedulable(GpulayerError):
    """No registered worker could ever run the job; ``str()`` is the scheduler's report."""

    status_code = 422
    code = "unschedulable"

    def __init__(self, message: str, job_id: str | None = None) -> None:
        super().__init__(message)
        self.job_id = job_id


class JobFailed(GpulayerError):
    code = "job_failed"

    def __init__(
        self, message: str, *, job_id: str | None = None, state: str | None = None,
        exit_code: int | None = None,
    ) -> None:
        super().__init__(message)
        self.job_id = job_id
        self.state = state
        self.exit_code = exit_code


class RemoteError(JobFailed):
    """A FunctionJob raised. ``remote_type``, ``remote_message`` and ``remote_traceback``
    carry what the job's process saw."""

    code = "remote_error"

    def __init__(
        self, remote_type: str, remote_message: str, remote_traceback: str,
        *, job_id: str | None = None,
    ) -> None:
        super().__init__(
            f"{remote_type}: {remote_message}\n\nRemote traceback (job {job_id}):\n"
            f"{remote_traceback}",
            job_id=job_id, state="failed",
        )
        self.remote_type = remote_type
        self.remote_message = remote_message
        self.remote_traceback = remote_traceback


class AuthError(GpulayerError):
    status_code = 401
    code = "unauthorized"

    def __init__(self, message: str, status_code: int = 401) -> None:
        super().__init__(message)
        self.status_code = status_code
        self.code = "unauthorized" if status_code == 401 else "forbidden"


class ConnectionFailed(GpulayerError):
    status_code = 503
    code = "unavailable"
