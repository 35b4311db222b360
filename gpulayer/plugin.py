"""The one import for plugin authors: ``from gpulayer import plugin``.

Everything a plugin needs is here, and ``__all__`` is the supported plugin API: the
``hookimpl`` marker, the records hooks return and receive, the helpers for running vendor
tools, and the helpers a plugin's own tests use. The hooks themselves are declared, with
an example each, in :mod:`gpulayer.hookspecs`; ``docs/plugins.md`` documents every name.

::

    from gpulayer import plugin

    @plugin.hookimpl
    def gpulayer_accelerator_detectors():
        yield plugin.AcceleratorDetector(name="npu", detect=detect)

Importing this module stays cheap (no database, HTTP or framework imports): detectors run
in the CLI's own process.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, TypeVar

from gpulayer import devices as _devices
from gpulayer import plugins as _plugins
from gpulayer.errors import NoCapacity, ProviderAuthFailed, ProviderError, ProviderTransient, QuotaExceeded, SkipOffer
from gpulayer.fakes import FakeAcceleratorPlugin, fake_devices_env, no_real_devices_env
from gpulayer.hookrecords import (
    AcceleratorDetector,
    Capabilities,
    DetectionResult,
    Device,
    DeviceEnvironment,
    DistributedLauncher,
    FrameworkProbe,
    HookRecord,
    HostInfo,
    LaunchCommand,
    LaunchedMachine,
    LaunchRequest,
    LiveMachine,
    MachineOffer,
    Provenance,
    Provider,
    ProviderAdapter,
    Rendezvous,
    RuntimeProfile,
    SubProbe,
    SupportLevel,
    is_kind,
)
from gpulayer.hookspecs import hookimpl
from gpulayer.probing import (
    ToolError,
    ToolFailed,
    ToolNotFound,
    ToolTimeout,
    env_flag,
    read_text,
    run_tool,
    try_run_tool,
)
from gpulayer.resources import detect_devices
from gpulayer.specs import DistributedJob, Requirements

__all__ = [
    "AcceleratorDetector",
    "Capabilities",
    "DetectionResult",
    "Device",
    "DeviceEnvironment",
    "DistributedJob",
    "DistributedLauncher",
    "FakeAcceleratorPlugin",
    "FrameworkProbe",
    "HostInfo",
    "LaunchCommand",
    "LaunchRequest",
    "LaunchedMachine",
    "LiveMachine",
    "MachineOffer",
    "NoCapacity",
    "Provenance",
    "Provider",
    "ProviderAdapter",
    "ProviderAuthFailed",
    "ProviderError",
    "ProviderTransient",
    "QuotaExceeded",
    "Rendezvous",
    "Requirements",
    "RuntimeProfile",
    "SkipOffer",
    "SubProbe",
    "SupportLevel",
    "ToolError",
    "ToolFailed",
    "ToolNotFound",
    "ToolTimeout",
    "detect_devices",
    "device_environment",
    "env_flag",
    "fake_devices_env",
    "hookimpl",
    "is_kind",
    "no_real_devices_env",
    "provider_settings",
    "read_text",
    "records",
    "run_tool",
    "try_run_tool",
]

_R = TypeVar("_R", bound=HookRecord)


def device_environment(kind: str, devices: Sequence[Device]) -> dict[str, str]:
    """The device variables a task granted ``devices`` of ``kind`` sees for that kind: the
    answer of ``gpulayer_device_environment``, or, for ``[]``, the ``hide_env`` of the
    kind's detector (the hook itself is never called with no devices)."""
    return _devices.kind_environment(kind, devices)


def records(record_type: type[_R]) -> dict[str, _R]:
    """Every record of ``record_type`` the loaded plugins offer, by name
    (``records(plugin.RuntimeProfile)["acme-npu"]``)."""
    return _plugins.records(record_type)


def provider_settings(text: str, adapter: ProviderAdapter, *, where: str = "providers.toml") -> dict[str, Any]:
    """The settings (``adapter.config`` records) that each section of the providers.toml
    ``text`` gives ``adapter``, read as ``gpulayer server start`` reads the file, core keys
    included, without creating a provider (nothing is called). A bad file raises
    :class:`ValueError` with the message a user sees, naming ``where``, the section and the key.
    For a provider package's own tests of its documented examples and its errors."""
    from gpulayer import provider_config

    reading = adapter.model_copy(update={"create": lambda name, settings: object()})
    return {c.name: c.settings for c in provider_config.parse(text, where, adapters={adapter.name: reading})}
