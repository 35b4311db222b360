"""The fleet of a pass (classes, free capacity) and per-shape state (check results, candidates)."""

from __future__ import annotations

import pytest

from gpulayer.hookrecords import MachineOffer
from gpulayer.scheduling import candidates as candidates_mod
from gpulayer.scheduling.candidates import ShapeStates, build_shape_state
from gpulayer.scheduling.fleet import Fleet, offer_record
from gpulayer.scheduling.shapes import shape_of
from tests.factories import make_capabilities, make_cuda_devices, make_device, make_job, make_shape_state, make_state, make_worker


def test_fleet_groups_workers_into_classes_in_fleet_order():
    a = make_worker("wkr-a", devices=make_cuda_devices(8))
    b = make_worker("wkr-b", devices=make_cuda_devices(8), address="10.0.0.2")
    c = make_worker("wkr-c")
    off = make_worker("wkr-off", devices=make_cuda_devices(8), online=False)
    drain = make_worker("wkr-drain", origin="existing", draining=True)
    fleet = Fleet([make_state(a), make_state(c), make_state(b), make_state(off), make_state(drain)])
    assert [w.id for w in fleet.workers] == ["wkr-a", "wkr-c", "wkr-b", "wkr-off", "wkr-drain"]
    assert [w.pos for w in fleet.workers] == [0, 1, 2, 3, 4]
    gpu, cpu, remote = fleet.classes
    assert gpu.rep is a and gpu.first_pos == 0 and gpu.n_devices == 8 and gpu.target == "local"
    assert [w.id for w in gpu.active] == ["wkr-a", "wkr-b"]  # wkr-off is in the class, not active
    assert fleet.workers[3].cls is gpu and fleet.workers[3].state == "offline"
    assert [w.id for w in cpu.active] == ["wkr-c"]
    assert remote.target == "remote" and remote.active == [] and fleet.workers[4].state == "draining"
    assert fleet.registered == {"local": 4, "remote": 1, "cloud": 0}


def test_worker_free_capacity():
    rec = make_worker("wkr-a", devices=[*make_cuda_devices(3), make_device("rocm", 0),
                                        make_device("rocm", 1, usable=False)], cpu_slots=4)
    (w,) = Fleet([make_state(rec, busy=[("cuda", 1)], busy_cpu_slots=1)]).workers
    assert w.free == {"cuda": {0, 2}, "rocm": {0}}
    assert w.free_cpu == 3 and w.reserved == {} and w.state is None
    (w,) = Fleet([make_state(rec, busy_cpu_slots=9)]).workers
    assert w.free_cpu == 0


def test_offer_record_names():
    caps = make_capabilities(devices=make_cuda_devices(1))
    assert offer_record(MachineOffer(provider="p", shape="gpu-1", capabilities=caps)).id == "p:gpu-1"
    rec = offer_record(("p:cpu", make_capabilities()))
    assert (rec.id, rec.name, rec.origin, rec.target) == ("p:cpu", "p:cpu", "provider", "cloud")
    assert offer_record(("p:w", make_worker("wkr-x", devices=make_cuda_devices(2)))).capabilities.devices[1].index == 1
    assert offer_record(("p:m", MachineOffer(provider="q", shape="s", capabilities=caps))).id == "p:m"



def test_build_shape_state_orders_candidates_smallest_first_per_target():
    big = make_worker("wkr-big", devices=make_cuda_devices(8))
    small = make_worker("wkr-small", devices=make_cuda_devices(1))
    small2 = make_worker("wkr-small2", devices=make_cuda_devices(1), labels={"x": "y"})
    remote = make_worker("wkr-remote", origin="existing", devices=make_cuda_devices(2))
    cpu = make_worker("wkr-cpu")
    fleet, st = make_shape_state(make_job(accelerator="cuda", target="remote", fallback=["local"]),
                                 *map(make_state, [big, remote, small, cpu, small2]))
    assert [t for t, _ in st.per_target] == ["remote", "local"]
    assert [[c.cls.rep.id for c in cands] for _, cands in st.per_target] == [
        ["wkr-remote"], ["wkr-small", "wkr-small2", "wkr-big"]]
    assert st.n_in_target == {"remote": 1, "local": 3}
    assert (st.n_compat, st.max_in_target) == (4, 3)
    assert [c.cls.rep.id for c in st.eligible_of.values()] == ["wkr-big", "wkr-remote", "wkr-small", "wkr-small2"]
    assert len(st.by_class) == 5 and st.by_class[fleet.classes[3]].reasons[0].code == "devices"
    assert [w.id for w in st.compatible_workers()] == ["wkr-big", "wkr-remote", "wkr-small", "wkr-small2"]
    assert st.compatible_workers() is st.compatible_workers()
    # a CPU job prefers machines without devices
    _, st = make_shape_state(make_job(), make_state(big), make_state(cpu))
    assert [c.cls.rep.id for _, cands in st.per_target for c in cands] == ["wkr-cpu", "wkr-big"]


def test_build_shape_state_orders_by_eligible_devices():
    mixed = make_worker("wkr-mixed", devices=[make_device("cuda", 0, memory_gb=80), *[
        make_device("cuda", i, memory_gb=16) for i in range(1, 8)]])
    two = make_worker("wkr-two", devices=make_cuda_devices(2, memory_gb=80))
    _, st = make_shape_state(make_job(accelerator="cuda", min_gpu_memory_gb=40), make_state(two), make_state(mixed))
    (_, cands), = st.per_target
    assert [(c.cls.rep.id, c.eligible, c.all_usable) for c in cands] == [
        ("wkr-mixed", (0,), False), ("wkr-two", (0, 1), True)]


def test_build_shape_state_offers_and_unlisted_targets():
    cpu_offer = ("p:cpu", make_capabilities())
    gpu_offer = ("p:gpu", make_capabilities(devices=make_cuda_devices(1)))
    gpu_offer2 = ("p:gpu2", make_capabilities(devices=make_cuda_devices(2)))
    cloud_worker = make_worker("wkr-cloud", origin="provider", devices=make_cuda_devices(1))
    _, st = make_shape_state(make_job(accelerator="cuda", target="cloud"), make_state(cloud_worker),
                             offers=[cpu_offer, gpu_offer, gpu_offer2])
    assert st.offer == "p:gpu"
    assert [(r.worker, r.code) for r in st.offer_reasons] == [("p:cpu", "devices")]
    assert st.n_compat == 1
    _, st = make_shape_state(make_job(accelerator="cuda"), make_state(cloud_worker), offers=[gpu_offer])
    assert st.n_compat == 0 and st.eligible_of == {} and st.per_target == [("local", [])]
    assert st.by_class[next(iter(st.by_class))].reasons[0].code == "target"
    assert [(r.worker, r.code) for r in st.offer_reasons] == [("p:gpu", "target")]


def test_check_runs_once_per_blanked_class_key(monkeypatch: pytest.MonkeyPatch):
    calls: list[str] = []
    real = candidates_mod.compat

    def counting(shape, rec):
        calls.append(rec.id)
        return real(shape, rec)

    monkeypatch.setattr(candidates_mod, "compat", counting)
    records = [make_worker(f"wkr-{i}", memory_gb=16 + i) for i in range(5)]  # five classes
    fleet = Fleet([make_state(r) for r in records])
    assert len(fleet.classes) == 5
    build_shape_state(shape_of(make_job()), fleet.classes, [])
    assert calls == ["wkr-0"]  # RAM is not read: one check for all five
    calls.clear()
    st = build_shape_state(shape_of(make_job(memory_gb=18)), fleet.classes, [])
    assert calls == [f"wkr-{i}" for i in range(5)]
    assert [st.by_class[c].reasons != [] for c in fleet.classes] == [True, True, False, False, False]


def test_shape_states_builds_each_shape_once():
    fleet = Fleet([make_state(make_worker(devices=make_cuda_devices(1)))])
    shapes = ShapeStates(fleet, [])
    a = shapes[shape_of(make_job(accelerator="cuda"))]
    assert shapes[shape_of(make_job(accelerator="cuda", gpus=1))] is a
    assert shapes[shape_of(make_job(accelerator="cuda", gpus=2))] is not a
    assert len(shapes) == 2 and a.shape.device_count == 1
