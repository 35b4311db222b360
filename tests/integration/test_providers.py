"""The cloud target end to end: a real ``gpulayer server start --providers FILE`` whose provider
(:mod:`gpulayer.testprovider`) boots real local ``gpulayer worker start`` processes."""

from __future__ import annotations

import atexit
import functools
import json
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests.server_support import Api, ServerProc, base_env, provider_server, until, wait_job
from tests.support import cli, first_detection, seed_probe_cache

pytestmark = pytest.mark.timeout(300)

WORKER_ENV = 'env = { GPULAYER_HEARTBEAT_INTERVAL = "0.3" }'


@functools.cache
def machine_image() -> Path:
    """What each machine's home starts as a copy of (``home_template``): the framework
    probes' cache of a first detection in this test process (tests.support.first_detection),
    as an image that ran GPUlayer once holds it; the machines' workers do not probe again."""
    image = Path(tempfile.mkdtemp(prefix="gpulayer-tests-image-"))
    atexit.register(shutil.rmtree, image, True)
    seed_probe_cache(image, first_detection())
    return image


def section(name: str = "local", *, shapes: str, max_machines: int = 2, idle: str = "3s", join: str = "60s",
            extra: str = "", state_dir: Path | None = None) -> str:
    lines = [f"[{name}]", 'type = "local-process"', f"max_machines = {max_machines}",
             f'idle_timeout = "{idle}"', f'join_timeout = "{join}"', WORKER_ENV,
             f'home_template = "{machine_image()}"']
    if state_dir is not None:
        lines.append(f'state_dir = "{state_dir}"')
    return "\n".join([*lines, extra, shapes]) + "\n"


def shape(provider: str, name: str, *, region: str = "here", devices: str = "cuda:1:80:9.0",
          price: float | None = 1.0, extra: str = "") -> str:
    price_line = f"price_per_hour = {price}" if price is not None else ""
    return (f'[[{provider}.shapes]]\nname = "{name}"\nregion = "{region}"\ndevices = "{devices}"\n'
            f"{price_line}\n{extra}\n")


CUDA_JOB = {"kind": "command", "command": ["sh", "-c", "echo on $CUDA_VISIBLE_DEVICES"],
            "requirements": {"accelerator": "cuda", "gpus": 1}, "placement": {"target": "cloud"}}


@pytest.fixture
def servers(tmp_path: Path) -> Iterator[list[ServerProc]]:
    started: list[ServerProc] = []
    yield started
    for srv in started:
        srv.stop()
    # nothing a test's machines started may outlive it
    for p in psutil.process_iter(["cmdline", "environ"]):
        try:
            if str(tmp_path) in " ".join(p.info["cmdline"] or []) or str(tmp_path) in (p.info["environ"] or {}).get(
                    "GPULAYER_HOME", ""):
                p.kill()
        except (psutil.Error, TypeError):
            continue


def start(servers: list[ServerProc], home: Path, toml: str, **kw: Any) -> tuple[ServerProc, Api]:
    srv = provider_server(home, toml, **kw).start()
    servers.append(srv)
    return srv, Api(srv.url, srv.admin_token)


def submit(api: Api, spec: dict[str, Any]) -> str:
    r = api("POST", "/v1/jobs", json={"spec": spec})
    assert r.status_code == 201, r.text
    return str(r.json()["id"])


def machines(api: Api) -> list[dict[str, Any]]:
    return list(api("GET", "/v1/machines").json())


def show(srv: ServerProc, job_id: str) -> str:
    out = cli("--url", srv.url, "--token", srv.admin_token, "jobs", "show", job_id, env=base_env(srv.home))
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_a_cloud_job_boots_a_machine_runs_on_it_and_the_idle_machine_is_terminated(
        servers: list[ServerProc], tmp_path: Path) -> None:
    srv, api = start(servers, tmp_path / "srv", section(shapes=shape("local", "gpu1", price=1.5)))
    job_id = submit(api, CUDA_JOB)
    job = wait_job(api, job_id)
    assert job["state"] == "succeeded", job
    assert [c["data"] for c in api("GET", f"/v1/jobs/{job_id}/logs").json()] == ["on 0\n"]
    [m] = machines(api)
    assert (m["provider"], m["shape"], m["job_id"]) == ("local", "gpu1", job_id)
    worker = api("GET", "/v1/workers").json()[0]
    assert (worker["id"], worker["origin"], worker["name"]) == (m["worker_id"], "provider", m["id"])
    assert job["tasks"][0]["worker_id"] == m["worker_id"]
    shown = show(srv, job_id)
    assert f"cloud     local/here/gpu1: launched {m['id']} (" in shown
    assert f"), joined as {m['worker_id']}" in shown
    # idle for 3 s: drained, terminated, its worker gone
    ended = until(lambda: [x for x in machines(api) if x["state"] == "terminated"], 60, "the idle machine's end")[0]
    assert ended["reason"] == "idle for 3 s" and ended["cost"] > 0
    # its home started as a copy of the image (home_template): its worker found the probes' answers there
    probes = sorted(p.name for p in (machine_image() / "cache" / "probes").iterdir())
    assert probes and sorted(p.name for p in (tmp_path / "srv" / "local-machines" / m["id"] / "cache" / "probes")
                             .iterdir()) == probes
    assert not any(w["online"] for w in api("GET", "/v1/workers").json())
    pid = int(ended["provider_id"].removeprefix("local-"))
    until(lambda: not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE, 30,
          "the machine's worker process to end")
    # its bootstrap token was spent by the join: it cannot join again
    tokens = [t for t in api("GET", "/v1/tokens").json() if t["scope"] == "bootstrap"]
    assert [t["uses_left"] for t in tokens] == [0]


def test_the_bootstrap_token_is_never_in_argv(servers: list[ServerProc], tmp_path: Path) -> None:
    toml = section(shapes=shape("local", "gpu1"), idle="60s", state_dir=tmp_path / "machines")
    _, api = start(servers, tmp_path / "srv", toml)
    wait_job(api, submit(api, CUDA_JOB))
    [m] = machines(api)
    proc = psutil.Process(int(m["provider_id"].removeprefix("local-")))
    argv = proc.cmdline()
    assert argv[-6:] == ["--name", m["id"], "--cpu-slots", "2", "--grace", "2"]
    assert not any(a.startswith("glt_") for a in argv)
    assert proc.environ()["GPULAYER_MACHINE_ID"] == m["id"]
    assert proc.environ()["GPULAYER_TOKEN"].startswith("glt_")  # the bootstrap token, by environment


def test_a_quota_error_fails_over_to_the_next_offer_and_jobs_show_reads_both(
        servers: list[ServerProc], tmp_path: Path) -> None:
    shapes = (shape("local", "p5", region="us-east-1", price=1.0, extra='fail = "quota"')
              + shape("local", "p5", region="us-west-2", price=2.0).replace('name = "p5"', 'name = "p5-west"'))
    srv, api = start(servers, tmp_path / "srv", section(shapes=shapes))
    job_id = submit(api, CUDA_JOB)
    assert wait_job(api, job_id)["state"] == "succeeded"
    shown = show(srv, job_id)
    line = next(x for x in shown.splitlines() if x.startswith("cloud"))
    assert line.startswith("cloud     local/us-east-1/p5: quota exceeded (")
    assert " -> local/us-west-2/p5-west: launched m-" in line and ", joined as wkr-" in line
    # the quota offer's machine failed; the one that ran the job did not (by now it may be busy
    # handing back its task, idle, or, past its 3 s idle timeout, being terminated)
    by_shape = {m["shape"]: m for m in machines(api)}
    assert set(by_shape) == {"p5", "p5-west"}
    assert by_shape["p5"]["state"] == "failed"
    assert by_shape["p5-west"]["state"] in {"busy", "idle", "terminating", "terminated"}


def test_a_machine_that_does_not_join_in_time_is_terminated_and_the_next_offer_is_tried(
        servers: list[ServerProc], tmp_path: Path) -> None:
    # two sections: a worker needs a few seconds to start, more than the silent one's 4 s
    toml = (section("slow", shapes=shape("slow", "silent", price=0.5, extra="join = false"), join="4s")
            + section("fast", shapes=shape("fast", "good", price=0.9)))
    srv, api = start(servers, tmp_path / "srv", toml)
    job_id = submit(api, CUDA_JOB)
    assert wait_job(api, job_id, 120)["state"] == "succeeded"
    by_shape = {m["shape"]: m for m in machines(api)}
    assert by_shape["silent"]["state"] == "failed"
    assert by_shape["silent"]["reason"] == "did not join within 4 s"
    pid = int(by_shape["silent"]["provider_id"].removeprefix("local-"))
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    line = next(x for x in show(srv, job_id).splitlines() if x.startswith("cloud"))
    assert f"slow/here/silent: launched {by_shape['silent']['id']}" in line
    assert f"{by_shape['silent']['id']} did not join within 4 s; terminated -> fast/here/good: launched" in line


def test_caps_are_respected(servers: list[ServerProc], tmp_path: Path) -> None:
    toml = section(shapes=shape("local", "cpu", devices="", price=0.1), max_machines=2, idle="60s",
                   extra="start_workers = false")
    _, api = start(servers, tmp_path / "srv", toml)
    jobs = [submit(api, {"kind": "command", "command": ["true"], "placement": {"target": "cloud"}})
            for _ in range(5)]
    until(lambda: len(machines(api)) >= 2, 30, "two machines")
    # several passes later there are still two: the cap holds with five jobs waiting
    for _ in range(3):
        until(lambda: api("GET", "/v1/providers").json()[0]["machines_running"] == 2, 10, "the count")
    assert len(machines(api)) == 2
    assert all(api("GET", f"/v1/jobs/{j}").json()["state"] == "queued" for j in jobs)


def test_restart_reconciliation_terminates_orphans(servers: list[ServerProc], tmp_path: Path) -> None:
    toml = section(shapes=shape("local", "gpu1"), idle="300s", state_dir=tmp_path / "machines")
    srv, api = start(servers, tmp_path / "srv", toml)
    wait_job(api, submit(api, CUDA_JOB))
    [m] = machines(api)
    pid = int(m["provider_id"].removeprefix("local-"))
    srv.kill()  # the machine lives on
    # a machine nobody recorded, with this server's label: an orphan
    meta = json.loads((tmp_path / "machines" / m["id"] / "machine.json").read_text())
    orphan = tmp_path / "machines" / "m-orphan000001"
    orphan.mkdir()
    sleeper = psutil.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True)
    (orphan / "machine.json").write_text(json.dumps({"machine_id": "m-orphan000001", "label": meta["label"],
                                                     "pid": sleeper.pid, "provider_id": f"local-{sleeper.pid}"}))
    srv.start()
    until(lambda: sleeper.poll() is not None, 60, "the orphan to be terminated")
    assert psutil.Process(pid).status() != psutil.STATUS_ZOMBIE  # the recorded machine is kept
    [again] = machines(api := Api(srv.url, srv.admin_token))
    assert again["id"] == m["id"] and again["state"] in ("idle", "busy")


def test_a_provider_whose_credentials_fail_is_disabled_with_the_reason(servers: list[ServerProc],
                                                                       tmp_path: Path) -> None:
    toml = section(shapes=shape("local", "gpu1"), extra="auth_fails = true")
    srv, api = start(servers, tmp_path / "srv", toml)
    [p] = [x for x in api("GET", "/v1/providers").json() if x["configured"]]  # installed adapters follow
    assert p["credentials_ok"] is False
    assert p["disabled"] == "credentials failed: local: the test credentials are refused (auth_fails = true)"
    out = cli("--url", srv.url, "--token", srv.admin_token, "providers", "list", env=base_env(srv.home))
    assert "failed" in out.stdout and "credentials failed: local: the test credentials are refused" in out.stdout
    # a cloud job cannot be placed: no provider offers a machine
    job = api("GET", f"/v1/jobs/{submit(api, CUDA_JOB)}").json()
    assert job["state"] == "unschedulable"
    assert "cloud: no cloud worker registered and no provider offered a machine" in job["error"]["message"]


@pytest.mark.parametrize(("toml", "message"), [
    ('[a]\ntype = "nope"\n', "providers.toml: [a] type: 'nope' is not an installed provider adapter; installed: "),
    ('[a]\ntype = "local-process"\nmax_machines = "many"\n',
     "providers.toml: [a] max_machines: expected a whole number >= 0, got 'many'"),
    ('[a]\ntype = "local-process"\nidle_timeout = "soon"\n',
     "providers.toml: [a] idle_timeout: expected seconds > 0 or a duration such as 90s, 15m, 1h; got 'soon'"),
    ('[a]\ntype = "local-process"\nshapes = [{ name = "x", cpus = 0 }]\n',
     "providers.toml: [a] shapes.0.cpus: expected a number >= 1, got 0"),
    ('[a]\ntype = "local-process"\nhome_template = "/no/such/folder"\n',
     "providers.toml: [a] home_template: Path does not point to a directory, got '/no/such/folder'"),
    ('[a]\ntype = "local-process"\ncolour = "red"\n',
     "providers.toml: [a] colour: not a setting of local-process providers; accepted: "),
    ("[a\n", "providers.toml: not valid TOML: "),
])
def test_a_bad_providers_file_stops_the_server_naming_file_section_and_key(tmp_path: Path, toml: str,
                                                                           message: str) -> None:
    path = tmp_path / "providers.toml"
    path.write_text(toml)
    out = cli("server", "start", "--port", "0", "--providers", str(path),
              env=base_env(tmp_path / "home", GPULAYER_PLUGINS="gpulayer.testprovider"), timeout=60)
    assert out.returncode == 2, out.stderr
    assert f"error: {path.parent}/{message}" in out.stderr


def test_an_embedded_cloud_job_fails_at_once_saying_how_to_start_a_server(tmp_path: Path) -> None:
    out = cli("submit", "--target", "cloud", "--", "true", env=base_env(tmp_path / "home"))
    assert out.returncode == 2
    assert "target cloud: machines that providers bring up join a control plane they can reach" in out.stderr
    assert "gpulayer server start" in out.stderr


def test_machines_terminate_ends_a_machine_at_once(servers: list[ServerProc], tmp_path: Path) -> None:
    srv, api = start(servers, tmp_path / "srv", section(shapes=shape("local", "gpu1"), idle="300s"))
    wait_job(api, submit(api, CUDA_JOB))
    # the job has ended; the machine reads idle from the next provisioning pass on (about 1 s)
    [m] = until(lambda: [x for x in machines(api) if x["state"] == "idle"], 30, "the machine to be idle")
    env = base_env(srv.home)
    listed = cli("--url", srv.url, "--token", srv.admin_token, "machines", "list", env=env)
    assert m["id"] in listed.stdout and "idle" in listed.stdout and "$" in listed.stdout
    out = cli("--url", srv.url, "--token", srv.admin_token, "machines", "terminate", m["id"], env=env)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == f"{m['id']} terminated (terminated by an admin (gpulayer machines terminate))"
    as_json = json.loads(cli("--url", srv.url, "--token", srv.admin_token, "machines", "list", "--all", "--json",
                             env=env).stdout)
    assert [x["state"] for x in as_json] == ["terminated"]


def test_a_machine_whose_worker_hangs_is_terminated_and_its_job_retried_on_a_new_machine(
        servers: list[ServerProc], tmp_path: Path) -> None:
    _, api = start(servers, tmp_path / "srv", section(shapes=shape("local", "gpu1"), idle="300s"))
    marker = tmp_path / "first-attempt"
    job_id = submit(api, {**CUDA_JOB, "retries": 1,
                          "command": ["sh", "-c", f"test -f {marker} || {{ touch {marker}; sleep 600; }}"]})
    until(lambda: marker.exists(), 90, "the first attempt to start")
    [first] = machines(api)
    worker = psutil.Process(int(first["provider_id"].removeprefix("local-")))
    worker.suspend()  # the machine hangs: no heartbeats, no answer
    job = wait_job(api, job_id, 180)
    assert job["state"] == "succeeded" and job["attempt"] == 2
    ended = until(lambda: next((m for m in machines(api) if m["id"] == first["id"] and m["state"] == "terminated"),
                               None), 60, "the hung machine's end")
    assert ended["reason"] == f"its worker {first['worker_id']} stopped sending heartbeats"
    assert not psutil.pid_exists(worker.pid) or worker.status() == psutil.STATUS_ZOMBIE
    assert len(machines(api)) == 2  # the retry booted a machine of its own


def test_providers_offers_lists_what_fits_cheapest_first(servers: list[ServerProc], tmp_path: Path) -> None:
    toml = (section("cloud", shapes=shape("cloud", "big", devices="cuda:4:80:9.0", price=8.0)
                    + shape("cloud", "small", price=1.25))
            + section("owned", shapes=shape("owned", "rack", devices="cuda:2:40:8.0", price=None)))
    srv, _ = start(servers, tmp_path / "srv", toml)
    env = base_env(srv.home)
    out = cli("--url", srv.url, "--token", srv.admin_token, "providers", "offers", "--accelerator", "cuda",
              "--gpus", "2", env=env)
    assert out.returncode == 0, out.stderr
    rows = [line.split()[:4] for line in out.stdout.splitlines()[1:]]
    assert rows == [["cloud", "big", "here", "$8.00"], ["owned", "rack", "here", "owned"]]
    bad = cli("--url", srv.url, "--token", srv.admin_token, "providers", "offers", "--gpus", "-1", env=env)
    assert bad.returncode == 2 and "--gpus" in bad.stderr
    # devices without an accelerator were ignored: every offer was listed, CPU-only ones too
    for flags in (["--gpus", "2"], ["--accelerator", "cpu", "--min-gpu-memory", "40"]):
        bad = cli("--url", srv.url, "--token", srv.admin_token, "providers", "offers", *flags, env=env)
        assert (bad.returncode, bad.stdout) == (2, ""), bad.stdout
        assert f"error: {flags[-2]} {flags[-1]}: " in bad.stderr and "--accelerator KIND" in bad.stderr
        assert "--profile" not in bad.stderr  # (offers takes none)
    listed = cli("--url", srv.url, "--token", srv.admin_token, "providers", "list", env=env).stdout
    assert [line.split()[:5] for line in listed.splitlines()[1:3]] == [
        ["cloud", "local-process", "gpulayer.testprovider", "yes", "ok"],
        ["owned", "local-process", "gpulayer.testprovider", "yes", "ok"]]


def test_providers_list_shows_installed_adapters_no_section_configures(tmp_path: Path) -> None:
    """Embedded, with a providers.toml in $GPULAYER_HOME that configures the adapter: the
    rows said 'no section in providers.toml', which was false; only a server reads it."""
    home = tmp_path / "home"
    home.mkdir()
    (home / "providers.toml").write_text(section("local", shapes=shape("local", "cpu", price=0.5)))
    env = base_env(home, GPULAYER_PLUGINS="gpulayer.testprovider")
    out = cli("providers", "list", env=env)
    assert out.returncode == 0, out.stderr
    row = next(line.split() for line in out.stdout.splitlines() if line.startswith("local-process"))
    assert row == ["local-process", "local-process", "gpulayer.testprovider", "no", "-", "-", "installed"]
    assert "no section in providers.toml" not in out.stdout
    note = "this control plane is embedded (no GPULAYER_URL): providers.toml is read, and machines brought up, only by"
    assert out.stdout.splitlines()[-1].startswith(note)
    offers = cli("providers", "offers", env=env)
    assert (offers.returncode, offers.stdout.splitlines()[0][:len(note)]) == (0, note)


def test_an_adapter_that_answers_garbage_is_named_and_the_other_providers_run_the_job(
        servers: list[ServerProc], tmp_path: Path) -> None:
    # bad: list answers dicts and launch a bare string; worse: offers answers strings
    toml = (section("bad", shapes=shape("bad", "gpu1", price=0.5),
                    extra='garbage = ["list", "launch"]\nstart_workers = false')
            + section("worse", shapes=shape("worse", "gpu1", price=0.1), extra='garbage = ["offers"]')
            + section("good", shapes=shape("good", "gpu1", price=0.9)))
    srv, api = start(servers, tmp_path / "srv", toml)
    job_id = submit(api, {**CUDA_JOB, "placement": {"target": "cloud", "prefer": ["bad", "good"]}})
    assert wait_job(api, job_id)["state"] == "succeeded"
    by_provider = {m["provider"]: m for m in machines(api)}
    assert set(by_provider) == {"bad", "good"}
    who = "provider 'bad' (plugin 'gpulayer.testprovider')"
    refused = f"{who}: launch() returned a str; accepted: a gpulayer.plugin.LaunchedMachine record"
    assert (by_provider["bad"]["state"], by_provider["bad"]["reason"]) == ("failed", f"launch failed ({refused})")
    # the machine the launch brought up before answering was terminated (by its machine id)
    assert (tmp_path / "srv" / "local-machines" / by_provider["bad"]["id"] / "machine.ended.json").is_file()
    line = next(x for x in show(srv, job_id).splitlines() if x.startswith("cloud"))
    assert line.startswith(f"cloud     bad/here/gpu1: launch failed ({refused}) -> good/here/gpu1: launched m-")
    log = srv.log()
    assert (f"{who}: list() returned a list whose item 0 is a dict; accepted: a list of gpulayer.plugin.LiveMachine "
            "records (an empty list for none); listing again in 60 s") in log
    assert ("provider 'worse' (plugin 'gpulayer.testprovider'): offers() returned a list whose item 0 is a str; "
            "accepted: a list of gpulayer.plugin.MachineOffer records (an empty list for none); asking again in 30 s"
            ) in log
    assert "provisioning pass failed" not in log and "Traceback" not in log
    listed = {p["name"]: p for p in api("GET", "/v1/providers").json()}
    assert listed["worse"]["last_error"].startswith("offers() returned a list whose item 0 is a str")
    assert listed["good"]["last_error"] is None
