"""Several providers.toml sections of one control plane on one cloud account: each lists the
machines of the others (a provider's ``list`` is by the control plane's label, which every
section shares), and none may take them for orphans."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from gpulayer.control import ControlPlane
from gpulayer.control.providers import ProviderSet
from gpulayer.hookrecords import LiveMachine
from gpulayer.provider_config import parse
from gpulayer.store import Store
from tests.unit.test_machines import ADAPTER, CLOUD, Recorder


@pytest.fixture(params=["sqlite", "postgresql"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    url = f"sqlite:///{tmp_path / 'm.db'}" if request.param == "sqlite" else request.getfixturevalue("postgres_url")
    s = Store(url)
    yield s
    s.dispose()


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
