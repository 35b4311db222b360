"""The bundled ``ssh`` provider against a real sshd on 127.0.0.1 (scripts/local-sshd.sh).

Adapter-level: the tests call the provider as the core does, and the worker it starts over
SSH joins a real ``gpulayer server start`` on loopback with a real bootstrap token.
"""

from __future__ import annotations

import json
import logging
import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
from gpulayer_ssh import SshPoolConfig
from gpulayer_ssh.provider import SshProvider
from pydantic import ValidationError

from gpulayer import plugin
from tests.providers.ssh_support import LocalSshd, local_sshd
from tests.server_support import Api, ServerProc, until

__all__ = ["local_sshd"]  # the fixture, imported to be found

LABEL = "gl-test-ssh"


_made: list[SshProvider] = []


def provider(sshd: LocalSshd, remote_state: Path, name: str = "pool", **host: Any) -> SshProvider:
    config = SshPoolConfig.model_validate({"hosts": [sshd.host_config(remote_state, **host)],
                                           "connect_timeout": 5, "command_timeout": 60, "stop_grace": 10})
    made = SshProvider(name, config)
    _made.append(made)
    return made


@pytest.fixture(autouse=True)
def _nothing_left_running() -> Iterator[None]:
    """Whatever a test started on the host is stopped, even when the test failed halfway."""
    yield
    while _made:
        pool = _made.pop()
        for host in pool.hosts.values():
            try:
                markers = pool.call(host, {"op": "status"})["markers"]
            except plugin.ProviderError:
                continue
            for marker in markers:
                pool.terminate(str(marker["machine_id"]), None)


def ssh_keygen(path: Path) -> Path:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)], check=True, timeout=30)
    return path


def cmdlines() -> Iterator[str]:
    for proc in psutil.process_iter(["cmdline"]):
        line = proc.info.get("cmdline")
        if line:
            yield "\0".join(line)


@pytest.fixture
def server(tmp_path: Path) -> Iterator[ServerProc]:
    srv = ServerProc(tmp_path / "server").start()
    yield srv
    srv.stop()


# ---------------------------------------------------------------------------- config


def test_pool_defaults_apply_to_every_host_and_hosts_may_override() -> None:
    config = SshPoolConfig.model_validate({"user": "ml", "key_file": "~/.ssh/k", "python": "/opt/py",
                                           "hosts": [{"host": "a"}, {"host": "b", "port": 2222, "user": "root"}]})
    a, b = config.hosts
    assert (a.user, a.key_file, a.python, a.label) == ("ml", "~/.ssh/k", "/opt/py", "a")
    assert (b.user, b.port, b.label) == ("root", 2222, "b:2222")


@pytest.mark.parametrize(("section", "wanted"), [
    ({"hosts": []}, "hosts"),
    ({"hosts": [{"host": "a", "user": "u"}]}, "hosts.0.key_file"),
    ({"hosts": [{"host": "a", "user": "u", "key_file": "k", "cpus": 8}]}, "declare cpus and memory_gb together"),
    ({"hosts": [{"host": "a", "user": "u", "key_file": "k", "environment": {"GPULAYER_TOKEN": "x"}}]},
     "GPULAYER_TOKEN is set by GPUlayer itself"),
    ({"hosts": [{"host": "a", "user": "u", "key_file": "k"}, {"host": "a", "user": "v", "key_file": "k"}]},
     "are both called 'a'"),
    ({"hosts": [{"host": "a", "user": "u", "key_file": "k", "strict_host_key_checking": "maybe"}]},
     "strict_host_key_checking"),
])
def test_a_bad_section_is_refused_naming_the_key(section: dict[str, Any], wanted: str) -> None:
    with pytest.raises(ValidationError) as info:
        SshPoolConfig.model_validate(section)
    assert wanted in str(info.value)


def test_the_plugin_offers_the_ssh_adapter() -> None:
    import gpulayer_ssh

    (adapter,) = list(gpulayer_ssh.gpulayer_provider_adapters())
    assert adapter.name == "ssh" and adapter.config is SshPoolConfig


# ---------------------------------------------------------------------------- check


def test_check_connects_with_the_key(local_sshd: LocalSshd, tmp_path: Path) -> None:
    provider(local_sshd, tmp_path / "remote").check()


def test_a_key_the_host_does_not_accept_is_auth_failed_naming_the_host(local_sshd: LocalSshd, tmp_path: Path) -> None:
    other = ssh_keygen(tmp_path / "other_key")
    with pytest.raises(plugin.ProviderAuthFailed) as info:
        provider(local_sshd, tmp_path / "remote", key_file=str(other)).check()
    text = str(info.value)
    assert "ssh host 'local'" in text and f"{local_sshd.user}@127.0.0.1:{local_sshd.port}" in text
    assert "authentication failed" in text and str(other) in text


def test_a_missing_key_file_is_auth_failed_naming_it(local_sshd: LocalSshd, tmp_path: Path) -> None:
    with pytest.raises(plugin.ProviderAuthFailed, match="key_file '/nonexistent/key' cannot be read"):
        provider(local_sshd, tmp_path / "remote", key_file="/nonexistent/key").check()


def test_an_unknown_host_key_is_refused_unless_accept_new(local_sshd: LocalSshd, tmp_path: Path) -> None:
    known = tmp_path / "known_hosts"
    known.write_text("")
    with pytest.raises(plugin.ProviderAuthFailed, match=r"is not in .*known_hosts.*ssh-keyscan") as info:
        provider(local_sshd, tmp_path / "remote", known_hosts=str(known)).check()
    # the fingerprint OpenSSH would show, to check before trusting it
    listed = subprocess.run(["ssh-keygen", "-lf", str(local_sshd.state / "host_ed25519_key.pub")],
                            capture_output=True, text=True, check=True, timeout=30).stdout.split()[1]
    assert f"ssh-ed25519 {listed}" in str(info.value)
    provider(local_sshd, tmp_path / "remote", known_hosts=str(known), strict_host_key_checking="accept-new").check()
    assert f"[127.0.0.1]:{local_sshd.port}" in known.read_text()  # remembered, as OpenSSH does
    provider(local_sshd, tmp_path / "remote", known_hosts=str(known)).check()


def test_accept_new_appends_one_line_once_and_never_rewrites_the_file(local_sshd: LocalSshd, tmp_path: Path) -> None:
    other = " ".join(Path(f"{ssh_keygen(tmp_path / 'other_host_key')}.pub").read_text().split()[:2])
    known = tmp_path / "known_hosts"
    # what a user's file holds: comments, blank lines, a line for several names, no newline at the end
    before = f"# the lab's hosts\n\nbox-a,box-b,10.0.0.9 {other}\n# end"
    known.write_text(before)
    pool = provider(local_sshd, tmp_path / "remote", known_hosts=str(known), strict_host_key_checking="accept-new")
    pool.check()
    host_key = " ".join((local_sshd.state / "host_ed25519_key.pub").read_text().split()[:2])
    assert known.read_text() == before + f"\n[127.0.0.1]:{local_sshd.port} {host_key}\n"  # one line, as OpenSSH adds
    after = known.read_text()
    stamp = known.stat().st_mtime_ns
    time.sleep(0.05)
    pool.check()
    pool.offers(plugin.Requirements())
    assert (known.read_text(), known.stat().st_mtime_ns) == (after, stamp)  # a known host writes nothing
    # what OpenSSH makes of the file: both hosts known, the names of the shared line kept together
    found = subprocess.run(["ssh-keygen", "-F", "box-b", "-f", str(known)], capture_output=True, text=True, timeout=30)
    assert f"box-a,box-b,10.0.0.9 {other}" in found.stdout
    found = subprocess.run(["ssh-keygen", "-F", f"[127.0.0.1]:{local_sshd.port}", "-f", str(known)],
                           capture_output=True, text=True, timeout=30)
    assert host_key in found.stdout


def public_key(path: Path) -> str:
    """``keytype base64`` of the public key beside the private key ``path``."""
    return " ".join(Path(f"{path}.pub").read_text().split()[:2])


def test_marker_lines_are_set_aside_and_a_malformed_line_is_reported_once(
        local_sshd: LocalSshd, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    ca, old = public_key(ssh_keygen(tmp_path / "ca")), public_key(ssh_keygen(tmp_path / "old"))
    host_key = public_key(local_sshd.state / "host_ed25519_key")
    known = tmp_path / "known_hosts"
    # a file OpenSSH reads: marker lines (paramiko stopped at them), then two lines that are broken
    known.write_text(f"@cert-authority *.example.com {ca}\n@revoked old.example.com {old}\n"
                     f"garbage\nbox-c ssh-ed25519 AAAAnot-base64!\n[127.0.0.1]:{local_sshd.port} {host_key}\n")
    pool = provider(local_sshd, tmp_path / "remote", known_hosts=str(known))
    with caplog.at_level(logging.WARNING, logger="gpulayer.ssh"):
        pool.check()
        pool.offers(plugin.Requirements())
        pool.check()
    skipped = [r.getMessage() for r in caplog.records if "the line is skipped" in r.getMessage()]
    assert len(skipped) == 2, skipped  # once each, however many connections
    assert f"{known} line 3: expected HOSTS KEYTYPE KEY (garbage)" in skipped[0]
    assert f"{known} line 4: its key does not decode" in skipped[1]
    # a host trusted only through a CA is unknown to paramiko, which checks no host certificate
    known.write_text(f"@cert-authority * {ca}\n")
    with pytest.raises(plugin.ProviderAuthFailed, match=r"is not in .*@cert-authority line.* not used"):
        provider(local_sshd, tmp_path / "remote", known_hosts=str(known)).check()


@pytest.mark.parametrize("mode", ["yes", "accept-new", "no"])
def test_a_host_key_listed_revoked_is_refused(local_sshd: LocalSshd, tmp_path: Path, mode: str) -> None:
    host_key = public_key(local_sshd.state / "host_ed25519_key")
    known = tmp_path / "known_hosts"
    # revoked, though a line lists it for the host too: OpenSSH refuses it all the same
    text = f"@revoked * {host_key}\n[127.0.0.1]:{local_sshd.port} {host_key}\n"
    known.write_text(text)
    pool = provider(local_sshd, tmp_path / "remote", known_hosts=str(known), strict_host_key_checking=mode)
    with pytest.raises(plugin.ProviderAuthFailed, match=r"its host key \(ssh-ed25519 SHA256:.*\) is listed @revoked in"):
        pool.check()
    assert known.read_text() == text  # accept-new does not take it for a new key
    # revoked while the host is listed with another key of its type: revoked, not "changed"
    other = public_key(ssh_keygen(tmp_path / "other"))
    known.write_text(f"@revoked * {host_key}\n[127.0.0.1]:{local_sshd.port} {other}\n")
    with pytest.raises(plugin.ProviderAuthFailed, match="is listed @revoked in"):
        pool.check()


def test_a_changed_host_key_is_auth_failed(local_sshd: LocalSshd, tmp_path: Path) -> None:
    wrong = ssh_keygen(tmp_path / "not_the_host_key")
    known = tmp_path / "known_hosts"
    known.write_text(f"[127.0.0.1]:{local_sshd.port} " + " ".join(Path(f"{wrong}.pub").read_text().split()[:2]) + "\n")
    with pytest.raises(plugin.ProviderAuthFailed, match="host key is not the one in"):
        provider(local_sshd, tmp_path / "remote", known_hosts=str(known)).check()


def test_a_host_nobody_listens_on_is_transient(local_sshd: LocalSshd, tmp_path: Path) -> None:
    from tests.server_support import free_port

    port = free_port()
    with pytest.raises(plugin.ProviderTransient, match="cannot connect") as caught:
        provider(local_sshd, tmp_path / "remote", port=port).check()
    assert f"cannot connect: Connection refused (port {port}: is an sshd listening there?)" in str(caught.value)
    assert "Errno" not in str(caught.value)


def test_a_port_that_is_not_an_sshd_is_said_so_without_tracebacks_in_the_log(
        local_sshd: LocalSshd, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A port where something else answers (a web server, say) or that never sends an SSH
    banner: the error says so, once, and paramiko's transport thread does not log the same
    error again as a twenty-line traceback at every connection."""
    import socket

    caplog.set_level(logging.DEBUG)
    with socket.socket() as silent, socket.socket() as talker:
        silent.bind(("127.0.0.1", 0))
        silent.listen(4)
        talker.bind(("127.0.0.1", 0))
        talker.listen(4)

        def answer_http() -> None:
            conn, _ = talker.accept()
            conn.sendall(b"HTTP/1.1 400 Bad Request\r\n\r\n")
            conn.close()

        threading.Thread(target=answer_http, daemon=True).start()
        for server in (talker, silent):
            port = server.getsockname()[1]
            pool = provider(local_sshd, tmp_path / "remote", port=port)
            pool.config.connect_timeout = 1.0
            with pytest.raises(plugin.ProviderTransient) as caught:
                pool.check()
            # (paramiko's own words in the brackets: "Error reading SSH protocol banner", with
            # "[Errno 104] Connection reset by peer" when the server closed first, or "No
            # existing session" when the banner's wait ran out)
            assert re.search(rf"cannot connect: no SSH server answered on port {port} within connect_timeout \(1 s\) "
                             rf"\((Error reading SSH protocol banner[^)]*|No existing session)\): "
                             rf"is it the port of the host's sshd\?$", str(caught.value)), str(caught.value)
    assert [r.getMessage() for r in caplog.records if r.name.startswith("paramiko") and r.levelno >= logging.ERROR] == []


# ---------------------------------------------------------------------------- offers


def test_offers_probe_the_host_once_and_declared_hosts_are_not_probed(local_sshd: LocalSshd, tmp_path: Path) -> None:
    pool = provider(local_sshd, tmp_path / "remote")
    (offer,) = pool.offers(plugin.Requirements())
    assert (offer.shape, offer.price_per_hour, offer.availability) == ("local", None, "available")
    assert offer.capabilities.host.cpu_count == psutil.cpu_count() and offer.capabilities.devices == []
    assert offer.capabilities.host.python_path  # what `resources detect --json` said on the host
    assert "local" in pool._probed

    declared = provider(local_sshd, tmp_path / "remote", cpus=64, memory_gb=512,
                        devices=[{"kind": "cuda", "count": 2, "memory_gb": 80, "name": "A100"}])
    (offer,) = declared.offers(plugin.Requirements())
    assert offer.capabilities.host.cpu_count == 64
    assert [(d.kind, d.index, d.memory_gb) for d in offer.capabilities.devices] == [("cuda", 0, 80.0), ("cuda", 1, 80.0)]
    assert declared._probed == {}


def test_a_python_the_host_lacks_fails_the_probe_with_a_clear_reason(local_sshd: LocalSshd, tmp_path: Path) -> None:
    pool = provider(local_sshd, tmp_path / "remote", python="/no/such/python3")
    with pytest.raises(plugin.ProviderTransient, match="'/no/such/python3' not found on the host"):
        pool.offers(plugin.Requirements())


# ---------------------------------------------------------------------------- the lifecycle


def launch_request(server: ServerProc, offer: plugin.MachineOffer, machine_id: str) -> tuple[plugin.LaunchRequest, str]:
    admin = Api(server.url, server.admin_token)
    secret = admin.token_for("bootstrap", ttl=300, description=f"machine {machine_id}")["token"]
    request = plugin.LaunchRequest(machine_id=machine_id, label=LABEL, offer=offer, control_url=server.url,
                                   bootstrap_token=secret, join_deadline=time.time() + 300)
    return request, secret


def test_launch_starts_a_worker_that_joins_and_terminate_stops_it(
        local_sshd: LocalSshd, server: ServerProc, tmp_path: Path) -> None:
    remote = tmp_path / "remote"
    pool = provider(local_sshd, remote)
    (offer,) = pool.offers(plugin.Requirements())
    request, secret = launch_request(server, offer, "m-ssh00000001")

    # watch every process's argv while the launch runs: the token must be in none of them
    seen: list[str] = []
    stop = threading.Event()

    def watch() -> None:
        while not stop.is_set():
            seen.extend(line for line in cmdlines() if secret in line)
            time.sleep(0.005)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        launched = pool.launch(request)
    finally:
        stop.set()
        watcher.join(10)
    pid = int(launched.data["pid"])
    assert launched.provider_id == f"local:{pid}"
    assert seen == []

    # the worker really joins the server, named by its machine id, with the provider origin
    admin = Api(server.url, server.admin_token)

    def joined() -> dict[str, Any] | None:
        return next((w for w in admin("GET", "/v1/workers").json() if w["name"] == "m-ssh00000001" and w["online"]), None)

    worker = until(joined, 90, "the worker started over SSH to join")
    assert worker["origin"] == "provider"
    assert not any(secret in line for line in cmdlines())
    proc = psutil.Process(pid)
    assert os.getpgid(pid) == pid and os.getsid(pid) == pid  # its own session and group
    assert proc.environ().get("GPULAYER_MACHINE_ID") == "m-ssh00000001"
    assert (remote / "logs" / "m-ssh00000001.log").exists()
    marker = remote / "machines" / "m-ssh00000001" / "marker.json"
    assert marker.stat().st_mode & 0o077 == 0 and marker.parent.stat().st_mode & 0o077 == 0  # private
    # its home started with the framework probes' answers of the host's probe, and its own
    # detection used them (a probe run would have written its entry anew)
    probed = sorted((remote / "probe-home" / "cache" / "probes").glob("*.json"))
    assert probed
    for entry in probed:
        seeded = remote / "machines" / "m-ssh00000001" / "home" / "cache" / "probes" / entry.name
        assert seeded.read_bytes() == entry.read_bytes()
        assert seeded.stat().st_mtime_ns == entry.stat().st_mtime_ns

    # list finds it by label, and only by its label
    (live,) = pool.list(LABEL)
    assert (live.machine_id, live.provider_id, live.state) == ("m-ssh00000001", launched.provider_id, "running")
    assert pool.list("gl-another-server") == []
    # the host is taken: its offer says so, a second machine is refused, the same one is the same
    (busy,) = pool.offers(plugin.Requirements())
    assert busy.availability == "unavailable"
    assert pool.launch(request).provider_id == launched.provider_id
    other, _ = launch_request(server, offer, "m-ssh00000002")
    with pytest.raises(plugin.NoCapacity, match="already runs machine m-ssh00000001"):
        pool.launch(other)

    pool.terminate("m-ssh00000001", launched.provider_id)
    until(lambda: not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE, 30,
          "the worker process to end")
    assert not marker.exists()
    assert pool.list(LABEL) == []
    until(lambda: not joined(), 30, "the server to see the worker leave")
    # idempotent: gone is success, with or without the provider's handle
    pool.terminate("m-ssh00000001", launched.provider_id)
    pool.terminate("m-ssh00000001", None)
    pool.terminate("m-never-launched", None)
    (free,) = pool.offers(plugin.Requirements())
    assert free.availability == "available"


def test_a_worker_that_cannot_start_fails_the_launch_with_its_words(local_sshd: LocalSshd, tmp_path: Path) -> None:
    """A host whose python has no GPUlayer (a host that declares what it has is offered
    without a probe): its worker exits at once, and the launch says so with the worker's own
    words, instead of a machine left booting until its join deadline (10 minutes by default)."""
    bare = tmp_path / "bare-venv"  # a Python with the standard library only
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(bare)], check=True, timeout=120)
    remote = tmp_path / "remote"
    pool = provider(local_sshd, remote, python=str(bare / "bin" / "python"), environment={}, cpus=2, memory_gb=4)
    (offer,) = pool.offers(plugin.Requirements())
    request = plugin.LaunchRequest(machine_id="m-nogpulayer", label=LABEL, offer=offer, control_url="http://127.0.0.1:9",
                                   bootstrap_token="glt_unused", join_deadline=time.time() + 300)
    with pytest.raises(plugin.SkipOffer) as caught:
        pool.launch(request)
    assert f"the worker exited at once (exit 1), so '{bare}/bin/python' cannot run it: " in str(caught.value)
    assert "No module named 'gpulayer'" in str(caught.value)
    assert not (remote / "machines" / "m-nogpulayer").exists()  # no marker: the host is free
    assert "No module named 'gpulayer'" in (remote / "logs" / "m-nogpulayer.log").read_text()
    (free,) = pool.offers(plugin.Requirements())
    assert free.availability == "available"


def test_terminate_kills_a_worker_that_ignores_sigterm(local_sshd: LocalSshd, tmp_path: Path) -> None:
    """A stuck worker gets SIGKILL after stop_grace; its whole tree goes, even a child in a
    session of its own (as a task's process is)."""
    remote = tmp_path / "remote"
    pool = provider(local_sshd, remote)
    pool.config.stop_grace = 1.0
    host = pool.hosts["local"]
    stubborn = ("import os, signal, subprocess, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
                "subprocess.Popen([sys.executable, '-c', 'import signal, time; "
                "signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)'], start_new_session=True); "
                "time.sleep(600)")
    answer = pool.call(host, {"op": "launch", "machine_id": "m-stubborn", "label": LABEL,
                              "argv": [host.python, "-c", stubborn], "worker_env": {}})
    pid = int(answer["pid"])
    children = until(lambda: psutil.Process(pid).children(recursive=True), 30, "the stubborn child")
    pool.terminate("m-stubborn", f"local:{pid}")
    for proc in [psutil.Process(pid), *children]:
        until(lambda p=proc: not p.is_running() or p.status() == psutil.STATUS_ZOMBIE, 30, f"pid {proc.pid} to end")
    assert pool.list(LABEL) == []


def test_terminate_ends_what_a_killed_worker_left_running(local_sshd: LocalSshd, tmp_path: Path) -> None:
    """A worker killed with SIGKILL (out of memory, say) leaves its task's processes behind
    (a child in a session of its own is re-parented to init): terminating its machine ends
    every process of the machine's (they carry its GPULAYER_MACHINE_ID), though the marker's
    worker is already gone."""
    remote = tmp_path / "remote"
    pool = provider(local_sshd, remote)
    pool.config.stop_grace = 1.0
    host = pool.hosts["local"]
    task = ("import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'], "
            "start_new_session=True); time.sleep(600)")
    answer = pool.call(host, {"op": "launch", "machine_id": "m-killed", "label": LABEL,
                              "argv": [host.python, "-c", task], "worker_env": {"GPULAYER_MACHINE_ID": "m-killed"}})
    pid = int(answer["pid"])
    (child,) = until(lambda: psutil.Process(pid).children(recursive=True), 30, "the task's child")
    psutil.Process(pid).kill()
    until(lambda: not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE, 30,
          "the worker to die")
    assert pool.list(LABEL) == []  # the machine is not alive any more: only its leftovers are
    pool.terminate("m-killed", f"local:{pid}")
    until(lambda: not child.is_running() or child.status() == psutil.STATUS_ZOMBIE, 30, "the task's child to end")
    assert not (remote / "machines" / "m-killed").exists()


def test_a_host_that_does_not_answer_costs_its_offer_only(local_sshd: LocalSshd, tmp_path: Path) -> None:
    from tests.server_support import free_port

    remote = tmp_path / "remote"
    good = local_sshd.host_config(remote)
    dead = {**good, "name": "dead", "port": free_port()}
    declared_dead = {**dead, "name": "dead-declared", "cpus": 8, "memory_gb": 32}
    pool = SshProvider("pool", SshPoolConfig.model_validate({"hosts": [good, dead, declared_dead], "connect_timeout": 5}))
    _made.append(pool)
    pool.check()  # one host answers: the credentials work
    by_shape = {o.shape: o.availability for o in pool.offers(plugin.Requirements())}
    assert by_shape == {"local": "available", "dead-declared": "unknown"}
    # a list that misses a host would make the core think its machines gone: it says so instead
    with pytest.raises(plugin.ProviderTransient, match="ssh host 'dead'"):
        pool.list(LABEL)
    # a terminate without the handle that finds nothing, and could not ask every host, is not done
    with pytest.raises(plugin.ProviderTransient, match="cannot connect"):
        pool.terminate("m-nowhere", None)
    pool.terminate("m-nowhere", "local:1")  # the host is known and answered: gone is success
    # a host probed before that stops answering (a reboot) is still offered, as unknown: a
    # job only it fits waits for it instead of failing at once as unschedulable
    (probed,) = [o for o in pool.offers(plugin.Requirements()) if o.shape == "local"]
    pool.hosts["local"] = pool.hosts["local"].model_copy(update={"port": free_port()})
    by_shape = {o.shape: o for o in pool.offers(plugin.Requirements())}
    assert {s: o.availability for s, o in by_shape.items()} == {"local": "unknown", "dead-declared": "unknown"}
    assert by_shape["local"].capabilities == probed.capabilities


def write_marker(state: Path, machine_id: str, label: str, pid: int) -> None:
    """A machine marker as remote.launch writes it, for process ``pid``."""
    folder = state / "machines" / machine_id
    folder.mkdir(parents=True)
    (folder / "marker.json").write_text(json.dumps({
        "machine_id": machine_id, "label": label, "pid": pid, "create_time": psutil.Process(pid).create_time(),
        "started_at": time.time()}))


def test_a_host_whose_python_fails_leaves_the_others_listed(
        local_sshd: LocalSshd, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    good_state, bad_state = tmp_path / "good", tmp_path / "bad"
    good = local_sshd.host_config(good_state)
    bad = {**local_sshd.host_config(bad_state), "name": "bad", "python": "/nonexistent/python3"}
    pool = SshProvider("pool", SshPoolConfig.model_validate({"hosts": [good, bad], "connect_timeout": 5}))
    _made.append(pool)
    # a machine of this server on the healthy host (an orphan, say): a process with its marker
    orphan = subprocess.Popen(["sleep", "300"], start_new_session=True)
    try:
        write_marker(good_state, "m-orphan", LABEL, orphan.pid)
        with caplog.at_level(logging.WARNING, logger="gpulayer.ssh"):
            for _ in range(2):
                (live,) = pool.list(LABEL)  # the bad host answers with exit 127: it holds nothing of ours
                assert (live.machine_id, live.provider_id) == ("m-orphan", f"local:{orphan.pid}")
        told = [r.getMessage() for r in caplog.records if "ssh host 'bad'" in r.getMessage()]
        assert len(told) == 1, told  # named once, not at every sweep
        assert "'/nonexistent/python3' not found on the host" in told[0] and "left out of the list" in told[0]
        # another server's marker there changes nothing; one of this server's makes the list
        # fail, as for an unreachable host: the core must not take that machine for gone
        write_marker(bad_state, "m-theirs", "gl-another-server", orphan.pid)
        assert [m.machine_id for m in pool.list(LABEL)] == ["m-orphan"]
        write_marker(bad_state, "m-ours", LABEL, orphan.pid)
        with pytest.raises(plugin.ProviderTransient, match=r"ssh host 'bad'.*not found.*holds a marker of this server"):
            pool.list(LABEL)
    finally:
        orphan.kill()
        orphan.wait()


def test_a_python_under_the_home_folder_is_left_for_the_host_to_expand() -> None:
    from gpulayer_ssh.provider import remote_path

    assert remote_path("~/venv/bin/python") == "~/venv/bin/python"
    assert remote_path("~/my venv/python") == "~/'my venv/python'"
    assert remote_path("/opt/py thon") == "'/opt/py thon'"
