"""GPUlayer: run jobs on any GPU or CPU machine you have.

The public API: the SDK (``remote``, ``submit``, ``explain``, ``wait``, ``as_completed``, ``cancel``), the job specs
and requirement records, and ``hookimpl`` for plugin authors.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from gpulayer.errors import (
    GpulayerError,
    InvalidInput,
    JobFailed,
    RemoteError,
    Unschedulable,
)

__version__ = "0.1.0"

# Everything but the errors is loaded on first use: the SDK imports the control plane and
# the store (SQLAlchemy), the specs pydantic, ``hookimpl`` pluggy. So ``import gpulayer``
# (which every ``gpulayer`` command and every plugin does) costs next to nothing
# (tests/unit/test_cli_startup.py).
_LAZY = {
    "remote": "gpulayer.remote_functions",
    **dict.fromkeys(("submit", "submit_many", "explain", "wait", "as_completed", "cancel", "JobHandle", "connect",
                     "get_job"), "gpulayer.sdk"),
    **dict.fromkeys(("CommandJob", "DistributedJob", "FunctionJob", "Placement", "Requirements"), "gpulayer.specs"),
    "hookimpl": "gpulayer.hookspecs",
    "UnsentFileWarning": "gpulayer.unsent",
}

if TYPE_CHECKING:
    from gpulayer.hookspecs import hookimpl
    from gpulayer.remote_functions import remote
    from gpulayer.sdk import JobHandle, as_completed, cancel, connect, explain, get_job, submit, submit_many, wait
    from gpulayer.specs import CommandJob, DistributedJob, FunctionJob, Placement, Requirements
    from gpulayer.unsent import UnsentFileWarning


#: Ray's names a user coming from Ray reaches for, and what to write here instead
_RAY_NAMES = {
    "get": "for Ray's ray.get(refs), a handle's result is h.result(): [h.result() for h in handles]; "
           "gl.wait(handles) answers their records, gl.as_completed(handles) each as it ends",
    "init": "for Ray's ray.init(address=...), gl.connect(url=..., token=...) (or GPULAYER_URL and "
            "GPULAYER_TOKEN); with neither, jobs run on the embedded control plane",
    "put": "arguments and results are JSON, sent with each call (docs/adr/0002-json-only-arguments.md): "
           "large data belongs in the bundle, a file or a URL the job reads",
    "kill": "for Ray's ray.kill/ray.cancel, h.cancel() or gl.cancel(handles)",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is not None:
        import importlib

        value = getattr(importlib.import_module(module), name)
        globals()[name] = value  # the next look-up is a plain attribute
        return value
    hint = _RAY_NAMES.get(name)
    raise AttributeError(f"module 'gpulayer' has no attribute {name!r}" + (f"; {hint}" if hint else ""))


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


__all__ = [
    "CommandJob",
    "DistributedJob",
    "FunctionJob",
    "GpulayerError",
    "InvalidInput",
    "JobFailed",
    "JobHandle",
    "Placement",
    "RemoteError",
    "Requirements",
    "Unschedulable",
    "UnsentFileWarning",
    "__version__",
    "as_completed",
    "cancel",
    "connect",
    "explain",
    "get_job",
    "hookimpl",
    "remote",
    "submit",
    "submit_many",
    "wait",
]
