"""Reading what Slurm's commands print, and what their errors mean (pure functions).

Nodes come from ``sinfo --Node --noheader --Format=...`` with ``|`` after every field
(:data:`SINFO_FIELDS`): one line per node and partition, a format every Slurm since 14.x
prints the same way. Jobs come from ``squeue --json`` (21.08 and later; ``job_state`` is a
string before 23.02 and a list after) or, where that is missing, from ``squeue --format``.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Literal

from gpulayer import plugin

#: sinfo --Format fields, in the order :func:`parse_nodes` reads them
SINFO_FIELDS = ["NodeList", "Partition", "StateLong", "CPUs", "CPUsState", "Memory", "AllocMem",
                "Gres", "GresUsed", "Available"]
SINFO_FORMAT = ",".join(f"{f}:0|" for f in SINFO_FIELDS)
#: squeue --format for Slurm without --json: id, name, state, comment (last: it may hold "|")
SQUEUE_FORMAT = "%i|%j|%T|%k"

#: node states (sinfo's long names, without the flag characters) that take no new job
_DOWN_STATES = {"down", "drained", "draining", "fail", "failing", "future", "maint", "reboot_issued",
                "reboot_requested", "power_down", "powered_down", "powering_down", "unknown", "inval",
                "planned", "not_responding"}
_PENDING = {"PENDING", "CONFIGURING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "RESIZING", "SUSPENDED"}
_RUNNING = {"RUNNING"}
_STOPPING = {"COMPLETING", "SIGNALING", "STAGE_OUT", "STOPPED"}


@dataclass(frozen=True)
class Node:
    """One node as one partition sees it."""

    name: str
    partition: str
    state: str
    cpus: int
    cpus_free: int
    memory_mb: int
    memory_free_mb: int
    #: GRES gpu type ("a100", or "" when the gres has none) -> count, configured and in use
    gpus: dict[str, int]
    gpus_used: dict[str, int]
    partition_up: bool

    @property
    def usable(self) -> bool:
        """Whether the node takes new jobs at all (up, not drained or down)."""
        base = self.state.rstrip("*~#!%$@^-+").lower()
        return self.partition_up and not self.state.endswith("*") and base not in _DOWN_STATES

    def gpu_count(self, gpu_type: str | None = None) -> int:
        return sum(n for t, n in self.gpus.items() if gpu_type in (None, t))

    def gpus_free(self, gpu_type: str | None = None) -> int:
        return self.gpu_count(gpu_type) - sum(n for t, n in self.gpus_used.items() if gpu_type in (None, t))


def _int(text: str) -> int:
    m = re.match(r"\s*(\d+)", text)
    return int(m.group(1)) if m else 0


def parse_gres(text: str, name: str = "gpu") -> dict[str, int]:
    """``gpu:a100:4(S:0-1),nic:1`` -> ``{"a100": 4}``; ``gpu:2`` -> ``{"": 2}``; ``(null)`` -> ``{}``."""
    out: dict[str, int] = {}
    text = re.sub(r"\([^)]*\)", "", text or "")  # socket/index annotations: (S:0-1), (IDX:0,1)
    for item in text.split(","):
        parts = item.strip().split(":")
        if not parts or parts[0] != name:
            continue
        count = _int(parts[-1]) if len(parts) > 1 and parts[-1].strip()[:1].isdigit() else 1
        gtype = parts[1] if len(parts) > 2 else ""
        out[gtype] = out.get(gtype, 0) + count
    return out


def parse_nodes(text: str) -> list[Node]:
    """Nodes from ``sinfo --Node --noheader --Format`` :data:`SINFO_FORMAT`."""
    nodes = []
    for line in text.splitlines():
        fields = line.split("|")
        if len(fields) < len(SINFO_FIELDS):
            continue
        name, part, state, cpus, cpu_state, mem, alloc_mem, gres, gres_used, avail = (f.strip() for f in fields[:10])
        # CPUsState is allocated/idle/other/total
        cpu_parts = cpu_state.split("/")
        idle = _int(cpu_parts[1]) if len(cpu_parts) == 4 else 0
        memory = _int(mem)
        nodes.append(Node(
            name=name, partition=part.rstrip("*"), state=state, cpus=_int(cpus), cpus_free=idle,
            memory_mb=memory, memory_free_mb=max(memory - _int(alloc_mem), 0),
            gpus=parse_gres(gres), gpus_used=parse_gres(gres_used), partition_up=avail.lower() == "up",
        ))
    return nodes


State = Literal["pending", "running", "stopping", "unknown"]


@dataclass(frozen=True)
class Job:
    job_id: str
    name: str
    state: str
    comment: str

    @property
    def live_state(self) -> State | None:
        """The machine state this job stands for; None once it has ended."""
        if self.state in _PENDING:
            return "pending"
        if self.state in _RUNNING:
            return "running"
        if self.state in _STOPPING:
            return "stopping"
        if self.state in {"COMPLETED", "CANCELLED", "FAILED", "TIMEOUT", "NODE_FAIL", "PREEMPTED",
                          "BOOT_FAIL", "DEADLINE", "OUT_OF_MEMORY", "SPECIAL_EXIT", "REVOKED"}:
            return None
        return "unknown"


def _state(value: Any) -> str:
    if isinstance(value, list):  # 23.02+: ["RUNNING", "COMPLETING"]
        return str(value[0]) if value else ""
    return str(value or "")


def parse_squeue_json(text: str) -> list[Job]:
    data = json.loads(text)
    return [Job(job_id=str(j.get("job_id", "")), name=str(j.get("name", "")), state=_state(j.get("job_state")),
                comment=str(j.get("comment") or "")) for j in data.get("jobs", [])]


def parse_squeue_format(text: str) -> list[Job]:
    jobs = []
    for line in text.splitlines():
        parts = line.split("|", 3)
        if len(parts) == 4:
            jobs.append(Job(job_id=parts[0].strip(), name=parts[1], state=parts[2].strip(),
                            comment="" if parts[3] == "(null)" else parts[3]))
    return jobs


def json_unsupported(stderr: str) -> bool:
    """Whether squeue failed because this Slurm has no ``--json`` (or no JSON serializer)."""
    s = stderr.lower()
    return "json" in s and any(k in s for k in ("unrecognized", "invalid option", "unknown option",
                                                 "serializer", "data_parser", "not supported"))


# --------------------------------------------------------------------------- errors

_AUTH = ("munge", "authentication", "invalid user id", "access denied", "permission denied",
         "auth/", "credential")
_TRANSIENT = ("unable to contact slurm controller", "socket timed out", "connection refused",
              "temporarily unable to accept", "slurm_persist_conn", "communication connection failure",
              "zero bytes were transmitted", "controller is not responding", "try again")
_QUOTA = ("qosmax", "assocmax", "violates accounting/qos policy", "maxsubmit", "max_submit",
          "job limit", "qos policy", "association limit")
_NOW = ("requested partition configuration not available now", "resources temporarily unavailable")


def sbatch_error(stderr: str, partition: str) -> plugin.ProviderError:
    """The typed error for an ``sbatch`` that refused a job; the message keeps Slurm's words."""
    text = " ".join(line.strip() for line in stderr.strip().splitlines()) or "no message"
    low = text.lower()
    if any(s in low for s in _AUTH):
        return plugin.ProviderAuthFailed(f"sbatch: {text}")
    if any(s in low for s in _TRANSIENT):
        return plugin.ProviderTransient(f"sbatch: {text}")
    if any(s in low for s in _QUOTA):
        return plugin.QuotaExceeded(f"partition {partition}: {text}")
    if any(s in low for s in _NOW):
        return plugin.NoCapacity(f"partition {partition}: {text}")
    # "Requested node configuration is not available", an invalid partition or gres, an
    # account not allowed there: this offer cannot be used, the next one may.
    return plugin.SkipOffer(f"partition {partition}: {text}")


def command_error(command: str, rc: int, stderr: str, where: str) -> plugin.ProviderError:
    """The typed error for a query command (sinfo, squeue, scancel) that failed."""
    text = " ".join(line.strip() for line in stderr.strip().splitlines()) or f"exit status {rc}"
    low = text.lower()
    if any(s in low for s in _TRANSIENT):
        return plugin.ProviderTransient(f"{command} on {where}: {text}")
    if any(s in low for s in _AUTH) or "could not establish a configuration source" in low \
            or "fatal" in low:
        return plugin.ProviderAuthFailed(f"{command} on {where}: {text}")
    return plugin.ProviderTransient(f"{command} on {where}: {text}")
