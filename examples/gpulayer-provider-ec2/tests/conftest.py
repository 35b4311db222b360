"""Fixtures of the EC2 provider's tests.

Everything here is a real process on 127.0.0.1: moto's EC2 in server mode (an HTTP server
boto3 talks to through ``endpoint_url``) and GPUlayer's control plane (``gpulayer server
start``). The provider is found the way GPUlayer finds it, through the installed entry
point, so the tests need the package installed: ``pip install -e '.[test]'``.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from importlib import metadata
from pathlib import Path
from typing import Any

import boto3
import httpx
import pytest

from gpulayer import plugin

HERE = Path(__file__).resolve().parent
# GPUlayer settings a developer's shell may carry that would point our processes elsewhere
CLEAN_ENV = ("GPULAYER_URL", "GPULAYER_TOKEN", "GPULAYER_CA", "GPULAYER_DATABASE_URL", "GPULAYER_MACHINE_ID",
             "GPULAYER_DISABLE_PLUGINS", "GPULAYER_PLUGINS", "GPULAYER_FAKE_DEVICES")
FAKE_AWS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1",
            "AWS_EC2_METADATA_DISABLED": "true"}


def pytest_configure(config: pytest.Config) -> None:
    try:
        metadata.distribution("gpulayer-provider-ec2")
    except metadata.PackageNotFoundError:
        raise pytest.UsageError("gpulayer-provider-ec2 is not installed: run pip install -e '.[test]' "
                                "in examples/gpulayer-provider-ec2 first") from None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_for(predicate: Callable[[], Any], timeout: float, what: str) -> Any:
    """Poll ``predicate`` until it returns something true, at most ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.2)


def stop(proc: subprocess.Popen[Any]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in CLEAN_ENV and not k.startswith("AWS_")}
    env.update(plugin.no_real_devices_env())
    env.update(FAKE_AWS)
    # a command line starts its home's warm CLI server, which waits ten minutes for the next:
    # the tests' homes are thrown away, so it leaves after each (no process left behind)
    env["GPULAYER_CLI_SERVER_IDLE"] = "0"
    env.update(extra)
    return env


def start_moto(log: Path, **env: str) -> tuple[subprocess.Popen[bytes], str]:
    """``python -m moto.server`` on a free loopback port; answers once it serves EC2."""
    port = free_port()
    with open(log, "ab") as out:
        proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                                stdout=out, stderr=subprocess.STDOUT, env=clean_env(**env))
    url = f"http://127.0.0.1:{port}"

    def up() -> bool:
        if proc.poll() is not None:
            raise AssertionError(f"moto exited {proc.returncode}:\n{log.read_text()}")
        try:
            return httpx.get(f"{url}/moto-api/", timeout=1).status_code < 500
        except httpx.HTTPError:
            return False

    wait_for(up, 60, "moto's server to answer")
    return proc, url


@pytest.fixture(autouse=True)
def fake_aws(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Credentials moto accepts, and none of the developer's real ones."""
    for name in [k for k in os.environ if k.startswith("AWS_")]:
        monkeypatch.delenv(name)
    for name, value in FAKE_AWS.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-aws-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-aws-credentials"))


@pytest.fixture(scope="session")
def moto_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    proc, url = start_moto(tmp_path_factory.mktemp("moto") / "moto.log")
    try:
        yield url
    finally:
        stop(proc)


@pytest.fixture(scope="session")
def amis(moto_url: str) -> dict[str, str]:
    """An image id moto knows in each region the tests use."""
    found = {}
    for region in ("us-east-1", "us-west-2"):
        ec2 = boto3.client("ec2", region_name=region, endpoint_url=moto_url, **_keys())
        found[region] = ec2.describe_images(Owners=["amazon"])["Images"][0]["ImageId"]
    return found


def _keys() -> dict[str, str]:
    return {"aws_access_key_id": "testing", "aws_secret_access_key": "testing"}


@pytest.fixture
def ec2(moto_url: str) -> Callable[[str], Any]:
    """A plain boto3 client on moto: what the tests look at EC2 with, besides the provider."""
    return lambda region="us-east-1": boto3.client("ec2", region_name=region, endpoint_url=moto_url, **_keys())


@pytest.fixture
def adapter(plugin_manager: Any, monkeypatch: pytest.MonkeyPatch) -> plugin.ProviderAdapter:
    """The adapter as GPUlayer loads it: from the installed entry point."""
    monkeypatch.delenv("GPULAYER_DISABLE_PLUGINS", raising=False)
    return plugin.records(plugin.ProviderAdapter)["ec2"]


@pytest.fixture
def make_provider(adapter: plugin.ProviderAdapter, moto_url: str, amis: dict[str, str]) -> Callable[..., Any]:
    def make(**section: Any) -> Any:
        section.setdefault("regions", {"us-east-1": {"ami": amis["us-east-1"]}})
        section.setdefault("endpoint_url", moto_url)
        section.setdefault("python", sys.executable)
        return adapter.create("aws", adapter.config.model_validate(section))

    return make


@pytest.fixture
def label() -> str:
    """A label of this test's own: the moto server is shared by the whole session."""
    return f"gl-{uuid.uuid4().hex[:10]}"


def launch_request(provider: Any, label: str, machine_id: str, *, shape: str = "t3.large",
                   url: str = "http://127.0.0.1:9", token: str = "glt_not-a-real-token") -> plugin.LaunchRequest:
    offer = next(o for o in provider.offers(plugin.Requirements()) if o.shape == shape)
    return plugin.LaunchRequest(machine_id=machine_id, label=label, offer=offer, control_url=url,
                                bootstrap_token=token, join_deadline=time.time() + 600)


class Server:
    """``gpulayer server start`` as a subprocess, and its admin API."""

    def __init__(self, home: Path, *args: str) -> None:
        self.home = home
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = home / "server.log"
        home.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as out:
            self.proc = subprocess.Popen([sys.executable, "-m", "gpulayer.cli", "server", "start", "--port",
                                          str(self.port), *args], stdout=out, stderr=subprocess.STDOUT,
                                         env=clean_env(GPULAYER_HOME=str(home)))

        def up() -> bool:
            if self.proc.poll() is not None:
                raise AssertionError(f"server exited {self.proc.returncode}:\n{self.log_path.read_text()}")
            try:
                return httpx.get(f"{self.url}/healthz", timeout=1).status_code == 200
            except httpx.HTTPError:
                return False

        wait_for(up, 60, "the server to answer /healthz")
        self.admin = (home / "admin.token").read_text().strip()
        self.http = httpx.Client(base_url=self.url, timeout=30, headers={"authorization": f"Bearer {self.admin}"})

    def cli(self, *args: str) -> str:
        """Run ``gpulayer ARGS`` against this server as its admin; return stdout."""
        out = subprocess.run([sys.executable, "-m", "gpulayer.cli", "--url", self.url, *args], capture_output=True,
                             text=True, timeout=60, env=clean_env(GPULAYER_HOME=str(self.home),
                                                                  GPULAYER_TOKEN=self.admin))
        assert out.returncode == 0, out.stderr
        return out.stdout

    def bootstrap_token(self) -> str:
        return str(json.loads(self.cli("token", "create", "--bootstrap", "--json"))["token"])

    def workers(self) -> list[dict[str, Any]]:
        r = self.http.get("/v1/workers")
        r.raise_for_status()
        return list(r.json())

    def stop(self) -> None:
        self.http.close()
        stop(self.proc)


@pytest.fixture
def server(tmp_path: Path) -> Iterator[Server]:
    s = Server(tmp_path / "server-home")
    try:
        yield s
    finally:
        s.stop()


def play_machine(ec2_client: Any, instance_id: str, home: Path, **env: str) -> subprocess.Popen[bytes]:
    """Be the booted instance: read its user-data back from EC2 and run it, as cloud-init
    would, as a real process (its worker joins whatever control plane the user-data names)."""
    import base64

    attr = ec2_client.describe_instance_attribute(InstanceId=instance_id, Attribute="userData")
    script = home / "user-data.sh"
    home.mkdir(parents=True, exist_ok=True)
    script.write_bytes(base64.b64decode(attr["UserData"]["Value"]))
    with open(home / "machine.log", "ab") as out:
        # the test machine's environment stands for the image's; the user-data adds the rest
        return subprocess.Popen(["/bin/sh", str(script)], stdout=out, stderr=subprocess.STDOUT,
                                env=clean_env(GPULAYER_HOME=str(home / "gpulayer"),
                                              GPULAYER_HEARTBEAT_INTERVAL="0.3", **env))
