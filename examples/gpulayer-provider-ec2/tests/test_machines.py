"""Launch, list, terminate and check against moto's EC2 (a real server on loopback)."""

from __future__ import annotations

import base64
import shlex

import pytest
from conftest import free_port, launch_request, start_moto, stop

from gpulayer import plugin


def instances(ec2, label, region="us-east-1"):
    pages = ec2(region).describe_instances(Filters=[{"Name": "tag:gpulayer:label", "Values": [label]}])
    return [i for r in pages["Reservations"] for i in r["Instances"]]


def test_launch_tags_the_machine_and_passes_the_token_in_user_data(make_provider, ec2, label):
    p = make_provider()
    req = launch_request(p, label, "m-tags1", shape="g5.xlarge", token="glt_secret-123")
    launched = p.launch(req)
    [inst] = instances(ec2, label)
    assert launched.provider_id == f"us-east-1/{inst['InstanceId']}" and inst["InstanceType"] == "g5.xlarge"
    tags = {t["Key"]: t["Value"] for t in inst["Tags"]}
    assert tags == {"gpulayer:label": label, "gpulayer:machine-id": "m-tags1", "Name": "gpulayer-m-tags1"}
    attr = ec2().describe_instance_attribute(InstanceId=inst["InstanceId"], Attribute="userData")
    script = base64.b64decode(attr["UserData"]["Value"]).decode()
    lines = script.splitlines()
    assert lines[0] == "#!/bin/sh" and "export GPULAYER_TOKEN=glt_secret-123" in lines
    assert "export GPULAYER_MACHINE_ID=m-tags1" in lines and "export GPULAYER_URL=http://127.0.0.1:9" in lines
    # the worker's own command line carries no secret
    assert lines[-1] == "exec " + shlex.join(req.worker_argv(python=p.config.python))
    assert "glt_secret" not in lines[-1]


def test_the_same_machine_id_twice_is_one_instance(make_provider, ec2, label):
    p = make_provider()
    req = launch_request(p, label, "m-idem1")
    first, second = p.launch(req), p.launch(req)
    assert first.provider_id == second.provider_id and len(instances(ec2, label)) == 1


def test_list_finds_this_label_only(make_provider, label):
    p = make_provider()
    a, b = p.launch(launch_request(p, label, "m-list-a")), p.launch(launch_request(p, label, "m-list-b"))
    p.launch(launch_request(p, label + "-other", "m-list-c"))
    live = p.list(label)
    assert sorted((m.machine_id, m.provider_id) for m in live) == [("m-list-a", a.provider_id), ("m-list-b", b.provider_id)]
    assert {m.state for m in live} <= {"pending", "running"}


def test_terminate_is_idempotent_and_finds_the_machine_by_its_tag(make_provider, ec2, label):
    p = make_provider()
    a, _ = p.launch(launch_request(p, label, "m-term-a")), p.launch(launch_request(p, label, "m-term-b"))
    p.terminate("m-term-a", a.provider_id)
    p.terminate("m-term-a", a.provider_id)  # already gone: success
    p.terminate("m-term-b", None)  # the launch's answer was lost: found by its machine-id tag
    p.terminate("m-term-b", None)
    p.terminate("m-never", "us-east-1/i-0123456789abcdef0")  # never existed: success too
    assert {i["State"]["Name"] for i in instances(ec2, label)} <= {"shutting-down", "terminated"}
    assert p.list(label) == []


def test_launch_in_the_offers_region(make_provider, ec2, amis, label):
    p = make_provider(regions={r: {"ami": amis[r]} for r in ("us-east-1", "us-west-2")})
    offer = next(o for o in p.offers(plugin.Requirements()) if o.region == "us-west-2")
    req = launch_request(p, label, "m-west").model_copy(update={"offer": offer})
    launched = p.launch(req)
    assert launched.provider_id.startswith("us-west-2/") and len(instances(ec2, label, "us-west-2")) == 1
    assert [m.machine_id for m in p.list(label)] == ["m-west"]
    p.terminate("m-west", None)
    assert p.list(label) == []


def test_check_passes_with_credentials_moto_accepts(make_provider):
    make_provider().check()


def test_refused_credentials_disable_the_provider(make_provider, tmp_path):
    # moto checks signatures when told to: a real AuthFailure answer, not a stub
    proc, url = start_moto(tmp_path / "moto-auth.log", INITIAL_NO_AUTH_ACTION_COUNT="0")
    try:
        p = make_provider(endpoint_url=url)
        with pytest.raises(plugin.ProviderAuthFailed, match="ec2 us-east-1: DescribeRegions: AuthFailure"):
            p.check()
    finally:
        stop(proc)


def test_no_endpoint_is_transient(make_provider):
    p = make_provider(endpoint_url=f"http://127.0.0.1:{free_port()}")
    with pytest.raises(plugin.ProviderTransient, match="ec2 us-east-1: DescribeRegions: Could not connect"):
        p.check()


def test_no_credentials_is_an_auth_failure(make_provider, monkeypatch):
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.delenv(name)
    with pytest.raises(plugin.ProviderAuthFailed, match="no usable AWS credentials"):
        make_provider().check()


def test_an_unknown_profile_is_an_auth_failure(make_provider):
    with pytest.raises(plugin.ProviderAuthFailed, match="The config profile \\(nope\\) could not be found; the 'profile' key"):
        make_provider(profile="nope").check()


def test_a_stopped_instance_is_still_listed_and_can_be_terminated(make_provider, ec2, label):
    p = make_provider()
    launched = p.launch(launch_request(p, label, "m-stopped"))
    ec2().stop_instances(InstanceIds=[launched.provider_id.split("/")[1]])
    [m] = p.list(label)  # it still costs its disks: the orphan sweep must see it
    assert (m.machine_id, m.state, m.data["state"]) == ("m-stopped", "unknown", "stopped")
    p.terminate("m-stopped", None)
    assert p.list(label) == []


def test_an_offer_for_another_section_is_skipped(make_provider, amis, label):
    wide = make_provider(regions={r: {"ami": amis[r]} for r in ("us-east-1", "us-west-2")})
    narrow = make_provider(instance_types=["g5.xlarge"])
    west = next(o for o in wide.offers(plugin.Requirements()) if o.region == "us-west-2" and o.shape == "g5.xlarge")
    with pytest.raises(plugin.SkipOffer, match="region 'us-west-2' is not configured for provider 'aws'"):
        narrow.launch(launch_request(wide, label, "m-skip1", shape="g5.xlarge").model_copy(update={"offer": west}))
    with pytest.raises(plugin.SkipOffer, match=r"instance type 't3\.large' is not allowed for 'aws'"):
        narrow.launch(launch_request(wide, label, "m-skip2"))
