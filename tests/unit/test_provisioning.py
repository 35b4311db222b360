"""The cloud target's pure decisions (gpulayer.provisioning): demand, offer order, caps,
gangs, blocked scopes, housekeeping, orphans; and loading providers.toml."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import BaseModel, ConfigDict

from gpulayer import provisioning as pv
from gpulayer.errors import InvalidInput
from gpulayer.hookrecords import LiveMachine, MachineOffer, ProviderAdapter
from gpulayer.provider_config import Limits, parse
from tests.factories import make_capabilities, make_cuda_devices, make_distributed_job, make_job


def offer(shape: str, *, provider: str = "p", region: str | None = "r", gpus: int = 1, price: float | None = 1.0,
          availability: Any = "available", boot: float | None = None, capacity: int | None = None) -> MachineOffer:
    return MachineOffer(provider=provider, shape=shape, region=region, price_per_hour=price,
                        capabilities=make_capabilities(devices=make_cuda_devices(gpus)),
                        availability=availability, boot_seconds=boot, capacity=capacity)


def q(job_id: str, spec: Any, preference: tuple[str, ...] = ()) -> pv.QueuedCloudJob:
    return pv.QueuedCloudJob(job_id=job_id, spec=spec, preference=preference)


CLOUD_GPU = make_job(target="cloud", accelerator="cuda", gpus=1)


def test_offers_are_tried_available_first_then_cheapest_owned_capacity_first_then_fastest_boot() -> None:
    offers = [offer("dear", price=3.0), offer("limited", price=0.1, availability="limited"),
              offer("cheap-slow", price=1.0, boot=90), offer("cheap-fast", price=1.0, boot=10),
              offer("owned", price=None), offer("unknown", price=0.01, availability="unknown")]
    assert [o.shape for o in pv.order_offers(offers)] == [
        "owned", "cheap-fast", "cheap-slow", "dear", "limited", "unknown"]


def test_the_jobs_preference_comes_first() -> None:
    offers = [offer("a", provider="ec2", region="us-east-1", price=1.0),
              offer("a", provider="ec2", region="us-west-2", price=2.0),
              offer("b", provider="slurm", region=None, price=None)]
    assert [o.scope for o in pv.order_offers(offers, ["ec2/us-west-2", "ec2"])] == [
        "ec2/us-west-2/a", "ec2/us-east-1/a", "slurm/b"]


def test_demand_is_the_cloud_jobs_with_the_offers_that_fit_them() -> None:
    queue = [q("local", make_job(target="local", accelerator="cuda")), q("gpu", CLOUD_GPU),
             q("fallback", make_job(target="local", fallback=["cloud"], accelerator="cuda", gpus=2)),
             q("big", make_job(target="cloud", accelerator="cuda", gpus=8)),
             q("gang", make_distributed_job(3, target="cloud", accelerator="cuda", gpus=1))]
    offers = [offer("one", gpus=1), offer("two", gpus=2, price=2.0)]
    jobs = {j.job_id: j for j in pv.demand(queue, offers, {"gpu": 1})}
    assert set(jobs) == {"gpu", "fallback", "big", "gang"}  # a local-only job is no demand
    assert [o.shape for o in jobs["gpu"].offers] == ["one", "two"] and jobs["gpu"].pending == 1
    assert [o.shape for o in jobs["fallback"].offers] == ["two"]
    assert jobs["big"].offers == []
    assert jobs["gang"].nodes == 3


def views(**caps: int) -> dict[str, pv.ProviderView]:
    return {name: pv.ProviderView(limits=Limits(max_machines=n)) for name, n in caps.items()}


def test_one_machine_per_unit_of_demand_and_never_over_the_cap() -> None:
    jobs = [pv.DemandJob(job_id=f"j{i}", nodes=1, offers=[offer("one")]) for i in range(5)]
    providers = views(p=3)
    launches = pv.plan(jobs, providers, {}, now=0.0)
    assert [(lc.job_id, lc.count) for lc in launches] == [("j0", 1), ("j1", 1), ("j2", 1)]
    assert providers["p"].live == 3
    assert pv.plan(jobs, providers, {}, now=0.0) == []  # full


def test_machines_already_running_count_against_the_cap_and_pending_jobs_ask_for_nothing() -> None:
    jobs = [pv.DemandJob(job_id="waiting", nodes=1, offers=[offer("one")], pending=1),
            pv.DemandJob(job_id="new", nodes=1, offers=[offer("one")])]
    providers = {"p": pv.ProviderView(limits=Limits(max_machines=2), live=1)}
    assert [lc.job_id for lc in pv.plan(jobs, providers, {}, now=0.0)] == ["new"]


def test_a_gang_gets_all_its_machines_from_one_offer_or_none() -> None:
    gang = pv.DemandJob(job_id="gang", nodes=3, offers=[offer("a", provider="small"), offer("b", provider="big")])
    launches = pv.plan([gang], views(small=2, big=4), {}, now=0.0)
    assert [(lc.offer.provider, lc.count) for lc in launches] == [("big", 3)]
    assert pv.plan([gang], views(small=2, big=2), {}, now=0.0) == []


def test_blocked_scopes_price_caps_disabled_providers_and_tried_offers_are_skipped() -> None:
    offers = [offer("a", region="east"), offer("a", region="west", price=9.0), offer("a", region="north"),
              offer("x", provider="off")]
    job = pv.DemandJob(job_id="j", nodes=1, offers=offers)
    providers = {"p": pv.ProviderView(limits=Limits(max_machines=5, max_price_per_hour=5.0)),
                 "off": pv.ProviderView(limits=Limits(), enabled=False)}
    blocked = {"p/east/a": 100.0}
    [launch] = pv.plan([job], providers, blocked, now=50.0)
    assert launch.offer.scope == "p/north/a"  # east blocked, west over the price cap
    assert [lc.offer.scope for lc in pv.plan([job], providers, blocked, now=150.0)] == ["p/east/a"]  # unblocked
    assert pv.plan([job], providers, {}, now=0.0, tried=[("j", "p/east/a"), ("j", "p/north/a")]) == []


def test_an_offer_of_one_machine_at_a_time_holds_one_and_a_gang_takes_several_such_offers() -> None:
    """An SSH pool offers each host once (capacity 1): a two-node job launched one machine on
    host a, failed the second with NoCapacity, ended the first and began again five minutes
    later, for ever; and a second one-node job was sent to a host already running one."""
    hosts = [offer("a", capacity=1), offer("b", capacity=1), offer("c", capacity=1)]
    providers = views(p=10)
    gang = pv.DemandJob(job_id="g", nodes=2, offers=hosts)
    [launch] = pv.plan([gang], providers, {}, now=0.0)
    assert [(o.shape, n) for o, n in launch.pieces] == [("a", 1), ("b", 1)] and launch.count == 2
    assert providers["p"].live == 2 and providers["p"].in_scope == {"p/r/a": 1, "p/r/b": 1}
    singles = [pv.DemandJob(job_id=f"j{i}", nodes=1, offers=hosts) for i in range(2)]
    assert [(lc.job_id, lc.offer.shape) for lc in pv.plan(singles, providers, {}, now=0.0)] == [("j0", "c")]
    # no three hosts free: no part of a gang is launched
    assert pv.plan([pv.DemandJob(job_id="g3", nodes=3, offers=hosts)], views(p=10), {"p/r/c": 9.0}, now=0.0) == []
    # one offer that holds the whole gang is preferred to several
    roomy = offer("big")
    [launch] = pv.plan([pv.DemandJob(job_id="g", nodes=2, offers=[*hosts, roomy])], views(p=10), {}, now=0.0)
    assert (launch.offer.shape, launch.parts) == ("big", ())
    # the provider's max_machines bounds a gang of several offers too
    assert pv.plan([gang], views(p=1), {}, now=0.0) == []
    # two offers of one scope (spot and not) share its capacity
    twins = [offer("a", capacity=1), offer("a", capacity=1, price=2.0), offer("b", capacity=1)]
    [launch] = pv.plan([pv.DemandJob(job_id="g", nodes=2, offers=twins)], views(p=10), {}, now=0.0)
    assert [(o.shape, n) for o, n in launch.pieces] == [("a", 1), ("b", 1)]


def test_an_unavailable_offer_is_not_launched() -> None:
    job = pv.DemandJob(job_id="j", nodes=1, offers=[offer("a", availability="unavailable")])
    assert pv.plan([job], views(p=1), {}, now=0.0) == []


def machine(mid: str, state: str, **kw: Any) -> pv.MachineView:
    base: dict[str, Any] = {"provider": "p", "scope": "p/r/a", "join_deadline": 100.0}
    return pv.MachineView(id=mid, state=state, **{**base, **kw})


def test_housekeeping() -> None:
    limits = {"p": Limits(idle_timeout=60, join_timeout=100)}
    ms = [
        machine("late", "booting"),  # past its join deadline at 101
        machine("early", "launching", join_deadline=500.0),
        machine("idle-long", "idle", idle_since=0.0, worker_id="w1"),
        machine("idle-short", "idle", idle_since=80.0, worker_id="w2"),
        machine("got-work", "idle", idle_since=0.0, worker_id="w3", busy=True),
        machine("work-done", "busy", worker_id="w4"),
        machine("worker-gone", "busy", worker_id="w5", busy=True, worker_online=False, last_heartbeat=0.0),
        machine("worker-just-gone", "busy", worker_id="w6", busy=True, worker_online=False, last_heartbeat=90.0),
        # its worker stopped (its Slurm pilot was cancelled) and its task is lost: not "idle for 60 s"
        machine("stopped-idle", "idle", idle_since=0.0, worker_id="w7", worker_online=False, last_heartbeat=90.0),
        machine("stuck", "terminating"),
    ]
    out = {a.machine_id: a for a in pv.housekeeping(ms, limits, now=101.0, grace=30.0)}
    assert set(out) == {"late", "idle-long", "got-work", "work-done", "worker-gone", "stuck"}
    assert (out["late"].kind, out["late"].reason, out["late"].block) == ("fail", "did not join within 100 s", "p/r/a")
    assert (out["idle-long"].kind, out["idle-long"].reason) == ("terminate", "idle for 60 s")
    assert out["got-work"].kind == "busy" and out["work-done"].kind == "idle"
    assert out["worker-gone"].reason == "its worker w5 stopped sending heartbeats"
    assert out["stuck"].kind == "terminate"


def test_a_gang_that_does_not_join_in_time_fails_together() -> None:
    ms = [machine("a", "booting", gang="g"), machine("b", "idle", gang="g", idle_since=100.0),
          machine("c", "booting", gang="g", join_deadline=50.0)]
    out = {a.machine_id: a for a in pv.housekeeping(ms, {"p": Limits()}, now=60.0, grace=30.0)}
    assert set(out) == {"a", "c"} and out["a"].reason == "another machine of its group did not join in time"


def test_orphans_are_live_machines_the_records_do_not_know_or_know_as_ended() -> None:
    live = [LiveMachine(machine_id=m, provider_id=f"i-{m}") for m in ("known", "ended", "stranger")]
    assert [m.machine_id for m in pv.orphans(live, {"known": "idle", "ended": "terminated"})] == ["ended", "stranger"]


def test_history_reads_like_one_line() -> None:
    events = [("submitted", "command"), ("cloud", "ec2/us-east-1/p5: quota exceeded"),
              ("cloud", "ec2/us-west-2/p5: launched m-1 (0.2 s)"), ("assigned", "x"),
              ("cloud_joined", "joined as wkr-1")]
    assert pv.history(events) == "ec2/us-east-1/p5: quota exceeded -> ec2/us-west-2/p5: launched m-1 (0.2 s), " \
                                 "joined as wkr-1"
    assert pv.history([("submitted", "command")]) is None
    # a provider that is down fails the job's launch every 30 s: one attempt, counted (the
    # line grew by the same failure twice a minute for as long as it was down)
    down = ("cloud", "ec2/us-east-1/t3: launch failed (could not connect)")
    assert pv.history([down] * 3 + [("cloud", "ec2/us-west-2/t3: launched m-2 (0.1 s)"), down]) == (
        "ec2/us-east-1/t3: launch failed (could not connect) (x3) -> ec2/us-west-2/t3: launched m-2 (0.1 s) -> "
        "ec2/us-east-1/t3: launch failed (could not connect)")


def test_blocks_expire() -> None:
    b = pv.Blocks()
    b.block("s", now=0.0, seconds=10)
    assert b.active(5.0) == {"s": 10.0}
    assert b.active(10.0) == {}


# --------------------------------------------------------------------------- providers.toml


class AcmeConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    region: str
    zones: int = 1


ACME = {"acme": ProviderAdapter(name="acme", config=AcmeConfig, create=lambda name, cfg: object())}


def test_a_section_gives_the_core_keys_and_the_adapters_settings() -> None:
    [p] = parse('[east]\ntype = "acme"\nregion = "us-east-1"\nmax_machines = 3\nidle_timeout = "5m"\n'
                "join_timeout = 90\nmax_price_per_hour = 2.5\n", adapters=ACME)
    assert (p.name, p.type) == ("east", "acme")
    assert p.limits == Limits(max_machines=3, max_price_per_hour=2.5, idle_timeout=300.0, join_timeout=90.0)
    assert p.settings == AcmeConfig(region="us-east-1")


@pytest.mark.parametrize(("text", "message"), [
    ('[east]\nregion = "x"\n', "f.toml: [east] type: missing; name a provider adapter (installed: acme)"),
    ('[east]\ntype = "acme"\n', "f.toml: [east] region: missing; it is required"),
    ('[east]\ntype = "acme"\nregion = "x"\nzones = "two"\n',
     "f.toml: [east] zones: expected a whole number, got 'two'"),
    ('[east]\ntype = "acme"\nregion = "x"\nzone = 2\n',
     "f.toml: [east] zone: not a setting of acme providers (did you mean zones?); accepted: idle_timeout, "
     "join_timeout, max_machines, "
     "max_price_per_hour, region, type, zones"),
    ('[east]\ntype = "acme"\nregion = "x"\nmax_price_per_hour = -1\n',
     "f.toml: [east] max_price_per_hour: expected a number >= 0, got -1"),
    ('[east]\ntype = "acme"\nregion = "x"\njoin_timeout = 0\n',
     "f.toml: [east] join_timeout: expected seconds > 0 or a duration such as 90s, 15m, 1h; got 0"),
    ('type = "acme"\n', "f.toml: 'type': expected a section [type] with a type key, got a bare value"),
])
def test_errors_name_the_file_the_section_and_the_key(text: str, message: str) -> None:
    with pytest.raises(InvalidInput) as err:
        parse(text, "f.toml", adapters=ACME)
    assert str(err.value) == message
