"""An offer whose availability counts the control plane's own machines (a host of an SSH pool
is ``unavailable`` while a worker runs there): when such a machine ends, the provider is asked
for its offers again at the next pass, so a job queued for the host that is free again does
not wait out the offers' cache (30 s) behind the stale ``unavailable``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gpulayer.control import ControlPlane
from gpulayer.control.providers import ProviderSet
from gpulayer.hookrecords import MachineOffer, ProviderAdapter
from gpulayer.provider_config import parse
from gpulayer.specs import Requirements
from gpulayer.store import Store
from tests.factories import make_job
from tests.unit.test_machines import Cfg, Recorder


class OneHost(Recorder):
    """One offer, of capacity one, ``unavailable`` while one of its machines is up."""

    def offers(self, requirements: Requirements) -> list[MachineOffer]:
        taken = bool(self.live)
        return [o.model_copy(update={"availability": "unavailable" if taken else "available", "capacity": 1})
                for o in super().offers(requirements)]


ADAPTER = {"host": ProviderAdapter(name="host", config=Cfg, create=OneHost)}
CLOUD = make_job(target="cloud")


def plane(store: Store, now: list[float]) -> tuple[ControlPlane, OneHost]:
    configured = parse('[pool]\ntype = "host"\nmax_machines = 1\njoin_timeout = 600\n', adapters=ADAPTER)
    ps = ProviderSet(configured, control_url="http://127.0.0.1:9", clock=lambda: now[0])
    cp = ControlPlane(store, providers=ps, serving=True, clock=lambda: now[0])
    host = configured[0].provider
    assert isinstance(host, OneHost)
    ps.check()
    ps.refresh_offers()
    return cp, host


def launches(host: OneHost) -> list[Any]:
    return [req for call, req in host.calls if call == "launch"]


def test_a_machine_that_ended_frees_its_offer_at_the_next_pass(store: Store, tmp_path: Path) -> None:
    now = [1000.0]
    cp, host = plane(store, now)
    first = cp.submit(CLOUD)
    cp.provision()
    (req,) = launches(host)
    now[0] += 31  # the offers are asked again while the machine is up: the host is taken
    cp.provision()
    assert [o.availability for o in cp.offers(Requirements())] == ["unavailable"]
    cp.cancel(first.id)  # its machine is withdrawn at the next pass
    now[0] += 1
    cp.provision()
    assert cp.get_machine(req.machine_id).state == "terminated"
    asked = host.count("offers")
    second = cp.submit(CLOUD)
    now[0] += 1  # the next pass, long before the offers' 30 s are up
    cp.provision()
    assert host.count("offers") == asked + 1
    assert [o.availability for o in cp.offers(Requirements())] == ["available"]
    assert [cp.get_machine(r.machine_id).job_id for r in launches(host)] == [first.id, second.id]
    now[0] += 1
    cp.provision()
    assert host.count("offers") == asked + 1  # once per machine ended, not at every pass
