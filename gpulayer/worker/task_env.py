"""The environment a task's process starts with (:func:`task_environ`): the worker's own,
without its secrets, with the job's variables, the task's identity and its granted devices."""

from __future__ import annotations

import os
from pathlib import Path

from gpulayer.api import TaskAssignment
from gpulayer.hookrecords import Capabilities

#: variables of the worker's environment its tasks do not inherit
WORKER_SECRETS = frozenset({"GPULAYER_TOKEN"})


def task_environ(a: TaskAssignment, workdir: Path, capabilities: Capabilities, artifacts: Path) -> dict[str, str]:
    """The environment of task ``a`` run in ``workdir`` on a worker with ``capabilities``;
    ``artifacts``: the folder whose files are kept with its job when it ends."""
    # the worker's own secrets stay with it: a job must not act as its worker (or join
    # as a new one with a token the worker was started with)
    env = {k: v for k, v in os.environ.items() if k not in WORKER_SECRETS}
    env.update(a.spec.env)
    env["GPULAYER_JOB_ID"] = a.job_id
    env["GPULAYER_TASK_ID"] = a.task_id
    env["GPULAYER_ATTEMPT"] = str(a.attempt)
    env["GPULAYER_NODE_RANK"] = str(a.node_rank)
    env["GPULAYER_ACCELERATOR"] = a.accelerator or "cpu"
    env["GPULAYER_ARTIFACTS_DIR"] = str(artifacts)
    env["PYTHONUNBUFFERED"] = "1"
    from gpulayer.devices import task_environment

    # the granted devices visible, every other device this worker has hidden
    # devices an override hid are hidden from every task too (their kind's hide_env)
    have = [*capabilities.devices, *capabilities.hidden_devices]
    env.update(task_environment(have, a.accelerator, a.devices))
    if a.spec.bundle_digest:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(workdir), env.get("PYTHONPATH", "")) if p)
    return env


__all__ = ["WORKER_SECRETS", "task_environ"]
