"""The slurm plugin's pure parts: what it reads from Slurm's commands, how it names their
errors, and what goes over SSH. Against a real Slurm: tests/providers/."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
import time

import pytest
from gpulayer_slurm import SlurmConfig, SlurmProvider, _parse
from gpulayer_slurm._runner import SshRunner
from pydantic import SecretStr, ValidationError

from gpulayer import plugin

SINFO = (
    "gpu1|gpu*|mixed|64|16/48/0/64|512000|128000|gpu:a100:4(S:0-1)|gpu:a100:3(IDX:0-2)|up|\n"
    "gpu2|gpu*|drained|64|0/0/64/64|512000|0|gpu:a100:4(S:0-1)|gpu:a100:0(IDX:N/A)|up|\n"
    "cpu1|cpu|idle|32|0/32/0/32|128000|0|(null)|gpu:0|up|\n"
    "old1|old|idle*|16|0/16/0/16|64000|0|gpu:2|gpu:0|down|\n"
)


def test_gres_strings() -> None:
    assert _parse.parse_gres("gpu:a100:4(S:0-1)") == {"a100": 4}
    assert _parse.parse_gres("gpu:2,nic:1") == {"": 2}
    assert _parse.parse_gres("gpu:a100:2(IDX:0,1),gpu:v100:1") == {"a100": 2, "v100": 1}
    assert _parse.parse_gres("(null)") == {}
    assert _parse.parse_gres("") == {}


def test_nodes_from_sinfo() -> None:
    nodes = _parse.parse_nodes(SINFO)
    gpu1, gpu2, cpu1, old1 = nodes
    assert (gpu1.partition, gpu1.cpus, gpu1.cpus_free, gpu1.memory_free_mb) == ("gpu", 64, 48, 384000)
    assert (gpu1.gpu_count(), gpu1.gpus_free("a100"), gpu1.usable) == (4, 1, True)
    assert not gpu2.usable and cpu1.usable and cpu1.gpu_count() == 0
    assert not old1.usable  # partition down, node not responding


class _Canned:
    """A runner that answers like Slurm's commands did (the real ones: tests/providers/)."""

    where = "canned"

    def __init__(self, answers: dict[str, tuple[int, str, str]]) -> None:
        self.answers = answers
        self.calls: list[tuple[list[str], dict[str, str] | None, str | None]] = []

    def run(self, argv: list[str], *, env: dict[str, str] | None = None, stdin: str | None = None,
            timeout: float) -> tuple[int, str, str]:
        self.calls.append((argv, env, stdin))
        return self.answers[argv[0]]


def test_offers_availability_and_shapes() -> None:
    runner = _Canned({"sinfo": (0, SINFO, "")})
    p = SlurmProvider("hpc", SlurmConfig(gpu_memory_gb={"a100": 80}), runner=runner)
    # a GPU's share of its node: gpu1 has 64 CPUs and 500 GB for 4 GPUs; old1 16 and 62.5 GB for 2
    one = p.offers(plugin.Requirements(accelerator="cuda", gpus=1))
    assert [(o.scope, o.availability) for o in one] == [("hpc/gpu/16cpu-125gb-1xa100", "available"),
                                                       ("hpc/old/8cpu-31.25gb-1xgpu", "unavailable")]
    assert one[0].capabilities.devices[0].memory_gb == 80
    assert one[0].capabilities.host.cpu_count == 16
    two = p.offers(plugin.Requirements(accelerator="cuda", gpus=2, cpus=8, memory_gb=300))
    # gpu1 has 1 GPU free now (limited); old1 cannot hold 300 GB (no offer)
    assert [(o.region, o.shape, o.availability) for o in two] == [("gpu", "32cpu-300gb-2xa100", "limited")]
    assert two[0].data["gres"] == "gpu:a100:2" and two[0].data["memory_mb"] == 300 * 1024
    cpu = p.offers(plugin.Requirements(cpus=4))
    assert [(o.scope, o.data["gres"]) for o in cpu] == [("hpc/gpu/4cpu-2gb", None), ("hpc/cpu/4cpu-2gb", None),
                                                        ("hpc/old/4cpu-2gb", None)]


def test_every_shape_for_empty_requirements() -> None:
    p = SlurmProvider("hpc", SlurmConfig(cpus_per_gpu=4, memory_gb_per_gpu=32),
                      runner=_Canned({"sinfo": (0, SINFO, "")}))
    shapes = [(o.region, o.shape) for o in p.offers(plugin.Requirements())]
    # without GPUs: cpus and memory_gb, then twice the CPUs and again up to a node's, with
    # their share of its memory (gpu1: 500 GB for 64 CPUs; cpu1 125 GB for 32; old1 62.5 for 16)
    assert shapes == [("gpu", "1cpu-2gb"), ("gpu", "2cpu-15.625gb"), ("gpu", "4cpu-31.25gb"), ("gpu", "8cpu-62.5gb"),
                      ("gpu", "16cpu-125gb"), ("gpu", "32cpu-250gb"), ("gpu", "64cpu-500gb"),
                      ("gpu", "4cpu-32gb-1xa100"), ("gpu", "8cpu-64gb-2xa100"),
                      ("gpu", "12cpu-96gb-3xa100"), ("gpu", "16cpu-128gb-4xa100"),
                      ("cpu", "1cpu-2gb"), ("cpu", "2cpu-7.8125gb"), ("cpu", "4cpu-15.625gb"), ("cpu", "8cpu-31.25gb"),
                      ("cpu", "16cpu-62.5gb"), ("cpu", "32cpu-125gb"),
                      ("old", "1cpu-2gb"), ("old", "2cpu-7.8125gb"), ("old", "4cpu-15.625gb"), ("old", "8cpu-31.25gb"),
                      ("old", "16cpu-62.5gb"), ("old", "4cpu-32gb-1xgpu")]  # old1's 64000 MB < 64 GB
    assert SlurmProvider("hpc", SlurmConfig(partitions=["cpu"]), runner=p.runner).offers(
        plugin.Requirements(accelerator="cuda")) == []


def test_declared_frameworks_and_python_let_jobs_that_need_them_fit() -> None:
    """Nothing probes the compute nodes' Python: without a declaration no offer has torch, so
    a job requiring it (every ``gpulayer.torch`` job does) could never get a pilot."""
    from gpulayer.scheduling import check
    from gpulayer.scheduling.fleet import offer_record
    from gpulayer.specs import CommandJob, Placement, Requirements

    job = CommandJob(command=["python", "train.py"], placement=Placement(target="cloud"), requirements=Requirements(
        accelerator="cuda", gpus=1, frameworks={"torch": ">=2.2", "torch.cuda": ""}, python=">=3.10"))
    runner = _Canned({"sinfo": (0, SINFO, "")})
    bare = SlurmProvider("hpc", SlurmConfig(partitions=["gpu"]), runner=runner)
    [offer] = bare.offers(plugin.Requirements(accelerator="cuda", gpus=1))
    assert {r.code for r in check(job, offer_record(offer))} == {"framework_missing", "python"}
    declared = SlurmProvider("hpc", SlurmConfig(partitions=["gpu"], python_version="3.11.9",
                                                frameworks={"torch": "2.5.1", "torch.cuda": "12.4"}), runner=runner)
    [offer] = declared.offers(plugin.Requirements(accelerator="cuda", gpus=1))
    assert check(job, offer_record(offer)) == []
    for bad in ({"frameworks": {"torch": "latest"}}, {"python_version": "3.x"}):
        with pytest.raises(ValidationError, match=r"is not a version; accepted: a version such as 2\.5\.1"):
            SlurmConfig.model_validate(bad)


def test_a_cpu_job_bigger_than_the_smallest_pilot_gets_no_gpus() -> None:
    """The core matches jobs against the shapes of ``offers(Requirements())``: with one CPU
    shape of 1 CPU and 2 GB, ``--memory 10`` fitted only GPU shapes, and its pilot held
    ``--gres=gpu:...`` GPUs it never used."""
    from gpulayer.provisioning import fitting, order_offers
    from gpulayer.specs import CommandJob, Placement, Requirements

    p = SlurmProvider("hpc", SlurmConfig(partitions=["gpu"]), runner=_Canned({"sinfo": (0, SINFO, "")}))
    every = p.offers(plugin.Requirements())
    for needs in ({"memory_gb": 10}, {"cpus": 2}, {"cpus": 20, "memory_gb": 200}):
        job = CommandJob(command=["true"], placement=Placement(target="cloud"), requirements=Requirements(**needs))
        first = order_offers(fitting(job, every))[0]
        assert first.data["gres"] is None and not first.capabilities.devices, (needs, first.shape)


def test_squeue_json_of_both_eras_and_the_format_fallback() -> None:
    old = json.dumps({"jobs": [{"job_id": 7, "name": "gpulayer-m-1", "job_state": "RUNNING",
                                "comment": "gpulayer:srv:m-1"}]})
    new = json.dumps({"jobs": [{"job_id": 8, "name": "gpulayer-m-2", "job_state": ["PENDING"],
                                "comment": "gpulayer:srv:m-2"}]})
    assert [(j.job_id, j.live_state) for j in _parse.parse_squeue_json(old)] == [("7", "running")]
    assert [(j.job_id, j.live_state) for j in _parse.parse_squeue_json(new)] == [("8", "pending")]
    fmt = _parse.parse_squeue_format("9|gpulayer-m-3|COMPLETING|gpulayer:srv:m-3\n10|x|COMPLETED|(null)\n")
    assert [(j.job_id, j.live_state, j.comment) for j in fmt] == [("9", "stopping", "gpulayer:srv:m-3"),
                                                                  ("10", None, "")]
    runner = _Canned({})

    def answer(argv: list[str], **_: object) -> tuple[int, str, str]:
        if "--json" in argv:
            return 1, "", "squeue: unrecognized option '--json'\n"
        return 0, "9|gpulayer-m-3|RUNNING|gpulayer:srv:m-3\n11|gpulayer-m-4|RUNNING|gpulayer:other:m-4\n", ""

    runner.run = answer  # type: ignore[assignment,method-assign]
    machines = SlurmProvider("hpc", SlurmConfig(), runner=runner).list("srv")
    assert [(m.machine_id, m.provider_id, m.state) for m in machines] == [("m-3", "9", "running")]


@pytest.mark.parametrize(("stderr", "error"), [
    ("sbatch: error: Batch job submission failed: Requested node configuration is not available",
     plugin.SkipOffer),
    ("sbatch: error: Batch job submission failed: Invalid partition name specified", plugin.SkipOffer),
    ("sbatch: error: Batch job submission failed: Requested partition configuration not available now",
     plugin.NoCapacity),
    ("sbatch: error: QOSMaxGRESPerUser\nsbatch: error: Batch job submission failed: Job violates "
     "accounting/QOS policy (job submit limit, user's size and/or time limits)", plugin.QuotaExceeded),
    ("sbatch: error: Munge encode failed: Failed to access \"/run/munge/munge.socket.2\"", plugin.ProviderAuthFailed),
    ("sbatch: error: Batch job submission failed: Unable to contact slurm controller (connect failure)",
     plugin.ProviderTransient),
])
def test_sbatch_errors_are_typed(stderr: str, error: type[plugin.ProviderError]) -> None:
    exc = _parse.sbatch_error(stderr, "gpu")
    assert type(exc) is error
    assert stderr.splitlines()[-1].split("error: ")[-1] in str(exc)


def _request(token: str) -> plugin.LaunchRequest:
    offer = plugin.MachineOffer(shape="1cpu-2gb-1xgpu", region="gpu", capabilities=plugin.Capabilities(
        host=plugin.HostInfo(os="linux", arch="x86_64", cpu_count=1, memory_bytes=2**31, python_version="")),
        data={"partition": "gpu", "cpus": 1, "memory_mb": 2048, "gres": "gpu:1"})
    return plugin.LaunchRequest(machine_id="m-1", label="srv", offer=offer, control_url="https://cp:8443",
                                bootstrap_token=SecretStr(token), join_deadline=time.time() + 60)


def test_launch_puts_the_token_in_the_environment_only() -> None:
    runner = _Canned({"squeue": (0, json.dumps({"jobs": []}), ""), "sbatch": (0, "4242\n", "")})
    config = SlurmConfig(setup=["module load cuda"], env={"HF_HOME": "/scratch/hf cache"}, log_dir="/scratch/logs",
                         sbatch_args=["--account=ml"], time_limit="8:00:00")
    launched = SlurmProvider("hpc", config, runner=runner).launch(_request("glb_secret"))
    assert launched.provider_id == "4242"
    argv, env, script = runner.calls[-1]
    assert "glb_secret" not in " ".join(argv) and script is not None and "glb_secret" not in script
    assert env is not None and env["GPULAYER_TOKEN"] == "glb_secret"
    export = next(a for a in argv if a.startswith("--export="))
    assert "GPULAYER_TOKEN" in export.split("=", 1)[1].split(",")
    assert {"--job-name=gpulayer-m-1", "--comment=gpulayer:srv:m-1", "--partition=gpu", "--gres=gpu:1",
            "--mem=2048M", "--time=8:00:00", "--output=/scratch/logs/%x-%j.out"} <= set(argv)
    assert argv[-1] == "--account=ml"
    assert script.splitlines()[2:] == ["module load cuda", "export GPULAYER_OVERRIDE_CPU_COUNT=1",
                                       "export GPULAYER_OVERRIDE_MEMORY_GB=2", "export HF_HOME='/scratch/hf cache'",
                                       "exec python3 -m gpulayer.cli worker start --name m-1"]


def test_the_pilots_worker_reports_its_allocation_not_the_node() -> None:
    """A worker detects the whole node; inside a 4-CPU, 6 GB allocation it must say 4 CPUs and
    6 GB, or jobs needing more are placed on it (and killed by Slurm's memory limit)."""
    request = _request("glb_x")
    request = request.model_copy(update={"offer": request.offer.model_copy(
        update={"data": {**request.offer.data, "cpus": 4, "memory_mb": 6144}})})
    script = SlurmProvider("hpc", SlurmConfig()).job_script(request)
    assert "export GPULAYER_OVERRIDE_CPU_COUNT=4\n" in script
    assert "export GPULAYER_OVERRIDE_MEMORY_GB=6\n" in script
    # a site that knows better says so in env, which wins
    mine = SlurmProvider("hpc", SlurmConfig(env={"GPULAYER_OVERRIDE_MEMORY_GB": "5.5"})).job_script(request)
    assert "GPULAYER_OVERRIDE_MEMORY_GB=6" not in mine and "export GPULAYER_OVERRIDE_MEMORY_GB=5.5\n" in mine


def test_config_errors_name_the_key() -> None:
    with pytest.raises(ValidationError, match="partitions"):
        SlurmConfig.model_validate({"partitions": [""]})
    with pytest.raises(ValidationError, match="not an environment variable name"):
        SlurmConfig.model_validate({"env": {"1X": "y"}})
    with pytest.raises(ValidationError, match="bootstrap token"):
        SlurmConfig.model_validate({"env": {"GPULAYER_TOKEN": "y"}})
    assert SlurmConfig.model_validate({"partition": "gpu"}).partitions == ["gpu"]
    assert SlurmConfig.model_validate({"partitions": "gpu"}).partitions == ["gpu"]
    with pytest.raises(ValidationError, match="give one of them"):
        SlurmConfig.model_validate({"partition": "gpu", "partitions": ["x"]})
    with pytest.raises(ValidationError, match="sbatch_arg"):
        SlurmConfig.model_validate({"sbatch_arg": []})


@pytest.mark.parametrize(("line", "said"), [
    # each of these was accepted, and failed only later: every sbatch refused (the job waited
    # for ever), the pilot died before its worker joined, or its join was refused
    ('time_limit = "forever"', "time_limit: 'forever' is not a Slurm time; accepted: MINUTES, "),
    ('python = ""', "python: expected at least 1 character(s), got ''"),
    ('gpu_kind = ""', "gpu_kind: '' is not a device kind; accepted: a kind such as cuda or rocm"),
    ("gpu_memory_gb = { a100 = -80 }", "gpu_memory_gb.a100: expected a number > 0, got -80"),
    ('env = { GPULAYER_MACHINE_ID = "m-1" }', "env: GPULAYER_MACHINE_ID is set by GPUlayer itself for each machine"),
    ('env = { GPULAYER_URL = "http://x" }', "env: GPULAYER_URL is set by GPUlayer itself for each machine"),
    ('export_env = ["PATH", "MY VAR"]', "export_env: 'MY VAR' is not an environment variable name"),
    # named as written, not as the key it stands for
    ("partition = 3", "partition: expected a partition name in quotes, or a list of them, got 3"),
])
def test_bad_values_stop_the_file_where_they_are_written(line: str, said: str) -> None:
    from gpulayer_slurm import gpulayer_provider_adapters

    from gpulayer.errors import InvalidInput
    from gpulayer.provider_config import parse

    adapters = {a.name: a for a in gpulayer_provider_adapters()}
    with pytest.raises(InvalidInput) as caught:
        parse(f'[hpc]\ntype = "slurm"\n{line}\n', "p.toml", adapters=adapters)
    assert str(caught.value).startswith(f"p.toml: [hpc] {said}")


def test_gpu_kind_takes_every_kind_a_detector_may_name_and_a_job_ask_for() -> None:
    # (a kind with a '-' or a '.' was refused here though a detector may name it and a job ask
    # for it; cpu, which a job's accelerator reads as none, was taken)
    from gpulayer.plugin import AcceleratorDetector, DetectionResult
    from gpulayer.specs import Requirements

    for kind in ("cuda", "rocm", "intel-gpu", "npu.v2", "my_npu"):
        AcceleratorDetector(name=kind, description="", detect=lambda _t: DetectionResult())
        assert Requirements(accelerator=kind).accelerator == kind
        assert SlurmConfig(gpu_kind=kind).gpu_kind == kind
    for bad in ("cpu", "none", "CUDA", "-x", ""):
        with pytest.raises(ValidationError, match="is not a device kind"):
            SlurmConfig(gpu_kind=bad)


def test_slurm_times_are_accepted_in_every_form_sbatch_takes() -> None:
    for ok in ("30", "30:00", "12:00:00", "2-0", "2-12:00", "1-12:00:00", "UNLIMITED", "infinite"):
        assert SlurmConfig(time_limit=ok).time_limit == ok


def test_ssh_command_line_keeps_secrets_on_stdin() -> None:
    runner = SshRunner("login.example", python="/opt/py/bin/python3", slurm_conf="/etc/slurm/x.conf")
    line, payload = runner.command_line(["sbatch", "--parsable", "--export=GPULAYER_TOKEN"],
                                        env={"GPULAYER_TOKEN": "glb_secret"}, stdin="#!/bin/sh\n")
    assert "glb_secret" not in line and payload is not None
    assert json.loads(payload) == {"env": {"GPULAYER_TOKEN": "glb_secret"}, "stdin": "#!/bin/sh\n"}
    argv = shlex.split(line)
    assert argv[:2] == ["/opt/py/bin/python3", "-c"]
    assert argv[3:] == ["env", "SLURM_CONF=/etc/slurm/x.conf", "sbatch", "--parsable", "--export=GPULAYER_TOKEN"]
    # The remote side: the same Python code run here reads the payload and runs the argv with it.
    proc = subprocess.run([sys.executable, "-c", argv[2], "sh", "-c", 'printf %s "$GPULAYER_TOKEN"; cat'],
                          input=payload, capture_output=True, text=True, timeout=30)
    assert (proc.returncode, proc.stdout) == (0, "glb_secret#!/bin/sh\n")
    plain, none = runner.command_line(["squeue", "--me"], env=None, stdin=None)
    assert (plain, none) == ("env SLURM_CONF=/etc/slurm/x.conf squeue --me", None)
