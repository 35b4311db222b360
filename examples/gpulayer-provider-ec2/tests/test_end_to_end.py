"""The whole path: a cloud job on a server whose providers.toml names this package.

The server launches an instance in moto's EC2; the test plays that instance from the
user-data EC2 holds; its worker joins with the bootstrap token and runs the job; once the
machine has been idle for its idle timeout, the server terminates it in EC2.
"""

from __future__ import annotations

import json
import re
import sys
import time

import boto3
from conftest import Server, play_machine, start_moto, stop, wait_for

from gpulayer import plugin


def tagged_instances(client):
    pages = client.describe_instances(Filters=[{"Name": "tag-key", "Values": ["gpulayer:machine-id"]}])
    return [i for r in pages["Reservations"] for i in r["Instances"]]


def test_a_cloud_job_boots_an_instance_runs_and_the_instance_is_terminated(tmp_path, make_provider):
    # moto of its own: the instances this test counts are the server's only
    moto, url = start_moto(tmp_path / "moto.log")
    try:
        client = boto3.client("ec2", region_name="us-east-1", endpoint_url=url,
                              aws_access_key_id="testing", aws_secret_access_key="testing")
        ami = client.describe_images(Owners=["amazon"])["Images"][0]["ImageId"]
        toml = tmp_path / "providers.toml"
        toml.write_text(f"""
[aws]
type = "ec2"
max_machines = 1
idle_timeout = 2
join_timeout = 120
instance_types = ["t3.large"]
endpoint_url = "{url}"
python = {json.dumps(sys.executable)}

[aws.regions.us-east-1]
ami = "{ami}"
""")
        server = Server(tmp_path / "server-home", "--providers", str(toml))
        machine = None
        try:
            # the configured section; installed adapters nobody configured follow it
            [info] = [p for p in json.loads(server.cli("providers", "list", "--json")) if p["configured"]]
            assert (info["name"], info["type"], info["plugin"], info["max_machines"]) == (
                "aws", "ec2", "ec2", 1)
            offers = json.loads(server.cli("providers", "offers", "--json"))
            assert [(o["provider"], o["shape"], o["region"], o["price_per_hour"]) for o in offers] == [
                ("aws", "t3.large", "us-east-1", 0.0832)]
            job_id = server.cli("submit", "--target", "cloud", "--detach", "--",
                                "python", "-c", "print('hello from ec2')").strip()
            [inst] = wait_for(lambda: tagged_instances(client) or None, 60, "RunInstances in moto")
            tags = {t["Key"]: t["Value"] for t in inst["Tags"]}
            assert inst["InstanceType"] == "t3.large" and tags["gpulayer:label"]

            machine = play_machine(client, inst["InstanceId"], tmp_path / "machine")

            def finished():
                job = server.http.get(f"/v1/jobs/{job_id}").json()
                return job if job["state"] in ("succeeded", "failed", "cancelled", "lost") else None

            job = wait_for(finished, 120, "the cloud job to finish")
            assert job["state"] == "succeeded", job
            [worker] = [w for w in server.workers() if w["name"] == tags["gpulayer:machine-id"]]
            assert worker["origin"] == "provider"
            assert "hello from ec2" in server.cli("jobs", "logs", job_id)

            def terminated():
                [now] = [i for i in tagged_instances(client) if i["InstanceId"] == inst["InstanceId"]]
                return now["State"]["Name"] in ("shutting-down", "terminated")

            wait_for(terminated, 120, "the idle machine to be terminated in EC2")
            [record] = json.loads(server.cli("machines", "list", "--all", "--json"))
            assert (record["id"], record["provider_id"], record["shape"]) == (
                tags["gpulayer:machine-id"], f"us-east-1/{inst['InstanceId']}", "t3.large")
            assert record["state"] == "terminated" and record["worker_id"] == worker["id"]
            shown = server.cli("jobs", "show", job_id)
            expected = rf"cloud +aws/us-east-1/t3\.large: launched {record['id']} \([\d.]+ s\), joined as {worker['id']}"
            assert re.search(expected, shown), shown

            # An instance with this server's label that its records do not know (a launch
            # whose answer was lost, a database restored from a backup): the server's list()
            # after a restart finds it, and it is terminated as an orphan.
            server.stop()
            orphan = make_provider(endpoint_url=url, regions={"us-east-1": {"ami": ami}})
            [offer] = [o for o in orphan.offers(plugin.Requirements()) if o.shape == "t3.large"]
            stray = orphan.launch(plugin.LaunchRequest(
                machine_id="m-stray", label=tags["gpulayer:label"], offer=offer, control_url=server.url,
                bootstrap_token="glt_never-issued", join_deadline=time.time() + 600)).provider_id.split("/")[1]
            server = Server(tmp_path / "server-home", "--providers", str(toml))

            def stray_gone():
                [now] = [i for i in tagged_instances(client) if i["InstanceId"] == stray]
                return now["State"]["Name"] in ("shutting-down", "terminated")

            wait_for(stray_gone, 120, "the orphan to be terminated after the restart")
        finally:
            if machine is not None:
                stop(machine)
            server.stop()
    finally:
        stop(moto)
