"""The user-data script a new instance runs at boot (cloud-init runs it as root, once).

It installs nothing: the image already has Python and gpulayer. It exports what the worker
needs, bootstrap token included, and replaces itself with ``gpulayer worker start``, whose
argv carries no secret (:meth:`~gpulayer.plugin.LaunchRequest.worker_argv`). The token is
single-use, bound to this machine id and dead after the join deadline: whoever reads the
user-data later (the instance metadata service, ``DescribeInstanceAttribute``) finds a
spent token.
"""

from __future__ import annotations

import shlex

from gpulayer import plugin


def user_data(request: plugin.LaunchRequest, python: str = "python3") -> str:
    lines = ["#!/bin/sh",
             f"# gpulayer-provider-ec2: the GPUlayer worker of machine {request.machine_id}",
             "set -eu",
             "umask 077"]
    lines += [f"export {name}={shlex.quote(value)}" for name, value in sorted(request.worker_environment().items())]
    lines.append("exec " + shlex.join(request.worker_argv(python=python)))
    return "\n".join(lines) + "\n"
