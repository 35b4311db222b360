"""The instance types this provider offers, their shapes and their prices per region.

A deliberately small table: a few CPU types and a few GPU types, enough to show how an
adapter turns what it knows into :class:`~gpulayer.plugin.MachineOffer` records. Prices are
illustrative on-demand Linux list prices in US dollars per hour; a deployment sets its own
with the ``prices`` key of its providers.toml section. A type missing from a region's
column is not offered there.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import Version

from gpulayer import plugin

GIB = 1024**3


@dataclass(frozen=True)
class InstanceType:
    name: str
    vcpus: int
    memory_gib: float
    #: accelerator kind of its GPUs (``cuda``), None for a CPU-only type
    gpu_kind: str | None = None
    gpu_name: str = ""
    gpu_count: int = 0
    gpu_memory_gib: float = 0
    compute_capability: str | None = None
    #: region -> price per hour
    prices: dict[str, float] = field(default_factory=dict)
    #: seconds from RunInstances to a worker, roughly (orders offers of equal price)
    boot_seconds: float = 90

    def devices(self) -> list[plugin.Device]:
        return [plugin.Device(kind=self.gpu_kind, index=i, name=self.gpu_name,
                              memory_bytes=int(self.gpu_memory_gib * GIB),
                              compute_capability=self.compute_capability)
                for i in range(self.gpu_count) if self.gpu_kind]

    def unfit(self, req: plugin.Requirements) -> str | None:
        """Why this type cannot run a job needing ``req``, or None when it can."""
        if req.os and req.os.lower() != "linux":
            return f"os {req.os!r}: EC2 offers are linux"
        if req.cpus and req.cpus > self.vcpus:
            return f"{req.cpus} CPUs wanted, {self.vcpus} vCPUs"
        if req.memory_gb and req.memory_gb > self.memory_gib:
            return f"{req.memory_gb:g} GB memory wanted, {self.memory_gib:g} GB"
        if req.accelerator is None:
            return None
        if req.accelerator != self.gpu_kind:
            return f"accelerator {req.accelerator!r} wanted, {self.gpu_kind or 'none'}"
        gpus = 1 if req.gpus is None else req.gpus
        if gpus > self.gpu_count:
            return f"{gpus} GPUs wanted, {self.gpu_count}"
        if req.min_gpu_memory_gb and req.min_gpu_memory_gb > self.gpu_memory_gib:
            return f"{req.min_gpu_memory_gb:g} GB GPU memory wanted, {self.gpu_memory_gib:g} GB"
        if req.compute_capability and self.compute_capability:
            try:
                if Version(self.compute_capability) not in SpecifierSet(req.compute_capability):
                    return f"compute capability {req.compute_capability} wanted, {self.compute_capability}"
            except InvalidSpecifier:
                return None  # the core validated it already; let its matcher explain
        return None


_US = ("us-east-1", "us-west-2")

CATALOG: dict[str, InstanceType] = {t.name: t for t in (
    InstanceType("t3.large", 2, 8, prices={**dict.fromkeys(_US, 0.0832), "eu-west-1": 0.0912}, boot_seconds=60),
    InstanceType("m6i.2xlarge", 8, 32, prices={**dict.fromkeys(_US, 0.384), "eu-west-1": 0.428}, boot_seconds=60),
    InstanceType("c6i.8xlarge", 32, 64, prices={**dict.fromkeys(_US, 1.36), "eu-west-1": 1.52}, boot_seconds=60),
    InstanceType("g5.xlarge", 4, 16, "cuda", "NVIDIA A10G", 1, 24, "8.6",
                 prices={**dict.fromkeys(_US, 1.006), "eu-west-1": 1.123}, boot_seconds=150),
    InstanceType("g5.12xlarge", 48, 192, "cuda", "NVIDIA A10G", 4, 24, "8.6",
                 prices={**dict.fromkeys(_US, 5.672), "eu-west-1": 6.332}, boot_seconds=150),
    InstanceType("p4d.24xlarge", 96, 1152, "cuda", "NVIDIA A100-SXM4-40GB", 8, 40, "8.0",
                 prices={**dict.fromkeys(_US, 32.77), "eu-west-1": 35.39}, boot_seconds=300),
    InstanceType("p5.48xlarge", 192, 2048, "cuda", "NVIDIA H100 80GB HBM3", 8, 80, "9.0",
                 prices=dict.fromkeys(_US, 98.32), boot_seconds=300),
)}
