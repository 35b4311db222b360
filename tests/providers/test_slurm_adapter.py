"""The slurm adapter against the real single-node Slurm of scripts/local-slurm.sh.

Every test has its own label and machine ids, so tests running side by side (xdist) see
only their own pilot jobs; each cancels what it launched.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from gpulayer_slurm import SlurmConfig, SlurmProvider
from pydantic import SecretStr

from gpulayer import plugin
from tests.providers.conftest import LocalSlurm, node_home
from tests.support import wait_for


def _provider(slurm: LocalSlurm, tmp_path: Path, **config: object) -> SlurmProvider:
    defaults: dict[str, object] = {"slurm_conf": slurm.conf, "python": sys.executable, "memory_gb": 0.25,
                                   "log_dir": str(tmp_path), "command_timeout": 30}
    # (a test that passes its own env keeps the home)
    config["env"] = {"GPULAYER_HOME": node_home(tmp_path), **dict(config.get("env") or {})}
    return SlurmProvider("slurm", SlurmConfig.model_validate({**defaults, **config}))


def _request(provider: SlurmProvider, label: str, *, gpus: int = 1, token: str | None = None,
             partition: str = "gpu") -> plugin.LaunchRequest:
    offers = provider.offers(plugin.Requirements(accelerator="cuda", gpus=gpus))
    offer = next(o for o in offers if o.region == partition)
    return plugin.LaunchRequest(
        machine_id=f"m-{secrets.token_hex(4)}", label=label, offer=offer,
        # Nothing listens there: the worker keeps trying to reach it, which keeps it alive.
        control_url="http://127.0.0.1:9", bootstrap_token=SecretStr(token or f"glb_{secrets.token_hex(16)}"),
        join_deadline=time.time() + 120)


@pytest.fixture
def label() -> str:
    return f"test-{secrets.token_hex(4)}"


@pytest.fixture
def provider(slurm: LocalSlurm, tmp_path: Path, label: str) -> Iterator[SlurmProvider]:
    p = _provider(slurm, tmp_path)
    yield p
    for machine in p.list(label):
        p.terminate(machine.machine_id, machine.provider_id)


def _squeue(slurm: LocalSlurm) -> list[dict[str, object]]:
    jobs: list[dict[str, object]] = json.loads(slurm.run("squeue", "--json").stdout)["jobs"]
    return jobs


def _job(slurm: LocalSlurm, job_id: str) -> dict[str, object]:
    return next(j for j in _squeue(slurm) if str(j["job_id"]) == job_id)


def _state(job: dict[str, object]) -> str:
    state = job["job_state"]
    return str(state[0] if isinstance(state, list) else state)


def _processes() -> Iterator[tuple[int, list[str], dict[str, str]]]:
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().decode(errors="replace").split("\0")
            raw = (entry / "environ").read_bytes().decode(errors="replace").split("\0")
        except OSError:
            continue
        yield int(entry.name), argv, dict(item.split("=", 1) for item in raw if "=" in item)


def _worker_of(machine_id: str) -> tuple[int, list[str], dict[str, str]] | None:
    for proc in _processes():
        if "worker" in proc[1] and machine_id in proc[1]:
            return proc
    return None


def test_check_passes_and_names_a_missing_partition(slurm: LocalSlurm, tmp_path: Path) -> None:
    _provider(slurm, tmp_path).check()
    with pytest.raises(plugin.ProviderAuthFailed, match=r"partitions = \['nope'\]: not on this cluster"):
        _provider(slurm, tmp_path, partitions=["nope"]).check()


def test_check_names_a_log_dir_or_workdir_that_is_not_there(slurm: LocalSlurm, tmp_path: Path) -> None:
    # sbatch accepts such a job, which then fails to start (JobLaunchFailure) with no output
    # anywhere: the machine would wait for its join deadline, and the next, and the next
    for key in ("log_dir", "workdir"):
        with pytest.raises(plugin.ProviderAuthFailed, match=rf"{key} = '{tmp_path}/nope': no such folder on this machine"):
            _provider(slurm, tmp_path, **{key: str(tmp_path / "nope")}).check()
    _provider(slurm, tmp_path, workdir=str(tmp_path)).check()
    # a Slurm pattern in the path (%u: the job's user) is filled in by sbatch: checked up to it
    _provider(slurm, tmp_path, log_dir=f"{tmp_path}/%u").check()
    with pytest.raises(plugin.ProviderAuthFailed, match=rf"log_dir = '{tmp_path}/nope/%u': no such folder"):
        _provider(slurm, tmp_path, log_dir=f"{tmp_path}/nope/%u").check()


def test_check_refuses_options_every_pilot_would_be_refused_for(slurm: LocalSlurm, tmp_path: Path) -> None:
    """A constraint no node has (or a bad account, QOS, time) in the section failed every
    launch in turn, each skipping its shape for five minutes while the job waited for ever."""
    with pytest.raises(plugin.ProviderAuthFailed, match=r"refused in partition debug \(sbatch --test-only: .*[Ff]eature.*"
                                                        r"check sbatch_args"):
        _provider(slurm, tmp_path, partitions=["debug"], sbatch_args=["--constraint=no-such-feature"]).check()
    _provider(slurm, tmp_path, partitions=["debug"], sbatch_args=["--comment=fine"]).check()


STUB_SBATCH = """\
#!/bin/sh
# Slurm's answer where the user's group may not use partition short (AllowGroups); the real
# sbatch everywhere else
case " $* " in
  *" --partition=short "*)
    echo "sbatch: error: Batch job submission failed: User's group not permitted to use this partition" >&2
    exit 1;;
esac
exec {sbatch} "$@"
"""


def test_check_leaves_a_partition_that_alone_refuses_the_pilot_to_the_launches(
        slurm: LocalSlurm, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A partition the account may not use refuses every pilot there, not the section's: the
    other partitions keep working (one such partition disabled the whole provider)."""
    real = shutil.which("sbatch")
    assert real is not None
    stub = tmp_path / "bin"
    stub.mkdir()
    (stub / "sbatch").write_text(STUB_SBATCH.format(sbatch=real))
    (stub / "sbatch").chmod(0o755)
    monkeypatch.setenv("PATH", f"{stub}{os.pathsep}{os.environ['PATH']}")
    _provider(slurm, tmp_path, partitions=["gpu", "short"]).check()
    _provider(slurm, tmp_path, partitions=["short", "gpu"]).check()
    _provider(slurm, tmp_path).check()  # (every partition: debug, gpu, short)
    with pytest.raises(plugin.ProviderAuthFailed, match=r"refused in partition short \(sbatch --test-only: .*not permitted"):
        _provider(slurm, tmp_path, partitions=["short"]).check()
    # refused in every partition: the first one's words, the others named
    with pytest.raises(plugin.ProviderAuthFailed, match=r"refused in partition debug \(sbatch --test-only: .*[Ff]eature.*\), "
                                                        r"and in gpu, short; check sbatch_args"):
        _provider(slurm, tmp_path, sbatch_args=["--constraint=no-such-feature"]).check()


def test_offers_show_partitions_and_gres(provider: SlurmProvider) -> None:
    offers = provider.offers(plugin.Requirements(accelerator="cuda", gpus=2))
    assert {o.region for o in offers} == {"gpu", "debug", "short"}
    for offer in offers:
        assert offer.price_per_hour is None
        assert offer.availability in ("available", "limited")
        assert [d.kind for d in offer.capabilities.devices] == ["cuda", "cuda"]
        assert offer.data["gres"] == "gpu:fake:2"
        assert offer.shape == "8cpu-8gb-2xfake"  # 2 of the node's 4 GPUs, 16 CPUs and 16 GB
    # The node has 4 GPUs: a job needing 5 gets no offer; one on another accelerator neither.
    assert provider.offers(plugin.Requirements(accelerator="cuda", gpus=5)) == []
    assert provider.offers(plugin.Requirements(accelerator="rocm")) == []
    cpu_only = provider.offers(plugin.Requirements(cpus=2))
    assert cpu_only and all(o.capabilities.devices == [] and o.data["gres"] is None for o in cpu_only)
    assert all(o.capabilities.host.cpu_count == 2 for o in cpu_only)
    # What the core caches: every shape, from none to all four GPUs, in every partition; the
    # ones without GPUs from cpus/memory_gb up to the whole node (16 CPUs, 1 GB per CPU)
    every = provider.offers(plugin.Requirements())
    assert [o.shape for o in every if o.region == "gpu"] == [
        "1cpu-0.25gb", "2cpu-2gb", "4cpu-4gb", "8cpu-8gb", "16cpu-16gb",
        "4cpu-4gb-1xfake", "8cpu-8gb-2xfake", "12cpu-12gb-3xfake", "16cpu-16gb-4xfake"]


def test_partitions_in_config_order(slurm: LocalSlurm, tmp_path: Path) -> None:
    p = _provider(slurm, tmp_path, partitions=["debug", "gpu"])
    assert [o.region for o in p.offers(plugin.Requirements(accelerator="cuda"))] == ["debug", "gpu"]


def test_launch_list_and_idempotent_terminate(slurm: LocalSlurm, provider: SlurmProvider, label: str) -> None:
    request = _request(provider, label)
    launched = provider.launch(request)
    assert launched.provider_id.isdigit()
    # The same machine id launched again is the same job, not a second one.
    assert provider.launch(request).provider_id == launched.provider_id

    job = _job(slurm, launched.provider_id)
    assert job["name"] == f"gpulayer-{request.machine_id}"
    assert job["comment"] == f"gpulayer:{label}:{request.machine_id}"
    assert [(m.machine_id, m.provider_id) for m in provider.list(label)] == [(request.machine_id, launched.provider_id)]
    assert provider.list(label + "-other") == []

    provider.terminate(request.machine_id, launched.provider_id)
    provider.terminate(request.machine_id, launched.provider_id)  # already gone: success
    provider.terminate(request.machine_id, None)                  # found by name: success
    wait_for(lambda: provider.list(label) == [], 30, "the pilot job to leave squeue's live jobs")
    assert _state(_job(slurm, launched.provider_id)) in ("CANCELLED", "COMPLETING", "COMPLETED")


def test_terminate_by_machine_id_alone(provider: SlurmProvider, label: str) -> None:
    request = _request(provider, label)
    provider.launch(request)
    provider.terminate(request.machine_id, None)
    wait_for(lambda: provider.list(label) == [], 30, "the pilot job to be cancelled")


def test_terminate_never_touches_another_job_with_that_id(slurm: LocalSlurm, provider: SlurmProvider,
                                                         label: str) -> None:
    other = slurm.run("sbatch", "--parsable", "--mem=64M", "--job-name=not-gpulayer", "--output=/dev/null",
                      "--wrap", "sleep 60").stdout.strip()
    try:
        provider.terminate("m-unknown", other)
        assert _state(_job(slurm, other)) in ("PENDING", "RUNNING")
    finally:
        slurm.run("scancel", other, check=False)


def test_pilot_job_starts_a_worker_and_the_token_is_in_no_argv(slurm: LocalSlurm, provider: SlurmProvider,
                                                                label: str) -> None:
    token = f"glb_{secrets.token_hex(16)}"
    request = _request(provider, label, token=token)
    launched = provider.launch(request)
    _, argv, env = wait_for(lambda: _worker_of(request.machine_id), 60, "the pilot's worker process")

    # The worker the pilot runs, inside the allocation, with the token in its environment.
    assert argv[1:6] == ["-m", "gpulayer.cli", "worker", "start", "--name"]
    assert env["SLURM_JOB_ID"] == launched.provider_id
    assert env["GPULAYER_TOKEN"] == token
    assert env["GPULAYER_MACHINE_ID"] == request.machine_id
    assert env["GPULAYER_URL"] == request.control_url
    assert env["CUDA_VISIBLE_DEVICES"] in ("0", "1", "2", "3")  # Slurm's GRES grant: one of the fake GPUs
    # It reports the allocation's CPUs and memory (what sbatch asked for), not the node's.
    assert env["GPULAYER_OVERRIDE_CPU_COUNT"] == str(request.offer.data["cpus"]) == env["SLURM_CPUS_PER_TASK"]
    assert float(env["GPULAYER_OVERRIDE_MEMORY_GB"]) * 1024 == request.offer.data["memory_mb"] \
        == int(env["SLURM_MEM_PER_NODE"])

    # Never an argv: not the worker's, not sbatch's, not slurmstepd's, not anybody's.
    leaks = [(p, a) for p, a, _ in _processes() if token in " ".join(a)]
    assert leaks == []
    # Not in what Slurm shows of the job or stores as its script.
    shown = slurm.run("scontrol", "show", "job", launched.provider_id).stdout
    script = slurm.run("scontrol", "write", "batch_script", launched.provider_id, "-").stdout
    assert "gpulayer.cli worker start" in script
    assert token not in shown and token not in script
    # The variables a server's own environment holds do not travel into the job.
    assert "GPULAYER_REQUIRE_SLURM" not in env


def test_pending_job_lists_as_pending(slurm: LocalSlurm, provider: SlurmProvider, label: str) -> None:
    provider.config.sbatch_args.append("--hold")
    request = _request(provider, label)
    launched = provider.launch(request)
    machines = provider.list(label)
    assert [(m.provider_id, m.state) for m in machines] == [(launched.provider_id, "pending")]


def test_refused_submission_is_a_typed_error(slurm: LocalSlurm, provider: SlurmProvider, label: str) -> None:
    request = _request(provider, label)
    bad = request.model_copy(update={"offer": request.offer.model_copy(
        update={"data": {**request.offer.data, "partition": "no-such-partition"}})})
    with pytest.raises(plugin.SkipOffer, match=r"partition no-such-partition: .*[Ii]nvalid partition"):
        provider.launch(bad)
    too_many = request.model_copy(update={"offer": request.offer.model_copy(
        update={"data": {**request.offer.data, "gres": "gpu:fake:9"}})})
    with pytest.raises(plugin.SkipOffer, match="node configuration is not available"):
        provider.launch(too_many)


def test_missing_commands_and_bad_munge_fail_authentication(slurm: LocalSlurm, tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(plugin.ProviderAuthFailed, match="sinfo: not found on PATH"):
        _provider(slurm, tmp_path).check()
    monkeypatch.undo()
    # A slurm.conf whose munge socket is not there: what a stopped munged looks like.
    conf = tmp_path / "slurm.conf"
    conf.write_text(Path(slurm.conf).read_text().replace(str(slurm.dir / "munge" / "munge.socket"),
                                                         str(tmp_path / "no-munge.socket")))
    with pytest.raises(plugin.ProviderAuthFailed, match=r"(?i)munge"):
        _provider(slurm, tmp_path, slurm_conf=str(conf), command_timeout=20).check()


def test_adapter_is_registered_by_entry_point() -> None:
    import gpulayer_slurm

    adapter = next(a for a in gpulayer_slurm.gpulayer_provider_adapters())
    assert adapter.name == "slurm" and adapter.config is SlurmConfig
    assert isinstance(adapter.create("slurm", {"partitions": ["gpu"]}), plugin.Provider)
