"""Bundled GPUlayer plugin: the common runtime profiles.

A profile fills in a job's accelerator and frameworks where the job leaves them empty;
``""`` means any version. The ``torch.cuda``-style entries are sub-probes that the worker
reports only when the framework can actually use that accelerator.
"""

from __future__ import annotations

from collections.abc import Iterator

from gpulayer import plugin

PROFILES = [
    plugin.RuntimeProfile(name="pytorch-cuda", description="PyTorch on NVIDIA GPUs",
                          accelerator="cuda", frameworks={"torch": "", "torch.cuda": ""}),
    plugin.RuntimeProfile(name="pytorch-rocm", description="PyTorch on AMD GPUs (ROCm/HIP build)",
                          accelerator="rocm", frameworks={"torch": "", "torch.rocm": ""}),
    plugin.RuntimeProfile(name="pytorch-mps", description="PyTorch on Apple silicon (Metal)",
                          accelerator="mps", frameworks={"torch": "", "torch.mps": ""}),
    plugin.RuntimeProfile(name="jax-cuda", description="JAX on NVIDIA GPUs",
                          accelerator="cuda", frameworks={"jax": "", "jax.cuda": ""}),
    plugin.RuntimeProfile(name="mlx", description="MLX on Apple silicon",
                          accelerator="mps", frameworks={"mlx": ""}),
    plugin.RuntimeProfile(name="cupy-cuda", description="CuPy on NVIDIA GPUs",
                          accelerator="cuda", frameworks={"cupy": "", "cupy.cuda": ""}),
    plugin.RuntimeProfile(name="onnxruntime-cuda", description="ONNX Runtime with the CUDA execution provider",
                          accelerator="cuda", frameworks={"onnxruntime": "", "onnxruntime.cuda": ""}),
    plugin.RuntimeProfile(name="cpu", description="no accelerator", accelerator=None, frameworks={}),
]


@plugin.hookimpl
def gpulayer_runtime_profiles() -> Iterator[plugin.RuntimeProfile]:
    yield from (p.model_copy(deep=True) for p in PROFILES)
