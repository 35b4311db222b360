"""Job shapes and worker class keys: what a pass groups jobs and workers by."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from gpulayer.scheduling import check
from gpulayer.scheduling.compat import compat
from gpulayer.scheduling.shapes import Shape, blank_unread, class_key, shape_of
from tests.factories import make_cuda_devices, make_device, make_distributed_job, make_function_job, make_job, make_worker


def test_shape_of_a_cpu_job_reads_no_device_filters():
    shape = shape_of(make_job(min_gpu_memory_gb=80, compute_capability=">=9.0", gpus=4))
    assert shape == Shape(accelerator=None, device_count=0, min_gpu_memory_gb=None, compute_capability=None,
                          frameworks=(), python=None, os=None, cpus=None, memory_gb=None, labels=(),
                          targets=("local",), distributed=False)
    assert type(shape) is Shape


def test_shape_of_normalises():
    a = shape_of(make_job(accelerator="cuda", frameworks={"torch": ">=2.2", "jax": ""},
                          labels={"zone": "a", "arch": "x"}, target="remote", fallback=["local", "cloud"]))
    assert a.device_count == 1  # gpus defaults to 1 with an accelerator
    assert a.frameworks == (("jax", ""), ("torch", ">=2.2"))
    assert a.labels == (("arch", "x"), ("zone", "a"))
    assert a.targets == ("remote", "local", "cloud")
    b = shape_of(make_job(accelerator="cuda", gpus=1, frameworks={"jax": "", "torch": ">=2.2"},
                          labels={"arch": "x", "zone": "a"}, target="remote", fallback=["local", "cloud"]))
    assert a == b and hash(a) == hash(b)
    # a function job with the same requirements has the same shape; priority is not part of it
    assert shape_of(make_function_job(accelerator="cuda", priority=5)) == shape_of(make_job(accelerator="cuda"))


def test_shape_of_distributed():
    assert shape_of(make_distributed_job(2)).distributed
    assert shape_of(make_distributed_job(1, nproc_per_node=2)).distributed
    assert not shape_of(make_distributed_job(1)).distributed
    assert shape_of(make_distributed_job(1)) == shape_of(make_job())


def test_class_key_is_named_and_ignores_identity():
    a = make_worker("wkr-a", devices=make_cuda_devices(2), frameworks={"torch": "2.3.0"}, address="10.0.0.1")
    b = make_worker("wkr-b", devices=make_cuda_devices(2), frameworks={"torch": "2.3.0"}, address="10.0.0.2",
                    name="other", hostname="elsewhere")
    assert class_key(a) == class_key(b)
    key = class_key(a)
    assert (key.origin, key.has_cpu_slots, key.os, key.cpu_count) == ("local", True, "linux", 8)
    assert [d[:3] for d in key.devices] == [("cuda", 0, True), ("cuda", 1, True)]
    assert key.frameworks == (("torch", "2.3.0"),)
    assert class_key(make_worker("wkr-c", cpu_slots=0)).has_cpu_slots is False
    assert class_key(make_worker("wkr-a", memory_gb=64)) != class_key(make_worker("wkr-a", memory_gb=32))


def test_blank_unread_blanks_only_host_fields_the_shape_does_not_read():
    key = class_key(make_worker(devices=make_cuda_devices(1), labels={"zone": "a"}))
    always = (key.origin, key.has_cpu_slots, key.os, key.devices, key.frameworks, key.labels, key.notes)
    assert blank_unread(shape_of(make_job(accelerator="cuda")))(key) == (*always[:3], *always[3:])
    assert blank_unread(shape_of(make_job(python=">=3.10", cpus=2, memory_gb=8)))(key) == tuple(key)
    assert blank_unread(shape_of(make_job(memory_gb=8)))(key) == (*always[:3], key.memory_bytes, *always[3:])
    assert blank_unread(shape_of(make_job(python=">=3", cpus=0)))(key) == (*always[:3], key.python_version, *always[3:])
    # two workers that differ only in RAM share a blanked key for a job without a RAM need
    small, big = class_key(make_worker(memory_gb=16)), class_key(make_worker(memory_gb=512))
    assert small != big
    assert blank_unread(shape_of(make_job(cpus=4)))(small) == blank_unread(shape_of(make_job(cpus=4)))(big)
    assert blank_unread(shape_of(make_job(memory_gb=1)))(small) != blank_unread(shape_of(make_job(memory_gb=1)))(big)


# --------------------------------------------------------------------------- properties:
# equal shapes (blanked class keys) must mean equal check results, or the caches lie.

requirements = st.fixed_dictionaries({}, optional={
    "accelerator": st.sampled_from(["cuda", "mps"]),
    "gpus": st.integers(0, 3),
    "min_gpu_memory_gb": st.sampled_from([20, 80]),
    "compute_capability": st.sampled_from([">=8.0", "9.0"]),
    "frameworks": st.sampled_from([{"torch": ">=2.2"}, {"torch": "", "jax": ""}]),
    "python": st.sampled_from([">=3.11", ""]),
    "os": st.sampled_from(["linux", "darwin"]),
    "cpus": st.sampled_from([0, 4, 16]),
    "memory_gb": st.sampled_from([0, 16, 64]),
    "labels": st.sampled_from([{"zone": "a"}]),
})

workers = st.builds(
    lambda i, n, mem, cc, origin, slots, os, py, cpus, ram, fw, labels: make_worker(
        f"wkr-{i}", devices=[make_device("cuda", j, memory_gb=mem, cc=cc) for j in range(n)], origin=origin,
        cpu_slots=slots, os=os, python_version=py, cpu_count=cpus, memory_gb=ram, frameworks=fw, labels=labels),
    st.integers(0, 3), st.integers(0, 3), st.sampled_from([24, 80]), st.sampled_from([None, "8.6", "9.0"]),
    st.sampled_from(["local", "existing"]), st.integers(0, 2), st.sampled_from(["linux", "darwin"]),
    st.sampled_from(["3.10.12", "3.11.9"]), st.sampled_from([4, 16]), st.sampled_from([16, 64]),
    st.sampled_from([{}, {"torch": "2.1.0"}, {"torch": "2.3.0", "jax": "0.4"}]),
    st.sampled_from([{}, {"zone": "a"}, {"zone": "b"}]),
)


def _variant(req: dict, draw_keys: list[str]) -> dict:
    """``req`` with changes that should not change its shape: fields a CPU job does not read,
    gpus=1 spelled out or left to default, dicts in another order."""
    out = dict(req)
    for key in draw_keys:
        if key == "device-filters" and "accelerator" not in out:
            out.update(min_gpu_memory_gb=40, compute_capability=">=7.0", gpus=2)
        elif key == "gpus" and out.get("accelerator") and out.get("gpus", 1) == 1:
            out["gpus"] = None if "gpus" in out else 1
        elif key == "order":
            for field in ("frameworks", "labels"):
                if field in out:
                    out[field] = dict(reversed(list(out[field].items())))
    return {k: v for k, v in out.items() if v is not None}


@settings(max_examples=300, deadline=None)
@given(req=requirements, changes=st.lists(st.sampled_from(["device-filters", "gpus", "order"])),
       other=requirements, worker=workers, target=st.sampled_from(["local", "remote"]))
def test_equal_shapes_get_equal_check_results(req, changes, other, worker, target):
    job = make_job(target=target, **req)
    same = make_job(target=target, **_variant(req, changes))
    assert shape_of(same) == shape_of(job)
    assert check(same, worker) == check(job, worker)
    maybe = make_job(target=target, **other)
    if shape_of(maybe) == shape_of(job):
        assert check(maybe, worker) == check(job, worker)


host_changes = st.fixed_dictionaries({}, optional={
    "python_version": st.sampled_from(["3.10.12", "3.11.9", "3.12.1"]),
    "cpu_count": st.sampled_from([2, 4, 16, 64]),
    "memory_bytes": st.sampled_from([8 * 2**30, 16 * 2**30, 64 * 2**30, 256 * 2**30]),
})


@settings(max_examples=300, deadline=None)
@given(req=requirements, worker=workers, changes=host_changes)
def test_equal_blanked_class_keys_get_equal_check_results(req, worker, changes):
    shape = shape_of(make_job(**req))
    caps = worker.capabilities
    other = worker.model_copy(update={"id": "wkr-other", "capabilities": caps.model_copy(
        update={"host": caps.host.model_copy(update=changes)})})
    blank = blank_unread(shape)
    if blank(class_key(worker)) == blank(class_key(other)):
        assert compat(shape, worker) == compat(shape, other)
    else:
        assert class_key(worker) != class_key(other)
