"""Bundled GPUlayer plugin: Slurm allocations as ``cloud`` machines (a pilot job per machine).

A ``[NAME]`` section of providers.toml with ``type = "slurm"`` makes one provider:

- ``offers(requirements)``: one offer per partition (and GPU type) where some usable node
  could hold the allocation the job needs: its GPUs as GRES ``gpu`` (reported as devices of
  ``gpu_kind``, cuda by default), its CPUs and memory. Read from ``sinfo``; price none
  (your own capacity); available when a node has that much free now, limited when the
  nodes are busy, unavailable when they are all down or drained.
- ``launch(request)``: ``sbatch --parsable`` of a pilot job whose script runs
  ``gpulayer worker start`` and nothing else. The job's name is ``gpulayer-<machine id>``
  and its comment ``gpulayer:<label>:<machine id>``. The bootstrap token and the rest of
  the worker's environment reach the job through sbatch's own environment and
  ``--export`` of their names: never an argv, never the script (which sbatch reads from
  stdin; no file is written).
- ``list(label)``: ``squeue --json --me`` (``squeue --format`` where this Slurm has no
  ``--json``), the jobs whose comment carries the label.
- ``terminate(machine_id, provider_id)``: ``scancel`` by job id and name (a job id reused
  by another job is left alone), or by name alone; an ended or unknown job is success.

Every command runs with a timeout, on this machine or, with ``ssh_host``, on a login node
through paramiko (see :mod:`gpulayer_slurm._runner`). See docs/providers.md, "slurm".
"""

from __future__ import annotations

import os
import re
import shlex
import time
from collections.abc import Iterator
from typing import Annotated, Any, Literal

from packaging.version import InvalidVersion, Version
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from gpulayer import plugin

from . import _parse
from ._runner import LocalRunner, Runner, SshRunner

NAME_PREFIX = "gpulayer-"
COMMENT_PREFIX = "gpulayer:"
Availability = Literal["available", "limited", "unavailable", "unknown"]
#: the environment passed to the pilot job besides the worker's own (when set where sbatch runs)
#: what the adapter itself puts in the worker's environment (refused in ``env``)
RESERVED_ENV = ("GPULAYER_URL", "GPULAYER_CA", "GPULAYER_MACHINE_ID")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
#: sbatch --time: minutes, minutes:seconds, hours:minutes:seconds, days-hours,
#: days-hours:minutes, days-hours:minutes:seconds; UNLIMITED or INFINITE for none
_TIME = re.compile(r"^(\d+(:\d+){0,2}|\d+-\d+(:\d+){0,2}|unlimited|infinite)$", re.IGNORECASE)
DEFAULT_EXPORT = ["PATH", "HOME", "USER", "LANG", "LC_ALL", "TMPDIR", "PYTHONPATH", "VIRTUAL_ENV"]


class SlurmConfig(BaseModel):
    """A ``type = "slurm"`` section of providers.toml (the core's own keys taken out)."""

    model_config = ConfigDict(extra="forbid")

    partitions: list[str] = Field(default_factory=list,
                                  description="partitions to offer, in this order; empty: every partition")
    python: str = Field(default="python3", min_length=1, description="the Python on the compute nodes that has gpulayer")
    cpus: int = Field(default=1, ge=1, description="CPUs of a pilot job at least (the whole of one without GPUs)")
    memory_gb: float = Field(default=2.0, gt=0, description="memory of a pilot job at least")
    cpus_per_gpu: int | None = Field(default=None, ge=1, description="CPUs per GPU (default: the node's share)")
    memory_gb_per_gpu: float | None = Field(default=None, gt=0,
                                            description="memory per GPU (default: the node's share)")
    gpu_kind: str = Field(default="cuda", description="device kind the GRES gpu stands for")
    gpu_memory_gb: dict[str, Annotated[float, Field(gt=0)]] = Field(
        default_factory=dict, description='memory of one GPU by GRES type, e.g. {a100 = 80}; "*" for any')
    frameworks: dict[str, str] = Field(
        default_factory=dict, description='framework versions the python has, e.g. {torch = "2.5.1"}: offers claim them')
    python_version: str | None = Field(default=None, description="the version of that python, e.g. 3.11.9")
    time_limit: str | None = Field(default=None, description="sbatch --time of the pilot job, e.g. 8:00:00")
    sbatch_args: list[str] = Field(default_factory=list, description="more sbatch options, e.g. --account=x")
    setup: list[str] = Field(default_factory=list,
                             description="shell lines the pilot runs before the worker (module load ...)")
    env: dict[str, str] = Field(default_factory=dict, description="variables the worker gets (no secrets)")
    export_env: list[str] = Field(default_factory=lambda: list(DEFAULT_EXPORT),
                                  description="variables copied from where sbatch runs into the job")
    log_dir: str | None = Field(default=None, description="where pilot jobs write their output")
    workdir: str | None = Field(default=None, description="sbatch --chdir of the pilot job")
    slurm_conf: str | None = Field(default=None, description="SLURM_CONF for the commands")
    command_timeout: float = Field(default=30.0, gt=0, description="seconds for one Slurm command")
    ssh_host: str | None = Field(default=None, description="run the commands on this login node")
    ssh_port: int = Field(default=22, ge=1, le=65535)
    ssh_user: str | None = None
    ssh_key: str | None = Field(default=None, description="private key file (default: agent, ~/.ssh)")
    ssh_known_hosts: str | None = Field(default=None, description="known_hosts file (default: the system's)")

    @model_validator(mode="before")
    @classmethod
    def _one_partition(cls, data: Any) -> Any:
        """``partition = "gpu"`` and ``partitions = "gpu"`` mean ``partitions = ["gpu"]``."""
        if isinstance(data, dict):
            data = dict(data)
            if isinstance(data.get("partitions"), str):
                data["partitions"] = [data["partitions"]]
            if "partition" in data:
                if "partitions" in data:
                    raise ValueError("partition and partitions: give one of them")
                one = data.pop("partition")
                if not (isinstance(one, str) or (isinstance(one, list) and all(isinstance(p, str) for p in one))):
                    # (said here: moved to partitions, it would be named as a key not written)
                    raise ValueError(f"partition: expected a partition name in quotes, or a list of them, "
                                     f"got {one!r}")
                data["partitions"] = [one] if isinstance(one, str) else one
        return data

    @field_validator("partitions", "sbatch_args", "setup", "export_env")
    @classmethod
    def _no_empty(cls, v: list[str]) -> list[str]:
        if any(not item.strip() for item in v):
            raise ValueError("empty entries are not accepted")
        return v

    @field_validator("gpu_kind")
    @classmethod
    def _kind(cls, v: str) -> str:
        if not plugin.is_kind(v):  # (as a detector names its kind, and a job asks for one)
            raise ValueError(f"{v!r} is not a device kind; accepted: a kind such as cuda or rocm "
                             "(lower-case letters, digits, '.', '_' and '-', other than cpu and none)")
        return v

    @field_validator("time_limit")
    @classmethod
    def _slurm_time(cls, v: str | None) -> str | None:
        if v is not None and not _TIME.match(v.strip()):
            raise ValueError(f"{v!r} is not a Slurm time; accepted: MINUTES, MINUTES:SECONDS, HOURS:MINUTES:SECONDS, "
                             "DAYS-HOURS, DAYS-HOURS:MINUTES, DAYS-HOURS:MINUTES:SECONDS or UNLIMITED")
        return v

    @field_validator("export_env")
    @classmethod
    def _export_names(cls, v: list[str]) -> list[str]:
        for name in v:
            if not _ENV_NAME.match(name):
                raise ValueError(f"{name!r} is not an environment variable name (letters, digits, _)")
        return v

    @field_validator("frameworks")
    @classmethod
    def _framework_versions(cls, v: dict[str, str]) -> dict[str, str]:
        for name, version in v.items():
            if not name.strip():
                raise ValueError("a framework needs a name")
            _version(version, f"{name}: ")
        return v

    @field_validator("python_version")
    @classmethod
    def _python_version(cls, v: str | None) -> str | None:
        return None if v is None else _version(v, "")

    @field_validator("env")
    @classmethod
    def _env_names(cls, v: dict[str, str]) -> dict[str, str]:
        for name in v:
            if not _ENV_NAME.match(name):
                raise ValueError(f"{name!r} is not an environment variable name (letters, digits, _)")
            if name.startswith("GPULAYER_TOKEN"):
                raise ValueError(f"{name} is set by GPULAYER itself (the bootstrap token)")
            if name in RESERVED_ENV:
                # exported after the worker's own environment, it would win: a join refused
                # (GPULAYER_MACHINE_ID), or sent to another server (GPULAYER_URL)
                raise ValueError(f"{name} is set by GPUlayer itself for each machine; leave it out "
                                 "(GPULAYER_PUBLIC_URL on the server sets the URL machines join)")
        return v


def _unpatterned(folder: str) -> str | None:
    """``folder`` up to its first part that holds a Slurm filename pattern (``%u``, ``%j``:
    ``sbatch --output`` replaces them), which is there only once Slurm fills it in; None
    where the first part does (relative: checked by sbatch itself)."""
    if "%" not in folder:
        return folder
    parts = folder.split("/")
    kept = parts[:next(i for i, part in enumerate(parts) if "%" in part)]
    return "/".join(kept) or ("/" if folder.startswith("/") else None)


def _version(text: str, what: str) -> str:
    try:
        Version(text)
    except InvalidVersion:
        raise ValueError(f"{what}{text!r} is not a version; accepted: a version such as 2.5.1") from None
    return text


def _gpu_request(requirements: plugin.Requirements, kind: str) -> int | None:
    """GPUs per machine the job needs; None when it needs an accelerator Slurm's gpu is not."""
    if requirements.accelerator is None:
        return 0
    if requirements.accelerator != kind:
        return None
    return 1 if requirements.gpus is None else requirements.gpus


class SlurmProvider:
    """One configured Slurm provider; see the module docstring."""

    def __init__(self, name: str, config: SlurmConfig, runner: Runner | None = None) -> None:
        self.name = name
        self.config = config
        self.runner = runner or self._runner(config)

    @staticmethod
    def _runner(c: SlurmConfig) -> Runner:
        if c.ssh_host:
            return SshRunner(c.ssh_host, port=c.ssh_port, user=c.ssh_user, key_file=c.ssh_key,
                             known_hosts=c.ssh_known_hosts, python=c.python, slurm_conf=c.slurm_conf,
                             connect_timeout=c.command_timeout)
        return LocalRunner(c.slurm_conf)

    # ----------------------------------------------------------------- commands

    def _run(self, argv: list[str], *, env: dict[str, str] | None = None, stdin: str | None = None) -> tuple[int, str, str]:
        return self.runner.run(argv, env=env, stdin=stdin, timeout=self.config.command_timeout)

    def _query(self, argv: list[str]) -> str:
        rc, out, err = self._run(argv)
        if rc != 0:
            raise _parse.command_error(argv[0], rc, err, self.runner.where)
        return out

    def nodes(self) -> list[_parse.Node]:
        out = self._query(["sinfo", "--Node", "--noheader", f"--Format={_parse.SINFO_FORMAT}"])
        return _parse.parse_nodes(out)

    def check(self) -> None:
        """``sinfo`` answers (commands found, munge and the controller reachable)."""
        conf = self.config.slurm_conf
        if conf and not self.config.ssh_host and not os.path.isfile(conf):
            raise plugin.ProviderAuthFailed(f"slurm_conf = {conf!r}: no such file on this machine")
        nodes = self.nodes()
        missing = [p for p in self.config.partitions if p not in {n.partition for n in nodes}]
        if missing:
            raise plugin.ProviderAuthFailed(
                f"partitions = {missing}: not on this cluster (sinfo shows "
                f"{sorted({n.partition for n in nodes}) or 'none'})")
        for key, given in (("log_dir", self.config.log_dir), ("workdir", self.config.workdir)):
            # Slurm does not make them: a pilot without one fails to start (JobLaunchFailure),
            # silently, and would be noticed only at its join deadline. A folder named by a
            # Slurm pattern (/scratch/%u/logs: the job's user) is checked up to the pattern.
            folder = _unpatterned(given) if given else None
            there = (self._run(["test", "-d", folder])[0] == 0 if self.config.ssh_host
                     else os.path.isdir(folder)) if folder else True
            if not there:
                raise plugin.ProviderAuthFailed(f"{key} = {given!r}: no such folder on {self.runner.where} "
                                                "(Slurm does not create it; a pilot job could not start)")
        self._test_submit(nodes)

    def _test_submit(self, nodes: list[_parse.Node]) -> None:
        """``sbatch --test-only`` of the smallest pilot with the section's options, in the
        partitions it offers (``partitions``, else every one), in turn until one would take
        it: an option every pilot would be refused for (a bad account, QOS or constraint in
        ``sbatch_args``) disables the provider now, naming it, rather than failing every
        launch in turn (each failure skipped the shape for five minutes, and a job waited for
        ever). A partition that refuses it while another takes it (one the account may not
        use) is left to the launches, which skip its shapes, as before: it must not disable
        the partitions that work. A busy cluster or controller only delays the answer; its
        errors are left to the launches."""
        c = self.config
        refused: list[tuple[str, str]] = []
        for partition in c.partitions or sorted({n.partition for n in nodes}):
            argv = ["sbatch", "--test-only", f"--partition={partition}", "--nodes=1", "--ntasks=1",
                    f"--cpus-per-task={c.cpus}", f"--mem={int(c.memory_gb * 1024)}M"]
            rc, _, err = self._run([*argv, *self._section_options(), "--wrap", "true"])
            if rc == 0:
                return  # (a pilot can start somewhere: the partitions that refuse are the launches')
            error = _parse.sbatch_error(err, partition)
            if isinstance(error, (plugin.ProviderTransient, plugin.NoCapacity, plugin.QuotaExceeded)):
                return  # (not the section's fault, or not for ever)
            refused.append((partition, " ".join(err.split()) or f"exit status {rc}"))
        if refused:
            (first, why), others = refused[0], [p for p, _ in refused[1:]]
            also = f", and in {', '.join(others)}" if others else ""
            raise plugin.ProviderAuthFailed(
                f"a pilot job with this section's options is refused in partition {first} "
                f"(sbatch --test-only: {why}){also}; check sbatch_args, time_limit, cpus and memory_gb")

    # ----------------------------------------------------------------- offers

    def offers(self, requirements: plugin.Requirements) -> list[plugin.MachineOffer]:
        """Every shape for an empty ``requirements`` (what the core caches): per partition, the
        sizes without GPUs (:meth:`_cpu_sizes`) and one per GPU type and count up to a node's; for a job's requirements,
        the shapes with exactly its GPUs, grown to its CPUs and memory."""
        c = self.config
        wanted = _gpu_request(requirements, c.gpu_kind)
        if wanted is None:
            return []
        every = requirements == plugin.Requirements()
        by_partition: dict[str, list[_parse.Node]] = {}
        for node in self.nodes():
            by_partition.setdefault(node.partition, []).append(node)
        offers = []
        for partition in c.partitions or list(by_partition):
            nodes = by_partition.get(partition, [])
            types = sorted({t for n in nodes for t, count in n.gpus.items() if count})
            sizes: list[tuple[str | None, int, tuple[int, int] | None]] = []
            if every:  # (what the core caches and matches every job against)
                sizes += [(None, 0, size) for size in self._cpu_sizes(nodes)]
            elif wanted == 0:
                sizes.append((None, 0, None))
            for kind in types:
                most = max(n.gpu_count(kind) for n in nodes)
                sizes += [(kind, k, None) for k in (range(1, most + 1) if every else [wanted] if wanted else [])]
            for gtype, count, cpu_size in sizes:
                cpus, memory_mb = cpu_size or self._size(nodes, gtype, count)
                cpus = max(cpus, requirements.cpus or 0)
                memory_mb = max(memory_mb, int((requirements.memory_gb or 0.0) * 1024))
                offer = self._offer(partition, nodes, gtype, count, cpus, memory_mb)
                if offer is not None:
                    offers.append(offer)
        return offers

    def _cpu_sizes(self, nodes: list[_parse.Node]) -> list[tuple[int, int]]:
        """CPUs and memory (MB) of the pilots without GPUs: ``cpus`` and ``memory_gb``, then
        twice the CPUs, and again, up to the biggest node's, each with that many CPUs' share
        of a node's memory (the smallest node's share; never less than ``memory_gb``). A CPU job bigger than the first
        gets a pilot of its own kind, not a GPU shape holding GPUs it does not use."""
        c = self.config
        least_mb = int(c.memory_gb * 1024)
        sized = [n for n in nodes if n.cpus > 0]
        if not sized:
            return [(c.cpus, least_mb)]
        most = max(n.cpus for n in sized)
        per_cpu_mb = min(n.memory_mb // n.cpus for n in sized)
        out, cpus = [(c.cpus, least_mb)], c.cpus
        while cpus < most:
            cpus = min(cpus * 2, most)
            out.append((cpus, max(least_mb, per_cpu_mb * cpus)))
        return out

    def _size(self, nodes: list[_parse.Node], gtype: str | None, count: int) -> tuple[int, int]:
        """CPUs and memory (MB) of a pilot with ``count`` GPUs: ``cpus_per_gpu`` and
        ``memory_gb_per_gpu``, else each GPU's share of its node (the smallest node's share)."""
        c = self.config
        cpus, memory_mb = c.cpus, int(c.memory_gb * 1024)
        if count == 0:
            return cpus, memory_mb
        having = [n for n in nodes if n.gpu_count(gtype)]
        per_cpu = c.cpus_per_gpu or min(max(1, n.cpus // n.gpu_count(gtype)) for n in having)
        per_mb = (int(c.memory_gb_per_gpu * 1024) if c.memory_gb_per_gpu
                  else min(n.memory_mb // n.gpu_count(gtype) for n in having))
        return max(cpus, per_cpu * count), max(memory_mb, per_mb * count)

    def _offer(self, partition: str, nodes: list[_parse.Node], gtype: str | None, gpus: int, cpus: int,
               memory_mb: int) -> plugin.MachineOffer | None:
        fits = [n for n in nodes if n.cpus >= cpus and n.memory_mb >= memory_mb and n.gpu_count(gtype) >= gpus]
        if not fits:
            return None
        usable = [n for n in fits if n.usable]
        free = [n for n in usable if n.cpus_free >= cpus and n.memory_free_mb >= memory_mb
                and n.gpus_free(gtype) >= gpus]
        availability: Availability = "available" if free else "limited" if usable else "unavailable"
        gres = f"gpu:{gtype}:{gpus}" if gtype else f"gpu:{gpus}"
        label = gtype or "gpu"
        shape = f"{cpus}cpu-{memory_mb / 1024:g}gb" + (f"-{gpus}x{label}" if gpus else "")
        memory = self.config.gpu_memory_gb.get(gtype or "", self.config.gpu_memory_gb.get("*"))
        devices = [plugin.Device(kind=self.config.gpu_kind, index=i, name=f"Slurm GRES {label}",
                                 memory_bytes=int(memory * 1024**3) if memory else None)
                   for i in range(gpus)]
        host = plugin.HostInfo(os="linux", arch="x86_64", hostname=fits[0].name, cpu_count=cpus,
                               memory_bytes=memory_mb * 1024 * 1024, python_version=self.config.python_version or "")
        caps = plugin.Capabilities(host=host, devices=devices, frameworks=dict(self.config.frameworks))
        return plugin.MachineOffer(
            provider=self.name, shape=shape, region=partition, availability=availability,
            capabilities=caps, price_per_hour=None,
            data={"partition": partition, "cpus": cpus, "memory_mb": memory_mb,
                  "gres": gres if gpus else None, "nodes": [n.name for n in fits]},
        )

    # ----------------------------------------------------------------- launch

    def job_script(self, request: plugin.LaunchRequest) -> str:
        """The pilot job's script: setup lines, the worker's plain settings, the worker. No secret."""
        c = self.config
        lines = ["#!/bin/sh", f"# GPUlayer pilot job for machine {request.machine_id}: one worker, then exit."]
        lines += c.setup
        # The worker reports what the allocation holds, not the whole node it runs on (which
        # is what it would detect): a job is placed on it by the CPUs and memory sbatch asked
        # for. A variable of the same name in ``env`` wins (it is exported after these).
        data = request.offer.data
        size = {"GPULAYER_OVERRIDE_CPU_COUNT": str(int(data.get("cpus") or c.cpus)),
                "GPULAYER_OVERRIDE_MEMORY_GB": f"{int(data.get('memory_mb') or c.memory_gb * 1024) / 1024:g}"}
        lines += [f"export {k}={v}" for k, v in size.items() if k not in c.env]
        lines += [f"export {k}={shlex.quote(v)}" for k, v in sorted(c.env.items())]
        lines.append("exec " + shlex.join(request.worker_argv(c.python)))
        return "\n".join(lines) + "\n"

    def sbatch_argv(self, request: plugin.LaunchRequest, export: list[str]) -> list[str]:
        c = self.config
        data = request.offer.data
        argv = ["sbatch", "--parsable", f"--job-name={NAME_PREFIX}{request.machine_id}",
                f"--comment={COMMENT_PREFIX}{request.label}:{request.machine_id}",
                f"--partition={data.get('partition') or request.offer.region}", "--nodes=1", "--ntasks=1",
                f"--cpus-per-task={int(data.get('cpus') or c.cpus)}",
                f"--mem={int(data.get('memory_mb') or c.memory_gb * 1024)}M",
                f"--export={','.join(export)}"]
        if data.get("gres"):
            argv.append(f"--gres={data['gres']}")
        return argv + self._section_options()

    def _section_options(self) -> list[str]:
        """The sbatch options every pilot gets from the section (last: ``sbatch_args``)."""
        c = self.config
        return ([f"--time={c.time_limit}"] if c.time_limit else []) \
            + ([f"--output={c.log_dir.rstrip('/')}/%x-%j.out"] if c.log_dir else []) \
            + ([f"--chdir={c.workdir}"] if c.workdir else []) + c.sbatch_args

    def launch(self, request: plugin.LaunchRequest) -> plugin.LaunchedMachine:
        # Idempotent: a launch retried with the same machine id finds its first job.
        for job in self._jobs():
            if job.name == NAME_PREFIX + request.machine_id and job.live_state is not None:
                return plugin.LaunchedMachine(provider_id=job.job_id, data={"partition": request.offer.region})
        env = request.worker_environment()
        export = sorted(env) + [n for n in self.config.export_env
                                if n not in env and (self.config.ssh_host or n in _local_env())]
        rc, out, err = self._run(self.sbatch_argv(request, export), env=env, stdin=self.job_script(request))
        if rc != 0:
            raise _parse.sbatch_error(err, str(request.offer.data.get("partition") or request.offer.region))
        job_id = out.strip().splitlines()[-1].split(";")[0].strip() if out.strip() else ""
        if not job_id.isdigit():
            raise plugin.ProviderTransient(f"sbatch answered {out.strip()!r}, not a job id")
        return plugin.LaunchedMachine(provider_id=job_id, data={"partition": request.offer.region,
                                                                "submitted_at": time.time()})

    # ----------------------------------------------------------------- list, terminate

    def _jobs(self) -> list[_parse.Job]:
        rc, out, err = self._run(["squeue", "--json", "--me"])
        if rc == 0:
            try:
                return _parse.parse_squeue_json(out)
            except ValueError:
                pass  # not JSON after all: read the plain format below
        elif not _parse.json_unsupported(err):
            raise _parse.command_error("squeue", rc, err, self.runner.where)
        out = self._query(["squeue", "--me", "--noheader", f"--format={_parse.SQUEUE_FORMAT}"])
        return _parse.parse_squeue_format(out)

    def list(self, label: str) -> list[plugin.LiveMachine]:
        prefix = f"{COMMENT_PREFIX}{label}:"
        machines = []
        for job in self._jobs():
            state = job.live_state
            if state is None or not job.comment.startswith(prefix):
                continue
            machines.append(plugin.LiveMachine(machine_id=job.comment[len(prefix):], provider_id=job.job_id,
                                               state=state, data={"slurm_state": job.state}))
        return machines

    def terminate(self, machine_id: str, provider_id: str | None) -> None:
        argv = ["scancel", f"--name={NAME_PREFIX}{machine_id}"]
        if provider_id:
            argv.append(provider_id)
        rc, _, err = self._run(argv)
        if rc != 0 and "invalid job id" not in err.lower() and "already completing or completed" not in err.lower():
            raise _parse.command_error("scancel", rc, err, self.runner.where)


def _local_env() -> set[str]:
    return set(os.environ)


def create(name: str, config: Any) -> SlurmProvider:
    return SlurmProvider(name, config if isinstance(config, SlurmConfig) else SlurmConfig.model_validate(config))


@plugin.hookimpl
def gpulayer_provider_adapters() -> Iterator[plugin.ProviderAdapter]:
    yield plugin.ProviderAdapter(
        name="slurm", description="Slurm allocations: a pilot job per machine (sbatch, squeue, scancel)",
        config=SlurmConfig, create=create)


__all__ = ["SlurmConfig", "SlurmProvider", "gpulayer_provider_adapters"]
