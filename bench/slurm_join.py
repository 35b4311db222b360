"""Time from submit to join through the local Slurm (scripts/local-slurm.sh).

For each of ``--machines`` machines, one at a time, against a real ``gpulayer server start``
on loopback:

- the slurm adapter driven by hand: its ``launch`` (one ``sbatch`` of a pilot job carrying a
  bootstrap token), then the wait until the pilot's worker has joined;
- the whole cloud path: a server with a ``type = "slurm"`` providers.toml, a 1-GPU cloud job
  submitted, and the time until the machine's worker joined and until the job ended (the
  provisioning pass, sbatch, Slurm's scheduling, the worker's start and join, placement).

Next to them, the floors measured in the same run: ``sbatch --wrap`` of a job that only
prints the time it started (Slurm's own submit-to-start), and a worker joining when started
directly.

    scripts/local-slurm.sh start
    python bench/slurm_join.py [--machines 5]

Prints a table: median and p95 in seconds.
"""

from __future__ import annotations

import argparse
import os
import secrets
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "plugins")]

SLURM_CONF = os.environ.get("SLURM_CONF", "/tmp/gpulayer-slurm/slurm.conf")
FAKE_CUDA = {"GPULAYER_PLUGINS": "gpulayer.fakes", "GPULAYER_FAKE_DEVICES": "cuda:1", "GPULAYER_DETECTORS": "none"}


def pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]


def wait(predicate: object, timeout: float, what: str) -> object:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()  # type: ignore[operator]
        if value:
            return value
        time.sleep(0.05)
    raise SystemExit(f"timed out waiting for {what}")


def slurm_floor(n: int, logs: Path) -> list[float]:
    env = {**os.environ, "SLURM_CONF": SLURM_CONF}
    out = []
    for i in range(n):
        stamp = logs / f"floor-{i}.out"
        t0 = time.time()
        job = subprocess.run(["sbatch", "--parsable", "--mem=64M", f"--output={stamp}", "--wrap",
                              'python3 -c "import time; print(repr(time.time()))"'],
                             env=env, capture_output=True, text=True, check=True, timeout=30).stdout.strip()
        text = wait(lambda s=stamp: s.exists() and s.read_text().strip(), 60, f"floor job {job}")
        out.append(float(str(text)) - t0)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--machines", type=int, default=5, help="pilot jobs, one at a time (default 5)")
    args = parser.parse_args()

    from gpulayer_slurm import SlurmConfig, SlurmProvider
    from pydantic import SecretStr

    from gpulayer import plugin
    from tests.server_support import Api, ServerProc, provider_server, start_remote_worker, stop_proc, wait_job

    home = Path(tempfile.mkdtemp(prefix="gpulayer-bench-slurm-"))
    server = ServerProc(home / "server").start()
    api = Api(server.url, server.admin_token)
    provider = SlurmProvider("slurm", SlurmConfig(
        slurm_conf=SLURM_CONF, python=sys.executable, memory_gb=0.25, log_dir=str(home),
        env={**FAKE_CUDA, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "plugins")])}))
    offer = next(o for o in provider.offers(plugin.Requirements(accelerator="cuda")) if o.region == "gpu")
    label = f"bench-{secrets.token_hex(3)}"

    def joined(name: str) -> bool:
        return any(w["name"] == name and w["online"] for w in api("GET", "/v1/workers").json())

    sbatch, join = [], []
    try:
        for _ in range(args.machines):
            machine = f"m-{secrets.token_hex(4)}"
            token = api.token_for("bootstrap")["token"]
            request = plugin.LaunchRequest(machine_id=machine, label=label, offer=offer, control_url=server.url,
                                           bootstrap_token=SecretStr(token), join_deadline=time.time() + 120)
            t0 = time.perf_counter()
            launched = provider.launch(request)
            sbatch.append(time.perf_counter() - t0)
            wait(lambda m=machine: joined(m), 120, f"{machine} to join")
            join.append(time.perf_counter() - t0)
            provider.terminate(machine, launched.provider_id)
            wait(lambda m=machine: not joined(m), 60, f"{machine} to leave")
        direct = []
        # one GPULAYER_HOME for all, and a first start not counted: the pilots' workers find
        # their probe cache warm in ~/.gpulayer too
        for i in range(args.machines + 1):
            name = f"direct-{i}"
            t0 = time.perf_counter()
            proc = start_remote_worker(server.url, api.token_for("join")["token"], home / "direct", name=name,
                                       env=FAKE_CUDA)
            wait(lambda n=name: joined(n), 120, f"{name} to join")
            if i:
                direct.append(time.perf_counter() - t0)
            stop_proc(proc)
        floor = slurm_floor(args.machines, home)
    finally:
        for m in provider.list(label):
            provider.terminate(m.machine_id, m.provider_id)
        server.stop()
    cloud_join, cloud_done = cloud_path(args.machines, home, provider_server, Api, wait_job)
    report(args.machines, sbatch, join, cloud_join, cloud_done, floor, direct)


def cloud_path(n: int, home: Path, provider_server: Any, api_type: Any, wait_job: Any) -> tuple[list[float], list[float]]:
    """Submit a 1-GPU cloud job to a server whose provider is the local Slurm; n times."""
    env = {**FAKE_CUDA, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "plugins")])}
    toml = "\n".join([
        "[slurm]", 'type = "slurm"', 'partitions = ["gpu"]', 'idle_timeout = "2s"',
        f'slurm_conf = "{SLURM_CONF}"', f'python = "{sys.executable}"', f'log_dir = "{home}"',
        "env = { " + ", ".join(f'{k} = "{v}"' for k, v in env.items()) + " }", ""])
    srv = provider_server(home / "cloud", toml, plugins="gpulayer_slurm").start()
    api = api_type(srv.url, srv.admin_token)
    joined, done = [], []
    spec = {"kind": "command", "command": ["true"], "requirements": {"accelerator": "cuda", "gpus": 1},
            "placement": {"target": "cloud"}}
    try:
        for _ in range(n):
            t0 = time.time()
            job_id = api("POST", "/v1/jobs", json={"spec": spec}).json()["id"]
            job = wait_job(api, job_id, 180)
            t_done = time.time()
            if job["state"] != "succeeded":
                raise SystemExit(f"cloud job {job_id} ended {job['state']}: {job.get('error')}")
            worker = next(w for w in api("GET", "/v1/workers").json() if w["id"] == job["tasks"][0]["worker_id"])
            joined.append(worker["registered_at"] - t0)
            done.append(t_done - t0)
            # wait for the idle machine's end, so the next job boots a machine of its own
            wait(lambda: all(m["state"] in ("terminated", "failed") for m in api("GET", "/v1/machines").json()),
                 120, "the idle machine to be terminated")
    finally:
        ids = {m["provider_id"] for m in api("GET", "/v1/machines").json() if m.get("provider_id")}
        srv.stop()
        subprocess.run(["scancel", *ids], env={**os.environ, "SLURM_CONF": SLURM_CONF}, capture_output=True,
                       check=False, timeout=30)
    return joined, done


def report(n: int, sbatch: list[float], join: list[float], cloud_join: list[float], cloud_done: list[float],
           floor: list[float], direct: list[float]) -> None:
    print(f"local single-node Slurm ({SLURM_CONF}), server on loopback; {n} machines, one at a time")
    print(f"{'measure':<52}{'median':>9}{'p95':>9}")
    for name, values in [("adapter launch (sbatch --parsable returns)", sbatch),
                         ("adapter launch -> worker joined (pilot job)", join),
                         ("cloud job submitted -> its machine's worker joined", cloud_join),
                         ("cloud job submitted -> job ended", cloud_done),
                         ("floor: sbatch --wrap -> job started", floor),
                         ("floor: worker started directly -> joined", direct)]:
        print(f"{name:<52}{statistics.median(values):>8.2f}s{pct(values, 95):>8.2f}s")


if __name__ == "__main__":
    main()
