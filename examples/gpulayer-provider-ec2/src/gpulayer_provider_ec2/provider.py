"""One configured EC2 provider: the five calls of GPUlayer's provider contract on boto3.

Machines are tagged ``gpulayer:label`` (the control plane's label) and ``gpulayer:machine-id``
(the id GPUlayer chose). ``provider_id`` is ``REGION/INSTANCE_ID``: ``terminate`` is given
only the ids, and an instance id means nothing without its region.
"""

from __future__ import annotations

import threading
from typing import Any

import boto3
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError

from gpulayer import plugin
from gpulayer_provider_ec2.catalog import CATALOG, GIB
from gpulayer_provider_ec2.config import Ec2Config
from gpulayer_provider_ec2.errors import GONE, code_of, mapped
from gpulayer_provider_ec2.userdata import user_data

LABEL_TAG = "gpulayer:label"
MACHINE_TAG = "gpulayer:machine-id"
#: states of a machine that still exists (stopped instances keep their disks, and cost)
LIVE_STATES = ("pending", "running", "stopping", "stopped")
_STATE: dict[str, Any] = {"pending": "pending", "running": "running", "stopping": "stopping"}
#: DescribeInstances' answer, flattened (``list`` is a method name in the class below)
Instances = list[dict[str, Any]]
# calls are bounded: GPUlayer calls from its own threads with its own timeouts, and a hung
# connection must not outlive them
_BOTO = Config(connect_timeout=5, read_timeout=30, retries={"mode": "standard", "max_attempts": 3})


class Ec2Provider:
    """The provider of one providers.toml section: a boto3 client per configured region."""

    def __init__(self, name: str, config: Ec2Config) -> None:
        self.name = name
        self.config = config
        self._clients: dict[str, Any] = {}
        self._lock = threading.Lock()  # boto3 sessions are not thread-safe; clients are
        self._session: boto3.session.Session | None = None

    def client(self, region: str) -> Any:
        with self._lock:
            if region not in self._clients:
                if self._session is None:
                    self._session = boto3.session.Session(profile_name=self.config.profile)
                self._clients[region] = self._session.client("ec2", region_name=region, config=_BOTO,
                                                             endpoint_url=self.config.endpoint_url)
            return self._clients[region]

    def _call(self, region: str, what: str, method: str, **kw: Any) -> Any:
        try:
            return getattr(self.client(region), method)(**kw)
        except (ClientError, BotoCoreError) as exc:
            raise mapped(exc, f"ec2 {region}: {what}") from exc

    # ------------------------------------------------------------------ the contract

    def check(self) -> None:
        """One cheap authenticated call per configured region."""
        for region in self.config.regions:
            self._call(region, "DescribeRegions", "describe_regions", RegionNames=[region])

    def offers(self, requirements: plugin.Requirements) -> list[plugin.MachineOffer]:
        found = []
        for region, where in self.config.regions.items():
            for name in self.config.allowed():
                kind = CATALOG[name]
                price = self.config.price(name, region)
                if price is None or kind.unfit(requirements):
                    continue
                host = plugin.HostInfo(os="linux", arch="x86_64", cpu_count=kind.vcpus,
                                       memory_bytes=int(kind.memory_gib * GIB),
                                       python_version=self.config.python_version)
                caps = plugin.Capabilities(host=host, devices=kind.devices(), frameworks=dict(self.config.frameworks))
                found.append(plugin.MachineOffer(shape=name, region=region, capabilities=caps, price_per_hour=price,
                                                 boot_seconds=kind.boot_seconds,
                                                 data={"instance_type": name, "region": region, "ami": where.ami}))
        return sorted(found, key=lambda o: (o.price_per_hour or 0.0, o.shape, o.region or ""))

    def launch(self, request: plugin.LaunchRequest) -> plugin.LaunchedMachine:
        region = request.offer.region or next(iter(self.config.regions))
        where = self.config.regions.get(region)
        if where is None:
            raise plugin.SkipOffer(f"ec2: region {region!r} is not configured for provider {self.name!r}")
        if request.offer.shape not in self.config.allowed():
            raise plugin.SkipOffer(f"ec2: instance type {request.offer.shape!r} is not allowed for {self.name!r}")
        # A retried launch must not bring up a second machine. EC2's ClientToken makes
        # RunInstances idempotent; the tag lookup covers emulators that ignore it and a
        # token EC2 has forgotten.
        existing = self._find(region, request.machine_id)
        if existing:
            return self._launched(region, existing[0])
        tags = [{"Key": LABEL_TAG, "Value": request.label}, {"Key": MACHINE_TAG, "Value": request.machine_id},
                {"Key": "Name", "Value": f"gpulayer-{request.machine_id}"}]
        kw: dict[str, Any] = {
            "ImageId": where.ami, "InstanceType": request.offer.shape, "MinCount": 1, "MaxCount": 1,
            "ClientToken": request.machine_id,
            "UserData": user_data(request, python=self.config.python),
            "TagSpecifications": [{"ResourceType": kind, "Tags": tags} for kind in ("instance", "volume")],
            # an OS shutdown ends the instance instead of leaving a stopped one that bills its disks
            "InstanceInitiatedShutdownBehavior": "terminate",
            # IMDSv2 only: user-data holds the (single-use) token until the join spends it
            "MetadataOptions": {"HttpTokens": "required", "HttpEndpoint": "enabled"},
        }
        if where.subnet:
            kw["SubnetId"] = where.subnet
        if where.security_groups:
            kw["SecurityGroupIds"] = where.security_groups
        if self.config.key_name:
            kw["KeyName"] = self.config.key_name
        reply = self._call(region, f"RunInstances {request.offer.shape}", "run_instances", **kw)
        return self._launched(region, reply["Instances"][0])

    def list(self, label: str) -> list[plugin.LiveMachine]:
        found = []
        for region in self.config.regions:
            for inst in self._describe(region, [{"Name": f"tag:{LABEL_TAG}", "Values": [label]}]):
                tags = {t["Key"]: t["Value"] for t in inst.get("Tags", [])}
                found.append(plugin.LiveMachine(
                    machine_id=tags.get(MACHINE_TAG, ""), provider_id=f"{region}/{inst['InstanceId']}",
                    state=_STATE.get(inst["State"]["Name"], "unknown"),
                    data={"region": region, "instance_type": inst.get("InstanceType"), "state": inst["State"]["Name"]}))
        return found

    def terminate(self, machine_id: str, provider_id: str | None) -> None:
        if provider_id:
            region, _, instance_id = provider_id.rpartition("/")
            targets = {region or next(iter(self.config.regions)): [instance_id]}
        else:  # the launch's answer was lost: whatever carries the machine's tag
            targets = {r: [i["InstanceId"] for i in self._find(r, machine_id)] for r in self.config.regions}
        for region, ids in targets.items():
            if not ids:
                continue
            try:
                self.client(region).terminate_instances(InstanceIds=ids)
            except ClientError as exc:
                if code_of(exc) not in GONE:
                    raise mapped(exc, f"ec2 {region}: TerminateInstances {' '.join(ids)}") from exc
            except BotoCoreError as exc:
                raise mapped(exc, f"ec2 {region}: TerminateInstances {' '.join(ids)}") from exc

    # ------------------------------------------------------------------ helpers

    def _describe(self, region: str, filters: Instances) -> Instances:
        filters = [*filters, {"Name": "instance-state-name", "Values": list(LIVE_STATES)}]
        try:
            pages = self.client(region).get_paginator("describe_instances").paginate(Filters=filters)
            return [inst for page in pages for res in page["Reservations"] for inst in res["Instances"]]
        except (ClientError, BotoCoreError) as exc:
            raise mapped(exc, f"ec2 {region}: DescribeInstances") from exc

    def _find(self, region: str, machine_id: str) -> Instances:
        return self._describe(region, [{"Name": f"tag:{MACHINE_TAG}", "Values": [machine_id]}])

    @staticmethod
    def _launched(region: str, inst: dict[str, Any]) -> plugin.LaunchedMachine:
        return plugin.LaunchedMachine(provider_id=f"{region}/{inst['InstanceId']}", address=inst.get("PrivateIpAddress"),
                                      data={"region": region, "instance_type": inst.get("InstanceType")})
