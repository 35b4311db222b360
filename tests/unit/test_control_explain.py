"""``explain`` and the unschedulable message on the control plane, over a real SQLite database."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpulayer.control import ControlPlane
from gpulayer.control.providers import ProviderSet
from gpulayer.errors import InvalidInput, NotFound
from gpulayer.hookrecords import MachineOffer
from gpulayer.records import JobState, WorkerRecord
from gpulayer.specs import CommandJob, Placement, Requirements
from gpulayer.store import Store
from tests.factories import make_capabilities, make_cuda_devices


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def cp(tmp_path: Path) -> Iterator[ControlPlane]:
    store = Store(f"sqlite:///{tmp_path / 'gpulayer.db'}")
    plane = ControlPlane(store, heartbeat_timeout=1e9, clock=Clock())
    yield plane
    store.dispose()


def cuda(n: int, torch: str = "2.3.0") -> Any:
    return make_capabilities(devices=make_cuda_devices(n), frameworks={"torch": torch})


def job(gpus: int | None = 1, *, accelerator: str | None = "cuda", **kw: Any) -> CommandJob:
    req = Requirements(accelerator=accelerator, gpus=gpus if accelerator else None,
                       frameworks=kw.pop("frameworks", {}))
    return CommandJob(command=["train"], requirements=req, **kw)


def test_the_message_of_an_unschedulable_job_ends_with_the_nearest_miss_and_the_command(cp: ControlPlane) -> None:
    cpu = cp.register_worker(make_capabilities(), cpu_slots=1)
    one = cp.register_worker(cuda(1), cpu_slots=0)
    old = cp.register_worker(cuda(2, torch="2.1.0"), cpu_slots=0)
    failed = cp.submit(job(2, frameworks={"torch": ">=2.2"}))
    assert failed.state is JobState.UNSCHEDULABLE and failed.error is not None and failed.decision is not None
    lines = failed.error.message.splitlines()
    # the scheduler's lines exactly as they are, then the two new ones
    assert lines[:-2] == failed.decision.render().splitlines()
    assert lines[0] == "scheduling: no eligible worker"
    assert lines[-2:] == [
        f"closest: {old.id} has torch 2.1.0, needs >=2.2 (one upgrade away); {one.id} has 1 of 2 cuda devices; "
        f"{cpu.id} has 0 of 2 cuda devices and has no torch installed (one install away)",
        f"run: gpulayer jobs explain {failed.id}",
    ]


def test_with_no_worker_at_all_the_message_ends_with_the_command(cp: ControlPlane) -> None:
    failed = cp.submit(job())
    assert failed.error is not None
    assert failed.error.message.splitlines() == ["scheduling: no eligible worker", "local: no local worker registered",
                                                 f"run: gpulayer jobs explain {failed.id}"]


def test_explain_stores_nothing_and_says_what_a_submit_would_get(cp: ControlPlane) -> None:
    cp.register_worker(make_capabilities(), cpu_slots=1)
    e = cp.explain(job())
    assert e.decision.outcome == "unschedulable" and e.job_id is None and e.queue_position == 1
    assert cp.list_jobs() == []
    failed = cp.submit(job())
    assert failed.decision is not None
    assert e.decision.render() == failed.decision.render()
    assert cp.explain(job(accelerator=None)).decision.summary.startswith("assigned to ")


def test_busy_workers_show_what_they_run_and_when_their_slot_frees(cp: ControlPlane) -> None:
    clock: Clock = cp.clock  # type: ignore[assignment]
    w = cp.register_worker(cuda(2), cpu_slots=0)
    first = cp.submit(job(1, timeout=600), owner="tok-a")
    second = cp.submit(job(1), owner="tok-b")
    tasks = {t.job_id: t for t in cp.poll_tasks(w.id)}
    cp.start_task(tasks[first.id].task_id, worker_id=w.id)
    clock.now += 100
    e = cp.explain(job(1), owner="tok-a")
    [view] = e.workers
    assert view.status == "busy" and e.decision.outcome == "waiting"
    assert [r.message for r in view.reasons] == ["compatible but busy: no free cuda device"]
    by_state = {t.state.value: t for t in view.running}
    started = by_state["running"]
    assert (started.job_id, started.devices, started.ends_by) == (first.id, [0], 1_000_000.0 + 600)
    # the other owner's task is shown, but not named; it has not started, so no end is known
    unnamed = by_state["assigned"]
    assert (unnamed.job_id, unnamed.task_id, unnamed.ends_by) == (None, None, None)
    assert view.frees_at == 1_000_000.0 + 600  # the first one ending frees the one device needed
    # two devices needed: the unstarted task must end too, and nobody knows when
    assert cp.explain(job(2), owner="tok-a").workers[0].frees_at is None
    # an admin (or the process itself) sees every job
    assert {t.job_id for t in cp.explain(job(1)).workers[0].running} == {first.id, second.id}


def test_queue_positions_follow_priority_then_arrival(cp: ControlPlane) -> None:
    clock: Clock = cp.clock  # type: ignore[assignment]
    cp.register_worker(cuda(1), cpu_slots=0)
    submitted = []
    for priority in (0, -5, 0, 0, 10):
        clock.now += 1  # first come, first placed: by submission time
        submitted.append(cp.submit(job(priority=priority)))
    running, low, a, b, high = submitted
    positions = {j.id: cp.explain_job(j.id).queue_position for j in (running, low, a, b, high)}
    assert positions == {running.id: None, high.id: 1, a.id: 2, b.id: 3, low.id: 4}
    # the cheap question a waiting submit polls gives the same answers
    assert {j.id: cp.queue_position(j.id) for j in (running, low, a, b, high)} == positions
    e = cp.explain_job(a.id)
    assert e.state is JobState.QUEUED and e.stored_decision is not None
    assert e.stored_decision.summary == "waiting: 1 compatible worker(s) busy"
    # a job not submitted yet would stand behind every queued job of its priority or higher
    assert cp.explain(job(priority=0)).queue_position == 4
    assert cp.explain(job(priority=11)).queue_position == 1
    with pytest.raises(NotFound):
        cp.explain_job("job-000000000000")
    with pytest.raises(NotFound):
        cp.queue_position("job-000000000000")


def test_workers_a_caller_would_start_count_as_workers(cp: ControlPlane) -> None:
    local = WorkerRecord(id="in-process", name="the worker this process would start", origin="local",
                         capabilities=cuda(1), cpu_slots=1)
    assert cp.explain(job()).decision.outcome == "unschedulable"
    e = cp.explain(job(), prospective=[local])
    assert e.decision.summary == "assigned to in-process (cuda 0)"
    assert [w.worker for w in e.workers] == ["in-process"]
    assert cp.list_workers() == []


class WithProviders(ControlPlane):
    """A control plane with providers whose cached offers are these (two shapes)."""

    def offers(self, requirements: Requirements, *, barred: bool = False) -> list[MachineOffer]:
        return [
            MachineOffer(provider="aws", shape="g5.2xlarge", region="us-east-1", capabilities=cuda(1),
                         price_per_hour=1.21),
            MachineOffer(provider="aws", shape="c7i.large", region="us-east-1", capabilities=make_capabilities(),
                         price_per_hour=0.09),
            MachineOffer(provider="slurm", shape="gpu", capabilities=cuda(4), price_per_hour=None),
            MachineOffer(provider="aws", shape="g5.xlarge", region="us-east-1", capabilities=cuda(1),
                         price_per_hour=1.01, spot=True),
        ]


def test_offers_that_fit_are_listed_cheapest_first_when_the_control_plane_has_providers(tmp_path: Path) -> None:
    store = Store(f"sqlite:///{tmp_path / 'p.db'}")
    try:
        plain = ControlPlane(store)
        assert plain.explain(job()).offers is None  # nothing to ask
        cp = WithProviders(store, providers=ProviderSet([]), serving=True)  # (a server: embedded refuses cloud-only)
        cloud = job(placement=Placement(target="cloud"))
        e = cp.explain(cloud)
        assert [(o.provider, o.shape, o.price_per_hour, o.spot) for o in e.offers or []] == [
            ("aws", "g5.xlarge", 1.01, True), ("aws", "g5.2xlarge", 1.21, False), ("slurm", "gpu", None, False)]
        # listed cheapest priced first, but the one a launch tries first, and the job waits for,
        # is capacity you own (it named the cheapest priced, which provisioning tries after it)
        assert e.decision.outcome == "waiting" and e.decision.summary.endswith("; offer slurm:gpu could run it once booted")
    finally:
        store.dispose()


def test_an_embedded_plane_explains_a_cloud_only_job_as_submit_refuses_it(cp: ControlPlane) -> None:
    """Submit refused it with the advice to start a server (exit 2); explain said 'would
    fail: scheduling: no eligible worker' (exit 125), with no word of why or what to do."""
    spec = CommandJob(command=["true"], placement=Placement(target="cloud"))
    for ask in (cp.explain, cp.submit):
        with pytest.raises(InvalidInput, match=r"target cloud: .* this one is embedded .*gpulayer server start"):
            ask(spec)
    # with a target it can reach, the cloud fallback is explained as usual
    local = CommandJob(command=["true"], placement=Placement(target="local", fallback_targets=["cloud"]))
    assert cp.explain(local).verdict == "unschedulable"


def test_explain_of_a_cloud_job_says_when_no_provider_is_configured(tmp_path: Path) -> None:
    """A server with no providers: submit failed with 'cloud: no cloud worker registered and
    no provider offered a machine'; explain listed the workers and said nothing of the cloud."""
    store = Store(f"sqlite:///{tmp_path / 'p.db'}")
    try:
        cp = ControlPlane(store, serving=True)
        cloud = cp.explain(CommandJob(command=["true"], placement=Placement(target="cloud")))
        assert cloud.offers is None and cloud.verdict == "unschedulable"
        assert ("offers: none: no provider is configured on this control plane, so no machine is brought up for "
                "the cloud target (providers.toml for gpulayer server start; see docs/providers.md)"
                ) in cloud.render().splitlines()
        remote = cp.explain(CommandJob(command=["true"], placement=Placement(target="remote")))
        assert "offers:" not in remote.render()
    finally:
        store.dispose()
