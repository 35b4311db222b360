"""What a user of the cloud target saw wrong: several providers.toml sections of one control
plane on one cloud account (each lists the machines of the others: a provider's ``list`` is
by the control plane's label, which every section shares), what ``explain`` says of an offer
whose scope a failure blocked, and a gang's launch in ``jobs show``."""

from __future__ import annotations

import pytest

from gpulayer.control import ControlPlane
from gpulayer.control.providers import ProviderSet
from gpulayer.errors import ProviderTransient, QuotaExceeded
from gpulayer.hookrecords import LiveMachine
from gpulayer.provider_config import parse
from gpulayer.provisioning import history
from gpulayer.store import Store
from tests.factories import make_capabilities, make_cuda_devices, make_distributed_job
from tests.unit.test_machines import ADAPTER, CLOUD, Recorder, plane

TWO = """
[gpu]
type = "rec"
shapes = ["a"]

[cheap]
type = "rec"
shapes = ["b"]
"""


def test_a_section_does_not_terminate_the_machines_of_another_section_on_the_same_account(store: Store) -> None:
    """[cheap]'s sweep listed [gpu]'s booting machine (same account, same label), found no
    record of it among its own and terminated it: the record said 'booting' while the
    machine was gone, and the job waited for it until its join deadline."""
    now = [1000.0]
    configured = parse(TWO, adapters=ADAPTER)
    ps = ProviderSet(configured, control_url="http://127.0.0.1:9", clock=lambda: now[0])
    cp = ControlPlane(store, providers=ps, serving=True, clock=lambda: now[0])
    gpu, cheap = (c.provider for c in configured)
    assert isinstance(gpu, Recorder) and isinstance(cheap, Recorder)
    cheap.live = gpu.live  # one account: each lists every machine with the label
    ps.check()
    ps.refresh_offers()
    cp.submit(CLOUD)
    cp.provision()
    [(_, req)] = [c for c in gpu.calls + cheap.calls if c[0] == "launch"]
    gpu.live["m-stranger"] = LiveMachine(machine_id="m-stranger", provider_id="i-x")  # no record: an orphan
    now[0] += 61  # the next sweep
    assert cp.sweep_orphans() == ["m-stranger"]
    assert ("terminate", req.machine_id) not in gpu.calls + cheap.calls
    assert cp.get_machine(req.machine_id).state == "booting"
    assert req.machine_id in gpu.live
    # once its own section has ended it, a listing of it is an orphan again, to either section
    cp.terminate_machine(req.machine_id)
    cp.provision()
    assert cp.get_machine(req.machine_id).state == "failed"
    gpu.live[req.machine_id] = LiveMachine(machine_id=req.machine_id, provider_id=f"i-{req.machine_id}")
    now[0] += 61
    assert cp.sweep_orphans() == [req.machine_id]


def test_explain_says_which_offers_a_failure_blocked_until_when_and_why(store: Store) -> None:
    """A launch that failed with a quota error blocks its scope for 5 minutes; explain went on
    listing the offer as if it would be tried, with no word of the failure."""
    cp, rec = plane(store, '[p]\ntype = "rec"\nshapes = ["a", "b"]\n')
    rec.fail["a"] = QuotaExceeded("vCPU limit of the account reached")
    cp.submit(CLOUD)
    cp.provision()
    assert [c[1].offer.shape for c in rec.calls if c[0] == "launch"] == ["a", "b"]  # failed over
    e = cp.explain(CLOUD)
    a, b = e.offers or []
    assert (a.shape, a.blocked_until, a.blocked_why) == ("a", e.at + 300, "quota exceeded (vCPU limit of the account "
                                                                            "reached)")
    assert (b.shape, b.blocked_until, b.blocked_why) == ("b", None, None)
    lines = e.render().splitlines()
    assert ("offer p:a in r: $1.00/h, availability unknown; not tried for another 300 s after: quota exceeded "
            "(vCPU limit of the account reached)") in lines
    assert "offer p:b in r: $2.00/h, availability unknown" in lines


def test_a_gangs_machines_are_one_attempt_in_the_jobs_cloud_history(store: Store) -> None:
    """A distributed job's two machines read 'launched m-1 -> p/r/a: launched m-2', the
    arrow that means the first attempt failed and the next offer was tried."""
    cp, rec = plane(store, '[p]\ntype = "rec"\nshapes = ["a", "b"]\ncapacity = 1\n')
    job = cp.submit(make_distributed_job(2, target="cloud", accelerator="cuda", gpus=1))
    cp.provision()
    first, second = (c[1] for c in rec.calls if c[0] == "launch")  # one host of the pool each
    for req in (first, second):
        cp.join_worker(make_capabilities(devices=make_cuda_devices(1)), machine_id=req.machine_id,
                       join_token=req.bootstrap_token.get_secret_value())
    line = history((e.kind, e.message) for e in cp.events(job.id))
    assert line is not None and " -> " not in line
    assert line.startswith(f"p/r/a: launched {first.machine_id} (")
    assert f"p/r/b: launched {second.machine_id} (" in line and line.count("joined as wkr-") == 2


def test_a_terminate_that_fails_is_tried_again_after_a_while_not_at_every_pass(
        store: Store, caplog: pytest.LogCaptureFixture) -> None:
    """A provider whose endpoint went away: the machine past its join deadline stayed
    'terminating' and the pass (every second) called terminate again and logged a warning
    each time, for as long as the provider failed."""
    now = [1000.0]
    cp, rec = plane(store, clock=now)
    cp.submit(CLOUD)
    cp.provision()
    [(_, req)] = [c for c in rec.calls if c[0] == "launch"]
    tries: list[float] = []

    def down(machine_id: str, provider_id: str | None) -> None:
        tries.append(now[0])
        raise ProviderTransient("ec2 us-east-1: TerminateInstances: Could not connect to the endpoint URL")

    rec.terminate = down  # type: ignore[method-assign]
    now[0] += 61  # past the join deadline (60 s)
    for _ in range(40):  # passes a second apart
        cp.provision()
        now[0] += 1
    assert cp.get_machine(req.machine_id).state == "terminating"
    assert tries == [1061.0, 1091.0]
    assert sum("trying again in 30 s" in r.getMessage() for r in caplog.records) == 2
    del rec.terminate  # the provider answers again
    now[0] += 30
    cp.provision()
    assert cp.get_machine(req.machine_id).state == "failed"


def test_explain_says_an_offer_has_no_room_while_its_provider_is_at_max_machines(store: Store) -> None:
    """A second cloud job waited with no machine on the way while the first one's machine
    held the provider's only place, and explain said only that the offer could run it."""
    cp, rec = plane(store, '[p]\ntype = "rec"\nmax_machines = 1\n')
    cp.submit(CLOUD)
    second = cp.submit(CLOUD)
    cp.provision()
    assert rec.count("launch") == 1
    [offer] = cp.explain_job(second.id).offers or []
    assert offer.no_room == ("provider p has 1 of its max_machines = 1 machines up; a machine is launched once one "
                             "of them ends")
    assert f"offer p:a in r: $1.00/h, availability unknown; no room now: {offer.no_room}" in \
        cp.explain_job(second.id).render().splitlines()
    # an offer's own capacity (a host of a pool: one machine) says so too
    pool, _ = plane(store, '[q]\ntype = "rec"\ncapacity = 1\n')
    pool.provision()
    [held] = pool.explain(CLOUD).offers or []
    assert held.no_room == "1 machine(s) of it are up, its capacity; a machine is launched once one of them ends"
