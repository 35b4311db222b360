"""Distributed jobs end to end: real workers (``gpulayer worker start`` subprocesses) on the
embedded control plane, real torchrun, gloo on the CPU.

Two workers with one CPU slot each are started once for the module (a third joins for the
killed-worker test); every job is placed on two of them as one gang. The workers also
report two fake CUDA GPUs (:mod:`gpulayer.fakes`), to check that each node of a GPU gang
sees only its granted device, and an Apple GPU (``GPULAYER_MPS_FORCE=1``: the bundled mps
detector, platform check skipped), whose detector says ``distributed=unsupported``, for the
refusal test. CPU jobs never touch either; the collectives always run on gloo on the CPU.
"""

from __future__ import annotations

import io
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

import gpulayer as gl
from gpulayer import client as _client
from gpulayer import plugins
from gpulayer.errors import JobFailed, Unschedulable
from gpulayer.fakes import fake_devices_env
from gpulayer.records import JobState, TaskState
from gpulayer.specs import DistributedJob
from tests.server_support import stop_proc
from tests.support import cli, first_detection, seed_probe_cache, wait_for

pytestmark = pytest.mark.timeout(240)

ALLREDUCE = """\
import json, os, sys, time

if "--stall-first-attempt" in sys.argv and os.environ["GPULAYER_ATTEMPT"] == "1":
    print(json.dumps({"stalling": int(os.environ["RANK"])}), flush=True)
    time.sleep(120)
    sys.exit(0)

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
t = torch.tensor([float(rank + 1)])
dist.all_reduce(t)
print(json.dumps({"rank": rank, "world_size": world, "sum": t.item(),
                  "local_rank": int(os.environ["LOCAL_RANK"]),
                  "node": int(os.environ["GPULAYER_NODE_RANK"]),
                  "attempt": int(os.environ["GPULAYER_ATTEMPT"]),
                  "rdzv": os.environ.get("GPULAYER_RDZV_ID"),
                  "visible": os.environ.get("CUDA_VISIBLE_DEVICES")}), flush=True)
dist.destroy_process_group()
"""

FAIL_ONE_RANK = """\
import os, sys, time

rank = int(os.environ["RANK"])
if rank == int(sys.argv[1]):
    print(f"rank {rank} failing", flush=True)
    sys.exit(3)
print(f"rank {rank} waiting", flush=True)
time.sleep(120)
"""

OPS = """\
import json, os


def allreduce_main(tag):
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    t = torch.tensor([float(dist.get_rank() + 1)])
    dist.all_reduce(t)
    print(json.dumps({"tag": tag, "rank": dist.get_rank(), "world_size": dist.get_world_size(),
                      "sum": t.item()}), flush=True)
    dist.destroy_process_group()
"""

RANK_LINE = re.compile(r"^(?:\[node (\d+)\] )?(?:\[rank(\d+)\]:)?(\{.*\})\s*$")


def rank_lines(text: str) -> list[dict[str, Any]]:
    """The JSON lines the scripts print, with the node/rank prefixes they were shown with."""
    out = []
    for line in text.splitlines():
        m = RANK_LINE.match(line)
        if m:
            data = json.loads(m.group(3))
            data["_node_prefix"] = None if m.group(1) is None else int(m.group(1))
            data["_rank_prefix"] = None if m.group(2) is None else int(m.group(2))
            out.append(data)
    return out


def write_project(project: Path) -> Path:
    """The source bundle the jobs run: the scripts above and a package for function entries."""
    (project / "trainlib").mkdir(parents=True)
    (project / "allreduce.py").write_text(ALLREDUCE)
    (project / "leave_rank.py").write_text(
        "import os\nrank = os.environ['RANK']\n"
        "open(os.path.join(os.environ['GPULAYER_ARTIFACTS_DIR'], f'rank-{rank}.txt'), 'w').write(rank)\n")
    (project / "fail_one_rank.py").write_text(FAIL_ONE_RANK)
    (project / "trainlib" / "__init__.py").write_text("")
    (project / "trainlib" / "ops.py").write_text(OPS)
    return project


class Cluster:
    """Worker subprocesses sharing one GPULAYER_HOME."""

    def __init__(self, home: Path, project: Path) -> None:
        self.home = home
        self.project = project
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    def add_worker(self, name: str) -> subprocess.Popen[bytes]:
        log = open(self.home / f"{name}.log", "wb")
        proc = subprocess.Popen(
            [sys.executable, "-m", "gpulayer.cli", "worker", "start", "--cpu-slots", "1",
             "--name", name, "--grace", "1"],
            stdout=log, stderr=subprocess.STDOUT, env=dict(os.environ), start_new_session=True,
        )
        log.close()
        self.procs[name] = proc
        return proc

    def live_workers(self) -> dict[str, Any]:
        """name -> WorkerRecord of the online workers this cluster started."""
        pids = {p.pid: n for n, p in self.procs.items() if p.poll() is None}
        return {pids[w.pid]: w for w in gl.connect().api.list_workers()
                if w.online and not w.draining and w.pid in pids}

    def wait_online(self, n: int, timeout: float = 90) -> dict[str, Any]:
        def ready() -> dict[str, Any] | None:
            for name, p in self.procs.items():
                if p.poll() is not None:
                    raise AssertionError(f"worker {name} exited {p.returncode}:\n"
                                         + (self.home / f"{name}.log").read_text())
            live = self.live_workers()
            return live if len(live) >= n else None

        return wait_for(ready, timeout, f"{n} workers online")  # type: ignore[no-any-return]

    def stop_all(self) -> None:
        for p in self.procs.values():
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in self.procs.values():
            try:
                p.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait(10)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    root = tmp_path_factory.mktemp("distributed")
    home = root / "home"
    home.mkdir()
    seed_probe_cache(home, first_detection())  # (its two workers start together: both would probe)
    kfd = root / "no-kfd"
    kfd.mkdir()
    project = write_project(root / "project")

    mp = pytest.MonkeyPatch()
    for name in ("GPULAYER_URL", "GPULAYER_TOKEN", "GPULAYER_DISABLE_PLUGINS", "GPULAYER_PLUGINS",
                 "GPULAYER_FAKE_DEVICES", "GPULAYER_DATABASE_URL", "RANK", "WORLD_SIZE",
                 "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        mp.delenv(name, raising=False)
    mp.setenv("GPULAYER_HOME", str(home))
    tmp = root / "tmp"  # torchrun's per-rank log files land here, not in the system's /tmp
    tmp.mkdir()
    mp.setenv("TMPDIR", str(tmp))
    mp.setenv("GPULAYER_CUDA_NO_NVML", "1")
    mp.setenv("GPULAYER_KFD_ROOT", str(kfd))
    mp.setenv("GPULAYER_MPS_FORCE", "1")
    for key, value in fake_devices_env("cuda:2:80:9.0").items():
        mp.setenv(key, value)
    mp.setenv("GPULAYER_HEARTBEAT_INTERVAL", "0.2")
    # (a worker silent this long is lost: a gang importing torch on two busy cores can hold one
    # back for seconds; a killed local worker is found by its pid, well before)
    mp.setenv("GPULAYER_HEARTBEAT_TIMEOUT", "10")
    _client.reset()
    plugins.reset_manager()
    c = Cluster(home, project)
    try:
        c.add_worker("w0")
        c.add_worker("w1")
        c.wait_online(2)
        yield c
    finally:
        c.stop_all()
        _client.reset()
        mp.undo()
        plugins.reset_manager()


def _task_states(job: Any, attempt: int) -> dict[int, TaskState]:
    return {t.node_rank: t.state for t in job.tasks if t.attempt == attempt}


# --------------------------------------------------------------------------- the tests


def test_two_nodes_by_two_processes_all_reduce(cluster: Cluster) -> None:
    started = time.monotonic()
    h = gl.submit(DistributedJob(nodes=2, nproc_per_node=2, entry="allreduce.py",
                                 bundle=str(cluster.project), timeout=120))
    job = h.wait(120)
    logs = h.logs()
    assert job.state is JobState.SUCCEEDED, logs
    lines = rank_lines(logs)
    assert sorted(d["rank"] for d in lines) == [0, 1, 2, 3], logs
    for d in lines:
        assert d["sum"] == 10.0 and d["world_size"] == 4
        assert d["_rank_prefix"] == d["rank"]  # torchrun prefixed the line with the global rank
        assert d["node"] == d["rank"] // 2 and d["local_rank"] == d["rank"] % 2
        assert d["rdzv"] == f"{job.id}-1"
    # one task per node, on two distinct workers, sharing one rendezvous at node 0's worker
    tasks = [t for t in job.tasks if t.attempt == 1]
    assert sorted(t.node_rank for t in tasks) == [0, 1]
    assert len({t.worker_id for t in tasks}) == 2
    assert {t.rendezvous.run_id for t in tasks if t.rendezvous} == {f"{job.id}-1"}
    rank0_worker = next(t.worker_id for t in tasks if t.node_rank == 0)
    live = {w.id: w for w in cluster.live_workers().values()}
    assert tasks[0].rendezvous is not None
    assert tasks[0].rendezvous.master_addr == live[rank0_worker].capabilities.host.address

    # logs per node: the SDK and `gpulayer jobs logs --node`
    node1 = rank_lines(h.logs(node=1))
    assert sorted(d["rank"] for d in node1) == [2, 3]
    proc = cli("jobs", "logs", h.id, "--node", "1", check=True)
    assert sorted(d["rank"] for d in rank_lines(proc.stdout)) == [2, 3]
    assert "[node " not in proc.stdout
    proc = cli("jobs", "logs", h.id, check=True)
    shown = rank_lines(proc.stdout)
    assert sorted((d["_node_prefix"], d["rank"]) for d in shown) == [(0, 0), (0, 1), (1, 2), (1, 3)]
    print(f"2x2 all_reduce: {time.monotonic() - started:.1f} s")


def test_each_node_leaves_its_own_artifacts(cluster: Cluster, tmp_path: Path) -> None:
    h = gl.submit(DistributedJob(nodes=2, nproc_per_node=2, entry="leave_rank.py", bundle=str(cluster.project),
                                 timeout=120))
    assert h.wait(120).state is JobState.SUCCEEDED, h.logs()
    got = h.artifacts(tmp_path / "out")
    assert sorted(str(p.relative_to(got)) for p in got.rglob("*") if p.is_file()) == [
        "node-0/rank-0.txt", "node-0/rank-1.txt", "node-1/rank-2.txt", "node-1/rank-3.txt"]
    assert (got / "node-1" / "rank-3.txt").read_text() == "3"


def test_a_failing_rank_ends_the_group_and_fails_the_job(cluster: Cluster) -> None:
    h = gl.submit(DistributedJob(nodes=2, nproc_per_node=1, entry="fail_one_rank.py", args=["1"],
                                 bundle=str(cluster.project), timeout=120))
    job = h.wait(90)
    assert job.state is JobState.FAILED, h.logs()
    states = _task_states(job, 1)
    assert states == {0: TaskState.CANCELLED, 1: TaskState.FAILED}
    failed = next(t for t in job.tasks if t.node_rank == 1)
    assert failed.exit_code not in (None, 0)
    # the job ended because of node 1: its error (saying which node and worker) and exit
    # code, not those of node 0, which its worker ended with the group (and reported last)
    assert failed.error is not None and job.error is not None
    assert job.error.type == failed.error.type and job.exit_code == failed.exit_code, job
    assert job.error.message == f"node 1 (worker {failed.worker_id}): {failed.error.message}"
    ended = next(t for t in job.tasks if t.node_rank == 0)
    assert ended.error is not None and ended.error.message == "another node of the job ended"
    shown = cli("jobs", "show", h.id, check=True).stdout
    [line] = [ln for ln in shown.splitlines() if ln.startswith("task") and " node=0 " in ln]
    assert line.endswith("(another node of the job ended)"), shown
    assert "rank 1 failing" in h.logs(node=1)
    with pytest.raises(JobFailed):
        h.result()

    # the waiting rank on node 0 was ended with its group, not left running
    def gone() -> bool:
        for p in psutil.process_iter(["cmdline"]):
            try:
                if any("fail_one_rank.py" in part for part in (p.info["cmdline"] or [])):
                    return False
            except psutil.Error:
                continue
        return True

    wait_for(gone, 20, "the other node's processes to end")


def test_a_gpu_gang_sees_only_its_granted_devices(cluster: Cluster) -> None:
    # fake CUDA devices: placement, device grants and CUDA_VISIBLE_DEVICES are real; the
    # all_reduce itself runs on gloo on the CPU (this machine has no GPU)
    h = gl.submit(DistributedJob(nodes=2, nproc_per_node=1, entry="allreduce.py",
                                 requirements=gl.Requirements(accelerator="cuda", gpus=1),
                                 bundle=str(cluster.project), timeout=120))
    job = h.wait(120)
    assert job.state is JobState.SUCCEEDED, h.logs()
    grants = {t.node_rank: t for t in job.tasks}
    assert all(t.accelerator == "cuda" and len(t.devices) == 1 for t in grants.values())
    lines = rank_lines(h.logs())
    assert sorted(d["rank"] for d in lines) == [0, 1]
    for d in lines:
        assert d["sum"] == 3.0
        assert d["visible"] == str(grants[d["node"]].devices[0])


def test_function_entry_and_trainer_fit_on_two_nodes(cluster: Cluster) -> None:
    from gpulayer.torch import Trainer

    out = io.StringIO()
    trainer = Trainer("trainlib.ops:allreduce_main", nodes=2, args=["hello"], bundle=cluster.project,
                      timeout=120)
    record = trainer.fit(out=out, err=io.StringIO())
    assert record.state is JobState.SUCCEEDED
    assert record.spec.kind == "distributed"
    assert record.spec.requirements.frameworks == {"torch": ""}
    lines = rank_lines(out.getvalue())
    assert sorted((d["_node_prefix"], d["rank"]) for d in lines) == [(0, 0), (1, 1)], out.getvalue()
    assert all(d["tag"] == "hello" and d["sum"] == 3.0 and d["world_size"] == 2 for d in lines)


def test_launch_one_process_runs_the_script_as_a_world_of_one(cluster: Cluster) -> None:
    from gpulayer.torch import launch

    h = launch("allreduce.py", bundle=cluster.project, timeout=120)
    assert h.record().spec.kind == "command"
    assert h.result(timeout=120) == 0, h.logs()
    lines = rank_lines(h.logs())
    assert len(lines) == 1, h.logs()
    assert (lines[0]["rank"], lines[0]["world_size"], lines[0]["sum"]) == (0, 1, 1.0)


def test_launch_two_nodes_runs_the_allreduce_example(cluster: Cluster) -> None:
    from gpulayer.torch import launch

    example = Path(__file__).resolve().parents[2] / "examples" / "distributed_allreduce"
    h = launch("train.py", nodes=2, bundle=example, timeout=120)
    assert h.result(timeout=120) == 0, h.logs()
    lines = rank_lines(h.logs())
    assert sorted((d["rank"], d["sum"], d["world_size"], d["backend"]) for d in lines) == [
        (0, 3.0, 2, "gloo"), (1, 3.0, 2, "gloo")], h.logs()


def test_trainer_example_and_trainer_failure(cluster: Cluster) -> None:
    from gpulayer.torch import Trainer

    example = Path(__file__).resolve().parents[2] / "examples" / "pytorch_trainer.py"
    proc = subprocess.run([sys.executable, str(example), "--nodes", "1", "--epochs", "2"],
                          capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "epoch 1 loss" in proc.stdout and "succeeded after 1 attempt(s)" in proc.stdout
    with pytest.raises(JobFailed) as info:
        Trainer("fail_one_rank.py", args=["0"], bundle=cluster.project).fit(out=io.StringIO())
    assert info.value.exit_code == 3


PIECES = """\
import os, sys, time

rank = os.environ["RANK"]
print(f"rank {rank} ready", flush=True)
sys.stdout.write(f"rank {rank} step 1 ")  # a line written in two pieces, the shipping interval apart
sys.stdout.flush()
time.sleep(1)
print(f"loss 0.{rank}", flush=True)
"""


def test_a_line_shipped_in_two_chunks_is_shown_whole_after_one_node_prefix(cluster: Cluster) -> None:
    # each chunk's lines were prefixed on their own: "[node 0] [rank0]:rank 0 step 1 [node 0]
    # [rank0]:loss 0.0", and another node's output could land inside the line
    from gpulayer.torch import Trainer

    (cluster.project / "pieces.py").write_text(PIECES)
    out = io.StringIO()
    trainer = Trainer("pieces.py", nodes=2, bundle=cluster.project, timeout=120)
    trainer.fit(out=out, err=io.StringIO())
    h = trainer.handle
    printed = [cli("jobs", "logs", h.id, *follow, check=True).stdout for follow in ((), ("--follow",))]
    for shown in (out.getvalue(), h.logs(), "".join(h.follow()), *printed):
        steps = [line for line in shown.splitlines() if "step 1" in line]
        assert sorted(steps) == [f"[node {r}] [rank{r}]:rank {r} step 1 [rank{r}]:loss 0.{r}" for r in (0, 1)], shown


FIT_AND_WAIT = """\
import sys
from gpulayer.torch import Trainer

if __name__ == "__main__":
    Trainer("fail_one_rank.py", nodes=2, args=["-1"], bundle=sys.argv[1], timeout=120).fit()
"""


def _ranks_running(needle: str) -> list[psutil.Process]:
    found = []
    for p in psutil.process_iter(["cmdline"]):
        try:
            if any(needle in part for part in (p.info["cmdline"] or [])):
                found.append(p)
        except psutil.Error:
            continue
    return found


def test_ctrl_c_in_trainer_fit_cancels_the_run_on_every_node(cluster: Cluster, tmp_path: Path) -> None:
    # a Ctrl-C in fit() ended only the wait: the job ran on with both workers held (until its
    # timeout), as `gpulayer submit` does not (its Ctrl-C cancels)
    script = tmp_path / "fit_and_wait.py"
    script.write_text(FIT_AND_WAIT)
    proc = subprocess.Popen([sys.executable, str(script), str(cluster.project)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=dict(os.environ),
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))  # (not ignored)
    try:
        def waiting() -> Any:
            jobs = [j for j in gl.connect().api.list_jobs(limit=5) if j.spec.name == "fail_one_rank.py"
                    and j.state is JobState.RUNNING]
            return jobs and gl.JobHandle(jobs[0].id, gl.connect()).logs().count("waiting") >= 2 and jobs[0]

        job = wait_for(waiting, 90, "both ranks to run")
        proc.send_signal(signal.SIGINT)
        _, stderr = proc.communicate(timeout=60)
    finally:
        stop_proc(proc, signal.SIGKILL)
    assert proc.returncode != 0 and "KeyboardInterrupt" in stderr, stderr
    assert "gpulayer: cancelled 1 job(s): the process that submitted it was interrupted while Trainer.fit()" in stderr
    ended = gl.connect().wait(job.id, 60)
    assert ended.state is JobState.CANCELLED, ended
    assert ended.error is not None and "interrupted while Trainer.fit() waited" in ended.error.message
    wait_for(lambda: not _ranks_running("fail_one_rank.py"), 20, "every rank's process to end")


def test_distributed_work_on_a_device_without_distributed_support_is_refused(cluster: Cluster) -> None:
    from gpulayer.torch import launch

    proc = cli("submit", "--nodes", "2", "--accelerator", "mps", "--bundle", str(cluster.project),
               "--", "allreduce.py")
    assert proc.returncode == 125, proc.stderr
    reason = "mps device(s) do not support distributed work (distributed=unsupported)"
    worker_lines = [line for line in proc.stderr.splitlines() if line.startswith("wkr-")]
    assert len(worker_lines) >= 2 and all(line.endswith(reason) for line in worker_lines), proc.stderr
    with pytest.raises(Unschedulable, match=re.escape(reason)):
        launch("allreduce.py", nodes=2, accelerator="mps", bundle=cluster.project)


def test_a_killed_worker_makes_the_group_retry_with_a_fresh_rendezvous(cluster: Cluster) -> None:
    cluster.add_worker("w2")
    cluster.wait_online(3)
    h = gl.submit(DistributedJob(nodes=2, nproc_per_node=1, entry="allreduce.py",
                                 args=["--stall-first-attempt"], retries=1,
                                 bundle=str(cluster.project), timeout=120))
    wait_for(lambda: h.logs().count('"stalling"') >= 2, 90, "both ranks of attempt 1 to start")
    first = {t.node_rank: t for t in h.record().tasks if t.attempt == 1}
    victim_id = first[0].worker_id
    name, victim = next((n, w) for n, w in cluster.live_workers().items() if w.id == victim_id)
    proc = cluster.procs[name]
    leftovers = psutil.Process(proc.pid).children(recursive=True)
    try:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
        job = h.wait(150)
        logs = h.logs()
        assert job.state is JobState.SUCCEEDED, logs
        assert job.attempt == 2
        assert _task_states(job, 1) == {0: TaskState.LOST, 1: TaskState.CANCELLED}
        second = [t for t in job.tasks if t.attempt == 2]
        assert sorted(t.node_rank for t in second) == [0, 1]
        assert victim_id not in {t.worker_id for t in second}
        assert len({t.worker_id for t in second}) == 2
        rdzv1, rdzv2 = first[0].rendezvous, second[0].rendezvous
        assert rdzv1 is not None and rdzv2 is not None
        assert (rdzv1.run_id, rdzv2.run_id) == (f"{job.id}-1", f"{job.id}-2")
        second_ids = {t.id for t in second}
        chunks = gl.connect().api.logs(h.id)
        # each task's output on its own: the two ranks' chunks interleave, and a chunk may
        # end inside a line (an unbuffered print writes its text, then its newline)
        lines = [d for tid in sorted(second_ids)
                 for d in rank_lines("".join(c.data for c in chunks if c.task_id == tid))]
        assert sorted(d["rank"] for d in lines) == [0, 1], logs
        assert all(d["sum"] == 3.0 and d["attempt"] == 2 and d["rdzv"] == f"{job.id}-2" for d in lines)
    finally:
        # the killed worker's torchrun kept running (execution is at-least-once): end it
        for p in leftovers:
            try:
                p.kill()
            except psutil.Error:
                pass
    assert victim.id not in {w.id for w in cluster.live_workers().values()}


def test_two_by_two_all_reduce_through_a_server_with_remote_workers(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.server_support import Api, ServerProc, start_remote_worker, wait_workers

    project = write_project(tmp_path / "project")
    srv = ServerProc(tmp_path / "server").start()
    workers: list[subprocess.Popen[str]] = []
    try:
        admin = Api(srv.url, srv.admin_token)
        join = admin.token_for("join")["token"]
        (tmp_path / "tmp").mkdir()
        clean = {"GPULAYER_PLUGINS": "", "GPULAYER_DISABLE_PLUGINS": "", "GPULAYER_FAKE_DEVICES": "",
                 "GPULAYER_MPS_FORCE": "", "TMPDIR": str(tmp_path / "tmp")}
        for i in range(2):
            workers.append(start_remote_worker(srv.url, join, tmp_path / f"worker{i}", cpu_slots=1,
                                               env=clean, name=f"remote{i}"))
        wait_workers(admin, 2, timeout=90)
        monkeypatch.setenv("GPULAYER_URL", srv.url)
        monkeypatch.setenv("GPULAYER_TOKEN", admin.token_for("client")["token"])
        monkeypatch.setenv("GPULAYER_HOME", str(tmp_path / "client-home"))
        _client.reset()
        h = gl.submit(DistributedJob(nodes=2, nproc_per_node=2, entry="allreduce.py", bundle=str(project),
                                     placement=gl.Placement(target="remote"), timeout=120))
        job = h.wait(150)
        assert job.state is JobState.SUCCEEDED, h.logs()
        lines = rank_lines(h.logs())
        assert sorted(d["rank"] for d in lines) == [0, 1, 2, 3]
        assert all(d["sum"] == 10.0 and d["world_size"] == 4 for d in lines)
        assert sorted(d["rank"] for d in rank_lines(h.logs(node=0))) == [0, 1]
        assert len({t.worker_id for t in job.tasks}) == 2
    finally:
        _client.reset()
        for p in workers:
            stop_proc(p)
        srv.stop()


def test_cli_submit_runs_a_distributed_job_and_prefixes_each_node(cluster: Cluster) -> None:
    proc = cli("submit", "--nodes", "2", "--nproc-per-node", "1", "--timeout", "120",
               "--bundle", str(cluster.project), "--", "allreduce.py", timeout=180)
    assert proc.returncode == 0, proc.stderr
    lines = rank_lines(proc.stdout)
    assert sorted((d["_node_prefix"], d["rank"]) for d in lines) == [(0, 0), (1, 1)], proc.stdout
    assert all(d["sum"] == 3.0 and d["world_size"] == 2 for d in lines)
