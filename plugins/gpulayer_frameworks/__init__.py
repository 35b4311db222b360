'''Bundled GPUlayer plugin: probes for the common GPU/ML frameworks.

Versions come from package metadata (no import). Sub-probes import the framework, in one
bounded subprocess of the job Python, and report the framework's version when it can use
that accelerator here (``torch.cuda`` is present on a CUDA build of torch that sees a GPU,
absent on a CPU build), so jobs can ask for ``{"torch.cuda": ""}`` or ``{"torch.cuda": ">=2.2"}``.
Each sub-probe names the accelerator it is for; the PyTorch integration reads that to add
``torch.cuda`` (``torch.rocm``, ``torch.mps``) to a torch job on that accelerator.
'''

from __future__ import annotations

from collections.abc import Iterator

from gpulayer import plugin

_TORCH_CUDA = """
import torch
if torch.version.cuda and not getattr(torch.version, "hip", None) and torch.cuda.is_available():
    return torch.__version__
return None
"""

_TORCH_ROCM = """
import torch
if getattr(torch.version, "hip", None) and torch.cuda.is_available():
    return torch.__version__
return None
"""

_TORCH_MPS = """
import torch
mps = getattr(torch.backends, "mps", None)
if mps is not None and mps.is_available():
    return torch.__version__
return None
"""

_TORCH_BACKENDS = """
import torch.distributed as dist
if not dist.is_available():
    return []
found = []
for name in ("gloo", "nccl", "mpi", "ucc"):
    check = getattr(dist, "is_%s_available" % name, None)
    try:
        if check is not None and check():
            found.append(name)
    except Exception:
        pass
return found
"""


def _jax(platforms: tuple[str, ...]) -> str:
    return f"""
import jax
try:
    devices = jax.devices()
except RuntimeError:
    return None
if any(d.platform in {platforms!r} for d in devices):
    return jax.__version__
return None
"""


def _cupy(hip: bool) -> str:
    return f"""
import cupy
try:
    if cupy.cuda.runtime.getDeviceCount() < 1:
        return None
except Exception:
    return None
if bool(getattr(cupy.cuda.runtime, "is_hip", False)) != {hip!r}:
    return None
return cupy.__version__
"""


def _ort(provider: str) -> str:
    return f"""
import onnxruntime
if {provider!r} in onnxruntime.get_available_providers():
    return onnxruntime.__version__
return None
"""


_MLX_METAL = """
import mlx.core as mx
if mx.metal.is_available():
    import importlib.metadata
    return importlib.metadata.version("mlx")
return None
"""

PROBES = [
    plugin.FrameworkProbe(
        name="torch", distributions=["torch"],
        subprobes=[plugin.SubProbe(name="torch.cuda", code=_TORCH_CUDA, accelerator="cuda"),
                   plugin.SubProbe(name="torch.rocm", code=_TORCH_ROCM, accelerator="rocm"),
                   plugin.SubProbe(name="torch.mps", code=_TORCH_MPS, accelerator="mps")],
        backends_code=_TORCH_BACKENDS,
    ),
    plugin.FrameworkProbe(
        name="jax", distributions=["jax"],
        subprobes=[plugin.SubProbe(name="jax.cuda", code=_jax(("gpu", "cuda")), accelerator="cuda"),
                   plugin.SubProbe(name="jax.rocm", code=_jax(("rocm",)), accelerator="rocm")],
    ),
    plugin.FrameworkProbe(name="mlx", distributions=["mlx"],
                          subprobes=[plugin.SubProbe(name="mlx.metal", code=_MLX_METAL, accelerator="mps")]),
    plugin.FrameworkProbe(
        name="cupy",
        distributions=["cupy", "cupy-cuda*", "cupy-rocm-*"],
        subprobes=[plugin.SubProbe(name="cupy.cuda", code=_cupy(hip=False), accelerator="cuda"),
                   plugin.SubProbe(name="cupy.rocm", code=_cupy(hip=True), accelerator="rocm")],
    ),
    plugin.FrameworkProbe(
        name="onnxruntime",
        distributions=["onnxruntime", "onnxruntime-gpu", "onnxruntime-silicon",
                       "onnxruntime-directml", "onnxruntime-openvino"],
        subprobes=[plugin.SubProbe(name="onnxruntime.cuda", code=_ort("CUDAExecutionProvider"), accelerator="cuda"),
                   plugin.SubProbe(name="onnxruntime.rocm", code=_ort("ROCMExecutionProvider"), accelerator="rocm"),
                   # Core ML picks the Neural Engine, the GPU or the CPU itself: no one accelerator
                   plugin.SubProbe(name="onnxruntime.coreml", code=_ort("CoreMLExecutionProvider"))],
    ),
    plugin.FrameworkProbe(name="numpy", distributions=["numpy"]),
]


@plugin.hookimpl
def gpulayer_framework_probes() -> Iterator[plugin.FrameworkProbe]:
    yield from (p.model_copy(deep=True) for p in PROBES)
