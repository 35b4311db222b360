"""The plugin contract: every hook GPUlayer calls, in one place.

A plugin is a module (or object) with functions marked ``@plugin.hookimpl`` whose names
match the hooks below; it is found through an entry point in the ``gpulayer`` group::

    [project.entry-points.gpulayer]
    myaccel = "gpulayer_myaccel"

Plugin authors import everything they need from :mod:`gpulayer.plugin`, as the examples
below do. Hooks that return records return an iterable of them; each record has a ``name``
and a name offered by two plugins is an error naming both. Record hooks take no wrappers
(``wrapper=True`` is refused when the plugin is registered): a record hook's result is
records, not a change to other plugins' records. A hookimpl may accept fewer arguments
than its spec (pluggy passes only the ones it asks for), which is how hooks grow without
breaking plugins.
"""

from __future__ import annotations

from collections.abc import Iterable

import pluggy

from gpulayer.hookrecords import (
    AcceleratorDetector,
    Device,
    DeviceEnvironment,
    DistributedLauncher,
    FrameworkProbe,
    HookRecord,
    ProviderAdapter,
    RuntimeProfile,
)

PROJECT = "gpulayer"

hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


# --------------------------------------------------------------------------- resources


@hookspec
def gpulayer_accelerator_detectors() -> Iterable[AcceleratorDetector]:
    """Offer detectors of accelerator devices, one record per accelerator kind.

    Called when a worker builds its capabilities and by ``gpulayer resources detect``.
    The record's ``name`` is the accelerator kind (``cuda``, ``rocm``, ``mps``, or your
    own, in lowercase: jobs name kinds in lowercase); its ``detect(timeout)`` returns a
    :class:`~gpulayer.plugin.DetectionResult`.
    ``detect`` runs in the CLI's process: never import a framework there, and run anything
    that can hang (a vendor tool, a driver call) with the given timeout. Report trouble
    as a diagnostic line, not an exception; GPUlayer also guards against both.

    ``hide_env`` is the environment that hides every device of the kind; a worker sets
    it for tasks that were granted none of them (see ``gpulayer_device_environment``).
    Say where the devices came from in ``DetectionResult.source`` (``"NVML"``,
    ``"nvidia-smi"``, ``"sysfs"``): ``resources detect --explain`` shows it with your
    plugin's name. A plugin whose hook raises is left out of it and named once, not fatal.

    **Example**::

        from gpulayer import plugin

        @plugin.hookimpl
        def gpulayer_accelerator_detectors():
            def detect(timeout: float) -> plugin.DetectionResult:
                return plugin.DetectionResult(
                    devices=[plugin.Device(kind="npu", index=0, name="Acme NPU")], source="acme-smi")
            yield plugin.AcceleratorDetector(name="npu", detect=detect,
                                             hide_env={"ACME_VISIBLE_DEVICES": ""})
    """


@hookspec(firstresult=True)
def gpulayer_device_environment(kind: str, devices: list[Device]) -> DeviceEnvironment | None:
    """Return the environment a job needs to see exactly ``devices`` of ``kind``.

    Called by the worker when it starts a task that was granted devices, once for the
    kind it was granted, and only then: ``devices`` is never empty. The first non-None
    answer wins: answer only for your own kind and return None otherwise. ``devices`` are
    the granted devices, in grant order (``index`` is the runtime index).

    Every other kind the worker has is hidden from the task by the ``hide_env`` of that
    kind's :class:`~gpulayer.plugin.AcceleratorDetector`, without calling this hook.

    **Example**::

        from gpulayer import plugin

        @plugin.hookimpl
        def gpulayer_device_environment(kind, devices):
            if kind == "npu":
                ids = ",".join(str(d.index) for d in devices)
                return plugin.DeviceEnvironment(name="npu", env={"ACME_VISIBLE_DEVICES": ids})
            return None
    """


@hookspec
def gpulayer_framework_probes() -> Iterable[FrameworkProbe]:
    """Offer probes for GPU/ML frameworks (torch, jax, mlx, cupy, ...).

    Called when capabilities are built. The version comes from the package metadata of
    the first of ``distributions`` found in the Python that runs jobs; ``subprobes`` (such
    as ``torch.cuda``) are function bodies run together in one subprocess of that Python,
    with a timeout, each returning a version string or None.

    A sub-probe's ``accelerator`` says which accelerator kind the capability is for; the
    PyTorch integration requires the ``torch.*`` sub-probe of a job's accelerator, so a
    plugin for a new accelerator can offer one (``torch.npu``) in a probe of its own.

    **Example**::

        from gpulayer import plugin

        @plugin.hookimpl
        def gpulayer_framework_probes():
            yield plugin.FrameworkProbe(
                name="tinygrad", distributions=["tinygrad"],
                subprobes=[plugin.SubProbe(name="tinygrad.cuda", accelerator="cuda",
                                           code="import tinygrad; return tinygrad.__version__")],
            )
    """


@hookspec
def gpulayer_runtime_profiles() -> Iterable[RuntimeProfile]:
    """Offer runtime profiles: named shorthands that fill in accelerator and frameworks.

    Called when a job names ``profile=...`` and by ``gpulayer profiles list``.

    **Example**::

        from gpulayer import plugin

        @plugin.hookimpl
        def gpulayer_runtime_profiles():
            yield plugin.RuntimeProfile(name="pytorch-cuda", accelerator="cuda",
                                        frameworks={"torch": "", "torch.cuda": ""})
    """


# --------------------------------------------------------------------------- placement


@hookspec
def gpulayer_provider_adapters() -> Iterable[ProviderAdapter]:
    """Offer kinds of providers that bring up machines for ``cloud`` jobs.

    Called when the control plane loads its providers (``$GPULAYER_HOME/providers.toml`` or
    ``gpulayer server start --providers FILE``): each section names an adapter by its
    ``type``; the section (without the core's own keys) is validated with the adapter's
    ``config`` model, and ``create(section_name, config)`` returns the
    :class:`~gpulayer.hookrecords.Provider` the control plane then calls: ``offers`` for
    queued cloud jobs no worker can take, ``launch`` with a machine id it chose and a
    single-use bootstrap token, ``list`` to reconcile and sweep orphans, ``terminate`` when
    a machine is idle, failed to join or was lost.

    **Example**::

        from pydantic import BaseModel
        from gpulayer import plugin

        class AcmeConfig(BaseModel):
            region: str

        class Acme:
            def __init__(self, name: str, config: AcmeConfig) -> None: ...
            def check(self) -> None: ...
            def offers(self, requirements): return [plugin.MachineOffer(shape="a1", ...)]
            def launch(self, request): return plugin.LaunchedMachine(provider_id="i-1")
            def list(self, label): return []
            def terminate(self, machine_id, provider_id): ...

        @plugin.hookimpl
        def gpulayer_provider_adapters():
            yield plugin.ProviderAdapter(name="acme", config=AcmeConfig, create=Acme)
    """


@hookspec
def gpulayer_distributed_launchers() -> Iterable[DistributedLauncher]:
    """Offer launchers for distributed jobs (torchrun is bundled; MPI, JAX multi-host, ...).

    Called by a worker starting one node of a ``DistributedJob`` whose ``launcher`` names
    the record. ``build(job, rendezvous, node_rank, python)`` returns that node's
    :class:`~gpulayer.plugin.LaunchCommand`.

    **Example**::

        from gpulayer import plugin

        @plugin.hookimpl
        def gpulayer_distributed_launchers():
            def build(job, rdzv, node_rank, python):
                argv = ["mpirun", "-n", str(job.nproc_per_node), python, job.entry]
                return plugin.LaunchCommand(argv=argv)
            yield plugin.DistributedLauncher(name="mpirun", build=build)
    """


#: Hooks whose results are records collected into a name -> record registry: the type of
#: their records, and what an error message calls one.
RECORD_HOOKS: dict[str, tuple[type[HookRecord], str]] = {
    "gpulayer_accelerator_detectors": (AcceleratorDetector, "accelerator detector"),
    "gpulayer_framework_probes": (FrameworkProbe, "framework probe"),
    "gpulayer_runtime_profiles": (RuntimeProfile, "runtime profile"),
    "gpulayer_provider_adapters": (ProviderAdapter, "provider adapter"),
    "gpulayer_distributed_launchers": (DistributedLauncher, "distributed launcher"),
}
