"""What each field of a job spec accepts, in the words errors use (added to
:data:`gpulayer.wording.ACCEPTED` when :mod:`gpulayer.specs` is imported)."""

from __future__ import annotations

from gpulayer.wording import ACCEPTED

#: what each field accepts, in the words errors use
_ACCEPTED = {
    "Requirements.accelerator": "a kind such as cuda, rocm or mps, or cpu for none",
    "Requirements.gpus": "a whole number >= 0 (devices per node)",
    "Requirements.min_gpu_memory_gb": "a number of GB > 0",
    "Requirements.compute_capability": "a version such as 8.0 (meaning >=8.0) or PEP 440 clauses such as '>=8.0,<9'",
    "Requirements.frameworks": "NAME or NAME followed by a PEP 440 version specifier, e.g. 'torch>=2.2' or 'jax'",
    "Requirements.python": "a version such as 3.11 (meaning >=3.11) or PEP 440 clauses such as '>=3.10,<3.13'",
    "Requirements.os": "an operating system name such as linux or darwin",
    "Requirements.cpus": "a whole number >= 0",
    "Requirements.memory_gb": "a number of GB >= 0",
    "Requirements.labels": "KEY=VALUE pairs of text",
    "Requirements.profile": "the name of a runtime profile such as pytorch-cuda",
    "Placement.target": "local, remote or cloud",
    "Placement.fallback_targets": "local, remote or cloud, each listed once",
    "Placement.on_unschedulable": "fail or wait",
    "_JobBase.name": "text of at most 200 characters",
    "_JobBase.requirements": "a Requirements record or a mapping of its fields",
    "_JobBase.placement": "a Placement record or a mapping of its fields",
    "_JobBase.timeout": "a number of seconds > 0 (leave it out for no limit)",
    "_JobBase.retries": "a whole number from 0 to 100",
    "_JobBase.priority": "a whole number from -1000 to 1000",
    "_JobBase.env": "NAME=VALUE pairs of text",
    "_JobBase.bundle": "the path of a directory",
    "_JobBase.bundle_digest": "64 lowercase hexadecimal digits (a SHA-256)",
    "_JobBase.after": "ids of stored jobs (job- and hexadecimal digits), each listed once, at most 100",
    "_JobBase.after_ended": "ids of stored jobs (job- and hexadecimal digits), each listed once, at most 100",
    "CommandJob.command": "a list of arguments such as ['python', 'train.py']",
    "FunctionJob.function": "'module:function', e.g. 'train:main' or 'pkg.mod:fn'",
    "FunctionJob.args": "a list of JSON values",
    "FunctionJob.kwargs": "a mapping of argument names to JSON values",
    "FunctionJob.python": "the path of a Python interpreter on the worker",
    "DistributedJob.nodes": "a whole number from 1 to 1024",
    "DistributedJob.nproc_per_node": "a whole number from 1 to 1024",
    "DistributedJob.entry": "a script ('train.py') or a function ('pkg.train:main')",
    "DistributedJob.args": "a list of text arguments",
    "DistributedJob.launcher": "the name of a distributed launcher such as torchrun",
}
ACCEPTED.update(_ACCEPTED)
