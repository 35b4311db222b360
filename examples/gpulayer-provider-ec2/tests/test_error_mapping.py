"""EC2 error codes become GPUlayer's typed errors.

moto answers RunInstances with an instance whatever the capacity or the account's quota, so
these codes cannot be produced by it. Only for them, botocore's ``Stubber`` puts the error
answer EC2 documents in front of the provider's real client; everything else in this suite
(and the happy path) runs against moto's server.
"""

from __future__ import annotations

import pytest
from botocore.stub import Stubber
from conftest import launch_request

from gpulayer import plugin


@pytest.mark.parametrize(("code", "error"), [
    ("InsufficientInstanceCapacity", plugin.NoCapacity),
    ("InstanceLimitExceeded", plugin.QuotaExceeded),
    ("VcpuLimitExceeded", plugin.QuotaExceeded),
    ("Unsupported", plugin.SkipOffer),
    ("InvalidParameterValue", plugin.SkipOffer),
    ("OptInRequired", plugin.SkipOffer),
    ("RequestLimitExceeded", plugin.ProviderTransient),
    ("UnauthorizedOperation", plugin.ProviderAuthFailed),
    ("PendingVerification", plugin.ProviderTransient),
    ("SomethingNew", plugin.ProviderError),
])
def test_run_instances_errors(make_provider, label, code, error):
    p = make_provider()
    req = launch_request(p, label, "m-err", shape="p5.48xlarge")
    client = p.client("us-east-1")
    with Stubber(client) as stub:
        stub.add_response("describe_instances", {"Reservations": []})
        stub.add_client_error("run_instances", service_error_code=code, service_message="EC2 says no",
                              http_status_code=400)
        with pytest.raises(plugin.ProviderError) as err:
            p.launch(req)
    assert type(err.value) is error
    assert str(err.value) == f"ec2 us-east-1: RunInstances p5.48xlarge: {code}: EC2 says no"


def test_terminate_errors_other_than_gone_are_raised(make_provider):
    p = make_provider()
    with Stubber(p.client("us-east-1")) as stub:
        stub.add_client_error("terminate_instances", service_error_code="RequestLimitExceeded", http_status_code=503)
        with pytest.raises(plugin.ProviderTransient, match="TerminateInstances i-0123456789abcdef0: RequestLimitExceeded"):
            p.terminate("m-1", "us-east-1/i-0123456789abcdef0")


@pytest.mark.parametrize("code", ["RequestExpired", "RequestTimeTooSkewed", "RequestInTheFuture"])
def test_a_clock_that_is_off_is_transient_and_said_so(make_provider, label, code):
    """RequestExpired (this machine's clock off AWS's by more than 15 minutes) disabled the
    provider until the server restarted, as if its credentials were bad; once the clock is
    right the same call works, so it is tried again later, with the likely cause named."""
    p = make_provider()
    hint = ("(clock skew: the request's time stamp is more than 15 minutes off AWS's clock; check this "
            "machine's clock, e.g. NTP; trying again later)")
    with Stubber(p.client("us-east-1")) as stub:
        stub.add_client_error("describe_regions", service_error_code=code, service_message="Request has expired.",
                              http_status_code=400)
        with pytest.raises(plugin.ProviderError) as err:
            p.check()
    assert type(err.value) is plugin.ProviderTransient
    assert str(err.value) == f"ec2 us-east-1: DescribeRegions: {code}: Request has expired. {hint}"
    req = launch_request(p, label, "m-skew", shape="p5.48xlarge")
    with Stubber(p.client("us-east-1")) as stub:
        stub.add_response("describe_instances", {"Reservations": []})
        stub.add_client_error("run_instances", service_error_code=code, service_message="Request has expired.",
                              http_status_code=400)
        with pytest.raises(plugin.ProviderTransient, match="clock skew"):
            p.launch(req)
