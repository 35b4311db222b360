"""The control plane's cloud target in one process (real SQLite, a provider object that
records its calls): launches written first, the bootstrap join, gangs, failover, restarts."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from gpulayer.control import ControlPlane
from gpulayer.control.providers import ProviderSet
from gpulayer.errors import AuthError, InvalidInput, NoCapacity, ProviderTransient
from gpulayer.hookrecords import LaunchedMachine, LaunchRequest, LiveMachine, MachineOffer, ProviderAdapter
from gpulayer.provider_config import parse
from gpulayer.records import JobState
from gpulayer.specs import Requirements
from gpulayer.store import Store
from tests.factories import make_capabilities, make_cuda_devices, make_distributed_job, make_job


class Cfg(BaseModel):
    shapes: list[str] = ["a"]


class Recorder:
    """A provider that records every call; ``fail`` maps a shape to the error its launch raises."""

    def __init__(self, name: str, cfg: Cfg) -> None:
        self.name, self.cfg = name, cfg
        self.calls: list[tuple[str, Any]] = []
        self.fail: dict[str, Exception] = {}
        self.live: dict[str, LiveMachine] = {}
        self.seen: dict[str, str] = {}  # machine id -> state the db had when launch was called
        self.plane: ControlPlane | None = None

    def check(self) -> None:
        self.calls.append(("check", None))

    def offers(self, requirements: Requirements) -> list[MachineOffer]:
        self.calls.append(("offers", None))
        return [MachineOffer(shape=s, region="r", capabilities=make_capabilities(devices=make_cuda_devices(1)),
                             price_per_hour=float(i + 1)) for i, s in enumerate(self.cfg.shapes)]

    def launch(self, request: LaunchRequest) -> LaunchedMachine:
        self.calls.append(("launch", request))
        if self.plane is not None:
            self.seen[request.machine_id] = self.plane.get_machine(request.machine_id).state
        err = self.fail.get(request.offer.shape)
        if err is not None:
            raise err
        self.live[request.machine_id] = LiveMachine(machine_id=request.machine_id, provider_id=f"i-{request.machine_id}")
        return LaunchedMachine(provider_id=f"i-{request.machine_id}")

    def list(self, label: str) -> list[LiveMachine]:
        self.calls.append(("list", label))
        return list(self.live.values())

    def terminate(self, machine_id: str, provider_id: str | None) -> None:
        self.calls.append(("terminate", machine_id))
        self.live.pop(machine_id, None)

    def count(self, method: str) -> int:
        return sum(1 for m, _ in self.calls if m == method)


ADAPTER = {"rec": ProviderAdapter(name="rec", config=Cfg, create=Recorder)}


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    s = Store(f"sqlite:///{tmp_path / 'm.db'}")
    yield s
    s.dispose()


def plane(store: Store, toml: str = '[p]\ntype = "rec"\nmax_machines = 4\njoin_timeout = 60\nidle_timeout = 30\n',
          clock: list[float] | None = None) -> tuple[ControlPlane, Recorder]:
    now = clock if clock is not None else [1000.0]
    configured = parse(toml, adapters=ADAPTER)
    ps = ProviderSet(configured, control_url="http://127.0.0.1:9", clock=lambda: now[0])
    cp = ControlPlane(store, providers=ps, serving=True, clock=lambda: now[0])
    rec = configured[0].provider
    assert isinstance(rec, Recorder)
    rec.plane = cp
    ps.check()
    ps.refresh_offers()  # as a server does before its first request
    return cp, rec


CLOUD = make_job(target="cloud", accelerator="cuda", gpus=1)


def test_a_launch_is_written_first_and_the_bootstrap_join_binds_the_worker_to_its_machine(store: Store) -> None:
    cp, rec = plane(store)
    job = cp.submit(CLOUD)
    cp.provision()
    [(_, req)] = [c for c in rec.calls if c[0] == "launch"]
    assert rec.seen[req.machine_id] == "launching"  # stored before the provider was called
    m = cp.get_machine(req.machine_id)
    assert (m.state, m.provider_id, m.job_id) == ("booting", f"i-{req.machine_id}", job.id)
    assert req.label == cp.machine_label() and req.control_url == "http://127.0.0.1:9"
    assert "GPULAYER_TOKEN" in req.worker_environment() and req.bootstrap_token.get_secret_value() not in \
        " ".join(req.worker_argv())
    cp.provision()
    assert rec.count("launch") == 1  # the job has a machine on the way: no second one
    caps = make_capabilities(devices=make_cuda_devices(1))
    token = req.bootstrap_token.get_secret_value()
    with pytest.raises(InvalidInput, match="this bootstrap token was made for machine"):
        cp.join_worker(caps, join_token=token, machine_id="m-someoneelse")
    reply = cp.join_worker(caps, join_token=token, machine_id=req.machine_id)
    assert (reply.worker.origin, reply.worker.name) == ("provider", req.machine_id)
    m = cp.get_machine(req.machine_id)
    assert (m.state, m.worker_id) == ("idle", reply.worker_id)
    assert cp.get_job(job.id).state is JobState.ASSIGNED
    with pytest.raises(AuthError, match="used up"):
        cp.join_worker(caps, join_token=token)


def test_a_job_that_fits_an_offer_waits_for_its_machine_and_one_that_fits_none_is_unschedulable(store: Store) -> None:
    cp, _ = plane(store)
    assert cp.submit(CLOUD).state is JobState.QUEUED
    big = cp.submit(make_job(target="cloud", accelerator="cuda", gpus=4))
    assert big.state is JobState.UNSCHEDULABLE
    assert big.error is not None and "cloud: no cloud worker registered" in big.error.message
    assert [o.shape for o in cp.offers(Requirements(accelerator="cuda", gpus=1))] == ["a"]
    assert cp.offers(Requirements(accelerator="cuda", gpus=2)) == []


def test_a_failed_launch_fails_over_in_the_same_pass_and_blocks_the_scope(store: Store) -> None:
    cp, rec = plane(store, '[p]\ntype = "rec"\nshapes = ["a", "b"]\n')
    rec.fail["a"] = NoCapacity("sold out")
    job = cp.submit(CLOUD)
    cp.provision()
    assert [r.offer.shape for m, r in rec.calls if m == "launch"] == ["a", "b"]
    states = {m.shape: (m.state, m.reason) for m in cp.list_machines()}
    assert states == {"a": ("failed", "no capacity (sold out)"), "b": ("booting", "")}
    events = [e.message for e in cp.events(job.id) if e.kind == "cloud"]
    assert events[0] == "p/r/a: no capacity (sold out)" and events[1].startswith("p/r/b: launched m-")
    # another job does not try the blocked scope
    cp.submit(CLOUD)
    cp.provision()
    assert [r.offer.shape for m, r in rec.calls if m == "launch"] == ["a", "b", "b"]


def test_a_transient_error_is_not_retried_at_every_pass(store: Store) -> None:
    cp, rec = plane(store)
    rec.fail["a"] = ProviderTransient("try later")
    cp.submit(CLOUD)
    for _ in range(5):
        cp.provision()
    assert rec.count("launch") == 1
    assert rec.count("offers") == 1 and rec.count("check") == 1


def test_a_gang_launches_all_its_machines_or_none(store: Store) -> None:
    cp, rec = plane(store, '[p]\ntype = "rec"\nmax_machines = 2\n')
    gang = cp.submit(make_distributed_job(3, target="cloud", accelerator="cuda", gpus=1))
    cp.provision()
    assert rec.count("launch") == 0  # 3 machines do not fit a cap of 2
    cp2, _ = plane(store, '[q]\ntype = "rec"\nmax_machines = 3\n')
    cp2.provision()
    machines = [m for m in cp2.list_machines() if m.provider == "q"]
    assert len(machines) == 3 and {m.job_id for m in machines} == {gang.id}
    assert len({m.join_deadline for m in machines}) == 1


def test_the_join_deadline_terminates_the_machine_revokes_its_token_and_blocks_the_scope(store: Store) -> None:
    now = [1000.0]
    cp, rec = plane(store, '[p]\ntype = "rec"\nshapes = ["a", "b"]\njoin_timeout = 60\n', clock=now)
    job = cp.submit(CLOUD)
    cp.provision()
    [(_, req)] = [c for c in rec.calls if c[0] == "launch"]
    now[0] += 61
    cp.provision()
    m = cp.get_machine(req.machine_id)
    assert (m.state, m.reason) == ("failed", "did not join within 60 s")
    assert ("terminate", req.machine_id) in rec.calls
    assert [r.offer.shape for c, r in rec.calls if c == "launch"] == ["a", "b"]  # the next offer, same pass
    with pytest.raises(AuthError):
        cp.join_worker(make_capabilities(), join_token=req.bootstrap_token.get_secret_value())
    line = [e.message for e in cp.events(job.id) if e.kind == "cloud"]
    assert line[1] == f"p/r/a: {req.machine_id} did not join within 60 s; terminated"


def test_an_idle_machine_is_drained_and_terminated_and_its_worker_leaves(store: Store) -> None:
    now = [1000.0]
    cp, rec = plane(store, clock=now)
    job = cp.submit(CLOUD)
    cp.provision()
    [(_, req)] = [c for c in rec.calls if c[0] == "launch"]
    reply = cp.join_worker(make_capabilities(devices=make_cuda_devices(1)),
                           join_token=req.bootstrap_token.get_secret_value())
    [task] = cp.poll_tasks(reply.worker_id)
    cp.start_task(task.task_id, worker_id=reply.worker_id)
    now[0] += 100
    cp.provision()
    assert cp.get_machine(req.machine_id).state == "busy"  # working, however long
    cp.finish_task(task.task_id, worker_id=reply.worker_id, state="succeeded", exit_code=0)  # type: ignore[arg-type]
    assert cp.get_job(job.id).state is JobState.SUCCEEDED
    now[0] += 29
    cp.heartbeat(reply.worker_id)
    cp.provision()
    assert cp.get_machine(req.machine_id).state == "idle"
    now[0] += 2  # 31 s after its task ended
    cp.heartbeat(reply.worker_id)
    cp.provision()
    m = cp.get_machine(req.machine_id)
    assert (m.state, m.reason) == ("terminated", "idle for 30 s")
    assert not cp.get_worker(reply.worker_id).online


def test_after_a_restart_orphans_are_terminated_and_half_done_launches_settled(store: Store) -> None:
    cp, rec = plane(store)
    cp.submit(CLOUD)
    cp.provision()
    [(_, req)] = [c for c in rec.calls if c[0] == "launch"]
    # a machine nobody recorded, with our label; and a launch left half-way by a crash
    rec.live["m-stranger"] = LiveMachine(machine_id="m-stranger", provider_id="i-x")
    with store.write() as s:
        from gpulayer.store import queries

        row = queries.machine(s, req.machine_id)
        row.state = "launching"
        s.add(row)
    cp2, rec2 = plane(store)
    rec2.live = dict(rec.live)
    cp2.provision()
    assert ("terminate", "m-stranger") in rec2.calls
    assert cp2.get_machine(req.machine_id).state == "booting"  # it came up: adopted
    assert rec2.count("list") == 1
    cp2.provision()
    assert rec2.count("list") == 1  # the sweep runs once a minute, not every pass


def test_terminate_machine_and_list_providers(store: Store) -> None:
    cp, _ = plane(store)
    job = cp.submit(CLOUD)
    cp.provision()
    [m] = cp.list_machines()
    [p] = [x for x in cp.list_providers() if x.configured]
    assert (p.name, p.type, p.credentials_ok, p.machines_running, p.max_machines) == ("p", "rec", True, 1, 4)
    assert cp.terminate_machine(m.id).state == "terminating"  # the provider is called by the pass
    assert cp.terminate_machine(m.id).state == "terminating"  # idempotent
    cp.cancel(job.id)  # (else the pass would launch it another machine)
    cp.provision()
    m = cp.get_machine(m.id)
    assert (m.state, m.reason) == ("failed", "terminated by an admin (gpulayer machines terminate)")  # never joined
    assert next(x for x in cp.list_providers() if x.configured).machines_running == 0


def test_an_embedded_control_plane_refuses_a_cloud_only_job(store: Store) -> None:
    cp = ControlPlane(store)
    with pytest.raises(InvalidInput, match="target cloud: machines that providers bring up join a control plane"):
        cp.submit(CLOUD)
    assert cp.submit(make_job(target="local", fallback=["cloud"])).state is JobState.UNSCHEDULABLE
