"""GPUlayer's exceptions, and how they cross the HTTP API.

Every error GPUlayer raises on purpose derives from :class:`GpulayerError`::

    GpulayerError
    ├── InvalidInput            bad user input: names the input and what is accepted
    │   ├── InvalidRequirement  a framework spec, profile, accelerator, ... that cannot be used
    │   ├── InvalidArgument     a FunctionJob argument that is not JSON
    │   ├── BundleError         a source bundle that is too large, unsafe, or not what it claims
    │   │   └── BundleMissing   a job names a bundle that is not stored (the SDK uploads it again)
    │   ├── UnknownAfter        a job to run after (spec.after, --after) that is not stored
    │   ├── BadRequest          a request body that is not JSON at all (HTTP 400)
    │   └── TooLarge            a request body over the server's limit (HTTP 413)
    ├── PluginError             a plugin conflict, an unknown hook, a plugin asked for but broken
    ├── ToolError               a vendor tool gave no answer (gpulayer.probing: not found,
    │                           timed out, failed); detectors turn it into a diagnostic
    ├── ProviderError           a provider adapter could not do what was asked
    │   ├── NoCapacity          no machine of that shape there now: try the next offer
    │   ├── QuotaExceeded       the account's quota is used up there: try the next offer
    │   ├── SkipOffer           this offer cannot be used (for a reason of the adapter's own)
    │   ├── ProviderAuthFailed  the credentials do not work: the provider is disabled
    │   └── ProviderTransient   try the same again later
    ├── NotFound                no job, worker, task, bundle or token with that id
    ├── Conflict                a state transition that is not allowed (a late report, ...)
    ├── SubmitWhileImporting    a job's module submitted a job while a worker imported it
    ├── JobFailed               the job ended without success (carries its state and exit code)
    │   ├── RemoteError         a FunctionJob raised: remote type, message and traceback
    │   └── Unschedulable       no registered worker could ever run the job (carries reasons)
    ├── AuthError               missing or unusable token (HTTP 401)
    │   └── Forbidden           a token whose scope may not do this (HTTP 403)
    ├── DatabaseFailed          the control plane's database could not store or read a change
    │                           now (a full disk, a database server gone): try again (HTTP 503)
    └── ConnectionFailed        the control plane could not be reached

Each class has a stable ``code``. The server answers an error as
``{"error": {"code": ..., "message": ..., "details": {...}}}`` with the class's HTTP status,
and the client raises the class registered for that code (:func:`error_from_wire`), with the
same message and details: callers never match message text.
"""

from __future__ import annotations

from typing import Any, ClassVar

__all__ = [
    "AuthError",
    "BadRequest",
    "BundleError",
    "BundleMissing",
    "Conflict",
    "ConnectionFailed",
    "DatabaseFailed",
    "Forbidden",
    "GpulayerError",
    "InvalidArgument",
    "InvalidInput",
    "InvalidRequirement",
    "JobFailed",
    "MethodNotAllowed",
    "NoCapacity",
    "NotFound",
    "PluginError",
    "ProviderAuthFailed",
    "ProviderError",
    "ProviderTransient",
    "QuotaExceeded",
    "RemoteError",
    "SkipOffer",
    "SubmitWhileImporting",
    "TooLarge",
    "UnknownAfter",
    "Unschedulable",
    "error_from_wire",
]

#: code -> class, filled by every subclass that names a ``code`` of its own
_BY_CODE: dict[str, type[GpulayerError]] = {}


class GpulayerError(Exception):
    """Base class of every error GPUlayer raises on purpose."""

    #: HTTP status the server answers with for this error.
    status_code: ClassVar[int] = 500
    #: stable machine-readable code, carried over the HTTP API.
    code: ClassVar[str] = "error"

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "code" in cls.__dict__:
            other = _BY_CODE.get(cls.code)
            if other is not None and other.__qualname__ != cls.__qualname__:
                raise TypeError(f"error code {cls.code!r} is used by {other.__qualname__} and {cls.__qualname__}")
            _BY_CODE[cls.code] = cls

    def details(self) -> dict[str, Any]:
        """What a subclass carries besides its message (JSON values), for the wire."""
        return {}

    @classmethod
    def from_details(cls, message: str, details: dict[str, Any]) -> GpulayerError:
        """Rebuild the error from :meth:`to_dict`'s fields (the inverse of :meth:`details`)."""
        return cls(message)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"code": self.code, "message": str(self)}
        details = self.details()
        if details:
            out["details"] = details
        return out


def error_from_wire(data: Any, *, status: int) -> GpulayerError:
    """The error an HTTP answer with status ``status`` and body ``{"error": data}`` carries."""
    if isinstance(data, dict) and isinstance(data.get("code"), str) and isinstance(data.get("message"), str):
        code, message = data["code"], data["message"]
        raw = data.get("details")
        details: dict[str, Any] = raw if isinstance(raw, dict) else {}
        cls = _BY_CODE.get(code)
        if cls is not None:
            try:
                return cls.from_details(message, details)
            except (TypeError, ValueError, KeyError):  # details of another version: keep the text
                return GpulayerError(message)
    else:
        message = f"HTTP {status}"
    if status == 401:
        return AuthError(message)
    if status == 403:
        return Forbidden(message)
    return GpulayerError(f"server error (HTTP {status}): {message}")


class InvalidInput(GpulayerError, ValueError):
    status_code = 422
    code = "invalid_input"


class InvalidRequirement(InvalidInput):
    code = "invalid_requirement"


class InvalidArgument(InvalidInput):
    code = "invalid_argument"


class BundleError(InvalidInput):
    code = "invalid_bundle"


class BundleMissing(BundleError):
    """A job names a bundle the control plane does not hold: never uploaded, or deleted since
    no stored job named it (``gpulayer jobs prune``). The SDK uploads it again and retries."""

    code = "bundle_missing"


class UnknownAfter(InvalidInput):
    """A job names, among those it runs after (``spec.after``), an id that no stored job has
    (or, for a client token of a server, none of its own). ``index`` and ``job``: which entry
    of the list, so that a front end can name it as its user wrote it (``--after job-...``)."""

    code = "unknown_after"

    def __init__(self, message: str, *, index: int = 0, job: str = "", field: str = "after") -> None:
        super().__init__(message)
        self.index = index
        self.job = job
        #: ``after`` or ``after_ended``
        self.field = field

    def details(self) -> dict[str, Any]:
        return {"index": self.index, "job": self.job, "field": self.field}

    @classmethod
    def from_details(cls, message: str, details: dict[str, Any]) -> GpulayerError:
        return cls(message, index=int(details["index"]), job=str(details["job"]),
                   field=str(details.get("field", "after")))


class BadRequest(InvalidInput):
    status_code = 400
    code = "bad_request"


class TooLarge(InvalidInput):
    status_code = 413
    code = "too_large"


class PluginError(GpulayerError):
    code = "plugin_error"

    def __init__(self, message: str, *, hook: str | None = None) -> None:
        super().__init__(message)
        #: the hook the error is about, when it is about one
        self.hook = hook


class ProviderError(GpulayerError):
    """A provider adapter could not do what was asked; the subclass says what to do next."""

    code = "provider_error"


class NoCapacity(ProviderError):
    code = "no_capacity"


class QuotaExceeded(ProviderError):
    code = "quota_exceeded"


class SkipOffer(ProviderError):
    code = "skip_offer"


class ProviderAuthFailed(ProviderError):
    code = "provider_auth_failed"


class ProviderTransient(ProviderError):
    code = "provider_transient"


class NotFound(GpulayerError, LookupError):
    status_code = 404
    code = "not_found"


class MethodNotAllowed(GpulayerError):
    """A server has the path but not the method asked for: a route it does not have (a
    server from before it, where ``POST /v1/jobs/cancel`` is ``/v1/jobs/{job_id}``)."""

    status_code = 405
    code = "method_not_allowed"


class Conflict(GpulayerError):
    status_code = 409
    code = "conflict"


class DatabaseFailed(GpulayerError):
    """The control plane's database failed under an operation (SQLite's "database or disk is
    full", a PostgreSQL server that went away): nothing of the operation was stored, and the
    same operation may succeed once the database can be written again. Embedded, the message
    names the database file; a server names none of its own paths to its clients."""

    status_code = 503
    code = "database_failed"

    def __init__(self, message: str, *, reason: str | None = None) -> None:
        super().__init__(message)
        #: the database's own words ("database or disk is full"), without its name
        self.reason = reason or message

    def for_clients(self) -> DatabaseFailed:
        """The same as a server says it to its clients (its API's and its dashboard's): what
        failed, naming none of the server's paths or URLs (its log names them)."""
        return DatabaseFailed(f"the server's database failed: {self.reason}", reason=self.reason)


class SubmitWhileImporting(GpulayerError):
    """A job was submitted by a module's top-level code while a worker imported that module
    to run one of its functions: on a worker the submission would repeat without end."""

    code = "submit_while_importing"


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

    def details(self) -> dict[str, Any]:
        return {"job_id": self.job_id, "state": self.state, "exit_code": self.exit_code}

    @classmethod
    def from_details(cls, message: str, details: dict[str, Any]) -> GpulayerError:
        return cls(message, job_id=details.get("job_id"), state=details.get("state"),
                   exit_code=details.get("exit_code"))


class RemoteError(JobFailed):
    """A FunctionJob raised. ``remote_type``, ``remote_message`` and ``remote_traceback``
    carry what the job's process saw."""

    code = "remote_error"

    def __init__(
        self, remote_type: str, remote_message: str, remote_traceback: str,
        *, job_id: str | None = None,
    ) -> None:
        # (an error of the runner's own, a result that is not JSON, has no traceback to show)
        where = (f"\n\nRemote traceback (job {job_id}):\n{remote_traceback}" if remote_traceback.strip()
                 else f" (job {job_id})")
        super().__init__(f"{remote_type}: {remote_message}{where}", job_id=job_id, state="failed")
        self.remote_type = remote_type
        self.remote_message = remote_message
        self.remote_traceback = remote_traceback

    def details(self) -> dict[str, Any]:
        return {"job_id": self.job_id, "remote_type": self.remote_type,
                "remote_message": self.remote_message, "remote_traceback": self.remote_traceback}

    @classmethod
    def from_details(cls, message: str, details: dict[str, Any]) -> GpulayerError:
        return cls(str(details["remote_type"]), str(details["remote_message"]),
                   str(details["remote_traceback"]), job_id=details.get("job_id"))


class Unschedulable(JobFailed):
    """No registered worker could ever run the job; ``str()`` is the scheduler's report.

    A :class:`JobFailed` (``state`` ``"unschedulable"``, no exit code): the job was stored
    and has ended without success, whether that is said at submit or by ``handle.result()``
    (a job that waited, and whose last worker left), so ``except gl.JobFailed`` catches
    every job that did not succeed."""

    status_code = 422
    code = "unschedulable"

    def __init__(self, message: str, job_id: str | None = None) -> None:
        super().__init__(message, job_id=job_id, state="unschedulable")

    def details(self) -> dict[str, Any]:
        return {"job_id": self.job_id} if self.job_id else {}

    @classmethod
    def from_details(cls, message: str, details: dict[str, Any]) -> GpulayerError:
        return cls(message, job_id=details.get("job_id"))


class AuthError(GpulayerError):
    status_code = 401
    code = "unauthorized"


class Forbidden(AuthError):
    status_code = 403
    code = "forbidden"


class ConnectionFailed(GpulayerError):
    status_code = 503
    code = "unavailable"


def one_line(exc: BaseException) -> str:
    """``Type: message`` on one line, for an error of someone else's code (a plugin's) that
    goes into a line of ours (a diagnostic, a scheduler's reason, a warning): pydantic's
    validation errors (a record built with a bad field) as ``ValidationError for Device:
    memory_gb: Extra inputs are not permitted``, without its line breaks and links; any
    other message with its line breaks made spaces."""
    errors = getattr(exc, "errors", None)
    title = getattr(exc, "title", None)
    if callable(errors) and isinstance(title, str):  # (pydantic's, not imported here)
        try:
            items = errors(include_url=False)
        except Exception:
            items = None
        if items:
            parts = ("{}: {}".format(".".join(str(p) for p in item.get("loc", ())) or title, item.get("msg"))
                     for item in items)
            return f"{type(exc).__name__} for {title}: {'; '.join(parts)}"
    return f"{type(exc).__name__}: {' '.join(str(exc).split())}"
