"""The ``ssh`` provider end to end: a real ``gpulayer server start --providers FILE`` whose pool
is 127.0.0.1 through the local sshd (scripts/local-sshd.sh). A cloud job makes the server
start a worker over SSH; the worker joins with its bootstrap token, runs the job, and is
stopped over SSH after its idle timeout."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from gpulayer.testing import fake_devices_env
from tests.providers.ssh_support import LocalSshd, local_sshd
from tests.server_support import Api, ServerProc, base_env, provider_server, until, wait_job
from tests.support import cli

__all__ = ["local_sshd"]  # the fixture, imported to be found

pytestmark = pytest.mark.timeout(300)

CUDA_JOB = {"kind": "command", "command": ["sh", "-c", "echo on $CUDA_VISIBLE_DEVICES; echo machine $GPULAYER_MACHINE_ID"],
            "requirements": {"accelerator": "cuda", "gpus": 1}, "placement": {"target": "cloud"}}


def toml_value(value: Any) -> str:
    """``value`` as TOML: strings, numbers, lists and inline tables (JSON strings are TOML's)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    return "{ " + ", ".join(f"{json.dumps(k)} = {toml_value(v)}" for k, v in value.items()) + " }"


def pool_section(sshd: LocalSshd, remote: Path, *, idle: str = "3s", **host: Any) -> str:
    entry = sshd.host_config(remote, **host)
    entry["environment"] = {**entry["environment"], **fake_devices_env("cuda:1:80:9.0")}
    return "\n".join(["[pool]", 'type = "ssh"', "max_machines = 1", f'idle_timeout = "{idle}"',
                      'join_timeout = "90s"', "connect_timeout = 5", "stop_grace = 10",
                      f"hosts = [{toml_value(entry)}]", ""])


def our_processes(remote: Path) -> list[psutil.Process]:
    """Processes that a machine of this test started on the "host" (found by their home)."""
    found = []
    for p in psutil.process_iter(["environ"]):
        try:
            if str(remote) in (p.info["environ"] or {}).get("GPULAYER_HOME", "") and p.status() != psutil.STATUS_ZOMBIE:
                found.append(p)
        except (psutil.Error, TypeError):
            continue
    return found


@pytest.fixture
def servers(tmp_path: Path) -> Iterator[list[ServerProc]]:
    started: list[ServerProc] = []
    yield started
    for srv in started:
        srv.stop()
    for p in our_processes(tmp_path / "remote"):  # nothing a test started may outlive it
        p.kill()


def start(servers: list[ServerProc], home: Path, toml: str) -> tuple[ServerProc, Api]:
    srv = provider_server(home, toml, plugins="gpulayer_ssh").start()
    servers.append(srv)
    return srv, Api(srv.url, srv.admin_token)


def submit(api: Api, spec: dict[str, Any]) -> str:
    r = api("POST", "/v1/jobs", json={"spec": spec})
    assert r.status_code == 201, r.text
    return str(r.json()["id"])


def gl(srv: ServerProc, *args: str) -> str:
    out = cli("--url", srv.url, "--token", srv.admin_token, *args, env=base_env(srv.home))
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_a_cloud_job_runs_on_a_worker_started_over_ssh_which_is_stopped_when_idle(
        local_sshd: LocalSshd, servers: list[ServerProc], tmp_path: Path) -> None:
    remote = tmp_path / "remote"
    srv, api = start(servers, tmp_path / "srv", pool_section(local_sshd, remote))

    listed = gl(srv, "providers", "list")
    assert "pool" in listed and "ssh" in listed
    offers = json.loads(gl(srv, "providers", "offers", "--accelerator", "cuda", "--gpus", "1", "--json"))
    assert [(o["provider"], o["shape"], o["price_per_hour"], o["availability"]) for o in offers] == [
        ("pool", "local", None, "available")]

    job_id = submit(api, CUDA_JOB)
    job = wait_job(api, job_id, timeout=180)
    assert job["state"] == "succeeded", job
    # (the worker may join, and a short job end, before the launch's answer is stored: the
    # host's script waits to see that the worker did not exit at once)
    [m] = until(lambda: [x for x in api("GET", "/v1/machines").json() if x["provider_id"]], 60, "the launch's answer")
    assert (m["provider"], m["shape"], m["job_id"]) == ("pool", "local", job_id)
    logs = "".join(c["data"] for c in api("GET", f"/v1/jobs/{job_id}/logs").json())
    assert logs == f"on 0\nmachine {m['id']}\n"
    worker = next(w for w in api("GET", "/v1/workers").json() if w["id"] == m["worker_id"])
    assert (worker["origin"], worker["name"]) == ("provider", m["id"])
    assert m["provider_id"].startswith("local:")
    shown = gl(srv, "jobs", "show", job_id)
    assert f"pool/local: launched {m['id']} (" in shown and f"joined as {m['worker_id']}" in shown

    # idle for 3 s: stopped over SSH, terminated in the machine table, nothing left on the host
    ended = until(lambda: [x for x in api("GET", "/v1/machines").json() if x["state"] == "terminated"], 90,
                  "the idle machine's end")[0]
    assert ended["reason"] == "idle for 3 s"
    assert m["id"] not in gl(srv, "machines", "list")  # ended: hidden
    assert "terminated" in gl(srv, "machines", "list", "--all")
    table = json.loads(gl(srv, "machines", "list", "--all", "--json"))
    assert [(x["id"], x["state"]) for x in table] == [(m["id"], "terminated")]
    until(lambda: not our_processes(remote), 30, "every process of the machine to end")
    assert not (remote / "machines" / m["id"]).exists()
    assert (remote / "logs" / f"{m['id']}.log").exists()
    # the bootstrap token was spent by the join
    assert [t["uses_left"] for t in api("GET", "/v1/tokens").json() if t["scope"] == "bootstrap"] == [0]


def two_host_section(sshd: LocalSshd, remote: Path, remote2: Path) -> str:
    first = sshd.host_config(remote)
    second = {**sshd.host_config(remote2), "name": "local2"}
    for entry in (first, second):
        entry["environment"] = {**entry["environment"], **fake_devices_env("cuda:1:80:9.0")}
    return "\n".join(["[pool]", 'type = "ssh"', "max_machines = 1", 'idle_timeout = "300s"',
                      'join_timeout = "90s"', "connect_timeout = 5", "stop_grace = 10",
                      f"hosts = [{toml_value(first)}, {toml_value(second)}]", ""])


def test_a_distributed_cloud_job_gets_a_machine_on_each_of_two_hosts(
        local_sshd: LocalSshd, servers: list[ServerProc], tmp_path: Path) -> None:
    """A gang took all its machines from one offer, and a host offers one machine: a two-node
    job launched one, failed the other (no capacity), ended the first, and began again five
    minutes later, for ever."""
    remote, remote2 = tmp_path / "remote", tmp_path / "remote" / "second-host"
    section = two_host_section(local_sshd, remote, remote2).replace("max_machines = 1", "max_machines = 2")
    _, api = start(servers, tmp_path / "srv", section)
    job = submit(api, {"kind": "distributed", "entry": "platform", "nodes": 2, "nproc_per_node": 1,
                       "requirements": {"accelerator": "cuda", "gpus": 1}, "placement": {"target": "cloud"}})
    done = wait_job(api, job, timeout=240)
    assert done["state"] == "succeeded", done
    ms = api("GET", "/v1/machines").json()
    assert sorted(m["shape"] for m in ms) == ["local", "local2"], ms  # no machine failed on the way
    assert sorted(t["node_rank"] for t in done["tasks"]) == [0, 1]
    assert len({t["worker_id"] for t in done["tasks"]}) == 2


def test_a_restarted_server_keeps_its_machine_and_stops_an_orphan_found_over_ssh(
        local_sshd: LocalSshd, servers: list[ServerProc], tmp_path: Path) -> None:
    from gpulayer_ssh import SshPoolConfig
    from gpulayer_ssh.provider import SshProvider

    remote, remote2 = tmp_path / "remote", tmp_path / "remote" / "second-host"
    srv, api = start(servers, tmp_path / "srv", two_host_section(local_sshd, remote, remote2))
    assert wait_job(api, submit(api, CUDA_JOB), timeout=180)["state"] == "succeeded"
    # (the launch's answer, and the host's marker, may come after a short job ended)
    [m] = until(lambda: [x for x in api("GET", "/v1/machines").json() if x["provider_id"]], 60, "the launch's answer")
    [worker_proc] = our_processes(remote / "machines")
    srv.kill()  # the machine lives on

    # on the other host, a process carrying this server's label that no record knows: an orphan
    hosts = {"local": remote, "local2": remote2}
    used = next(name for name, folder in hosts.items() if (folder / "machines" / m["id"]).exists())
    free = "local2" if used == "local" else "local"
    label = json.loads((hosts[used] / "machines" / m["id"] / "marker.json").read_text())["label"]
    pool = SshProvider("pool", SshPoolConfig.model_validate(
        {"hosts": [local_sshd.host_config(remote), {**local_sshd.host_config(remote2), "name": "local2"}]}))
    host = pool.hosts[free]
    answer = pool.call(host, {"op": "launch", "machine_id": "m-orphan000001", "label": label,
                              "argv": [host.python, "-c", "import time; time.sleep(600)"], "worker_env": {}})
    orphan = psutil.Process(int(answer["pid"]))

    srv.start()
    until(lambda: not orphan.is_running() or orphan.status() == psutil.STATUS_ZOMBIE, 90,
          "the orphan to be terminated over SSH")
    # its marker goes right after its process
    until(lambda: not (hosts[free] / "machines" / "m-orphan000001").exists(), 30, "the orphan's marker to go")
    assert worker_proc.is_running() and worker_proc.status() != psutil.STATUS_ZOMBIE  # the recorded one is kept
    api = Api(srv.url, srv.admin_token)
    [again] = api("GET", "/v1/machines").json()
    assert again["id"] == m["id"] and again["state"] in ("idle", "busy")

    # machines terminate: stopped over SSH at once
    assert m["id"] in gl(srv, "machines", "terminate", m["id"])
    until(lambda: not our_processes(remote), 60, "the terminated machine's processes to end")
    until(lambda: [x["state"] for x in api("GET", "/v1/machines").json()] == ["terminated"], 30,
          "the machine to be terminated")


def test_a_pool_whose_key_is_refused_is_disabled_naming_the_host(
        local_sshd: LocalSshd, servers: list[ServerProc], tmp_path: Path) -> None:
    import subprocess

    wrong = tmp_path / "wrong_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(wrong)], check=True, timeout=30)
    srv, api = start(servers, tmp_path / "srv", pool_section(local_sshd, tmp_path / "remote", key_file=str(wrong)))
    [p] = [x for x in api("GET", "/v1/providers").json() if x["configured"]]  # installed adapters follow
    assert p["credentials_ok"] is False
    assert "ssh host 'local'" in p["disabled"] and "authentication failed" in p["disabled"]
    assert "ssh host 'local'" in gl(srv, "providers", "list")


def test_two_cloud_jobs_at_once_get_a_host_each(local_sshd: LocalSshd, servers: list[ServerProc], tmp_path: Path) -> None:
    """One machine per host (each offer's capacity is 1): both jobs run, on different hosts.
    (A launch on a host that runs one anyway, started meanwhile by someone else, answers
    NoCapacity and the job fails over to the other host in the same pass.)"""
    remote, remote2 = tmp_path / "remote", tmp_path / "remote" / "second-host"
    section = two_host_section(local_sshd, remote, remote2).replace("max_machines = 1", "max_machines = 2")
    _, api = start(servers, tmp_path / "srv", section)
    slow = {**CUDA_JOB, "command": ["sh", "-c", "sleep 2; echo $GPULAYER_MACHINE_ID"]}
    jobs = [submit(api, slow), submit(api, slow)]
    done = [wait_job(api, j, timeout=180) for j in jobs]
    assert [j["state"] for j in done] == ["succeeded", "succeeded"], done
    ms = api("GET", "/v1/machines").json()
    assert sorted(m["shape"] for m in ms if m["state"] != "failed") == ["local", "local2"]
    for m in ms:
        if m["state"] == "failed":
            assert m["reason"].startswith("no capacity (ssh host") and "already runs machine" in m["reason"]
    # a job may run on the machine launched for the other one: any free worker takes it
    logs = sorted("".join(c["data"] for c in api("GET", f"/v1/jobs/{j}/logs").json()) for j in jobs)
    assert logs == sorted(f"{m['id']}\n" for m in ms if m["state"] != "failed")


def test_machines_terminate_says_why_a_machine_is_still_terminating(
        local_sshd: LocalSshd, servers: list[ServerProc], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A host whose key changed while its machine ran: the terminate fails (the provider is
    disabled), and gpulayer machines terminate, after its wait, exits 1 saying why instead of
    printing 'terminating (terminated by an admin ...)' with exit 0. Once known_hosts is
    right again, the command run again has the server try at once, and the machine ends."""
    import shutil
    import subprocess

    from typer.testing import CliRunner

    from gpulayer.cli import app, machines

    remote = tmp_path / "remote"
    known = tmp_path / "known_hosts"
    shutil.copy(local_sshd.known_hosts, known)
    srv, api = start(servers, tmp_path / "srv", pool_section(local_sshd, remote, idle="10m", known_hosts=str(known)))
    assert wait_job(api, submit(api, CUDA_JOB), timeout=180)["state"] == "succeeded"
    [m] = api("GET", "/v1/machines").json()
    other = tmp_path / "other_host_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other)], check=True, timeout=30)
    good = known.read_text()
    known.write_text(f"[{local_sshd.host}]:{local_sshd.port} {' '.join(other.with_suffix('.pub').read_text().split()[:2])}\n")

    monkeypatch.setattr(machines, "TERMINATE_WAIT", 3.0)
    result = CliRunner().invoke(app, ["--url", srv.url, "--token", srv.admin_token, "machines", "terminate", m["id"]],
                                env=base_env(srv.home))
    assert result.exit_code == 1, result.output
    assert result.stdout.startswith(f"{m['id']} terminating (terminated by an admin")
    assert f"error: {m['id']} is still terminating after 3 s: provider 'pool': " in result.stderr
    assert "the host key is not the one in" in result.stderr
    assert our_processes(remote)  # still running: nothing was stopped

    # known_hosts right again: the command run again has the server try at once (its next try
    # on its own comes 30 s after the failed one) and ends with the machine terminated
    known.write_text(good)
    monkeypatch.setattr(machines, "TERMINATE_WAIT", 60.0)
    again = CliRunner().invoke(app, ["--url", srv.url, "--token", srv.admin_token, "machines", "terminate", m["id"]],
                               env=base_env(srv.home))
    assert again.exit_code == 0, again.output
    assert again.stdout.startswith(f"{m['id']} terminated (terminated by an admin"), again.output
    assert [x["state"] for x in api("GET", "/v1/machines").json()] == ["terminated"]
    until(lambda: not our_processes(remote), 30, "the machine's processes to end")
