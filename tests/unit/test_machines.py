"""The control plane's cloud target in one process (real SQLite, a provider object that
records its calls): launches written first, the bootstrap join, gangs, failover, restarts,
and adapters that answer with the wrong types."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any, cast

import pytest
from pydantic import BaseModel

from gpulayer.control import ControlPlane
from gpulayer.control.providers import ProviderCallFailed, ProviderSet
from gpulayer.errors import AuthError, InvalidInput, NoCapacity, ProviderTransient
from gpulayer.hookrecords import LaunchedMachine, LaunchRequest, LiveMachine, MachineOffer, ProviderAdapter
from gpulayer.hookspecs import hookimpl
from gpulayer.plugins import PluginManager
from gpulayer.provider_config import parse
from gpulayer.records import JobState
from gpulayer.specs import Placement, Requirements
from gpulayer.store import Store
from tests.factories import make_capabilities, make_cuda_devices, make_distributed_job, make_job


class Cfg(BaseModel):
    shapes: list[str] = ["a"]
    #: calls that answer with the wrong types: offers the shapes' names, launch (after
    #: bringing the machine up) its provider id as a bare string, list a dict
    garbage: list[str] = []
    check_fails: bool = False
    #: check() calls sys.exit(), as an adapter whose SDK gives up might
    check_exits: bool = False
    #: machines of each offer at once (None: no bound), as a host of an SSH pool holds one
    capacity: int | None = None


class Recorder:
    """A provider that records every call; ``fail`` maps a shape to the error its launch
    raises; the section's ``garbage`` and ``check_fails`` make it misbehave (see :class:`Cfg`)."""

    def __init__(self, name: str, cfg: Cfg) -> None:
        self.name, self.cfg = name, cfg
        self.calls: list[tuple[str, Any]] = []
        self.fail: dict[str, Exception] = {}
        self.terminate_fails: Exception | None = None  # what terminate raises, while set
        self.live: dict[str, LiveMachine] = {}
        self.seen: dict[str, str] = {}  # machine id -> state the db had when launch was called
        self.plane: ControlPlane | None = None

    def check(self) -> None:
        self.calls.append(("check", None))
        if self.cfg.check_fails:
            raise RuntimeError("boom")
        if self.cfg.check_exits:
            raise SystemExit("no credentials file")

    def offers(self, requirements: Requirements) -> list[MachineOffer]:
        self.calls.append(("offers", None))
        if "offers" in self.cfg.garbage:
            return cast("list[MachineOffer]", list(self.cfg.shapes))
        return [MachineOffer(shape=s, region="r", capabilities=make_capabilities(devices=make_cuda_devices(1)),
                             price_per_hour=float(i + 1), capacity=self.cfg.capacity)
                for i, s in enumerate(self.cfg.shapes)]

    def launch(self, request: LaunchRequest) -> LaunchedMachine:
        self.calls.append(("launch", request))
        if self.plane is not None:
            self.seen[request.machine_id] = self.plane.get_machine(request.machine_id).state
        err = self.fail.get(request.offer.shape)
        if err is not None:
            raise err
        self.live[request.machine_id] = LiveMachine(machine_id=request.machine_id, provider_id=f"i-{request.machine_id}")
        if "launch" in self.cfg.garbage:
            return cast(LaunchedMachine, f"i-{request.machine_id}")
        return LaunchedMachine(provider_id=f"i-{request.machine_id}")

    def list(self, label: str) -> list[LiveMachine]:
        self.calls.append(("list", label))
        if "list" in self.cfg.garbage:
            return cast("list[LiveMachine]", [m.model_dump() for m in self.live.values()] or [{"machine_id": "m-x", "provider_id": "i-x"}])
        return list(self.live.values())

    def terminate(self, machine_id: str, provider_id: str | None) -> None:
        self.calls.append(("terminate", machine_id))
        if self.terminate_fails is not None:
            raise self.terminate_fails
        self.live.pop(machine_id, None)

    def count(self, method: str) -> int:
        return sum(1 for m, _ in self.calls if m == method)


ADAPTER = {"rec": ProviderAdapter(name="rec", config=Cfg, create=Recorder)}


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
    # each offer by its region too (two regions' offers of a shape were two identical lines)
    assert "\np:a in r: needs 4 usable cuda device(s), worker has 1\n" in big.error.message
    assert [o.shape for o in cp.offers(Requirements(accelerator="cuda", gpus=1))] == ["a"]
    assert cp.offers(Requirements(accelerator="cuda", gpus=2)) == []


@pytest.mark.parametrize(("limit", "why"), [
    ("max_price_per_hour = 0.5", "priced over its section's max_price_per_hour ($0.50/h)"),
    ("max_machines = 0", "its section's max_machines is 0"),
])
def test_an_offer_its_section_never_lets_launch_is_no_offer_to_wait_for(store: Store, limit: str, why: str) -> None:
    """The docs: an offer over the cap is never launched. A job only it fits waited for ever,
    saying a machine was coming; it is unschedulable, and explain says why the offer is out."""
    cp, rec = plane(store, f'[p]\ntype = "rec"\n{limit}\n')
    job = cp.submit(CLOUD)
    assert job.state is JobState.UNSCHEDULABLE, job.decision
    cp.provision()
    assert rec.count("launch") == 0
    assert cp.offers(Requirements(accelerator="cuda", gpus=1)) == []
    [offer] = cp.explain_job(job.id).offers or []
    assert (offer.shape, offer.never_launched) == ("a", why)
    assert cp.explain_job(job.id).render().count(f"; never launched: {why}") == 1


def test_explain_says_why_each_offer_cannot_run_the_job_and_which_providers_offer_nothing(store: Store) -> None:
    """The docs: a job is matched against an offer as against a worker, with the same reasons
    in explain. A job no offer fits read only 'no configured provider offers a machine that
    fits'; a disabled provider was not named."""
    cp, _ = plane(store, '[p]\ntype = "rec"\nshapes = ["a", "b"]\n[q]\ntype = "rec"\n')
    assert cp.providers is not None
    cp.providers.disable("q", "boom: no credentials")  # (what a check() that raises ProviderAuthFailed does)
    job = cp.submit(make_job(target="cloud", accelerator="cuda", gpus=5))
    assert job.state is JobState.UNSCHEDULABLE
    e = cp.explain_job(job.id)
    assert e.offers == []
    assert [(o.provider, o.shape, o.unfit) for o in e.unfit_offers] == [
        ("p", "a", "needs 5 usable cuda device(s), worker has 1"), ("p", "b", "needs 5 usable cuda device(s), worker has 1")]
    [down] = e.providers_down
    assert down.startswith("q: ") and "boom" in down
    lines = e.render().splitlines()
    assert "offer p:a in r: needs 5 usable cuda device(s), worker has 1" in lines
    assert f"provider {down}" in lines
    # an offer that fits is not listed again among those that do not
    fits = cp.explain(make_job(target="cloud", accelerator="cuda", gpus=1))
    assert [o.shape for o in fits.offers or []] == ["a", "b"] and fits.unfit_offers == []


def test_a_cloud_job_no_provider_can_offer_for_says_which_are_down_and_why(store: Store) -> None:
    """Every provider disabled (its credentials failed): submit said only 'no provider
    offered a machine', while explain named each provider and why; the job's error names
    them as explain does."""
    cp, _ = plane(store, '[p]\ntype = "rec"\n[q]\ntype = "rec"\n')
    assert cp.providers is not None
    cp.providers.disable("p", "AuthFailure: AWS was not able to validate the provided access credentials")
    cp.providers.disable("q", "no credentials")
    job = cp.submit(CLOUD)
    assert job.state is JobState.UNSCHEDULABLE and job.error is not None
    assert job.error.message.splitlines() == [
        "scheduling: no eligible worker",
        "cloud: no cloud worker registered and no provider offered a machine",
        "provider p: credentials failed: AuthFailure: AWS was not able to validate the provided access credentials",
        "provider q: credentials failed: no credentials",
        f"run: gpulayer jobs explain {job.id}",
    ]
    explained = cp.explain_job(job.id).render().splitlines()
    assert all(line in explained for line in job.error.message.splitlines()[2:4])
    # a job that may run elsewhere too (local first, cloud as a fallback) is told the same
    other = cp.submit(make_job(target="remote", fallback=["cloud"]))
    assert other.error is not None and "\nprovider q: credentials failed: no credentials\n" in other.error.message
    # and one that lists no cloud target is not
    remote = cp.submit(make_job(target="remote"))
    assert remote.error is not None and "provider" not in remote.error.message


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
    spec = make_distributed_job(3, target="cloud", accelerator="cuda", gpus=1)
    # 3 machines do not fit a cap of 2: no offer to wait for (it failed at once, or waits
    # for a worker to join, saying why)
    refused = cp.submit(spec)
    assert refused.state is JobState.UNSCHEDULABLE and refused.error is not None
    assert "p:a in r: needs 3 machines at once, its provider brings up 2 at most" in refused.error.message
    gang = cp.submit(spec.model_copy(update={"placement": Placement(target="cloud", on_unschedulable="wait")}))
    cp.provision()
    assert rec.count("launch") == 0
    cp2, _ = plane(store, '[q]\ntype = "rec"\nmax_machines = 3\n')
    cp2.schedule_queue()  # (a pass as the server's loop runs them: the job waits for [q]'s offer now)
    cp2.provision()
    machines = [m for m in cp2.list_machines() if m.provider == "q"]
    assert len(machines) == 3 and {m.job_id for m in machines} == {gang.id}
    assert len({m.join_deadline for m in machines}) == 1


def test_a_gang_bigger_than_what_the_offers_hold_together_is_unschedulable(store: Store) -> None:
    """Three nodes on a pool of two hosts of one machine each waited for ever, saying a
    machine was coming."""
    cp, rec = plane(store, '[p]\ntype = "rec"\nshapes = ["a", "b"]\ncapacity = 1\n')
    job = cp.submit(make_distributed_job(3, target="cloud", accelerator="cuda", gpus=1))
    assert job.state is JobState.UNSCHEDULABLE and job.error is not None
    assert "p:a in r: needs 3 machines at once, its provider brings up 2 at most" in job.error.message
    cp.provision()
    assert rec.count("launch") == 0
    assert cp.submit(make_distributed_job(2, target="cloud", accelerator="cuda", gpus=1)).state is JobState.QUEUED
    # two offers of one scope (spot and not) hold its capacity once: no room for two
    twins, _ = plane(store, '[t]\ntype = "rec"\nshapes = ["x", "x"]\ncapacity = 1\n')
    job = twins.submit(make_distributed_job(2, target="cloud", accelerator="cuda", gpus=1))
    assert job.state is JobState.UNSCHEDULABLE and job.error is not None, job.decision
    assert "needs 2 machines at once, its provider brings up 1 at most" in job.error.message


def test_a_gang_no_one_offer_holds_takes_a_machine_of_each_of_several(store: Store) -> None:
    """A pool of hosts of one machine each: a two-node job launched a machine on the first
    host, failed the second with no capacity there, ended the first, and began again five
    minutes later, for ever."""
    cp, rec = plane(store, '[p]\ntype = "rec"\nshapes = ["a", "b", "c"]\ncapacity = 1\n')
    gang = cp.submit(make_distributed_job(2, target="cloud", accelerator="cuda", gpus=1))
    cp.provision()
    shapes = [req.offer.shape for m, req in rec.calls if m == "launch"]
    assert shapes == ["a", "b"]
    machines = cp.list_machines()
    assert {(m.shape, m.state, m.job_id) for m in machines} == {("a", "booting", gang.id), ("b", "booting", gang.id)}
    assert len({m.join_deadline for m in machines}) == 1
    single = cp.submit(CLOUD)
    cp.provision()
    assert [req.offer.shape for m, req in rec.calls if m == "launch"][2:] == ["c"]  # not a or b: they hold one
    cp.submit(CLOUD)
    cp.provision()
    assert rec.count("launch") == 3  # every host holds one
    assert single.id in {m.job_id for m in cp.list_machines()}


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


def test_a_machine_booting_for_a_job_that_was_cancelled_is_withdrawn_without_blocking_its_scope(
        store: Store) -> None:
    """A Slurm pilot still queued (or a VM booting) for a job cancelled meanwhile would join and
    hold its devices until the idle timeout, or fail at its join deadline and block the scope
    for every job: it is terminated at the next pass, as no failure."""
    now = [1000.0]
    cp, rec = plane(store, '[p]\ntype = "rec"\nshapes = ["a", "b"]\njoin_timeout = 60\n', clock=now)
    job = cp.submit(CLOUD)
    cp.provision()
    [(_, req)] = [c for c in rec.calls if c[0] == "launch"]
    assert cp.get_machine(req.machine_id).state == "booting"
    cp.cancel(job.id)
    now[0] += 1
    cp.provision()
    m = cp.get_machine(req.machine_id)
    assert (m.state, m.reason) == ("terminated", f"withdrawn: its job {job.id} is cancelled (before the machine joined)")
    assert ("terminate", req.machine_id) in rec.calls
    with pytest.raises(AuthError):  # its token is revoked: a join on its way is refused
        cp.join_worker(make_capabilities(), join_token=req.bootstrap_token.get_secret_value())
    again = cp.submit(CLOUD)  # the scope is not blocked: the next job takes the same offer
    cp.provision()
    assert [r.offer.shape for c, r in rec.calls if c == "launch"] == ["a", "a"]
    assert cp.get_job(again.id).state is JobState.QUEUED


def test_a_machine_booting_for_a_job_that_was_cancelled_and_deleted_is_withdrawn(store: Store) -> None:
    """`gpulayer jobs cancel JOB && gpulayer jobs delete JOB` while its machine boots: with
    its job gone, the machine was taken for still wanted, joined and held its devices until
    the idle timeout. It is withdrawn as for a cancelled job."""
    now = [1000.0]
    cp, rec = plane(store, '[p]\ntype = "rec"\nshapes = ["a"]\njoin_timeout = 60\n', clock=now)
    job = cp.submit(CLOUD)
    cp.provision()
    [(_, req)] = [c for c in rec.calls if c[0] == "launch"]
    cp.cancel(job.id)
    assert cp.delete_jobs([job.id]).deleted == [job.id]
    now[0] += 1
    cp.provision()
    m = cp.get_machine(req.machine_id)
    assert (m.state, m.reason) == ("terminated", f"withdrawn: its job {job.id} was deleted (before the machine joined)")
    assert ("terminate", req.machine_id) in rec.calls


def test_a_machine_that_joined_since_housekeeping_looked_is_not_withdrawn_or_failed(store: Store) -> None:
    """Housekeeping reads the machines, then ends each: one that joined in between (and may
    have taken a task) is left alone."""
    cp, rec = plane(store)
    cp.submit(CLOUD)
    cp.provision()
    [(_, req)] = [c for c in rec.calls if c[0] == "launch"]
    cp.join_worker(make_capabilities(devices=make_cuda_devices(1)), join_token=req.bootstrap_token.get_secret_value())
    cp._end_machine(req.machine_id, "withdrawn: as housekeeping decided before the join", failed=False, unjoined=True)
    assert cp.get_machine(req.machine_id).state == "idle"
    assert ("terminate", req.machine_id) not in rec.calls


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


def test_an_idle_machine_says_it_is_idle_since_its_last_task_ended(store: Store) -> None:
    """``machines list`` showed IDLE FOR 41s on a machine with idle_timeout 20 s that was not
    terminated: it counted from the join, while the timeout counts from the last task's end."""
    now = [1000.0]
    cp, rec = plane(store, clock=now)
    cp.submit(CLOUD)
    cp.provision()
    [(_, req)] = [c for c in rec.calls if c[0] == "launch"]
    reply = cp.join_worker(make_capabilities(devices=make_cuda_devices(1)),
                           join_token=req.bootstrap_token.get_secret_value())

    def run_one() -> None:  # a task no pass sees running
        [task] = cp.poll_tasks(reply.worker_id)
        cp.start_task(task.task_id, worker_id=reply.worker_id)
        cp.finish_task(task.task_id, worker_id=reply.worker_id, state="succeeded", exit_code=0)  # type: ignore[arg-type]

    run_one()
    cp.provision()
    assert cp.get_machine(req.machine_id).idle_since == 1000.0
    now[0] += 25
    cp.submit(CLOUD)  # placed on the idle machine at once, and done before the next pass
    now[0] += 1
    run_one()
    now[0] += 10
    cp.heartbeat(reply.worker_id)
    cp.provision()
    [listed] = cp.list_machines()
    assert (listed.state, listed.idle_since) == ("idle", 1026.0) == (cp.get_machine(req.machine_id).state,
                                                                      cp.get_machine(req.machine_id).idle_since)


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


def test_a_machine_of_a_renamed_section_that_the_new_one_ends_as_an_orphan_ends_in_the_records(
        store: Store) -> None:
    """It stayed 'idle' for ever, its idle time counting, and 'machines terminate' said its
    provider was not configured: no section could end its record."""
    cp, rec = plane(store)
    job = cp.submit(CLOUD)
    cp.provision()
    [(_, req)] = [c for c in rec.calls if c[0] == "launch"]
    reply = cp.join_worker(make_capabilities(devices=make_cuda_devices(1)), machine_id=req.machine_id,
                           join_token=req.bootstrap_token.get_secret_value())
    cp.cancel(job.id)
    renamed, rec2 = plane(store, '[q]\ntype = "rec"\nmax_machines = 4\n')  # [p] is [q] now: same hosts
    rec2.live = dict(rec.live)
    renamed.provision()
    assert ("terminate", req.machine_id) in rec2.calls  # an orphan to [q], as before
    m = renamed.get_machine(req.machine_id)
    assert (m.state, m.reason) == ("terminated", "its provider 'p' is no longer configured; provider 'q' "
                                                 "terminated it")
    assert not renamed.get_worker(reply.worker_id).online
    # a worker pruned meanwhile is no error of the sweep's (it stopped the sweep with NotFound)
    again, rec3 = plane(store, '[r]\ntype = "rec"\n')
    with store.write() as s:
        from gpulayer.store import queries

        row = queries.machine(s, req.machine_id)
        row.provider, row.state, row.ended_at = "gone", "idle", None
        s.add(row)
    renamed.prune_workers(worker_ids=[reply.worker_id])
    rec3.live = {**dict(rec.live), "m-other": LiveMachine(machine_id="m-other", provider_id="i-o")}
    assert sorted(again.sweep_orphans()) == sorted([req.machine_id, "m-other"])
    assert again.get_machine(req.machine_id).state == "terminated"


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


def test_a_failed_terminate_is_tried_again_after_30_s_or_at_once_when_asked_again(store: Store) -> None:
    clock = [1000.0]
    cp, rec = plane(store, clock=clock)
    job = cp.submit(CLOUD)
    cp.provision()
    [m] = cp.list_machines()
    cp.cancel(job.id)  # (else the pass would launch it another machine)
    rec.terminate_fails = ProviderTransient("the host does not answer")
    cp.terminate_machine(m.id)
    cp.provision()
    assert rec.count("terminate") == 1 and cp.get_machine(m.id).state == "terminating"
    clock[0] += 29
    cp.provision()  # not at every pass
    assert rec.count("terminate") == 1
    assert cp.terminate_machine(m.id).state == "terminating"  # asked again: the next pass tries
    cp.provision()
    assert rec.count("terminate") == 2 and cp.get_machine(m.id).state == "terminating"
    rec.terminate_fails = None  # fixed: asked again, it ends at the next pass
    cp.terminate_machine(m.id)
    cp.provision()
    assert rec.count("terminate") == 3
    assert cp.get_machine(m.id).state == "failed"  # (it never joined)


def test_an_embedded_control_plane_refuses_a_cloud_only_job(store: Store) -> None:
    cp = ControlPlane(store)
    with pytest.raises(InvalidInput, match="target cloud: machines that providers bring up join a control plane"):
        cp.submit(CLOUD)
    assert cp.submit(make_job(target="local", fallback=["cloud"])).state is JobState.UNSCHEDULABLE


def test_the_jobs_preference_picks_the_offer(store: Store) -> None:
    """The waiting line (`gpulayer submit`, the job's decision) named the shape's first
    offer, the cheaper a, while the machine launched was the preferred b."""
    cp, _ = plane(store, '[p]\ntype = "rec"\nshapes = ["a", "b"]\n')
    job = cp.submit(make_job(target="cloud", accelerator="cuda", gpus=1).model_copy(
        update={"placement": Placement(target="cloud", prefer=["p/r/b"])}))
    plain = cp.submit(CLOUD)  # (the same shape, no preference)
    cp.provision()
    assert {m.job_id: m.shape for m in cp.list_machines()} == {job.id: "b", plain.id: "a"}  # not the cheaper a
    assert job.decision is not None and job.decision.summary == (
        "waiting: no compatible worker registered yet; offer p:b in r could run it once booted")
    assert plain.decision is not None and plain.decision.summary.endswith("offer p:a in r could run it once booted")
    assert cp.explain_job(job.id).decision.summary.endswith("offer p:b in r could run it once booted")


def test_the_waiting_line_names_the_offer_provisioning_tries_first(store: Store) -> None:
    """Capacity you own (priced None) before priced, available before unknown; a blocked
    scope after the others: the offer the job waits for is the one a launch would take."""
    cp, _ = plane(store, '[p]\ntype = "rec"\nshapes = ["a", "b", "c"]\n')
    assert cp.providers is not None
    offers = cp.providers.status["p"].offers
    offers[1] = offers[1].model_copy(update={"price_per_hour": None})
    job = cp.submit(CLOUD)
    assert job.decision is not None and job.decision.summary.endswith("offer p:b in r could run it once booted")
    assert cp.explain(CLOUD).decision.summary.endswith("offer p:b in r could run it once booted")
    cp.providers.blocks.block("p/r/b", cp.clock(), 300, "no capacity")
    later = cp.submit(CLOUD)
    assert later.decision is not None and later.decision.summary.endswith("offer p:a in r could run it once booted")


# --------------------------------------------------------------------------- adapters that misbehave


class RecorderPlugin:
    """The ``rec`` adapter as a registered plugin, so that providers name their plugin."""

    @hookimpl
    def gpulayer_provider_adapters(self) -> Iterator[ProviderAdapter]:
        yield ADAPTER["rec"]


@pytest.fixture
def rec_plugin(plugin_manager: PluginManager) -> str:
    plugin_manager.register(RecorderPlugin(), name="tests-recorder")
    return "tests-recorder"


WHO = "provider 'bad' (plugin 'tests-recorder')"


def warnings_of(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "gpulayer.provisioning" and r.levelno == logging.WARNING]


def provider_info(cp: ControlPlane, name: str) -> Any:
    return next(p for p in cp.list_providers() if p.name == name)


def test_a_list_of_non_machines_is_refused_naming_the_plugin_asked_again_a_minute_later_and_others_launch(
        store: Store, rec_plugin: str, caplog: pytest.LogCaptureFixture) -> None:
    now = [1000.0]
    cp, bad = plane(store, '[bad]\ntype = "rec"\nshapes = []\ngarbage = ["list"]\n[good]\ntype = "rec"\n', clock=now)
    good = cast(Recorder, cp.providers.configured["good"].provider)  # type: ignore[union-attr]
    cp.submit(CLOUD)
    for _ in range(5):
        cp.provision()  # (a provider's answer never breaks the pass)
    assert good.count("launch") == 1 and [m.provider for m in cp.list_machines()] == ["good"]
    assert (bad.count("list"), good.count("list")) == (1, 1)  # not at every pass
    now[0] += 61
    cp.provision()
    assert (bad.count("list"), good.count("list")) == (2, 2)  # once a minute, as after a raise
    refused = ("list() returned a list whose item 0 is a dict; accepted: a list of gpulayer.plugin.LiveMachine "
               "records (an empty list for none)")
    assert warnings_of(caplog) == [f"{WHO}: {refused}; listing again in 60 s"] * 2
    assert provider_info(cp, "bad").last_error == refused


def test_offers_that_are_not_offers_are_refused_naming_the_plugin_and_asked_again_after_the_ttl(
        store: Store, rec_plugin: str, caplog: pytest.LogCaptureFixture) -> None:
    now = [1000.0]
    cp, bad = plane(store, '[bad]\ntype = "rec"\ngarbage = ["offers"]\n[good]\ntype = "rec"\n', clock=now)
    good = cast(Recorder, cp.providers.configured["good"].provider)  # type: ignore[union-attr]
    assert [o.provider for o in cp.offers(Requirements())] == ["good"]
    cp.submit(CLOUD)
    for _ in range(5):
        cp.provision()
    assert good.count("launch") == 1
    assert (bad.count("offers"), good.count("offers")) == (1, 1)  # cached for 30 s, also after a refusal
    now[0] += 30
    cp.provision()
    assert (bad.count("offers"), good.count("offers")) == (2, 2)
    refused = ("offers() returned a list whose item 0 is a str; accepted: a list of gpulayer.plugin.MachineOffer "
               "records (an empty list for none)")
    assert warnings_of(caplog) == [f"{WHO}: {refused}; asking again in 30 s"] * 2
    assert provider_info(cp, "bad").last_error == refused


def test_a_launch_answer_that_is_not_a_launched_machine_fails_over_like_a_raise(
        store: Store, rec_plugin: str, caplog: pytest.LogCaptureFixture) -> None:
    cp, bad = plane(store, '[bad]\ntype = "rec"\ngarbage = ["launch"]\n[good]\ntype = "rec"\n')
    good = cast(Recorder, cp.providers.configured["good"].provider)  # type: ignore[union-attr]
    job = cp.submit(CLOUD.model_copy(update={"placement": Placement(target="cloud", prefer=["bad", "good"])}))
    with caplog.at_level(logging.WARNING, logger="gpulayer"):
        cp.provision()
    # the server's log names the provider, its plugin, the call, what it returned (as the docs say)
    assert [r.getMessage() for r in caplog.records if "launch()" in r.getMessage()] == [
        f"{WHO}: launch() returned a str; accepted: a gpulayer.plugin.LaunchedMachine record; bad/r/a is skipped "
        "for 30 s"]
    [(_, req)] = [c for c in bad.calls if c[0] == "launch"]
    refused = f"{WHO}: launch() returned a str; accepted: a gpulayer.plugin.LaunchedMachine record"
    m = cp.get_machine(req.machine_id)
    assert (m.state, m.reason) == ("failed", f"launch failed ({refused})")
    assert ("terminate", req.machine_id) in bad.calls and not bad.live  # it may have come up: ended
    with pytest.raises(AuthError):  # its bootstrap token is revoked
        cp.join_worker(make_capabilities(), join_token=req.bootstrap_token.get_secret_value())
    # the job's next offer, in the same pass
    [(_, other)] = [c for c in good.calls if c[0] == "launch"]
    assert cp.get_machine(other.machine_id).state == "booting"
    events = [e.message for e in cp.events(job.id) if e.kind == "cloud"]
    assert events[0] == f"bad/r/a: launch failed ({refused})" and events[1].startswith("good/r/a: launched m-")
    cp.submit(CLOUD.model_copy(update={"placement": Placement(target="cloud", prefer=["bad"])}))
    cp.provision()
    assert bad.count("launch") == 1  # the scope is blocked for a while, as after a raise


def test_a_failing_check_is_logged_once_naming_the_provider_and_its_plugin(
        store: Store, rec_plugin: str, caplog: pytest.LogCaptureFixture) -> None:
    cp, _ = plane(store, '[bad]\ntype = "rec"\ncheck_fails = true\n')
    assert warnings_of(caplog) == [f"{WHO}: check() raised RuntimeError: boom; checking again in 30 s"]
    # shown until a check succeeds (the offers that answered since do not hide it)
    assert provider_info(cp, "bad").last_error == "check() raised RuntimeError: boom"


def test_a_check_that_calls_sys_exit_is_the_providers_failure_not_the_servers_end(
        store: Store, rec_plugin: str, caplog: pytest.LogCaptureFixture) -> None:
    cp, _ = plane(store, '[bad]\ntype = "rec"\ncheck_exits = true\n')
    assert warnings_of(caplog) == [f"{WHO}: check() raised SystemExit: no credentials file; checking again in 30 s"]
    assert provider_info(cp, "bad").last_error == "check() raised SystemExit: no credentials file"


class Answers:
    """A provider whose every call answers ``answer``."""

    def __init__(self, name: str, cfg: Cfg) -> None:
        self.answer: Any = None

    def offers(self, requirements: Requirements) -> Any:
        return self.answer

    def launch(self, request: LaunchRequest) -> Any:
        return self.answer

    def list(self, label: str) -> Any:
        return self.answer


OFFER = MachineOffer(shape="a", capabilities=make_capabilities())
MACHINE = LiveMachine(machine_id="m-1", provider_id="i-1")


@pytest.mark.parametrize(("method", "answer", "returned"), [
    ("offers", None, "None"),
    ("offers", {"shape": "a"}, "a dict"),
    ("offers", "a", "a str"),
    ("offers", OFFER, "one MachineOffer, not a list of them"),
    ("offers", [OFFER, "a"], "a list whose item 1 is a str"),
    ("offers", [OFFER.model_copy(update={"data": {"s": {1}}})],
     "a list whose item 0 is a MachineOffer whose data is not JSON (TypeError: Object of type set is not JSON serializable)"),
    ("launch", None, "None"),
    ("launch", "i-1", "a str"),
    ("launch", {"provider_id": "i-1"}, "a dict"),
    ("launch", LaunchedMachine(provider_id="i-1", data={"s": {1}}),
     "a LaunchedMachine whose data is not JSON (TypeError: Object of type set is not JSON serializable)"),
    ("list", None, "None"),
    ("list", MACHINE, "one LiveMachine, not a list of them"),
    ("list", (MACHINE, MACHINE.model_dump()), "a tuple whose item 1 is a dict"),
])
def test_every_answer_is_checked_once_where_the_call_is_made(rec_plugin: str, method: str, answer: Any,
                                                             returned: str) -> None:
    adapter = ProviderAdapter(name="answers", config=Cfg, create=Answers)
    [c] = parse('[bad]\ntype = "answers"\n', adapters={"answers": adapter})
    c.plugin = rec_plugin
    ps = ProviderSet([c])
    cast(Answers, c.provider).answer = answer
    try:
        with pytest.raises(ProviderCallFailed) as caught:
            ps.call("bad", method, None)
        assert isinstance(caught.value, ProviderTransient)  # the path a raised error takes
        assert str(caught.value).startswith(f"{WHO}: {method}() returned {returned}; accepted: ")
    finally:
        ps.close()


class BuildsBadRecords(Answers):
    def launch(self, request: LaunchRequest) -> Any:
        return LaunchedMachine(provider_id="i-1", adress="10.0.0.1")  # (a misspelt field)


def test_an_adapter_that_raises_pydantics_error_is_told_on_one_line(rec_plugin: str) -> None:
    """Its several lines, with links, would go into the log, providers list and a machine's reason."""
    adapter = ProviderAdapter(name="bad-records", config=Cfg, create=BuildsBadRecords)
    [c] = parse('[bad]\ntype = "bad-records"\n', adapters={"bad-records": adapter})
    c.plugin = rec_plugin
    ps = ProviderSet([c])
    try:
        with pytest.raises(ProviderCallFailed) as caught:
            ps.call("bad", "launch", None)
        assert str(caught.value) == (f"{WHO}: launch() raised ValidationError for LaunchedMachine: adress: "
                                     "Extra inputs are not permitted")
        assert ps.status["bad"].last_error == str(caught.value).removeprefix(f"{WHO}: ")
    finally:
        ps.close()


def test_a_list_may_be_any_iterable_of_records(rec_plugin: str) -> None:
    adapter = ProviderAdapter(name="answers", config=Cfg, create=Answers)
    [c] = parse('[ok]\ntype = "answers"\n', adapters={"answers": adapter})
    ps = ProviderSet([c])
    cast(Answers, c.provider).answer = (m for m in [MACHINE])
    try:
        assert ps.call("ok", "list", "label") == [MACHINE]
        assert ps.status["ok"].last_error is None
    finally:
        ps.close()
