"""GPUlayer: run jobs on any GPU or CPU machine you have.

The public API: the SDK (``remote``, ``submit``, ``explain``, ``wait``, ``as_completed``), the job specs
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
from gpulayer.hookspecs import hookimpl
from gpulayer.specs import CommandJob, DistributedJob, FunctionJob, Placement, Requirements

__version__ = "0.1.0"

# The SDK imports the control plane and the store (SQLModel); load it on first use so that
# ``import gpulayer`` stays cheap for plugins and the CLI.
_SDK_NAMES = {"remote", "submit", "explain", "wait", "as_completed", "JobHandle", "connect", "get_job"}

if TYPE_CHECKING:
    from gpulayer.sdk import JobHandle, as_completed, connect, explain, get_job, remote, submit, wait


def __getattr__(name: str) -> Any:
    if name in _SDK_NAMES:
        from gpulayer import sdk

        return getattr(sdk, name)
    raise AttributeError(f"module 'gpulayer' has no attribute {name!r}")


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
    "__version__",
    "as_completed",
    "connect",
    "explain",
    "get_job",
    "hookimpl",
    "remote",
    "submit",
    "wait",
]
