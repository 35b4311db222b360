"""Offers: the instance-type table filtered by a job's requirements; the config model."""

from __future__ import annotations

from importlib import metadata

import pytest
from pydantic import ValidationError

from gpulayer import plugin


def test_installed_entry_point_offers_the_adapter(adapter):
    [ep] = [e for e in metadata.entry_points(group="gpulayer") if e.name == "ec2"]
    assert (ep.value, ep.dist.name if ep.dist else None) == ("gpulayer_provider_ec2", "gpulayer-provider-ec2")
    assert adapter.name == "ec2" and adapter.config.__name__ == "Ec2Config"


def shapes(offers):
    return [(o.shape, o.region) for o in offers]


def test_every_shape_cheapest_first(make_provider, amis):
    p = make_provider(regions={"us-east-1": {"ami": amis["us-east-1"]}, "eu-west-1": {"ami": "ami-0123456789abcdef0"}})
    offers = p.offers(plugin.Requirements())
    prices = [o.price_per_hour for o in offers]
    assert prices == sorted(prices) and shapes(offers)[:2] == [("t3.large", "us-east-1"), ("t3.large", "eu-west-1")]
    # p5 has no eu-west-1 price in the table: not offered there
    assert ("p5.48xlarge", "us-east-1") in shapes(offers) and ("p5.48xlarge", "eu-west-1") not in shapes(offers)
    g5 = next(o for o in offers if o.shape == "g5.12xlarge")
    caps = g5.capabilities
    assert (caps.host.cpu_count, caps.host.os, len(caps.devices)) == (48, "linux", 4)
    assert {(d.kind, d.name, d.memory_gb, d.compute_capability) for d in caps.devices} == {
        ("cuda", "NVIDIA A10G", 24.0, "8.6")}
    assert g5.data == {"instance_type": "g5.12xlarge", "region": "us-east-1", "ami": amis["us-east-1"]}


@pytest.mark.parametrize(("requirements", "expected"), [
    ({"accelerator": "cuda", "gpus": 1}, ["g5.xlarge", "g5.12xlarge", "p4d.24xlarge", "p5.48xlarge"]),
    ({"accelerator": "cuda", "gpus": 4}, ["g5.12xlarge", "p4d.24xlarge", "p5.48xlarge"]),
    ({"accelerator": "cuda", "min_gpu_memory_gb": 60}, ["p5.48xlarge"]),
    ({"accelerator": "cuda", "compute_capability": ">=8.9"}, ["p5.48xlarge"]),
    ({"accelerator": "cuda", "gpus": 16}, []),
    ({"accelerator": "rocm"}, []),
    ({"cpus": 30, "memory_gb": 60}, ["c6i.8xlarge", "g5.12xlarge", "p4d.24xlarge", "p5.48xlarge"]),
    ({"os": "darwin"}, []),
])
def test_requirements_filter_offers(make_provider, requirements, expected):
    offers = make_provider().offers(plugin.Requirements(**requirements))
    assert [o.shape for o in offers] == expected


def test_allowed_types_and_own_prices(make_provider):
    p = make_provider(instance_types=["g5.xlarge", "t3.large"], prices={"g5.xlarge": {"us-east-1": 0.05}})
    assert [(o.shape, o.price_per_hour) for o in p.offers(plugin.Requirements())] == [
        ("g5.xlarge", 0.05), ("t3.large", 0.0832)]


@pytest.mark.parametrize(("section", "message"), [
    ({"instance_types": ["g9.huge"]}, "unknown instance type 'g9.huge'; accepted: t3.large, m6i.2xlarge"),
    ({"regions": {"us-east-1": {"ami": "ubuntu"}}}, "'ubuntu' is not an image id; accepted: ami- followed by"),
    ({"regions": {"mars-1": {"ami": "ami-0123456789abcdef0"}}}, "region 'mars-1' has no prices"),
    ({"regions": {}}, "regions"),
    ({"zones": ["a"]}, "zones"),
    ({"instance_types": []}, "an empty list allows no instance type, so nothing would ever be offered; leave "
                             "instance_types out to allow every type"),
    ({"prices": {"g5.xlarge": {"us-east-1": -1.0}}}, "greater than or equal to 0"),
    ({"prices": {"g5.xlarge": {"us-east-1": float("nan")}}}, "finite number"),
    ({"regions": {"eu-west-1": {"ami": "ami-0123456789abcdef0"}}, "instance_types": ["t3.large", "p5.48xlarge"]},
     "instance_types: 'p5.48xlarge' has no price in eu-west-1, so it would never be offered"),
])
def test_config_errors_name_the_key(adapter, section, message):
    section = {"regions": {"us-east-1": {"ami": "ami-0123456789abcdef0"}}, **section}
    with pytest.raises(ValidationError) as err:
        adapter.config.model_validate(section)
    assert message in str(err.value)


def test_an_allowed_type_priced_by_the_section_alone_is_accepted(adapter):
    config = adapter.config.model_validate({"regions": {"eu-west-1": {"ami": "ami-0123456789abcdef0"}},
                                            "instance_types": ["p5.48xlarge"],
                                            "prices": {"p5.48xlarge": {"eu-west-1": 0.0}}})
    assert (config.allowed(), config.price("p5.48xlarge", "eu-west-1")) == (["p5.48xlarge"], 0.0)
