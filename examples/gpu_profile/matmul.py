"""A function that uses a GPU framework through a runtime profile.

``profile="pytorch-cuda"`` asks for a CUDA device and torch with CUDA support; on a
machine without one the job fails at once with the scheduler's reasons, e.g.
``wkr-...: needs 1 usable cuda device(s), worker has 0``. ``--cpu`` uses the ``cpu``
profile with torch instead, which runs anywhere torch is installed.

    python matmul.py          # needs an NVIDIA GPU worker
    python matmul.py --cpu    # any worker with torch
"""

import sys

import gpulayer as gl


def matmul(n: int) -> dict:
    import os
    import time

    import torch

    device = "cuda" if torch.cuda.is_available() else "cpu"
    a = torch.randn(n, n, device=device)
    b = torch.randn(n, n, device=device)
    start = time.perf_counter()
    c = a @ b
    if device == "cuda":
        torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    return {"device": device, "visible": os.environ.get("CUDA_VISIBLE_DEVICES"),
            "gflops": round(2 * n**3 / seconds / 1e9, 1), "checksum": float(c.sum())}


matmul_gpu = gl.remote(profile="pytorch-cuda", timeout=300)(matmul)
matmul_cpu = gl.remote(profile="cpu", frameworks={"torch": ">=2.2"}, timeout=300)(matmul)

if __name__ == "__main__":
    fn = matmul_cpu if "--cpu" in sys.argv else matmul_gpu
    try:
        print(fn.remote(1024).result())
    except gl.Unschedulable as err:
        print(err)
        sys.exit(125)
