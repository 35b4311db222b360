"""One memory unit: GPUlayer's GB (1024**3 bytes) is what sizes are shown in and compared in."""

from __future__ import annotations

import re

from gpulayer.cli.resources import render_capabilities
from gpulayer.hookrecords import Device, HostInfo
from gpulayer.scheduling import check
from gpulayer.units import GB, format_gb, format_gb_below, format_wanted_gb, gb
from tests.factories import make_job, make_worker


def test_gb_is_binary():
    assert GB == 1024**3
    assert gb(80 * 1024**3) == 80.0
    assert format_gb(80 * 1024**3) == "80.0"
    assert format_gb(32 * 10**9) == "29.8"
    assert format_gb(63.9999 * GB, 3) == "64.000"


def test_a_card_of_exactly_80_gb_meets_80_not_85_and_shows_the_number_it_is_compared_with():
    card = Device(kind="cuda", index=0, name="NVIDIA A100-SXM4-80GB", memory_bytes=80 * 1024**3,
                  compute_capability="8.0")
    assert card.memory_gb == 80.0
    line = card.describe()
    assert line.startswith("[0] cuda NVIDIA A100-SXM4-80GB (80.0 GB) cc=8.0 ")
    worker = make_worker(devices=[card])
    assert check(make_job(accelerator="cuda", min_gpu_memory_gb=80), worker) == []
    (r,) = check(make_job(accelerator="cuda", min_gpu_memory_gb=85), worker)
    assert (r.code, r.message) == ("gpu_memory", "needs 1 cuda device(s) with >= 85.0 GB, worker has 0")
    # the number describe() shows is the number a requirement is compared with
    shown = float(re.search(r"\(([\d.]+) GB\)", line).group(1))  # type: ignore[union-attr]
    assert check(make_job(accelerator="cuda", min_gpu_memory_gb=shown), worker) == []
    (r,) = check(make_job(accelerator="cuda", min_gpu_memory_gb=shown + 0.1), worker)
    assert r.message == "needs 1 cuda device(s) with >= 80.1 GB, worker has 0"


def test_host_ram_reason_and_resources_line_print_the_same_number():
    host = HostInfo(os="linux", arch="x86_64", cpu_count=8, memory_bytes=32 * 10**9, python_version="3.11.9")
    worker = make_worker()
    worker = worker.model_copy(update={"capabilities": worker.capabilities.model_copy(update={"host": host})})
    (r,) = check(make_job(memory_gb=32), worker)  # 32 * 10**9 bytes is 29.8 GB
    assert (r.code, r.wanted, r.have, r.message) == ("memory", "32.0", "29.8", "needs 32.0 GB RAM, worker has 29.8 GB")
    assert ", 29.8 GB RAM, " in render_capabilities(worker.capabilities)[0]
    assert check(make_job(memory_gb=29.8), worker) == []
    # just below the ask: enough digits to see why it is not met
    (r,) = check(make_job(memory_gb=64), make_worker(memory_gb=63.9999))
    assert r.message == "needs 64.0 GB RAM, worker has 63.999 GB"  # (rounded, 64.000 read as enough)
    (r,) = check(make_job(memory_gb=32), make_worker(memory_gb=31.96))
    assert r.message == "needs 32.0 GB RAM, worker has 31.959 GB"


def test_a_requirement_is_shown_with_the_digits_it_is_compared_with():
    """--memory 64.05 or --min-gpu-memory 80.05 read as 64.0 and 80.0: a worker shown with
    64.0 GB, or cards shown as 80.0 GB, then seemed to meet what they were refused for."""
    (r,) = check(make_job(memory_gb=64.05), make_worker(memory_gb=64.0))
    assert (r.wanted, r.have, r.message) == ("64.05", "64.0", "needs 64.05 GB RAM, worker has 64.0 GB")
    worker = make_worker(devices=[Device(kind="cuda", index=0, name="A100", memory_bytes=80 * GB)])
    (r,) = check(make_job(accelerator="cuda", min_gpu_memory_gb=80.05), worker)
    assert r.message == "needs 1 cuda device(s) with >= 80.05 GB, worker has 0"
    assert format_wanted_gb(64) == "64.0" and format_wanted_gb(0.5) == "0.5" and format_wanted_gb(1 / 3) == "0.3333333333"
    assert format_gb_below(63.9999 * GB, 64) == "63.999" and format_gb_below(31.3 * GB, 64) == "31.3"
